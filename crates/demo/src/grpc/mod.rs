//! A `Generate` gRPC service on the simulator (contract: `crates/demo/proto/generate.proto`), with
//! hand-written prost messages and tonic plumbing, and its client.
//!
//! The server marks the request's [`RequestRecorder`](infertrace_tower::RequestRecorder) the
//! same way the HTTP front end does; an engine error mid-stream ends the stream with `INTERNAL`
//! in the trailers.

mod client;
pub mod messages;
mod server;

use std::future::Future;

use bytes::Bytes;
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tower::{Layer, Service};

pub use client::GeneratorClient;
pub use messages::{
    GENERATE_PATH, GENERATE_STREAM_PATH, GenerateRequest, GenerateResponse, GenerateStreamResponse,
    SERVICE_NAME, Usage,
};
pub use server::{GenerateStream, GeneratorServer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Serves `server` on `listener` behind `layer` (normally an `InferenceTraceLayer`) until
/// `shutdown` completes, then waits for open calls to finish.
pub async fn serve<L, ResBody>(
    listener: TcpListener,
    server: GeneratorServer,
    layer: L,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    L: Layer<Routes> + Clone + Send + Sync + 'static,
    L::Service: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Future: Send,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Error:
        Into<BoxError> + Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .layer(layer)
        .add_service(server)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
