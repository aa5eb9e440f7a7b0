//! infertrace's batch span processor: the SDK's batching, plus whole requests handed over as one
//! message and turned into spans on the export thread.
//!
//! It batches like the SDK's `BatchSpanProcessor` (same `OTEL_BSP_*` variables, same defaults):
//! a bounded data queue that never blocks the caller (a full queue drops and counts), a control
//! channel the export thread sleeps on, an export when a batch's worth of spans is queued or the
//! schedule delay has passed, and flush / shutdown that export everything queued first. The SDK
//! spans of a tracer provider go through it unchanged ([`SpanProcessor::on_end`]).
//!
//! What it adds is [`BatchProcessor::submit_request`]: the layer's direct path
//! ([`crate::direct`]) hands over a finished request (the request span's identity, start
//! attributes and status, the end-of-request values, the phase intervals) as **one** queue entry,
//! and the export thread builds the request span and its phase spans from it. On the request's
//! thread that replaces four `SpanData` builds, the end attributes and four queue entries with
//! one; the spans' heap blocks are allocated and freed on the export thread, which also spares
//! glibc's arena lock the cross-thread frees.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{SpanContext, SpanKind, Status};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Span, SpanData, SpanEvents, SpanExporter, SpanLinks,
    SpanProcessor,
};

use infertrace_semconv::{infer, span as span_names};

use crate::direct::DirectSpan;
use crate::end_attributes::EndAttributes;

/// The most queue entries a processor holds: the queue is allocated up front, ≈ 850 bytes an
/// entry (≈ 56 MB at this size).
pub const MAX_QUEUE_ENTRIES: usize = 65_536;

/// Batching settings of infertrace's batch processor ([`SharedSpanProcessor::batch_with`]):
/// the SDK's `BatchConfig`, whose fields are not public.
///
/// [`SharedSpanProcessor::batch_with`]: crate::SharedSpanProcessor::batch_with
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSettings {
    /// Queue entries held before new ones are dropped (default 2,048; at most
    /// [`MAX_QUEUE_ENTRIES`], as the queue is allocated up front). An entry is one span, or one
    /// whole request from the layer (its request span and up to four phase spans).
    pub max_queue_size: usize,
    /// Longest time a queued span waits for its batch to be exported (default 5 s; at least 1 ms).
    pub scheduled_delay: Duration,
    /// Spans per export call (default 512; at most `max_queue_size`).
    pub max_export_batch_size: usize,
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self {
            max_queue_size: 2048,
            scheduled_delay: Duration::from_millis(5000),
            max_export_batch_size: 512,
        }
    }
}

