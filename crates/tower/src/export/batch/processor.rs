//! [`BatchProcessor`]: infertrace's batch span processor. It batches as the SDK's
//! `BatchSpanProcessor` does, and also takes whole finished requests as one queue entry.
//!
//! Batching as the SDK's: a bounded data queue that never blocks the caller (a full queue drops
//! and counts), a control channel the export thread sleeps on, an export when a batch's worth of
//! entries is queued or the schedule delay has passed, and flush / shutdown that export everything
//! queued first. Spans of a tracer provider go through it unchanged ([`SpanProcessor::on_end`]).
//!
//! The queue and the batch both count **entries**: a span, or a whole request of the layer.
//! For spans alone that is the SDK's meaning of `OTEL_BSP_MAX_QUEUE_SIZE` and
//! `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`; for the layer it means a request's four spans take one
//! place in the queue and one in the batch, so they cost as many export calls as one span a
//! request would (an export call — an HTTP round trip — costs far more than a span).
//!
//! [`BatchProcessor::submit_request`] takes a finished request (its request span and what it
//! ended with) as **one** queue entry, and the export thread builds its spans. The request's
//! thread then makes one queue operation instead of one per span, and the spans' heap blocks
//! are allocated and freed on the export thread rather than across threads.
//!
//! Given a [`RequestExport`] (OTLP/HTTP protobuf from `otlp::init`), the export thread builds
//! no `SpanData` for those requests at all: it hands them to it, which encodes them itself and
//! sends them with the exporter's next call.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{RandomIdGenerator, Span, SpanData, SpanExporter, SpanProcessor};

use super::settings::BatchSettings;
use crate::export::span_data::{self, DirectSpan};
use crate::finished::FinishedRequest;

/// What travels on the data queue.
// Not boxed on purpose: a box allocated on the request's thread and freed on the export thread
// is the cross-thread free this processor exists to avoid.
#[allow(clippy::large_enum_variant)]
enum Item {
    Span(SpanData),
    /// A whole request: its request span and what it finished with.
    Request(DirectSpan, FinishedRequest),
}

impl Item {
    fn span_count(&self) -> usize {
        match self {
            Item::Span(_) => 1,
            Item::Request(span, request) => span_data::span_count(span, request),
        }
    }
}

/// Whole requests exported without `SpanData`: encoded by the implementation and sent along
/// with the exporter's next export call (`otlp_encode::OtlpRequests`).
pub(crate) trait RequestExport: Send + fmt::Debug {
    /// Takes a finished request (its spans are the ones `span_data::request_spans` builds).
    fn push(&mut self, span: DirectSpan, request: FinishedRequest, ids: &RandomIdGenerator);
    /// Makes what was taken go with the next export call; `with_other_spans`: that call gets
    /// spans of its own too. Returns the number of spans staged.
    fn stage(&mut self, with_other_spans: bool) -> usize;
    /// The export call returned: forget what was staged.
    fn unstage(&mut self);
}

/// What travels on the control channel.
enum Control {
    /// A batch's worth of entries is queued.
    Export,
    Flush(SyncSender<OTelSdkResult>),
    Shutdown(SyncSender<OTelSdkResult>),
}

/// The batch processor: cheap to share (`Arc`), one export thread.
pub(crate) struct BatchProcessor {
    items: SyncSender<Item>,
    control: SyncSender<Control>,
    /// Entries queued and not yet taken by the export thread.
    queued: Arc<AtomicUsize>,
    /// An `Export` message is on its way (cleared by the export thread).
    export_signalled: Arc<AtomicBool>,
    max_export_batch_size: usize,
    /// Spans dropped: queue full, or given after shutdown (counted here and by the export
    /// thread for what it finds left after its last export).
    dropped_spans: Arc<AtomicU64>,
    shut_down: AtomicBool,
    worker: Mutex<Option<thread::JoinHandle<()>>>,
    /// Whether the layer's requests go to a [`RequestExport`] (shown by `Debug`).
    request_export: bool,
}

impl fmt::Debug for BatchProcessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchProcessor")
            .field("max_export_batch_size", &self.max_export_batch_size)
            .field("dropped_spans", &self.dropped_spans.load(Ordering::Relaxed))
            .field("request_export", &self.request_export)
            .finish_non_exhaustive()
    }
}

/// How long `force_flush` waits for the export thread (as the SDK's batch processor).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

