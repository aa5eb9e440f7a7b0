//! [`GeneratorClient`]: the hand-written tonic client of the `Generator` service.

use http::uri::PathAndQuery;
use tonic::codec::Streaming;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

use super::messages::{
    GENERATE_PATH, GENERATE_STREAM_PATH, GenerateRequest, GenerateResponse, GenerateStreamResponse,
};

/// A client of `infertrace.examples.v1.Generator`.
#[derive(Clone, Debug)]
pub struct GeneratorClient {
    inner: tonic::client::Grpc<Channel>,
}

impl GeneratorClient {
    /// Connects to `endpoint` (e.g. `http://127.0.0.1:50051`).
    pub async fn connect(endpoint: String) -> Result<Self, tonic::transport::Error> {
        let channel = tonic::transport::Endpoint::from_shared(endpoint)?
            .tcp_nodelay(true)
            .connect()
            .await?;
        Ok(Self::new(channel))
    }

    /// A client on an existing channel.
    pub fn new(channel: Channel) -> Self {
        Self {
            inner: tonic::client::Grpc::new(channel),
        }
    }

    async fn ready(&mut self) -> Result<(), Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("service was not ready: {e}")))
    }

    /// Unary `Generate`.
    pub async fn generate(
        &mut self,
        request: impl tonic::IntoRequest<GenerateRequest>,
    ) -> Result<Response<GenerateResponse>, Status> {
        self.ready().await?;
        self.inner
            .unary(
                request.into_request(),
                PathAndQuery::from_static(GENERATE_PATH),
                ProstCodec::default(),
            )
            .await
    }

    /// Server-streaming `GenerateStream`.
    pub async fn generate_stream(
        &mut self,
        request: impl tonic::IntoRequest<GenerateRequest>,
    ) -> Result<Response<Streaming<GenerateStreamResponse>>, Status> {
        self.ready().await?;
        let request: Request<GenerateRequest> = request.into_request();
        self.inner
            .server_streaming(
                request,
                PathAndQuery::from_static(GENERATE_STREAM_PATH),
                ProstCodec::default(),
            )
            .await
    }
}
