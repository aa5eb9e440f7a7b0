//! The layer's runtime configuration: what every request of a layer reads ([`Shared`]), where
//! phase boundaries come from ([`PhaseSource`]), and the instrumentation [`scope`] of everything
//! the layer emits.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use opentelemetry::{InstrumentationScope, StringValue};

use crate::admission::AdmissionQueue;
use crate::counters::Counters;
use crate::metrics::LayerMetrics;
use crate::request_facts::{ArrivalHeaders, RequestDescription, RequestFacts, RequestHead};

/// Where the queue / prefill / decode boundaries come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PhaseSource {
    /// The engine marks them through the [`RequestRecorder`](crate::RequestRecorder) in the
    /// request extensions (`scheduled`, `first_token`, `tokens`). A request whose engine made no
    /// mark at all falls back to [`Derived`](Self::Derived), and says so in `infer.phase.source`
    /// — unless it is a stream that ended before any output (a client gone while the engine
    /// still queued it), or a request refused without streaming any output (a client error or
    /// a rejection: a handler's own 400 or 429, in `Derived` too): then only the layer's
    /// admission queue, if any, gets a phase span, since that time was most likely the engine's
    /// queue or no engine's at all, not a prefill. A stream whose engine marked `scheduled` but
    /// no token has its body chunks stand for the tokens, as in `Derived`; a unary answer marked
    /// so is one `inference` phase from `scheduled` (an embedding's is prefill).
    #[default]
    Engine,
    /// No engine changes: queue = arrival → admitted by the layer's admission queue; for streamed
    /// responses prefill = admitted → first body chunk and decode = first → last chunk; for
    /// non-streamed responses one `inference` span covers admitted → end of body, because there is
    /// no first-chunk signal to split prefill from decode.
    Derived,
}

impl PhaseSource {
    /// The `infer.phase.source` value.
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseSource::Engine => infertrace_semconv::infer::phase_source::ENGINE,
            PhaseSource::Derived => infertrace_semconv::infer::phase_source::DERIVED,
        }
    }
}

/// A layer's `describe` function.
pub(crate) type DescribeFn = dyn Fn(&RequestHead<'_>) -> RequestDescription + Send + Sync;
/// A layer's `skip` predicate.
pub(crate) type SkipFn = dyn Fn(&RequestHead<'_>) -> bool + Send + Sync;

/// The instrumentation scope of every span and metric the layer emits. Built from constants on
/// each call: cheaper than cloning a stored scope.
#[inline]
pub(crate) fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("infertrace-tower")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// The settings and instruments every service of one layer shares.
pub(crate) struct Shared {
    pub(crate) metrics: LayerMetrics,
    /// Whether requests are recorded in `metrics` ([`InferenceTraceLayer::without_metrics`]
    /// turns it off; the admission queue's gauge still goes through `metrics`, a no-op then).
    ///
    /// [`InferenceTraceLayer::without_metrics`]: crate::InferenceTraceLayer::without_metrics
    pub(crate) record_metrics: bool,
    pub(crate) phase_source: PhaseSource,
    pub(crate) admission: Option<Arc<AdmissionQueue>>,
    pub(crate) default_model: Option<StringValue>,
    pub(crate) default_operation: Cow<'static, str>,
    /// `gen_ai.provider.name` on every request span.
    pub(crate) provider: StringValue,
    pub(crate) describe: Option<Arc<DescribeFn>>,
    pub(crate) skip: Option<Arc<SkipFn>>,
    /// GPU and host counters for the phase spans (`None`: no enrichment at all).
    pub(crate) gpu: Option<Counters>,
}

impl Shared {
    /// Whether the layer passes this request through untraced.
    pub(crate) fn skips(&self, head: &RequestHead<'_>) -> bool {
        self.skip.as_ref().is_some_and(|skip| skip(head))
    }

    /// Operation, model and protocol of a request: the `describe` function's answer first,
    /// then the request head, then this layer's defaults.
    pub(crate) fn request_facts(
        &self,
        head: &RequestHead<'_>,
        headers: &ArrivalHeaders<'_>,
    ) -> RequestFacts {
        let described = self
            .describe
            .as_ref()
            .map(|describe| describe(head))
            .unwrap_or_default();
        RequestFacts::read(
            head,
            headers,
            described,
            &self.default_operation,
            self.default_model.as_ref(),
            &self.provider,
        )
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("phase_source", &self.phase_source)
            .finish_non_exhaustive()
    }
}
