//! Disaggregated serving over real HTTP: a router, prefill workers and decode workers on a
//! [`DisaggSim`], each its own axum service behind its own [`InferenceTraceLayer`] (own
//! `service.name`), with W3C trace context propagated router → prefill → decode.
//!
//! - **Router** (`POST /v1/chat/completions`, OpenAI-compatible, streamed): routes on the
//!   simulator ([`DisaggSim::route`]), marks a `routing` child span (arrival → forwarded),
//!   forwards to the chosen prefill worker with `traceparent` injected, and relays the stream
//!   back, marking each token on its recorder (its TTFT is the client's view).
//! - **Prefill worker** (`POST /pd/prefill`): the prompt on its engine (the layer's `queue` and
//!   `prefill` phases, marked by the engine), then `bootstrap` and `kv_transfer` child spans,
//!   then calls the routed decode worker (context injected) and relays its stream.
//! - **Decode worker** (`POST /pd/decode`): the request on its engine with the KV cache in
//!   place; `decode_wait` (arrival → admitted) and `first_token` (admitted → token 0) child
//!   spans, the layer's `decode` phase, and the tokens as server-sent events.
//!
//! Every role's request span carries `infer.disagg.role`, which the layer's public API cannot
//! set on its request span: [`RoleTelemetry`] adds it in a [`SpanProcessor`] wrapped around the
//! export processor, to the layer's SERVER spans only. The sub-phase spans are the handler's own,
//! built with the service's tracer under the request span's context (which the layer makes
//! current while the handler runs), with the handler's own clock readings as start and end.
//! The simulator's truth ([`DisaggSim::truth`]) stays an independent check of them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infertrace_semconv as sc;
use infertrace_sim::{
    DisaggSim, FinishReason, RequestObserver, SimError, SimEvent, SimRequest, Usage,
};
use infertrace_tower::otlp::OtlpProviders;
use infertrace_tower::{InferenceTraceLayer, RequestRecorder, SharedSpanProcessor};
use opentelemetry::propagation::{Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span, SpanData, SpanProcessor};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::EngineMarks;
use crate::openai::wire::{ChatRequest, value_tokens};
use crate::openai::{self, DEFAULT_MAX_TOKENS, MAX_BODY_BYTES, recorder_of};

/// Header carrying the simulator's request id from the router to the workers.
pub const PD_ID_HEADER: &str = "x-infertrace-pd-id";

/// Adds `infer.disagg.role` to the layer's request spans (the SERVER spans) on their way to
/// the export processor.
#[derive(Debug)]
struct RoleTag {
    role: &'static str,
    inner: SharedSpanProcessor,
}

impl SpanProcessor for RoleTag {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        if span.span_kind == SpanKind::Server {
            span.attributes
                .push(KeyValue::new(sc::disagg::ROLE, self.role));
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
}

/// What one role's service exports through: its layer (request spans tagged with the role) and
/// its tracer (the sub-phase spans).
#[derive(Clone)]
pub struct RoleTelemetry {
    /// The layer to wrap the service in; add GPU telemetry or a default model before use.
    pub layer: InferenceTraceLayer,
    /// The service's tracer.
    pub tracer: SdkTracer,
}

impl RoleTelemetry {
    /// For a service exporting through `providers` (`otlp::init` with the service's own
    /// `service.name`), playing `role` (one of [`sc::disagg::role`]'s values).
    pub fn new(providers: &OtlpProviders, role: &'static str) -> Self {
        Self::with_processor(&providers.tracer_provider, &providers.span_processor, role)
    }

