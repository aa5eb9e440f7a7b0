//! Heap allocations the layer adds on the request's thread, counted by a global allocator.
//!
//! The same request (the layer benchmark's: `POST /v1/chat/completions` with host and user
//! agent, an engine that marks every phase, the body drained) is served bare and through the
//! layer handing requests to infertrace's batch processor; the difference of the request
//! thread's allocations per request is what the layer adds. The export thread's own
//! allocations are not counted (they are not on the request's thread).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use infertrace_tower::{BatchSettings, InferenceTraceLayer, RequestRecorder, SharedSpanProcessor};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor as _};
use tower::{Layer, Service};

/// The system allocator, counting what each thread allocates.
struct Counting;

thread_local! {
    /// Allocations (reallocations included) and bytes requested by this thread.
    static ALLOCATED: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

fn count(bytes: usize) {
    // `try_with`: a thread being torn down has no counter left, and needs none.
    let _ = ALLOCATED.try_with(|c| {
        let (n, b) = c.get();
        c.set((n + 1, b + bytes as u64));
    });
}

// SAFETY: every call is passed on to the system allocator unchanged; counting touches only a
// thread-local `Cell` (const-initialised, so reading it never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// An exporter that drops what it is given.
#[derive(Debug)]
struct Discard;

impl SpanExporter for Discard {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        drop(batch);
        ready(Ok(()))
    }
}

/// The inner service: marks every phase when a recorder is there, answers at once.
#[derive(Clone, Copy)]
struct Engine;

impl<B> Service<Request<B>> for Engine {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if let Some(rec) = req.extensions().get::<RequestRecorder>() {
            rec.scheduled();
            rec.tokens(1);
            rec.tokens(1);
            rec.usage(128, 2);
            rec.finish("stop");
        }
        ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }
}

fn request() -> Request<Full<Bytes>> {
    Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("host", "localhost:8080")
        .header("user-agent", "bench/1.0")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap_or_default()
}

/// Serves one request through `svc` and drains the body, polling with a no-op waker (every
/// future here is ready at once).
fn one<S, B>(svc: &mut S)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    B: Body,
{
    let mut cx = Context::from_waker(Waker::noop());
    let _ = svc.poll_ready(&mut cx);
    let mut call = pin!(svc.call(request()));
    let response = loop {
        if let Poll::Ready(r) = call.as_mut().poll(&mut cx) {
            break r;
        }
    };
    let Ok(response) = response else {
        return;
    };
    let mut body = pin!(response.into_body());
    while let Poll::Ready(Some(_)) = body.as_mut().poll_frame(&mut cx) {}
}

/// Allocations and bytes per request on this thread, over `n` requests after `n` to warm up
/// (per-thread caches of interned strings fill on the first ones).
fn per_request<S, B>(svc: &mut S, n: u64) -> (f64, f64)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    B: Body,
{
    for _ in 0..n {
        one(svc);
    }
    let (n0, b0) = ALLOCATED.with(Cell::get);
    for _ in 0..n {
        one(svc);
    }
    let (n1, b1) = ALLOCATED.with(Cell::get);
    ((n1 - n0) as f64 / n as f64, (b1 - b0) as f64 / n as f64)
}

#[test]
fn the_hand_off_adds_few_allocations_on_the_request_thread() {
    let n = 2_000;
    let (bare_allocs, bare_bytes) = per_request(&mut Engine, n);
    let processor = SharedSpanProcessor::batch_with(
        Discard,
        &opentelemetry_sdk::Resource::builder().build(),
        BatchSettings {
            max_queue_size: 1 << 14,
            scheduled_delay: Duration::from_millis(50),
            max_export_batch_size: 512,
        },
    )
    .expect("export thread");
    let layer = InferenceTraceLayer::new()
        .with_span_processor(processor.clone())
        .default_model("llama-3.1-8b");
    let (traced_allocs, traced_bytes) = per_request(&mut layer.layer(Engine), n);
    let added = traced_allocs - bare_allocs;
    eprintln!(
        "request thread, per request: bare {bare_allocs:.2} allocations ({bare_bytes:.0} B), \
         with the layer {traced_allocs:.2} ({traced_bytes:.0} B): the layer adds {added:.2} \
         allocations, {:.0} B",
        traced_bytes - bare_bytes
    );
    // The record, the recorder's state, the request's OpenTelemetry context, and the
    // request-extension map (its box, its table, the boxed recorder in it).
    assert!(
        added <= 6.0,
        "the layer adds {added} allocations per request"
    );
    assert!(added >= 1.0, "the layer's record is allocated: {added}");
    let _ = processor.force_flush();
}