impl BatchSettings {
    /// The defaults, overridden by `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_SCHEDULE_DELAY`
    /// (milliseconds) and `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` from the process environment.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with the variables `env` returns; unparsable or zero
    /// values are ignored, and the batch size is capped at the queue size (as the SDK does).
    pub(crate) fn from_vars(env: impl Fn(&str) -> Option<String>) -> Self {
        let read = |name: &str| {
            env(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|v| *v > 0)
        };
        let mut s = Self::default();
        if let Some(v) = read("OTEL_BSP_MAX_QUEUE_SIZE") {
            s.max_queue_size = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = read("OTEL_BSP_SCHEDULE_DELAY") {
            s.scheduled_delay = Duration::from_millis(v);
        }
        if let Some(v) = read("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
            s.max_export_batch_size = usize::try_from(v).unwrap_or(usize::MAX);
        }
        s.normalized()
    }

    /// Both sizes at least 1, the queue at most [`MAX_QUEUE_ENTRIES`], the batch size at most
    /// the queue size, the delay at least 1 ms.
    fn normalized(mut self) -> Self {
        self.max_queue_size = self.max_queue_size.clamp(1, MAX_QUEUE_ENTRIES);
        // A zero delay would make the export thread spin.
        self.scheduled_delay = self.scheduled_delay.max(Duration::from_millis(1));
        self.max_export_batch_size = self.max_export_batch_size.clamp(1, self.max_queue_size);
        self
    }
}

/// One phase span of a finished request.
#[derive(Debug)]
pub(crate) struct PhaseSpan {
    pub(crate) name: &'static str,
    pub(crate) start: SystemTime,
    pub(crate) end: SystemTime,
    /// With counters: `infer.phase` and the window statistics. `None`: `infer.phase` alone,
    /// written on the export thread.
    pub(crate) attributes: Option<Vec<KeyValue>>,
}

/// The phase spans of a request (`queue`, `prefill`, `decode`, `inference`), compact: their
/// intervals, and only with counters their attribute lists.
#[derive(Debug, Default)]
pub(crate) struct PhaseSpans {
    times: [Option<(SystemTime, SystemTime)>; 4],
    attributes: Option<Box<[Option<Vec<KeyValue>>; 4]>>,
}

/// The names of [`PhaseSpans`], in order.
pub(crate) const PHASE_NAMES: [&str; 4] = [
    span_names::QUEUE,
    span_names::PREFILL,
    span_names::DECODE,
    span_names::INFERENCE,
];

impl PhaseSpans {
    /// Adds the phase span [`PHASE_NAMES`]`[i]` over `[start, end]`, with `attributes` when
    /// it has counters (an index past the last phase is ignored).
    pub(crate) fn set(
        &mut self,
        i: usize,
        start: SystemTime,
        end: SystemTime,
        attributes: Option<Vec<KeyValue>>,
    ) {
        let Some(slot) = self.times.get_mut(i) else {
            return;
        };
        *slot = Some((start, end));
        if let Some(attributes) = attributes {
            self.attributes.get_or_insert_with(Box::default)[i] = Some(attributes);
        }
    }

    /// The number of phase spans.
    pub(crate) fn len(&self) -> usize {
        self.times.iter().flatten().count()
    }
}

impl IntoIterator for PhaseSpans {
    type Item = PhaseSpan;
    type IntoIter = std::iter::Flatten<std::array::IntoIter<Option<PhaseSpan>, 4>>;

    fn into_iter(self) -> Self::IntoIter {
        let mut attributes = self.attributes.map(|a| *a).unwrap_or_default();
        let mut i = 0;
        self.times
            .map(|times| {
                let name = PHASE_NAMES[i];
                let attributes = attributes[i].take();
                i += 1;
                times.map(|(start, end)| PhaseSpan {
                    name,
                    start,
                    end,
                    attributes,
                })
            })
            .into_iter()
            .flatten()
    }
}

impl PhaseSpan {
    /// The span's attributes: `infer.phase` first.
    pub(crate) fn into_attributes(self) -> Vec<KeyValue> {
        self.attributes
            .unwrap_or_else(|| vec![KeyValue::new(infer::PHASE, self.name)])
    }
}

/// A finished request, as the layer hands it over: everything its spans are built from.
#[derive(Debug)]
pub(crate) struct FinishedRequest {
    /// The request span: identity, name, start, the attributes known at arrival, status.
    pub(crate) span: DirectSpan,
    pub(crate) end: SystemTime,
    pub(crate) end_attributes: EndAttributes,
    /// The phase spans (exported only when the request span is sampled).
    pub(crate) phases: PhaseSpans,
}

impl FinishedRequest {
    /// The number of spans this request becomes.
    fn span_count(&self) -> usize {
        1 + if self.span.span_context().is_sampled() {
            self.phases.len()
        } else {
            0
        }
    }

