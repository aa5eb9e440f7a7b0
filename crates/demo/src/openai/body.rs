//! [`OpenAiBody`]: a whole JSON body, or a server-sent-events stream with one frame per token.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use infertrace_sim::{SimError, SimEvent, TokenStream};
use serde::Serialize;
use tokio_stream::Stream;

use super::wire::{Endpoint, UsageBody, error_body};

/// The response body of the OpenAI-compatible handlers.
///
/// A stream sends one `data: {chunk}\n\n` frame per token (so the layer sees one body chunk per
/// token), a last chunk carrying `finish_reason` (and `usage` when asked), then `data: [DONE]`.
/// An engine error mid-stream becomes a `data: {"error": …}` event before `[DONE]`.
/// Dropping the body drops the simulator stream, which cancels the request.
#[derive(Debug)]
pub enum OpenAiBody {
    /// A complete body (`None` once sent).
    Full(Option<Bytes>),
    /// A token stream.
    Sse(Box<SseStream>),
}

impl OpenAiBody {
    /// A complete body.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        OpenAiBody::Full(Some(bytes.into()))
    }
}

/// State of a streamed response.
#[derive(Debug)]
pub struct SseStream {
    pub(super) tokens: TokenStream,
    pub(super) endpoint: Endpoint,
    pub(super) id: Arc<str>,
    pub(super) model: Arc<str>,
    pub(super) created: u64,
    pub(super) include_usage: bool,
    pub(super) phase: SsePhase,
    pub(super) buf: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SsePhase {
    Tokens { first: bool },
    Done,
    End,
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageBody>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Choice<'a> {
    Chat {
        index: u32,
        delta: Delta<'a>,
        finish_reason: Option<&'a str>,
    },
    Text {
        index: u32,
        text: &'a str,
        finish_reason: Option<&'a str>,
    },
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

impl SseStream {
    fn event(
        &mut self,
        text: Option<&str>,
        finish: Option<&str>,
        usage: Option<UsageBody>,
    ) -> Bytes {
        let first = matches!(self.phase, SsePhase::Tokens { first: true });
        let choice = match self.endpoint {
            Endpoint::Chat => Choice::Chat {
                index: 0,
                delta: Delta {
                    role: first.then_some("assistant"),
                    content: text,
                },
                finish_reason: finish,
            },
            Endpoint::Completions => Choice::Text {
                index: 0,
                text: text.unwrap_or(""),
                finish_reason: finish,
            },
        };
        let chunk = Chunk {
            id: &self.id,
            object: self.endpoint.chunk_object(),
            created: self.created,
            model: &self.model,
            choices: [choice],
            usage,
        };
        self.buf.clear();
        self.buf.extend_from_slice(b"data: ");
        // Serialising plain structs of strings and integers into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.buf, &chunk);
        self.buf.extend_from_slice(b"\n\n");
        Bytes::copy_from_slice(&self.buf)
    }

    fn error_event(&mut self, err: &SimError) -> Bytes {
        let body = error_body(500, err.kind(), &err.to_string());
        self.buf.clear();
        self.buf.extend_from_slice(b"data: ");
        let _ = serde_json::to_writer(&mut self.buf, &body);
        self.buf.extend_from_slice(b"\n\n");
        Bytes::copy_from_slice(&self.buf)
    }

    fn poll_next_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            match self.phase {
                SsePhase::End => return Poll::Ready(None),
                SsePhase::Done => {
                    self.phase = SsePhase::End;
                    return Poll::Ready(Some(Bytes::from_static(b"data: [DONE]\n\n")));
                }
                SsePhase::Tokens { .. } => {}
            }
            let ev = match Pin::new(&mut self.tokens).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(ev) => ev,
            };
            let frame = match ev {
                Some(Ok(SimEvent::Token(t))) => {
                    let f = self.event(Some(t.text), None, None);
                    self.phase = SsePhase::Tokens { first: false };
                    f
                }
                Some(Ok(SimEvent::Finished { reason, usage })) => {
                    let usage = self
                        .include_usage
                        .then(|| UsageBody::new(usage.prompt_tokens, usage.output_tokens));
                    let f = self.event(None, Some(reason.as_str()), usage);
                    self.phase = SsePhase::Done;
                    f
                }
                Some(Err(e)) => {
                    let f = self.error_event(&e);
                    self.phase = SsePhase::Done;
                    f
                }
                None => {
                    self.phase = SsePhase::Done;
                    continue;
                }
            };
            return Poll::Ready(Some(frame));
        }
    }
}

impl Body for OpenAiBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            OpenAiBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            OpenAiBody::Sse(s) => s.poll_next_frame(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            OpenAiBody::Full(b) => b.is_none(),
            OpenAiBody::Sse(s) => s.phase == SsePhase::End,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            OpenAiBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            OpenAiBody::Full(None) => SizeHint::with_exact(0),
            OpenAiBody::Sse(_) => SizeHint::default(),
        }
    }
}
