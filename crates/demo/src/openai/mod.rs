//! An OpenAI-compatible HTTP front end on the simulator: `POST /v1/chat/completions`,
//! `POST /v1/completions` (streamed as server-sent events or whole), `GET /v1/models`,
//! `GET /health`.
//!
//! [`OpenAiService`] holds the framework-free request handling (used by the axum [`router`] and
//! by [`hyper_service`](crate::hyper_service)). It marks the request's
//! [`RequestRecorder`] with what the body says (requested model, `max_tokens`, `stream`) and the
//! response id; the simulator marks the phases.

mod body;
pub mod wire;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::Route;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{StatusCode, header};
use infertrace_sim::{SimError, SimEvent, SimHandle, SimRequest};
use infertrace_tower::RequestRecorder;

use crate::EngineMarks;
use serde_json::json;
use std::convert::Infallible;
use tower::{Layer, Service};

use body::SsePhase;
pub use body::{OpenAiBody, SseStream};
use wire::{ChatRequest, CompletionRequest, UsageBody, value_tokens};
pub use wire::{Endpoint, error_body};

/// Largest request body accepted (bytes).
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// Output token limit when a request sets none.
pub const DEFAULT_MAX_TOKENS: u32 = 512;

/// The simulator request id inside a response id (`chatcmpl-42` → 42), to look up its truth.
pub fn sim_id_of_response(response_id: &str) -> Option<u64> {
    response_id.rsplit('-').next()?.parse().ok()
}

/// What the handlers need from a parsed request body.
#[derive(Clone, Debug, PartialEq)]
struct Parsed {
    model: Option<String>,
    prompt_tokens: u32,
    max_tokens: u32,
    stream: bool,
    include_usage: bool,
    ignore_eos: bool,
}

fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Parsed, serde_json::Error> {
    Ok(match endpoint {
        Endpoint::Chat => {
            let r: ChatRequest = serde_json::from_slice(body)?;
            let prompt = r
                .messages
                .iter()
                .map(|m| value_tokens(&m.content))
                .fold(0u32, u32::saturating_add);
            Parsed {
                model: r.model,
                prompt_tokens: prompt,
                max_tokens: r
                    .max_completion_tokens
                    .or(r.max_tokens)
                    .unwrap_or(DEFAULT_MAX_TOKENS),
                stream: r.stream,
                include_usage: r.stream_options.is_some_and(|o| o.include_usage),
                ignore_eos: r.ignore_eos,
            }
        }
        Endpoint::Completions => {
            let r: CompletionRequest = serde_json::from_slice(body)?;
            Parsed {
                model: r.model,
                prompt_tokens: value_tokens(&r.prompt),
                max_tokens: r.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
                stream: r.stream,
                include_usage: r.stream_options.is_some_and(|o| o.include_usage),
                ignore_eos: r.ignore_eos,
            }
        }
    })
}