    /// Appends the phase spans, then the request span, as the direct path exports them.
    fn into_spans(self, ids: &RandomIdGenerator, out: &mut Vec<SpanData>) {
        let Self {
            span,
            end,
            end_attributes,
            phases,
        } = self;
        let parent = span.span_context();
        if parent.is_sampled() {
            for phase in phases {
                out.push(phase_span_data(parent, ids, phase));
            }
        }
        out.push(span.into_span_data(end, |attributes| {
            end_attributes.write(&mut |kv| attributes.push(kv));
        }));
    }
}

/// The `SpanData` of one INTERNAL phase span under the request span `parent`.
pub(crate) fn phase_span_data(
    parent: &SpanContext,
    ids: &RandomIdGenerator,
    phase: PhaseSpan,
) -> SpanData {
    let context = SpanContext::new(
        parent.trace_id(),
        ids.new_span_id(),
        parent.trace_flags(),
        false,
        parent.trace_state().clone(),
    );
    SpanData {
        span_context: context,
        parent_span_id: parent.span_id(),
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: std::borrow::Cow::Borrowed(phase.name),
        start_time: phase.start,
        end_time: phase.end,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        // Built from constants: cheaper than cloning a stored scope.
        instrumentation_scope: crate::layer::scope(),
        attributes: phase.into_attributes(),
    }
}

/// What travels on the data queue.
// Not boxed on purpose: a box allocated on the request's thread and freed on the export thread
// is the cross-thread free this processor exists to avoid.
#[allow(clippy::large_enum_variant)]
enum Item {
    Span(SpanData),
    Request(FinishedRequest),
}

impl Item {
    fn span_count(&self) -> usize {
        match self {
            Item::Span(_) => 1,
            Item::Request(r) => r.span_count(),
        }
    }
}

/// What travels on the control channel.
enum Control {
    /// A batch's worth of spans is queued.
    Export,
    Flush(SyncSender<OTelSdkResult>),
    Shutdown(SyncSender<OTelSdkResult>),
}

/// The batch processor: cheap to share (`Arc`), one export thread.
pub(crate) struct BatchProcessor {
    items: SyncSender<Item>,
    control: SyncSender<Control>,
    /// Spans queued and not yet taken by the export thread.
    queued_spans: Arc<AtomicUsize>,
    /// An `Export` message is on its way (cleared by the export thread).
    export_signalled: Arc<AtomicBool>,
    max_export_batch_size: usize,
    /// Spans dropped: queue full, or given after shutdown (counted here and by the export
    /// thread for what it finds left after its last export).
    dropped_spans: Arc<AtomicU64>,
    shut_down: AtomicBool,
    worker: Mutex<Option<thread::JoinHandle<()>>>,
}

impl fmt::Debug for BatchProcessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchProcessor")
            .field("max_export_batch_size", &self.max_export_batch_size)
            .field("dropped_spans", &self.dropped_spans.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// How long `force_flush` waits for the export thread (as the SDK's batch processor).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

impl BatchProcessor {
    /// Starts the export thread, exporting to `exporter` (given `resource` first).
    pub(crate) fn new<E>(
        mut exporter: E,
        resource: &Resource,
        settings: BatchSettings,
    ) -> std::io::Result<Self>
    where
        E: SpanExporter + 'static,
    {
        exporter.set_resource(resource);
        let settings = settings.normalized();
        let (items, item_rx) = sync_channel(settings.max_queue_size);
        let (control, control_rx) = sync_channel(64);
        let queued_spans = Arc::new(AtomicUsize::new(0));
        let export_signalled = Arc::new(AtomicBool::new(false));
        let dropped_spans = Arc::new(AtomicU64::new(0));
        let mut worker = Worker {
            dropped_spans: Arc::clone(&dropped_spans),
            exporter,
            items: item_rx,
            control: control_rx,
            queued_spans: Arc::clone(&queued_spans),
            export_signalled: Arc::clone(&export_signalled),
            settings,
            batch: Vec::with_capacity(settings.max_export_batch_size + 4),
            ids: RandomIdGenerator::default(),
        };
        let handle = thread::Builder::new()
            .name("infertrace-span-export".into())
            .spawn(move || {
                // The exporter's own work (an HTTP client, say) must not be traced into itself.
                let _suppressed = Context::enter_telemetry_suppressed_scope();
                worker.run();
            })?;
        Ok(Self {
            items,
            control,
            queued_spans,
            export_signalled,
            max_export_batch_size: settings.max_export_batch_size,
            dropped_spans,
            shut_down: AtomicBool::new(false),
            worker: Mutex::new(Some(handle)),
        })
    }

    /// Spans dropped because the queue was full or the processor shut down.
    pub(crate) fn dropped_spans(&self) -> u64 {
        self.dropped_spans.load(Ordering::Relaxed)
    }

    /// Hands over a finished request: one queue entry for its request and phase spans.
    #[inline]
    pub(crate) fn submit_request(&self, request: FinishedRequest) {
        self.enqueue(Item::Request(request));
    }

    #[inline]
    fn enqueue(&self, item: Item) {
        let spans = item.span_count();
        if self.shut_down.load(Ordering::Acquire) {
            self.dropped(spans);
            return;
        }
        // Counted before it is queued, so a concurrent flush never misses a queued span.
        let before = self.queued_spans.fetch_add(spans, Ordering::AcqRel);
        match self.items.try_send(item) {
            Ok(()) => {
                if before + spans >= self.max_export_batch_size
                    && !self.export_signalled.load(Ordering::Relaxed)
                    && !self.export_signalled.swap(true, Ordering::Relaxed)
                    && self.control.try_send(Control::Export).is_err()
                {
                    self.export_signalled.store(false, Ordering::Relaxed);
                }
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.queued_spans.fetch_sub(spans, Ordering::AcqRel);
                self.dropped(spans);
            }
        }
    }

    fn dropped(&self, spans: usize) {
        if self
            .dropped_spans
            .fetch_add(spans as u64, Ordering::Relaxed)
            == 0
        {
            tracing::warn!(
                target: "infertrace_tower",
                "span export queue full or shut down: dropping spans (OTEL_BSP_MAX_QUEUE_SIZE)"
            );
        }
    }

    /// Sends `message` (made with the reply channel) to the export thread and waits for the
    /// reply; `on_full` runs if the control channel was full.
    fn ask(
        &self,
        message: impl FnOnce(SyncSender<OTelSdkResult>) -> Control,
        wait: Duration,
        on_full: impl FnOnce(),
    ) -> OTelSdkResult {
        let (tx, rx) = sync_channel(1);
        if let Err(e) = self.control.try_send(message(tx)) {
            if matches!(e, TrySendError::Full(_)) {
                on_full();
            }
            return Err(OTelSdkError::InternalFailure(format!(
                "span export thread: {e}"
            )));
        }
        match rx.recv_timeout(wait) {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => Err(OTelSdkError::Timeout(wait)),
            Err(RecvTimeoutError::Disconnected) => Err(OTelSdkError::InternalFailure(
                "span export thread is gone".into(),
            )),
        }
    }
}

impl SpanProcessor for BatchProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        self.enqueue(Item::Span(span));
    }