    /// For a service whose tracer provider exports through `processor` (already given the
    /// service's resource), playing `role`.
    pub fn with_processor(
        provider: &SdkTracerProvider,
        processor: &SharedSpanProcessor,
        role: &'static str,
    ) -> Self {
        // `processor` already has its resource; `SharedSpanProcessor::new` only hands this one
        // to `RoleTag`, which ignores it.
        let tagged = SharedSpanProcessor::new(
            RoleTag {
                role,
                inner: processor.clone(),
            },
            &Resource::builder_empty().build(),
        );
        Self {
            layer: InferenceTraceLayer::new()
                .with_tracer_provider(provider)
                .with_span_processor(tagged),
            tracer: provider.tracer("infertrace-demo-pd"),
        }
    }
}

/// A `(SystemTime, Instant)` pair read together, to put monotonic instants on the wall clock.
static ANCHOR: LazyLock<(SystemTime, Instant)> =
    LazyLock::new(|| (SystemTime::now(), Instant::now()));

fn wall(at: Instant) -> SystemTime {
    let (sys, mono) = *ANCHOR;
    match at.checked_duration_since(mono) {
        Some(after) => sys + after,
        None => sys - mono.duration_since(at),
    }
}

/// Emits sub-phase spans as children of the request span of `cx`.
#[derive(Clone)]
struct Phases {
    tracer: SdkTracer,
    cx: Context,
}

impl Phases {
    fn current(tracer: &SdkTracer) -> Self {
        Self {
            tracer: tracer.clone(),
            cx: Context::current(),
        }
    }

    fn span(&self, phase: &'static str, start: Instant, end: Instant) {
        let builder = self
            .tracer
            .span_builder(phase)
            .with_kind(SpanKind::Internal)
            .with_start_time(wall(start))
            .with_attributes([KeyValue::new(sc::infer::PHASE, phase)]);
        let mut span = self.tracer.build_with_context(builder, &self.cx);
        span.end_with_timestamp(wall(end.max(start)));
    }

    /// The trace id, hex.
    fn trace_id(&self) -> String {
        self.cx.span().span_context().trace_id().to_string()
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// POSTs `body` to `url` with the trace context of `cx` and the request id.
async fn forward(
    client: &HttpClient,
    url: &str,
    id: u64,
    body: Bytes,
    cx: &Context,
) -> Result<http::Response<hyper::body::Incoming>, String> {
    let mut req = http::Request::post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .header(PD_ID_HEADER, id.to_string())
        .body(Full::new(body))
        .map_err(|e| format!("cannot build the request to {url}: {e}"))?;
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(req.headers_mut()));
    client.request(req).await.map_err(|e| format!("{url}: {e}"))
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "code": status.as_u16()}});
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn sim_error(rec: &RequestRecorder, e: &SimError) -> Response {
    rec.error(e.kind());
    let status = match e {
        SimError::InvalidRequest(_) => StatusCode::BAD_REQUEST,
        SimError::QueueFull => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.kind(), &e.to_string())
}

/// Relays an upstream event stream, ending it right after its `[DONE]` event (not when the
/// upstream body ends, one hand-over later): a client that stops reading at `[DONE]` then
/// finds the response complete. `counter` also counts its tokens on a recorder.
fn relay(
    resp: http::Response<hyper::body::Incoming>,
    counter: Option<RequestRecorder>,
) -> Response {
    let (parts, body) = resp.into_parts();
    let mut events = SseEvents {
        rec: counter,
        buf: Vec::new(),
        tokens: 0,
        done: false,
    };
    let mut upstream = body.into_data_stream();
    let stream = async_stream::stream! {
        while let Some(chunk) = upstream.next().await {
            if let Ok(bytes) = &chunk {
                events.feed(bytes);
            }
            yield chunk;
            if events.done {
                break;
            }
        }
    };
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Follows a relayed OpenAI event stream: whether `[DONE]` has passed, and, with a recorder,
/// its tokens (the first is the relaying service's TTFT), finish reason and errors.
struct SseEvents {
    rec: Option<RequestRecorder>,
    buf: Vec<u8>,
    tokens: u64,
    done: bool,
}

impl SseEvents {
    fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            let Some(payload) = event.strip_prefix(b"data:") else {
                continue;
            };
            let payload = payload.trim_ascii();
            if payload == b"[DONE]" {
                self.done = true;
                continue;
            }
            let Some(rec) = &self.rec else {
                continue;
            };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(payload) else {
                continue;
            };
            let choice = &v["choices"][0];
            if choice["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
            {
                self.tokens += 1;
                rec.tokens(1);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                rec.usage(
                    v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                    self.tokens,
                );
                rec.finish(reason);
            }
            if v.get("error").is_some() {
                rec.error("engine_error");
            }
        }
    }
}

/// The request id a worker was sent.
fn pd_id(headers: &HeaderMap) -> Option<u64> {
    headers.get(PD_ID_HEADER)?.to_str().ok()?.parse().ok()
}