fn error_response(status: StatusCode, kind: &str, message: &str) -> http::Response<OpenAiBody> {
    let body = serde_json::to_vec(&error_body(status.as_u16(), kind, message)).unwrap_or_default();
    let mut resp = http::Response::new(OpenAiBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Framework-free OpenAI-compatible request handling on a simulator.
#[derive(Clone, Debug)]
pub struct OpenAiService {
    sim: SimHandle,
    model: Arc<str>,
}

impl OpenAiService {
    /// Serves `model` from `sim`.
    pub fn new(sim: SimHandle, model: &str) -> Self {
        Self {
            sim,
            model: Arc::from(model),
        }
    }

    /// The simulator.
    pub fn sim(&self) -> &SimHandle {
        &self.sim
    }

    /// `GET /v1/models` body.
    pub fn models_body(&self) -> Bytes {
        let v = json!({"object": "list", "data": [{"id": &*self.model, "object": "model", "owned_by": "infertrace-sim"}]});
        Bytes::from(v.to_string())
    }

    /// Handles one completion request whose body has been read. `recorder` is the one the layer
    /// put in the request's extensions (or a fresh one without the layer).
    pub async fn handle(
        &self,
        endpoint: Endpoint,
        body: &[u8],
        recorder: RequestRecorder,
    ) -> http::Response<OpenAiBody> {
        let req = match parse(endpoint, body) {
            Ok(r) => r,
            Err(e) => {
                recorder.error("invalid_request");
                return error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!("request body is not a valid {endpoint:?} request: {e}"),
                );
            }
        };
        if let Some(m) = &req.model {
            recorder.request_model(m);
        }
        recorder.max_tokens(u64::from(req.max_tokens));
        recorder.stream(req.stream);
        if let Some(m) = req.model.as_deref().filter(|m| *m != &*self.model) {
            recorder.error("model_not_found");
            return error_response(
                StatusCode::NOT_FOUND,
                "model_not_found",
                &format!(
                    "the model `{m}` does not exist; this server serves `{}`",
                    self.model
                ),
            );
        }
        if req.max_tokens == 0 {
            recorder.error("invalid_request");
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "max_tokens must be at least 1",
            );
        }
        let mut sim_req = SimRequest::new(req.prompt_tokens.max(1), req.max_tokens);
        if req.ignore_eos {
            sim_req = sim_req.with_output_tokens(req.max_tokens);
        }
        let mut tokens = match self.sim.submit(sim_req, EngineMarks(recorder.clone())) {
            Ok(t) => t,
            Err(e) => {
                recorder.error(e.kind());
                let status = match e {
                    SimError::QueueFull => StatusCode::SERVICE_UNAVAILABLE,
                    SimError::InvalidRequest(_) => StatusCode::BAD_REQUEST,
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                };
                return error_response(status, e.kind(), &e.to_string());
            }
        };
        recorder.model(tokens.model());
        let id: Arc<str> = Arc::from(format!("{}{}", endpoint.id_prefix(), tokens.id()));
        recorder.response_id(&id);
        let created = unix_now();
        if req.stream {
            let body = OpenAiBody::Sse(Box::new(SseStream {
                tokens,
                endpoint,
                id,
                model: self.model.clone(),
                created,
                include_usage: req.include_usage,
                phase: SsePhase::Tokens { first: true },
                buf: Vec::with_capacity(256),
            }));
            let mut resp = http::Response::new(body);
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/event-stream"),
            );
            h.insert(
                header::CACHE_CONTROL,
                http::HeaderValue::from_static("no-cache"),
            );
            return resp;
        }
        // Whole response: wait for every token (dropping this future cancels the request).
        let mut text = String::new();
        let (reason, usage) = loop {
            match tokens.recv().await {
                Some(Ok(SimEvent::Token(t))) => text.push_str(t.text),
                Some(Ok(SimEvent::Finished { reason, usage })) => break (reason, usage),
                Some(Err(e)) => {
                    return error_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        e.kind(),
                        &e.to_string(),
                    );
                }
                None => {
                    return error_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        SimError::Stopped.kind(),
                        &SimError::Stopped.to_string(),
                    );
                }
            }
        };
        let usage = UsageBody::new(usage.prompt_tokens, usage.output_tokens);
        let choice = match endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": reason.as_str(),
            }),
            Endpoint::Completions => json!({
                "index": 0, "text": text, "finish_reason": reason.as_str(), "logprobs": null,
            }),
        };
        let body = json!({
            "id": &*id, "object": endpoint.object(), "created": created, "model": &*self.model,
            "choices": [choice], "usage": usage,
        });
        let mut resp = http::Response::new(OpenAiBody::full(body.to_string()));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }
}

/// The recorder the layer put in `extensions`, or a fresh one when the layer is absent.
pub fn recorder_of(extensions: &http::Extensions) -> RequestRecorder {
    extensions
        .get::<RequestRecorder>()
        .cloned()
        .unwrap_or_default()
}