    fn force_flush(&self) -> OTelSdkResult {
        if self.shut_down.load(Ordering::Acquire) {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        self.ask(Control::Flush, FLUSH_TIMEOUT, || {})
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        if self.shut_down.swap(true, Ordering::AcqRel) {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        // A control channel full of flushes waiting on a stalled exporter: not shut down, so a
        // later call can try again.
        let result = self.ask(Control::Shutdown, timeout, || {
            self.shut_down.store(false, Ordering::Release);
        });
        if result.is_ok()
            && let Ok(mut worker) = self.worker.lock()
            && let Some(handle) = worker.take()
        {
            let _ = handle.join();
        }
        result
    }

    /// Ignored: the exporter was given its resource at construction.
    fn set_resource(&mut self, _resource: &Resource) {}
}

/// The export thread's state.
struct Worker<E> {
    exporter: E,
    items: Receiver<Item>,
    control: Receiver<Control>,
    queued_spans: Arc<AtomicUsize>,
    export_signalled: Arc<AtomicBool>,
    dropped_spans: Arc<AtomicU64>,
    settings: BatchSettings,
    batch: Vec<SpanData>,
    ids: RandomIdGenerator,
}

impl<E: SpanExporter> Worker<E> {
    fn run(&mut self) {
        let mut last_export = Instant::now();
        loop {
            let wait = self
                .settings
                .scheduled_delay
                .checked_sub(last_export.elapsed())
                .unwrap_or(Duration::ZERO);
            match self.control.recv_timeout(wait) {
                Ok(Control::Export) => {
                    self.export_signalled.store(false, Ordering::Relaxed);
                    let _ = self.drain();
                    last_export = Instant::now();
                }
                Ok(Control::Flush(reply)) => {
                    let result = self.drain();
                    last_export = Instant::now();
                    let _ = reply.send(result);
                }
                Ok(Control::Shutdown(reply)) => {
                    let result = self.drain();
                    let shutdown = self.exporter.shutdown();
                    self.count_leftovers();
                    let _ = reply.send(result.and(shutdown));
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.drain();
                    last_export = Instant::now();
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Every handle is gone without a shutdown: export what is left.
                    let _ = self.drain();
                    let _ = self.exporter.shutdown();
                    self.count_leftovers();
                    return;
                }
            }
        }
    }

    /// Exports every span queued when called, in batches of at most the batch size.
    ///
    /// The shared count of queued spans is lowered once per export, not per entry: the
    /// request threads increment it with every entry, and a decrement per entry would bounce
    /// its cache line between them and this thread all the time.
    fn drain(&mut self) -> OTelSdkResult {
        let mut result = Ok(());
        let target = self.queued_spans.load(Ordering::Acquire);
        let mut taken = 0;
        let mut uncounted = 0;
        while taken < target {
            let Ok(item) = self.items.try_recv() else {
                break;
            };
            let n = item.span_count();
            match item {
                Item::Span(span) => self.batch.push(span),
                Item::Request(request) => request.into_spans(&self.ids, &mut self.batch),
            }
            taken += n;
            uncounted += n;
            while self.batch.len() >= self.settings.max_export_batch_size {
                self.queued_spans.fetch_sub(uncounted, Ordering::AcqRel);
                uncounted = 0;
                let rest = self.batch.split_off(self.settings.max_export_batch_size);
                let full = std::mem::replace(&mut self.batch, rest);
                result = result.and(self.export(full));
            }
        }
        if uncounted > 0 {
            self.queued_spans.fetch_sub(uncounted, Ordering::AcqRel);
        }
        if !self.batch.is_empty() {
            let capacity = self.settings.max_export_batch_size + 4;
            let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(capacity));
            result = result.and(self.export(batch));
        }
        result
    }

    /// Counts what was queued after the last export as dropped (it arrived while shutting down).
    fn count_leftovers(&mut self) {
        let mut left = 0;
        while let Ok(item) = self.items.try_recv() {
            left += item.span_count() as u64;
        }
        if left > 0 {
            self.dropped_spans.fetch_add(left, Ordering::Relaxed);
        }
    }

    fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = futures_executor::block_on(self.exporter.export(batch));
        if let Err(e) = &result {
            tracing::warn!(target: "infertrace_tower", spans, "span export failed: {e}");
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
    use opentelemetry_sdk::trace::InMemorySpanExporter;

    use super::*;

    /// An exporter that records the size of every export call (and can be slow).
    #[derive(Clone, Debug, Default)]
    struct Batches {
        sizes: Arc<StdMutex<Vec<usize>>>,
        delay: Duration,
        shut_down: Arc<AtomicBool>,
    }

    impl SpanExporter for Batches {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            std::thread::sleep(self.delay);
            if let Ok(mut sizes) = self.sizes.lock() {
                sizes.push(batch.len());
            }
            Ok(())
        }

        fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
            self.shut_down.store(true, Ordering::SeqCst);
            Ok(())
        }
    }