/// Which simulator request each router request span (by trace id, hex) stands for; the latest
/// [`PdIndex::CAPACITY`] requests are kept.
#[derive(Clone, Debug, Default)]
pub struct PdIndex(Arc<Mutex<IndexInner>>);

#[derive(Debug, Default)]
struct IndexInner {
    ids: HashMap<String, u64>,
    order: std::collections::VecDeque<String>,
}

impl PdIndex {
    /// Requests remembered (the oldest are forgotten first).
    pub const CAPACITY: usize = 100_000;

    fn insert(&self, trace_id: String, id: u64) {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while inner.order.len() >= Self::CAPACITY {
            if let Some(old) = inner.order.pop_front() {
                inner.ids.remove(&old);
            }
        }
        inner.order.push_back(trace_id.clone());
        inner.ids.insert(trace_id, id);
    }

    /// The simulator's request id of the trace `trace_id` (hex).
    pub fn get(&self, trace_id: &str) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ids
            .get(trace_id)
            .copied()
    }
}

#[derive(Clone)]
struct RouterState {
    sim: DisaggSim,
    phases: SdkTracer,
    prefill: Arc<[String]>,
    client: HttpClient,
    index: PdIndex,
    model: Arc<str>,
}

async fn route(State(st): State<RouterState>, req: Request) -> Response {
    let rec = recorder_of(req.extensions());
    let phases = Phases::current(&st.phases);
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            rec.error("invalid_request");
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                &e.to_string(),
            );
        }
    };
    let chat: ChatRequest = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            rec.error("invalid_request");
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &e.to_string(),
            );
        }
    };
    let prompt = chat
        .messages
        .iter()
        .map(|m| value_tokens(&m.content))
        .fold(0u32, u32::saturating_add)
        .max(1);
    let max_tokens = chat
        .max_completion_tokens
        .or(chat.max_tokens)
        .unwrap_or(DEFAULT_MAX_TOKENS)
        .max(1);
    rec.request_model(chat.model.as_deref().unwrap_or(&st.model));
    rec.max_tokens(u64::from(max_tokens));
    rec.stream(true);
    let mut sim_req = SimRequest::new(prompt, max_tokens);
    if chat.ignore_eos {
        sim_req = sim_req.with_output_tokens(max_tokens);
    }
    let routed = match st.sim.route(sim_req).await {
        Ok(r) => r,
        Err(e) => return sim_error(&rec, &e),
    };
    st.index.insert(phases.trace_id(), routed.id);
    let Some(url) = st.prefill.get(routed.prefill_worker) else {
        st.sim.abandon(routed.id);
        rec.error("no_worker");
        return error(
            StatusCode::BAD_GATEWAY,
            "no_worker",
            "no such prefill worker",
        );
    };
    let forwarded = Instant::now();
    phases.span(sc::disagg::ROUTING, rec.arrival(), forwarded);
    rec.scheduled();
    rec.model(&st.model);
    rec.response_id(&format!("pd-{}", routed.id));
    match forward(&st.client, url, routed.id, body, &phases.cx).await {
        Ok(resp) if resp.status().is_success() => relay(resp, Some(rec)),
        Ok(resp) => {
            st.sim.abandon(routed.id);
            rec.error("worker_error");
            relay(resp, None)
        }
        Err(e) => {
            st.sim.abandon(routed.id);
            rec.error("worker_unreachable");
            error(StatusCode::BAD_GATEWAY, "worker_unreachable", &e)
        }
    }
}

#[derive(Clone)]
struct PrefillState {
    sim: DisaggSim,
    phases: SdkTracer,
    decode: Arc<[String]>,
    client: HttpClient,
}

/// Gives back what a request holds if its prefill handler ends early (error or dropped).
struct Abandon<'a>(&'a DisaggSim, u64);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        // After the decode worker took the request over, there is nothing left to give back.
        self.0.abandon(self.1);
    }
}