async fn completions(
    State(svc): State<OpenAiService>,
    endpoint: Endpoint,
    req: Request,
) -> Response {
    let recorder = recorder_of(req.extensions());
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            recorder.error("invalid_request");
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                &format!("could not read the request body: {e}"),
            )
            .map(axum::body::Body::new)
            .into_response();
        }
    };
    svc.handle(endpoint, &body, recorder)
        .await
        .map(axum::body::Body::new)
}

/// The axum router: the completion endpoints behind `layer` (normally an
/// `InferenceTraceLayer`; any layer axum accepts works, e.g. `tower::layer::util::Identity`),
/// and `/health` and `/v1/models` outside it (untraced).
///
/// ```no_run
/// # async fn run() -> anyhow::Result<()> {
/// use infertrace_sim::{SimConfig, Simulator};
/// use infertrace_tower::InferenceTraceLayer;
/// let sim = Simulator::start(SimConfig::default())?;
/// let layer = InferenceTraceLayer::new().default_model("llama-3.1-8b");
/// let app = infertrace_demo::openai::router(sim, layer, "llama-3.1-8b");
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app).await?;
/// # Ok(()) }
/// ```
pub fn router<L>(sim: SimHandle, layer: L, model: &str) -> Router
where
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Response: IntoResponse + 'static,
    <L::Service as Service<Request>>::Error: Into<Infallible> + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    let svc = OpenAiService::new(sim, model);
    let models = svc.models_body();
    Router::new()
        .route(
            "/v1/chat/completions",
            post(|s: State<OpenAiService>, r: Request| completions(s, Endpoint::Chat, r)),
        )
        .route(
            "/v1/completions",
            post(|s: State<OpenAiService>, r: Request| completions(s, Endpoint::Completions, r)),
        )
        .layer(layer)
        .route("/health", get(|| async { "ok\n" }))
        .route(
            "/v1/models",
            get(move || {
                let models = models.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], models) }
            }),
        )
        .with_state(svc)
}

