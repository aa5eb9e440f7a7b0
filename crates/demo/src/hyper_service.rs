//! The OpenAI-compatible API as a bare hyper/tower service (no framework), and an accept loop
//! serving it behind a layer with graceful shutdown.
//!
//! [`OpenAiHyperService`] routes by hand: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models`, `GET /health`; anything else is a 404 JSON error. Every request passes
//! through the layer (use the layer's `skip` to leave `/health` untraced).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::{Layer, Service};

use crate::openai::{Endpoint, MAX_BODY_BYTES, OpenAiBody, OpenAiService, error_body, recorder_of};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The OpenAI-compatible API as a `tower::Service` over any request body.
#[derive(Clone, Debug)]
pub struct OpenAiHyperService {
    svc: OpenAiService,
}

impl OpenAiHyperService {
    /// Wraps the framework-free handler.
    pub fn new(svc: OpenAiService) -> Self {
        Self { svc }
    }
}

fn json_response(status: StatusCode, body: impl Into<Bytes>) -> Response<OpenAiBody> {
    let mut resp = Response::new(OpenAiBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response<OpenAiBody> {
    let body = serde_json::to_vec(&error_body(status.as_u16(), kind, message)).unwrap_or_default();
    json_response(status, body)
}

impl<B> Service<Request<B>> for OpenAiHyperService
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<OpenAiBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<OpenAiBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let svc = self.svc.clone();
        Box::pin(async move {
            let path = req.uri().path();
            let endpoint = Endpoint::from_path(path);
            let resp = match (req.method(), endpoint, path) {
                (&Method::POST, Some(endpoint), _) => {
                    let recorder = recorder_of(req.extensions());
                    match Limited::new(req.into_body(), MAX_BODY_BYTES)
                        .collect()
                        .await
                    {
                        Ok(body) => svc.handle(endpoint, &body.to_bytes(), recorder).await,
                        Err(e) => {
                            recorder.error("invalid_request");
                            error(
                                StatusCode::PAYLOAD_TOO_LARGE,
                                "invalid_request_error",
                                &format!("could not read the request body: {e}"),
                            )
                        }
                    }
                }
                (&Method::GET, None, "/health") => {
                    let mut r = Response::new(OpenAiBody::full(Bytes::from_static(b"ok\n")));
                    r.headers_mut().insert(
                        header::CONTENT_TYPE,
                        http::HeaderValue::from_static("text/plain"),
                    );
                    r
                }
                (&Method::GET, None, "/v1/models") => {
                    json_response(StatusCode::OK, svc.models_body())
                }
                (_, Some(_), _) => error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "invalid_request_error",
                    "use POST",
                ),
                _ => error(StatusCode::NOT_FOUND, "not_found", "no such route"),
            };
            Ok(resp)
        })
    }
}

/// Accepts connections on `listener` and serves `service` behind `layer` (HTTP/1.1 and h2c)
/// until `shutdown` completes; then stops accepting and waits for open connections to finish.
pub async fn serve<L, ResBody>(
    listener: TcpListener,
    service: OpenAiHyperService,
    layer: L,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    L: Layer<OpenAiHyperService>,
    L::Service: Service<Request<hyper::body::Incoming>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    <L::Service as Service<Request<hyper::body::Incoming>>>::Future: Send + 'static,
    <L::Service as Service<Request<hyper::body::Incoming>>>::Error: Into<BoxError>,
    ResBody: http_body::Body + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    let svc = layer.layer(service);
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                // Transient accept errors (e.g. too many open files): keep serving.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let conn = builder
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc.clone()))
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
