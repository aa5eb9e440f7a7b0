//! [`TracedBody`]: the response-body wrapper that sees first chunk, gaps and end of stream.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::record::{End, PanicGuard, RequestRecord};

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Body { #[pin] body: B },
        Empty,
    }
}

pin_project! {
    /// A response body that records, for the request's span, when its first chunk went out, the
    /// gaps between chunks (p50 / p99 / max), how many chunks there were, the gRPC status in its
    /// trailers, and when it ended. The request span ends when the body ends; a body dropped
    /// before its end (client disconnect) ends the request as `cancelled`.
    ///
    /// Chunk counting: for gRPC responses `infer.stream.chunks` counts length-prefixed gRPC
    /// messages (however frames split them); for any other response it counts non-empty data
    /// frames. An SSE server that writes one event per frame (axum's `Sse`, the examples) thus
    /// counts events; one that batches several events into a frame counts frames. An SSE frame
    /// of comments alone (keep-alives) or `data: [DONE]` is no chunk. Gaps are measured between
    /// chunks.
    pub struct TracedBody<B> {
        #[pin]
        inner: Inner<B>,
        record: Option<Box<RequestRecord>>,
    }
}

impl<B> TracedBody<B> {
    pub(crate) fn new(body: B, record: Box<RequestRecord>) -> Self {
        Self {
            inner: Inner::Body { body },
            record: Some(record),
        }
    }

    /// A body that only passes frames through (skipped or already finished requests).
    pub(crate) fn passthrough(body: B) -> Self {
        Self {
            inner: Inner::Body { body },
            record: None,
        }
    }

    /// An empty body (admission rejections).
    pub(crate) fn empty() -> Self {
        Self {
            inner: Inner::Empty,
            record: None,
        }
    }
}

impl<B> std::fmt::Debug for TracedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracedBody")
            .field("traced", &self.record.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for TracedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let mut body = match this.inner.project() {
            InnerProj::Body { body } => body,
            InnerProj::Empty => return Poll::Ready(None),
        };
        let result = {
            let _panic = PanicGuard(this.record.as_deref_mut());
            ready!(body.as_mut().poll_frame(cx))
        };
        let Some(record) = this.record.as_mut() else {
            return Poll::Ready(result);
        };
        let done = match &result {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.remaining();
                    if len > 0 {
                        record.on_data(data.chunk(), len);
                    }
                    // A server stops polling once the body says it is at its end.
                    body.is_end_stream()
                } else if let Some(trailers) = frame.trailers_ref() {
                    // Trailers are always the last frame; servers do not poll past them.
                    record.on_trailers(trailers);
                    true
                } else {
                    body.is_end_stream()
                }
            }
            Some(Err(_)) => {
                record.fail("body_error");
                true
            }
            None => true,
        };
        if done {
            record.finish(End::Completed);
            *this.record = None;
        }
        Poll::Ready(result)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Body { body } => body.is_end_stream(),
            Inner::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Body { body } => body.size_hint(),
            Inner::Empty => SizeHint::with_exact(0),
        }
    }
}