async fn prefill(State(st): State<PrefillState>, req: Request) -> Response {
    let rec = recorder_of(req.extensions());
    let phases = Phases::current(&st.phases);
    let Some(id) = pd_id(req.headers()) else {
        rec.error("invalid_request");
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "no request id",
        );
    };
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            rec.error("invalid_request");
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                &e.to_string(),
            );
        }
    };
    let _abandon = Abandon(&st.sim, id);
    let Some(routed) = st.sim.routed(id) else {
        rec.error("invalid_request");
        return error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown request id",
        );
    };
    let mut stream = match st.sim.prefill(id, EngineMarks(rec.clone())) {
        Ok(s) => s,
        Err(e) => return sim_error(&rec, &e),
    };
    rec.model(stream.model());
    while let Some(ev) = stream.recv().await {
        if let Err(e) = ev {
            return sim_error(&rec, &e);
        }
    }
    let bootstrap = Instant::now();
    if let Err(e) = st.sim.bootstrap(id).await {
        return sim_error(&rec, &e);
    }
    let transfer = Instant::now();
    phases.span(sc::disagg::BOOTSTRAP, bootstrap, transfer);
    if let Err(e) = st.sim.transfer_kv(id).await {
        return sim_error(&rec, &e);
    }
    phases.span(sc::disagg::KV_TRANSFER, transfer, Instant::now());
    let Some(url) = st.decode.get(routed.decode_worker) else {
        rec.error("no_worker");
        return error(
            StatusCode::BAD_GATEWAY,
            "no_worker",
            "no such decode worker",
        );
    };
    match forward(&st.client, url, id, body, &phases.cx).await {
        Ok(resp) => {
            if !resp.status().is_success() {
                rec.error("worker_error");
            }
            relay(resp, None)
        }
        Err(e) => {
            rec.error("worker_unreachable");
            error(StatusCode::BAD_GATEWAY, "worker_unreachable", &e)
        }
    }
}

#[derive(Clone)]
struct DecodeState {
    sim: DisaggSim,
    phases: SdkTracer,
}

/// The decode engine's observer: the layer's marks, and the `decode_wait` and `first_token`
/// spans when token 0 comes (the observer's own clock).
struct DecodeMarks {
    marks: EngineMarks,
    phases: Phases,
    admitted: Mutex<Option<Instant>>,
}

impl RequestObserver for DecodeMarks {
    fn admitted(&self) {
        let now = Instant::now();
        self.marks.admitted();
        *self.admitted.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
    }

    fn token(&self, index: u32) {
        let now = Instant::now();
        self.marks.token(index);
        if index != 0 {
            return;
        }
        let admitted = *self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(admitted) = admitted {
            let arrival = self.marks.0.arrival();
            self.phases.span(sc::disagg::DECODE_WAIT, arrival, admitted);
            self.phases.span(sc::disagg::FIRST_TOKEN, admitted, now);
        }
    }

    fn finished(&self, reason: FinishReason, usage: Usage) {
        self.marks.finished(reason, usage);
    }

    fn failed(&self, error: &SimError, usage: Usage) {
        self.marks.failed(error, usage);
    }
}