/// Serves `app` on `listener` with `TCP_NODELAY` on every connection (without it, Nagle's
/// algorithm and the client's delayed ACK hold small SSE frames back by up to ~40 ms) until
/// `shutdown` completes, then lets open requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::wire::ErrorBody;
    use super::*;

    #[test]
    fn parses_both_endpoints() {
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"abcdabcd"}],"max_tokens":7,"stream":true,"ignore_eos":true}"#;
        let p = parse(Endpoint::Chat, chat).unwrap();
        assert_eq!(
            p,
            Parsed {
                model: Some("m".into()),
                prompt_tokens: 2,
                max_tokens: 7,
                stream: true,
                include_usage: false,
                ignore_eos: true
            }
        );
        let comp = br#"{"prompt":"abcd","stream_options":{"include_usage":true}}"#;
        let p = parse(Endpoint::Completions, comp).unwrap();
        assert_eq!(
            (p.prompt_tokens, p.max_tokens, p.include_usage),
            (1, DEFAULT_MAX_TOKENS, true)
        );
        assert!(parse(Endpoint::Chat, b"{not json").is_err());
    }

    use http_body_util::BodyExt;
    use infertrace_sim::{SimConfig, Simulator};

    fn sim(error_rate: f64, max_waiting: usize) -> OpenAiService {
        let cfg = SimConfig {
            time_scale: 0.0,
            error_rate,
            max_waiting,
            ..SimConfig::default()
        };
        OpenAiService::new(Simulator::start(cfg).unwrap(), "llama-3.1-8b")
    }

    /// The body's frames as strings.
    async fn frames(resp: http::Response<OpenAiBody>) -> Vec<String> {
        let mut body = resp.into_body();
        let mut out = Vec::new();
        while let Some(f) = body.frame().await {
            let data = f.unwrap().into_data().unwrap();
            out.push(String::from_utf8(data.to_vec()).unwrap());
        }
        out
    }

    #[tokio::test]
    async fn streams_one_sse_frame_per_token_then_finish_then_done() {
        let svc = sim(0.0, 16);
        let rec = RequestRecorder::new();
        let body = br#"{"messages":[{"role":"user","content":"abcdabcdabcd"}],"max_tokens":3,"stream":true,"ignore_eos":true,"stream_options":{"include_usage":true}}"#;
        let resp = svc.handle(Endpoint::Chat, body, rec.clone()).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
        let frames = frames(resp).await;
        assert_eq!(frames.len(), 5, "{frames:?}");
        let json = |f: &str| -> serde_json::Value {
            serde_json::from_str(f.strip_prefix("data: ").unwrap().trim_end()).unwrap()
        };
        let first = json(&frames[0]);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert!(
            first["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .starts_with(' ')
        );
        assert!(
            json(&frames[1])["choices"][0]["delta"]
                .get("role")
                .is_none()
        );
        let last = json(&frames[3]);
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["usage"]["prompt_tokens"], 3);
        assert_eq!(last["usage"]["completion_tokens"], 3);
        assert_eq!(frames[4], "data: [DONE]\n\n");
        assert!(frames.iter().all(|f| f.ends_with("\n\n")));
        let snap = rec.snapshot();
        assert_eq!(snap.response_id.as_deref(), Some("chatcmpl-0"));
        assert_eq!((snap.max_tokens, snap.stream), (Some(3), Some(true)));
    }

    #[tokio::test]
    async fn whole_completion_has_text_and_usage() {
        let svc = sim(0.0, 16);
        let body = br#"{"model":"llama-3.1-8b","prompt":"abcd","max_tokens":4,"ignore_eos":true}"#;
        let resp = svc
            .handle(Endpoint::Completions, body, RequestRecorder::new())
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&frames(resp).await.concat()).unwrap();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["usage"]["completion_tokens"], 4);
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(
            v["choices"][0]["text"].as_str().unwrap().split(' ').count(),
            5
        );
    }

    #[tokio::test]
    async fn errors_are_openai_shaped() {
        let svc = sim(0.0, 16);
        let cases: [(&[u8], StatusCode, &str); 3] = [
            (b"{oops", StatusCode::BAD_REQUEST, "invalid_request_error"),
            (
                br#"{"model":"gpt-4","messages":[]}"#,
                StatusCode::NOT_FOUND,
                "model_not_found",
            ),
            (
                br#"{"messages":[],"max_tokens":0}"#,
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
            ),
        ];
        for (body, status, kind) in cases {
            let rec = RequestRecorder::new();
            let resp = svc.handle(Endpoint::Chat, body, rec.clone()).await;
            assert_eq!(resp.status(), status);
            let v: ErrorBody = serde_json::from_str(&frames(resp).await.concat()).unwrap();
            assert_eq!(v.error.kind, kind);
            assert_eq!(v.error.code, status.as_u16());
            assert!(rec.snapshot().error.is_some());
        }
        // Engine queue full → 503; engine failure mid-stream → an error event, then [DONE].
        let full = sim(0.0, 0);
        let resp = full
            .handle(
                Endpoint::Chat,
                br#"{"messages":[]}"#,
                RequestRecorder::new(),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        let failing = sim(1.0, 16);
        let body = br#"{"messages":[],"max_tokens":20,"stream":true,"ignore_eos":true}"#;
        let frames = frames(
            failing
                .handle(Endpoint::Chat, body, RequestRecorder::new())
                .await,
        )
        .await;
        assert!(
            frames[frames.len() - 2].contains(r#""type":"engine_error""#),
            "{frames:?}"
        );
        assert_eq!(frames.last().unwrap(), "data: [DONE]\n\n");
        let whole = br#"{"messages":[],"max_tokens":20,"ignore_eos":true}"#;
        let resp = failing
            .handle(Endpoint::Chat, whole, RequestRecorder::new())
            .await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn response_ids_map_back_to_sim_ids() {
        assert_eq!(sim_id_of_response("chatcmpl-42"), Some(42));
        assert_eq!(sim_id_of_response("cmpl-7"), Some(7));
        assert_eq!(sim_id_of_response("nope"), None);
        assert_eq!(
            Endpoint::from_path("/v1/completions"),
            Some(Endpoint::Completions)
        );
    }
}