    impl Batches {
        fn sizes(&self) -> Vec<usize> {
            self.sizes.lock().map(|s| s.clone()).unwrap_or_default()
        }
    }

    fn settings(queue: usize, delay_ms: u64, batch: usize) -> BatchSettings {
        BatchSettings {
            max_queue_size: queue,
            scheduled_delay: Duration::from_millis(delay_ms),
            max_export_batch_size: batch,
        }
    }

    fn resource() -> Resource {
        Resource::builder().with_service_name("batch-test").build()
    }

    fn sampled_context() -> SpanContext {
        SpanContext::new(
            TraceId::from(7_u128),
            SpanId::from(9_u64),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        )
    }

    fn request(context: SpanContext) -> FinishedRequest {
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let mut phases = PhaseSpans::default();
        phases.set(0, at(0), at(10), None);
        phases.set(1, at(10), at(20), None);
        phases.set(2, at(20), at(100), None);
        FinishedRequest {
            span: DirectSpan::for_test(context, "chat m", at(0)),
            end: at(100),
            end_attributes: EndAttributes {
                e2e: 0.1,
                outcome: "ok",
                ..EndAttributes::default()
            },
            phases,
        }
    }

    fn sdk_span(name: &'static str) -> SpanData {
        let mut span = request(sampled_context())
            .span
            .into_span_data(SystemTime::UNIX_EPOCH, |_| {});
        span.name = std::borrow::Cow::Borrowed(name);
        span
    }

