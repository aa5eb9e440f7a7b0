//! [`GeneratorServer`]: the hand-written tonic service of `Generator` on the simulator.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::StreamExt;
use infertrace_sim::{SimError, SimEvent, SimHandle, SimRequest, TokenStream};
use infertrace_tower::RequestRecorder;
use tokio_stream::Stream;
use tonic::body::Body as TonicBody;
use tonic::server::{NamedService, ServerStreamingService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

use super::messages::{
    GENERATE_PATH, GENERATE_STREAM_PATH, GenerateRequest, GenerateResponse, GenerateStreamResponse,
    SERVICE_NAME, Usage,
};
use crate::EngineMarks;
use crate::openai::{DEFAULT_MAX_TOKENS, recorder_of, wire::estimate_tokens};

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;
/// The response stream of `GenerateStream`.
pub type GenerateStream =
    Pin<Box<dyn Stream<Item = Result<GenerateStreamResponse, Status>> + Send + 'static>>;

/// The `Generator` service on a simulator. Add it to a tonic server (behind the layer with
/// `Server::builder().layer(..)`), or use [`serve`](super::serve).
#[derive(Clone, Debug)]
pub struct GeneratorServer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sim: SimHandle,
    model: Arc<str>,
}

impl GeneratorServer {
    /// Serves `model` from `sim`.
    pub fn new(sim: SimHandle, model: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                sim,
                model: Arc::from(model),
            }),
        }
    }
}

fn status_of(e: &SimError) -> Status {
    match e {
        SimError::QueueFull => Status::unavailable(e.to_string()),
        SimError::InvalidRequest(_) => Status::invalid_argument(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

impl Inner {
    /// Validates, marks the recorder and submits; returns the response id and the tokens.
    fn start(
        &self,
        req: &Request<GenerateRequest>,
        streamed: bool,
    ) -> Result<(String, TokenStream, RequestRecorder), Status> {
        let recorder = recorder_of(req.extensions());
        let msg = req.get_ref();
        let max_tokens = if msg.max_tokens == 0 {
            DEFAULT_MAX_TOKENS
        } else {
            msg.max_tokens
        };
        if !msg.model.is_empty() {
            recorder.request_model(&msg.model);
        }
        recorder.max_tokens(u64::from(max_tokens));
        recorder.stream(streamed);
        if !msg.model.is_empty() && *msg.model != *self.model {
            recorder.error("model_not_found");
            return Err(Status::not_found(format!(
                "the model `{}` does not exist; this server serves `{}`",
                msg.model, self.model
            )));
        }
        let prompt = if msg.prompt_tokens > 0 {
            msg.prompt_tokens
        } else {
            estimate_tokens(&msg.prompt).max(1)
        };
        let mut sim_req = SimRequest::new(prompt, max_tokens);
        if msg.ignore_eos {
            sim_req = sim_req.with_output_tokens(max_tokens);
        }
        let tokens = self
            .sim
            .submit(sim_req, EngineMarks(recorder.clone()))
            .map_err(|e| {
                recorder.error(e.kind());
                status_of(&e)
            })?;
        recorder.model(tokens.model());
        let id = format!("gen-{}", tokens.id());
        recorder.response_id(&id);
        Ok((id, tokens, recorder))
    }
}

struct GenerateSvc(Arc<Inner>);

impl UnaryService<GenerateRequest> for GenerateSvc {
    type Response = GenerateResponse;
    type Future = BoxFuture<Result<Response<GenerateResponse>, Status>>;

    fn call(&mut self, request: Request<GenerateRequest>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move {
            let (id, mut tokens, _recorder) = inner.start(&request, false)?;
            let mut text = String::new();
            loop {
                match tokens.recv().await {
                    Some(Ok(SimEvent::Token(t))) => text.push_str(t.text),
                    Some(Ok(SimEvent::Finished { reason, usage })) => {
                        return Ok(Response::new(GenerateResponse {
                            id,
                            model: inner.model.to_string(),
                            text,
                            finish_reason: reason.as_str().to_owned(),
                            usage: Some(Usage {
                                prompt_tokens: usage.prompt_tokens,
                                completion_tokens: usage.output_tokens,
                            }),
                        }));
                    }
                    Some(Err(e)) => return Err(status_of(&e)),
                    None => return Err(status_of(&SimError::Stopped)),
                }
            }
        })
    }
}

struct GenerateStreamSvc(Arc<Inner>);

impl ServerStreamingService<GenerateRequest> for GenerateStreamSvc {
    type Response = GenerateStreamResponse;
    type ResponseStream = GenerateStream;
    type Future = BoxFuture<Result<Response<GenerateStream>, Status>>;

    fn call(&mut self, request: Request<GenerateRequest>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move {
            let (id, tokens, _recorder) = inner.start(&request, true)?;
            let stream = tokens.map(move |ev| match ev {
                Ok(SimEvent::Token(t)) => Ok(GenerateStreamResponse {
                    id: id.clone(),
                    index: t.index,
                    text: t.text.to_owned(),
                    finish_reason: String::new(),
                    usage: None,
                }),
                Ok(SimEvent::Finished { reason, usage }) => Ok(GenerateStreamResponse {
                    id: id.clone(),
                    index: usage.output_tokens,
                    text: String::new(),
                    finish_reason: reason.as_str().to_owned(),
                    usage: Some(Usage {
                        prompt_tokens: usage.prompt_tokens,
                        completion_tokens: usage.output_tokens,
                    }),
                }),
                Err(e) => Err(status_of(&e)),
            });
            Ok(Response::new(Box::pin(stream) as GenerateStream))
        })
    }
}

impl<B> tower::Service<http::Request<B>> for GeneratorServer
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<TonicBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        match req.uri().path() {
            GENERATE_PATH => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(GenerateSvc(inner), req).await)
            }),
            GENERATE_STREAM_PATH => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.server_streaming(GenerateStreamSvc(inner), req).await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

impl NamedService for GeneratorServer {
    const NAME: &'static str = SERVICE_NAME;
}