impl BatchProcessor {
    /// Starts the export thread, exporting to `exporter` (given `resource` first).
    pub(crate) fn new<E>(
        exporter: E,
        resource: &Resource,
        settings: BatchSettings,
    ) -> std::io::Result<Self>
    where
        E: SpanExporter + 'static,
    {
        Self::with_requests(exporter, resource, settings, None)
    }

    /// [`new`](Self::new), the layer's requests going to `requests` instead of being built
    /// into `SpanData` for `exporter` (which still exports them, see [`RequestExport`]).
    pub(crate) fn with_requests<E>(
        mut exporter: E,
        resource: &Resource,
        settings: BatchSettings,
        requests: Option<Box<dyn RequestExport>>,
    ) -> std::io::Result<Self>
    where
        E: SpanExporter + 'static,
    {
        exporter.set_resource(resource);
        let settings = settings.normalized();
        let (items, item_rx) = sync_channel(settings.max_queue_size);
        let (control, control_rx) = sync_channel(64);
        let queued = Arc::new(AtomicUsize::new(0));
        let export_signalled = Arc::new(AtomicBool::new(false));
        let dropped_spans = Arc::new(AtomicU64::new(0));
        let request_export = requests.is_some();
        let mut worker = Worker {
            dropped_spans: Arc::clone(&dropped_spans),
            exporter,
            items: item_rx,
            control: control_rx,
            queued: Arc::clone(&queued),
            export_signalled: Arc::clone(&export_signalled),
            settings,
            batch: Vec::with_capacity(settings.max_export_batch_size),
            pending: 0,
            ids: RandomIdGenerator::default(),
            requests,
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
            queued,
            export_signalled,
            max_export_batch_size: settings.max_export_batch_size,
            dropped_spans,
            shut_down: AtomicBool::new(false),
            worker: Mutex::new(Some(handle)),
            request_export,
        })
    }

    /// Spans dropped because the queue was full or the processor shut down.
    pub(crate) fn dropped_spans(&self) -> u64 {
        self.dropped_spans.load(Ordering::Relaxed)
    }

    /// Hands over a finished request: one queue entry for its request and phase spans, built
    /// on the export thread.
    #[inline]
    pub(crate) fn submit_request(&self, span: DirectSpan, request: FinishedRequest) {
        self.enqueue(Item::Request(span, request));
    }

    #[inline]
    fn enqueue(&self, item: Item) {
        if self.shut_down.load(Ordering::Acquire) {
            self.dropped(item.span_count());
            return;
        }
        // Counted before it is queued, so a concurrent flush never misses a queued entry.
        let before = self.queued.fetch_add(1, Ordering::AcqRel);
        match self.items.try_send(item) {
            Ok(()) => {
                if before + 1 >= self.max_export_batch_size
                    && !self.export_signalled.load(Ordering::Relaxed)
                    && !self.export_signalled.swap(true, Ordering::Relaxed)
                    && self.control.try_send(Control::Export).is_err()
                {
                    self.export_signalled.store(false, Ordering::Relaxed);
                }
            }
            Err(TrySendError::Full(item) | TrySendError::Disconnected(item)) => {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                self.dropped(item.span_count());
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
    queued: Arc<AtomicUsize>,
    export_signalled: Arc<AtomicBool>,
    dropped_spans: Arc<AtomicU64>,
    settings: BatchSettings,
    /// `SpanData` waiting for the next export call.
    batch: Vec<SpanData>,
    /// Entries taken since the last export call (in `batch` or in `requests`).
    pending: usize,
    ids: RandomIdGenerator,
    /// Where the layer's requests go instead of `batch`, if anywhere.
    requests: Option<Box<dyn RequestExport>>,
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

    /// Exports every entry queued when called, in export calls of at most the batch size
    /// (in entries: a request's spans are never split between calls).
    ///
    /// The shared count of queued entries is lowered once per export, not per entry: the
    /// request threads increment it with every entry, and a decrement per entry would bounce
    /// its cache line between them and this thread all the time.
    fn drain(&mut self) -> OTelSdkResult {
        let max = self.settings.max_export_batch_size;
        let mut result = Ok(());
        let target = self.queued.load(Ordering::Acquire);
        let mut uncounted = 0;
        for _ in 0..target {
            let Ok(item) = self.items.try_recv() else {
                break;
            };
            match item {
                Item::Span(span) => self.batch.push(span),
                Item::Request(span, request) => match &mut self.requests {
                    Some(requests) => requests.push(span, request, &self.ids),
                    None => {
                        let batch = &mut self.batch;
                        span_data::request_spans(span, request, &self.ids, |data| batch.push(data));
                    }
                },
            }
            uncounted += 1;
            self.pending += 1;
            if self.pending >= max {
                self.queued.fetch_sub(uncounted, Ordering::AcqRel);
                uncounted = 0;
                result = result.and(self.export_pending());
            }
        }
        if uncounted > 0 {
            self.queued.fetch_sub(uncounted, Ordering::AcqRel);
        }
        if self.pending > 0 {
            result = result.and(self.export_pending());
        }
        result
    }

    /// Exports the batch and whatever `requests` holds, in one export call.
    fn export_pending(&mut self) -> OTelSdkResult {
        self.pending = 0;
        // The next batch keeps this one's capacity (growing it span by span would reallocate
        // and fault in fresh pages); an empty batch — the layer's requests alone — stays.
        let batch = if self.batch.is_empty() {
            Vec::new()
        } else {
            let capacity = self.batch.capacity();
            std::mem::replace(&mut self.batch, Vec::with_capacity(capacity))
        };
        let with_other_spans = !batch.is_empty();
        let Some(requests) = &mut self.requests else {
            return self.export(batch);
        };
        let staged = requests.stage(with_other_spans);
        let spans = batch.len() + staged;
        let result = futures_executor::block_on(self.exporter.export(batch));
        if let Some(requests) = &mut self.requests {
            requests.unstage();
        }
        if let Err(e) = &result {
            tracing::warn!(target: "infertrace_tower", spans, "span export failed: {e}");
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

    use std::time::SystemTime;

    use opentelemetry::KeyValue;
    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry_sdk::trace::InMemorySpanExporter;

    use infertrace_semconv::infer;

    use super::*;
    use crate::end_attributes::EndAttributes;
    use crate::finished::PhaseSpans;

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

    fn request(context: SpanContext) -> (DirectSpan, FinishedRequest) {
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let mut phases = PhaseSpans::default();
        phases.set(0, at(0), at(10), None);
        phases.set(1, at(10), at(20), None);
        phases.set(2, at(20), at(100), None);
        let request = FinishedRequest {
            end: at(100),
            late_model: None,
            end_attributes: EndAttributes {
                e2e: 0.1,
                outcome: "ok",
                ..EndAttributes::default()
            },
            phases,
        };
        (DirectSpan::for_test(context, "chat m", at(0)), request)
    }

    fn submit(p: &BatchProcessor, context: SpanContext) {
        let (span, request) = request(context);
        p.submit_request(span, request);
    }

    fn sdk_span(name: &'static str) -> SpanData {
        let mut span = request(sampled_context()).0.into_span_data(
            SystemTime::UNIX_EPOCH,
            Status::Unset,
            |_| {},
        );
        span.name = std::borrow::Cow::Borrowed(name);
        span
    }

    #[test]
    fn a_request_becomes_its_phase_spans_then_its_request_span() {
        let exporter = InMemorySpanExporter::default();
        let p = BatchProcessor::new(exporter.clone(), &resource(), settings(16, 3_600_000, 16))
            .expect("thread");
        submit(&p, sampled_context());
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
        submit(&p, unsampled);
        assert!(p.force_flush().is_ok());
        assert_eq!(exporter.get_finished_spans().unwrap_or_default().len(), 1);
    }

    #[test]
    fn exports_in_batches_of_the_batch_size_in_entries_when_a_batch_is_queued() {
        let exporter = Batches::default();
        let p = BatchProcessor::new(exporter.clone(), &resource(), settings(1000, 3_600_000, 2))
            .expect("thread");
        for _ in 0..5 {
            submit(&p, sampled_context()); // one entry, 4 spans
        }
        // A batch's worth of entries queued wakes the export thread: no flush, and the timer
        // is an hour.
        let deadline = Instant::now() + Duration::from_secs(10);
        while exporter.sizes().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!exporter.sizes().is_empty(), "exported without a flush");
        for _ in 0..3 {
            p.on_end(sdk_span("one")); // one entry, 1 span
        }
        assert!(p.force_flush().is_ok());
        let sizes = exporter.sizes();
        assert_eq!(sizes.iter().sum::<usize>(), 23, "{sizes:?}");
        // At most two entries a call: two requests (8 spans), a request and a span (5), two
        // spans; a request is never split (counting spans, calls would hold at most 2).
        assert!(sizes.iter().all(|n| *n <= 8), "{sizes:?}");
        assert!(sizes.iter().any(|n| *n >= 4), "{sizes:?}");
        assert!((4..=8).contains(&sizes.len()), "{sizes:?}");
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
            submit(&p, sampled_context());
        }
        // Blocking on the 200 ms exporter would take seconds for 50 requests; a busy machine
        // can delay the loop itself by far less than that.
        assert!(started.elapsed() < Duration::from_secs(1), "never blocks");
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
        submit(&p, sampled_context());
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
}

#[cfg(test)]
mod request_export_tests {
    //! The processor with a [`RequestExport`]: requests go to it, whole, and every export call
    //! carries at most a batch's worth of entries, theirs and the exporter's together.

    use std::sync::Mutex as StdMutex;
    use std::time::SystemTime;

    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use opentelemetry_sdk::trace::InMemorySpanExporter;

    use super::*;
    use crate::end_attributes::EndAttributes;
    use crate::finished::PhaseSpans;

    /// Counts the spans it is given; records each staging: (its spans, with other spans).
    #[derive(Debug, Default)]
    struct Fake {
        spans: usize,
        staged: Arc<StdMutex<Vec<(usize, bool)>>>,
    }

    impl RequestExport for Fake {
        fn push(&mut self, span: DirectSpan, request: FinishedRequest, _: &RandomIdGenerator) {
            self.spans += span_data::span_count(&span, &request);
        }
        fn stage(&mut self, with_other_spans: bool) -> usize {
            let n = std::mem::take(&mut self.spans);
            if let Ok(mut staged) = self.staged.lock() {
                staged.push((n, with_other_spans));
            }
            n
        }
        fn unstage(&mut self) {}
    }

    fn submit(p: &BatchProcessor) {
        let context = SpanContext::new(
            TraceId::from(1_u128),
            SpanId::from(2_u64),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        );
        let now = SystemTime::now();
        let mut phases = PhaseSpans::default();
        for i in 0..3 {
            phases.set(i, now, now, None);
        }
        let request = FinishedRequest {
            end: now,
            late_model: None,
            end_attributes: EndAttributes::default(),
            phases,
        };
        p.submit_request(DirectSpan::for_test(context, "chat", now), request);
    }

    #[test]
    fn requests_go_to_the_request_export_whole_and_batches_stay_within_the_size() {
        let exporter = InMemorySpanExporter::default();
        let fake = Fake::default();
        let staged = Arc::clone(&fake.staged);
        let settings = BatchSettings {
            max_queue_size: 1000,
            scheduled_delay: Duration::from_secs(3600),
            max_export_batch_size: 2,
        };
        let p = BatchProcessor::with_requests(
            exporter.clone(),
            &Resource::builder_empty().build(),
            settings,
            Some(Box::new(fake)),
        )
        .expect("thread");
        for _ in 0..5 {
            submit(&p);
        }
        assert!(p.force_flush().is_ok());
        // 20 spans in calls of at most two entries (8 + 8 + 4, or a lone request exported
        // early when the export thread wakes mid-way); counting spans, every call would be 4.
        let got = staged.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(got.iter().map(|(n, _)| n).sum::<usize>(), 20, "{got:?}");
        assert!(
            got.iter().all(|(n, other)| (*n == 4 || *n == 8) && !other),
            "{got:?}"
        );
        assert!(got.contains(&(8, false)), "{got:?}");
        assert!(exporter.get_finished_spans().unwrap_or_default().is_empty());

        // An SDK span and a request in one export: the request rides along with it.
        let span = {
            let mut s = DirectSpan::for_test(
                SpanContext::new(
                    TraceId::from(3_u128),
                    SpanId::from(4_u64),
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::NONE,
                ),
                "handler",
                SystemTime::now(),
            );
            s.attributes.clear();
            s.into_span_data(
                SystemTime::now(),
                opentelemetry::trace::Status::Unset,
                |_| {},
            )
        };
        p.on_end(span);
        submit(&p);
        assert!(p.force_flush().is_ok());
        let got = staged.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(got.last(), Some(&(4, true)), "{got:?}");
        assert_eq!(exporter.get_finished_spans().unwrap_or_default().len(), 1);
        assert!(p.shutdown().is_ok());
    }
}