    #[test]
    fn a_request_becomes_its_phase_spans_then_its_request_span() {
        let exporter = InMemorySpanExporter::default();
        let p = BatchProcessor::new(exporter.clone(), &resource(), settings(16, 3_600_000, 16))
            .expect("thread");
        p.submit_request(request(sampled_context()));
        p.on_end(sdk_span("handler"));
        assert!(p.force_flush().is_ok());
        let spans = exporter.get_finished_spans().unwrap_or_default();
        let names: Vec<_> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["queue", "prefill", "decode", "chat m", "handler"]);
        for phase in &spans[..3] {
            assert_eq!(phase.parent_span_id, SpanId::from(9_u64));
            assert_eq!(phase.span_context.trace_id(), TraceId::from(7_u128));
            assert_eq!(phase.span_kind, SpanKind::Internal);
            assert_eq!(
                phase.attributes,
                [KeyValue::new(infer::PHASE, phase.name.clone())]
            );
        }
        let server = &spans[3];
        assert_eq!(server.span_kind, SpanKind::Server);
        assert_eq!(
            server.end_time,
            SystemTime::UNIX_EPOCH + Duration::from_millis(100)
        );
        assert!(
            server
                .attributes
                .iter()
                .any(|kv| kv.key.as_str() == "infer.outcome")
        );
        // An unsampled (record-only) request exports its request span alone.
        exporter.reset();
        let unsampled = SpanContext::new(
            TraceId::from(8_u128),
            SpanId::from(10_u64),
            TraceFlags::default(),
            false,
            TraceState::NONE,
        );
        p.submit_request(request(unsampled));
        assert!(p.force_flush().is_ok());
        assert_eq!(exporter.get_finished_spans().unwrap_or_default().len(), 1);
    }

    #[test]
    fn phase_spans_keep_their_order_and_their_own_attributes() {
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let mut phases = PhaseSpans::default();
        phases.set(2, at(20), at(90), Some(vec![KeyValue::new("gpu.x", 1_i64)]));
        phases.set(0, at(0), at(10), None);
        phases.set(4, at(0), at(1), None);
        assert_eq!(phases.len(), 2);
        let spans: Vec<PhaseSpan> = phases.into_iter().collect();
        assert_eq!(spans.len(), 2);
        assert_eq!((spans[0].name, spans[0].end), ("queue", at(10)));
        assert!(spans[0].attributes.is_none());
        assert_eq!((spans[1].name, spans[1].start), ("decode", at(20)));
        assert_eq!(
            spans[1].attributes.as_deref(),
            Some(&[KeyValue::new("gpu.x", 1_i64)][..])
        );
    }

    #[test]
    fn exports_in_batches_of_the_batch_size_when_a_batch_is_queued() {
        let exporter = Batches::default();
        let p = BatchProcessor::new(exporter.clone(), &resource(), settings(1000, 3_600_000, 10))
            .expect("thread");
        for _ in 0..5 {
            p.submit_request(request(sampled_context())); // 4 spans each
        }
        // A batch's worth queued wakes the export thread: no flush, and the timer is an hour.
        let deadline = Instant::now() + Duration::from_secs(10);
        while exporter.sizes().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            exporter.sizes().iter().sum::<usize>() >= 10,
            "{:?}",
            exporter.sizes()
        );
        p.on_end(sdk_span("one"));
        assert!(p.force_flush().is_ok());
        let sizes = exporter.sizes();
        assert_eq!(sizes.iter().sum::<usize>(), 21, "{sizes:?}");
        assert!(sizes.iter().all(|n| *n <= 10), "{sizes:?}");
    }

    #[test]
    fn the_timer_exports_a_partial_batch() {
        let exporter = Batches::default();
        let p = BatchProcessor::new(exporter.clone(), &resource(), settings(100, 50, 100))
            .expect("thread");
        p.on_end(sdk_span("lonely"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while exporter.sizes().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(exporter.sizes(), [1]);
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        // A slow exporter and a queue of 2 entries: most of 50 requests cannot be queued.
        let exporter = Batches {
            delay: Duration::from_millis(200),
            ..Batches::default()
        };
        let p = BatchProcessor::new(exporter.clone(), &resource(), settings(2, 3_600_000, 2))
            .expect("thread");
        let started = Instant::now();
        for _ in 0..50 {
            p.submit_request(request(sampled_context()));
        }
        assert!(
            started.elapsed() < Duration::from_millis(150),
            "never blocks"
        );
        let dropped = p.dropped_spans();
        assert!(dropped >= 4 * 40, "{dropped} spans dropped");
        assert_eq!(dropped % 4, 0, "whole requests are dropped");
        assert!(p.shutdown().is_ok());
        let exported: usize = exporter.sizes().iter().sum();
        assert_eq!(
            exported as u64 + dropped,
            200,
            "every span exported or counted"
        );
    }

    #[test]
    fn shutdown_exports_what_is_queued_then_refuses() {
        let exporter = Batches::default();
        let p = BatchProcessor::new(exporter.clone(), &resource(), settings(100, 3_600_000, 100))
            .expect("thread");
        p.submit_request(request(sampled_context()));
        p.on_end(sdk_span("late"));
        assert!(p.shutdown().is_ok());
        assert_eq!(exporter.sizes(), [5]);
        assert!(exporter.shut_down.load(Ordering::SeqCst));
        assert!(matches!(p.shutdown(), Err(OTelSdkError::AlreadyShutdown)));
        assert!(matches!(
            p.force_flush(),
            Err(OTelSdkError::AlreadyShutdown)
        ));
        p.on_end(sdk_span("after"));
        assert_eq!(p.dropped_spans(), 1);
    }

    #[test]
    fn settings_follow_the_sdk_variables() {
        let none = BatchSettings::from_vars(|_| None);
        assert_eq!(none, BatchSettings::default());
        let set = BatchSettings::from_vars(|name| {
            match name {
                "OTEL_BSP_MAX_QUEUE_SIZE" => Some("100"),
                "OTEL_BSP_SCHEDULE_DELAY" => Some(" 250 "),
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" => Some("512"),
                _ => None,
            }
            .map(String::from)
        });
        assert_eq!(set.max_queue_size, 100);
        assert_eq!(set.scheduled_delay, Duration::from_millis(250));
        assert_eq!(set.max_export_batch_size, 100, "capped at the queue size");
        let junk = BatchSettings::from_vars(|_| Some("zero".into()));
        assert_eq!(junk, BatchSettings::default());
        let zero = BatchSettings::from_vars(|_| Some("0".into()));
        assert_eq!(zero, BatchSettings::default());
        let spin = BatchSettings {
            scheduled_delay: Duration::ZERO,
            ..BatchSettings::default()
        };
        assert_eq!(spin.normalized().scheduled_delay, Duration::from_millis(1));
        let huge = BatchSettings::from_vars(|_| Some("100000000".into()));
        assert_eq!(huge.max_queue_size, MAX_QUEUE_ENTRIES);
        assert_eq!(huge.max_export_batch_size, MAX_QUEUE_ENTRIES);
    }
}