fn sse(v: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

async fn decode(State(st): State<DecodeState>, req: Request) -> Response {
    let rec = recorder_of(req.extensions());
    let phases = Phases::current(&st.phases);
    let Some(id) = pd_id(req.headers()) else {
        rec.error("invalid_request");
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "no request id",
        );
    };
    let observer = DecodeMarks {
        marks: EngineMarks(rec.clone()),
        phases,
        admitted: Mutex::new(None),
    };
    let mut tokens = match st.sim.decode(id, observer) {
        Ok(s) => s,
        Err(e) => return sim_error(&rec, &e),
    };
    rec.stream(true);
    let model: Arc<str> = Arc::from(tokens.model());
    rec.model(&model);
    let rid = format!("pd-{id}");
    let chunk = move |delta: serde_json::Value, finish: Option<&str>| {
        json!({
            "id": rid, "object": "chat.completion.chunk", "model": &*model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let body = async_stream::stream! {
        while let Some(ev) = tokens.recv().await {
            match ev {
                Ok(SimEvent::Token(t)) => {
                    yield Ok::<Bytes, Infallible>(sse(&chunk(json!({"content": t.text}), None)));
                }
                Ok(SimEvent::Finished { reason, usage }) => {
                    let mut last = chunk(json!({}), Some(reason.as_str()));
                    last["usage"] = json!({
                        "prompt_tokens": usage.prompt_tokens,
                        "completion_tokens": usage.output_tokens,
                    });
                    // The final chunk and `[DONE]` in one frame.
                    let mut frame = sse(&last).to_vec();
                    frame.extend_from_slice(b"data: [DONE]\n\n");
                    yield Ok(Bytes::from(frame));
                }
                Err(e) => {
                    yield Ok(sse(&json!({"error": {"message": e.to_string(), "type": e.kind()}})));
                }
            }
        }
    };
    let mut resp = Response::new(Body::from_stream(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    resp
}

/// A running disaggregated deployment: the router's address and every worker's task.
#[derive(Debug)]
pub struct PdDeployment {
    /// The router (OpenAI-compatible, streamed chat completions).
    pub router: SocketAddr,
    /// `(service name, address)` of every service, router first.
    pub services: Vec<(String, SocketAddr)>,
    /// Simulator request of each router trace.
    pub index: PdIndex,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
}

impl PdDeployment {
    /// Stops every service, letting open requests finish.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// The name of each service: `pd-router`, `pd-prefill-{i}`, `pd-decode-{i}`.
pub fn service_name(role: &str, index: usize) -> String {
    if role == sc::disagg::role::ROUTER {
        "pd-router".to_owned()
    } else {
        format!("pd-{role}-{index}")
    }
}

/// Starts the router and every worker of `sim` on loopback ports, each with the telemetry
/// `telemetry(role, index)` gives it (`role` one of [`sc::disagg::role`]'s values; the router
/// is index 0).
pub async fn launch(
    sim: DisaggSim,
    model: &str,
    mut telemetry: impl FnMut(&'static str, usize) -> RoleTelemetry,
) -> std::io::Result<PdDeployment> {
    let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
    let router_l = bind().await?;
    let mut prefill_l = Vec::new();
    for _ in 0..sim.prefill_workers().len() {
        prefill_l.push(bind().await?);
    }
    let mut decode_l = Vec::new();
    for _ in 0..sim.decode_workers().len() {
        decode_l.push(bind().await?);
    }
    let url = |l: &tokio::net::TcpListener, path: &str| {
        l.local_addr().map(|a| format!("http://{a}{path}"))
    };
    let prefill_urls: Arc<[String]> = prefill_l
        .iter()
        .map(|l| url(l, "/pd/prefill"))
        .collect::<std::io::Result<Vec<_>>>()?
        .into();
    let decode_urls: Arc<[String]> = decode_l
        .iter()
        .map(|l| url(l, "/pd/decode"))
        .collect::<std::io::Result<Vec<_>>>()?
        .into();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let index = PdIndex::default();
    let mut services = Vec::new();
    let mut tasks = Vec::new();
    let mut serve = |name: String, listener: tokio::net::TcpListener, app: Router| {
        let addr = listener.local_addr()?;
        services.push((name, addr));
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(openai::serve(listener, app, async move {
            let _ = stopped.wait_for(|s| *s).await;
        })));
        Ok::<_, std::io::Error>(addr)
    };

    let t = telemetry(sc::disagg::role::ROUTER, 0);
    let app = Router::new()
        .route("/v1/chat/completions", post(route))
        .layer(t.layer.default_model(model))
        .with_state(RouterState {
            sim: sim.clone(),
            phases: t.tracer,
            prefill: prefill_urls,
            client: client(),
            index: index.clone(),
            model: Arc::from(model),
        });
    let router = serve(service_name(sc::disagg::role::ROUTER, 0), router_l, app)?;
    for (i, l) in prefill_l.into_iter().enumerate() {
        let t = telemetry(sc::disagg::role::PREFILL, i);
        let app = Router::new()
            .route("/pd/prefill", post(prefill))
            .layer(t.layer.default_model(model))
            .with_state(PrefillState {
                sim: sim.clone(),
                phases: t.tracer,
                decode: decode_urls.clone(),
                client: client(),
            });
        serve(service_name(sc::disagg::role::PREFILL, i), l, app)?;
    }
    for (i, l) in decode_l.into_iter().enumerate() {
        let t = telemetry(sc::disagg::role::DECODE, i);
        let app = Router::new()
            .route("/pd/decode", post(decode))
            .layer(t.layer.default_model(model))
            .with_state(DecodeState {
                sim: sim.clone(),
                phases: t.tracer,
            });
        serve(service_name(sc::disagg::role::DECODE, i), l, app)?;
    }
    Ok(PdDeployment {
        router,
        services,
        index,
        stop,
        tasks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::{LengthDist, LoadConfig};
    use infertrace_sim::DisaggConfig;
    use opentelemetry::trace::SpanId;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SimpleSpanProcessor};

    /// One request through the three services: one trace, each role's request span tagged and
    /// nested router → prefill → decode, and each sub-phase span under its role's request span.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_request_is_one_trace_across_the_roles() {
        let exporter = InMemorySpanExporter::default();
        let resource = Resource::builder().with_service_name("pd-test").build();
        let processor =
            SharedSpanProcessor::new(SimpleSpanProcessor::new(exporter.clone()), &resource);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor.clone())
            .with_resource(resource)
            .build();
        let sim = DisaggSim::start(DisaggConfig {
            time_scale: 0.1,
            ..Default::default()
        })
        .unwrap();
        let deployment = launch(sim.clone(), "m", |role, _| {
            RoleTelemetry::with_processor(&provider, &processor, role)
        })
        .await
        .unwrap();
        let load = LoadConfig {
            target: format!("http://{}", deployment.router),
            model: "m".to_owned(),
            rate: 50.0,
            duration: Duration::from_millis(100),
            prompt_tokens: LengthDist::Fixed(300),
            output_tokens: LengthDist::Fixed(4),
            ignore_eos: true,
            ..LoadConfig::default()
        };
        let report = crate::loadgen::run(&load, false).await.unwrap();
        assert!(report.sent >= 1);
        assert_eq!(report.outcomes[0], report.sent, "every request ok");
        let index = deployment.index.clone();
        deployment.stop().await;
        let _ = provider.force_flush();
        let spans = exporter.get_finished_spans().unwrap();

        let role_of = |s: &SpanData| {
            s.attributes
                .iter()
                .find(|kv| kv.key.as_str() == sc::disagg::ROLE)
                .map(|kv| kv.value.as_str().into_owned())
        };
        let routers: Vec<&SpanData> = spans
            .iter()
            .filter(|s| role_of(s).as_deref() == Some(sc::disagg::role::ROUTER))
            .collect();
        assert_eq!(routers.len() as u64, report.sent);
        for router in routers {
            let trace = router.span_context.trace_id();
            let id = index
                .get(&trace.to_string())
                .expect("the router noted its request");
            let in_trace: Vec<&SpanData> = spans
                .iter()
                .filter(|s| s.span_context.trace_id() == trace)
                .collect();
            let request = |role: &str| {
                in_trace
                    .iter()
                    .copied()
                    .find(|s| role_of(s).as_deref() == Some(role))
                    .unwrap_or_else(|| panic!("no {role} span in the trace"))
            };
            let (prefill, decode) = (
                request(sc::disagg::role::PREFILL),
                request(sc::disagg::role::DECODE),
            );
            // Context went router → prefill → decode: each worker's request span is a
            // descendant of the caller's (through the HTTP client's call).
            assert_eq!(router.parent_span_id, SpanId::INVALID);
            let child_of = |s: &SpanData, phase: &str| {
                in_trace.iter().any(|c| {
                    c.parent_span_id == s.span_context.span_id()
                        && (c.name == phase
                            || c.attributes.iter().any(|kv| {
                                kv.key.as_str() == sc::infer::PHASE && kv.value.as_str() == phase
                            }))
                })
            };
            assert!(
                prefill.start_time >= router.start_time
                    && prefill.parent_span_id == router.span_context.span_id()
            );
            assert!(decode.parent_span_id == prefill.span_context.span_id());
            assert!(child_of(router, sc::disagg::ROUTING));
            for phase in [
                sc::span::QUEUE,
                sc::span::PREFILL,
                sc::disagg::BOOTSTRAP,
                sc::disagg::KV_TRANSFER,
            ] {
                assert!(child_of(prefill, phase), "prefill worker: {phase}");
            }
            for phase in [
                sc::disagg::DECODE_WAIT,
                sc::disagg::FIRST_TOKEN,
                sc::span::DECODE,
            ] {
                assert!(child_of(decode, phase), "decode worker: {phase}");
            }
            let truth = sim.truth(id).expect("truth");
            assert_eq!(truth.decode.as_ref().map(|d| d.output_tokens), Some(4));
        }
    }
}
