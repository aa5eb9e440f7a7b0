//! [`InferenceTraceService`] and its [`ResponseFuture`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, ready};
use std::time::Instant;

use http::{Request, Response};
use opentelemetry::context::{FutureExt as _, WithContext};
use pin_project_lite::pin_project;
use tower::Service;

use crate::admission::{Admission, QueueTicket, SlotWait};
use crate::body::TracedBody;
use crate::grpc;
use crate::record::{End, LayerState, PanicGuard, RequestRecord};
use crate::request_facts::RequestHead;
use crate::tick_clock;

/// The service [`InferenceTraceLayer`](crate::InferenceTraceLayer) wraps around an inner
/// `http::Request → http::Response` service (axum router, tonic server, hyper `service_fn`).
///
/// The inner service must be `Clone` because, with an admission queue, a request that has to
/// wait is served by the instance that was ready when it arrived, taken out of `self`.
#[derive(Clone, Debug)]
pub struct InferenceTraceService<S> {
    inner: S,
    state: Arc<LayerState>,
}

impl<S> InferenceTraceService<S> {
    pub(crate) fn new(inner: S, state: Arc<LayerState>) -> Self {
        Self { inner, state }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for InferenceTraceService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: http_body::Body,
{
    type Response = Response<TracedBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let arrival = Instant::now();
        let arrival_tick = tick_clock::ticks();
        let head = RequestHead {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
        };
        let shared = &self.state.shared;
        if shared.skips(&head) {
            return ResponseFuture {
                state: State::Passthrough {
                    future: self.inner.call(req),
                },
                record: None,
            };
        }
        let mut record =
            RequestRecord::start(Arc::clone(&self.state), arrival, arrival_tick, &mut req);
        let state = match &self.state.shared.admission {
            None => State::Calling {
                future: self.inner.call(req).with_context(record.context().clone()),
            },
            Some(queue) => {
                record.set_queue_depth(queue.waiting());
                match queue.enter(&self.state.shared.metrics.queue_size) {
                    Admission::Admitted(permit) => {
                        record.admitted(permit, Instant::now());
                        State::Calling {
                            future: self.inner.call(req).with_context(record.context().clone()),
                        }
                    }
                    Admission::Wait(wait, ticket) => {
                        record.waiting();
                        let fresh = self.inner.clone();
                        let ready = std::mem::replace(&mut self.inner, fresh);
                        State::Admitting {
                            wait,
                            ticket: Some(ticket),
                            service: Some(ready),
                            request: Some(req),
                        }
                    }
                    Admission::Full => {
                        record.reject();
                        State::Rejected {
                            grpc: record.grpc(),
                        }
                    }
                }
            }
        };
        ResponseFuture {
            state,
            record: Some(record),
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, F> {
        // Waiting in the admission queue with the ready inner service and the request.
        Admitting {
            wait: SlotWait,
            ticket: Option<QueueTicket>,
            service: Option<S>,
            request: Option<Request<ReqBody>>,
        },
        // The inner service's future, polled under the request's OpenTelemetry context.
        Calling { #[pin] future: WithContext<F> },
        // A skipped request: no tracing at all.
        Passthrough { #[pin] future: F },
        // The admission queue was full.
        Rejected { grpc: bool },
        Done,
    }
}

pin_project! {
    /// The future of [`InferenceTraceService`]: waits for admission (if configured), runs the
    /// inner service under the request's OpenTelemetry context, and wraps the response body in a
    /// [`TracedBody`]. Dropping it before completion ends the request as `cancelled`.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody, S::Future>,
        record: Option<Box<RequestRecord>>,
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body,
{
    type Output = Result<Response<TracedBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Admitting {
                    wait,
                    ticket,
                    service,
                    request,
                } => {
                    let permit = ready!(wait.as_mut().poll(cx));
                    let now = Instant::now();
                    ticket.take();
                    let (Some(mut service), Some(request)) = (service.take(), request.take())
                    else {
                        this.state.set(State::Done);
                        continue;
                    };
                    let Some(record) = this.record.as_mut() else {
                        this.state.set(State::Passthrough {
                            future: service.call(request),
                        });
                        continue;
                    };
                    // The semaphore is never closed, so `permit` is always Ok; if it ever were
                    // not, the request still runs, just without a slot.
                    if let Ok(permit) = permit {
                        record.admitted(permit, now);
                    }
                    let future = service.call(request).with_context(record.context().clone());
                    this.state.set(State::Calling { future });
                }
                StateProj::Calling { future } => {
                    let result = {
                        let _panic = PanicGuard(this.record.as_deref_mut());
                        ready!(future.poll(cx))
                    };
                    this.state.set(State::Done);
                    let Some(mut record) = this.record.take() else {
                        return Poll::Ready(result.map(|r| r.map(TracedBody::passthrough)));
                    };
                    return Poll::Ready(match result {
                        Ok(response) => {
                            record.on_response(&response);
                            let (parts, body) = response.into_parts();
                            let body = if http_body::Body::is_end_stream(&body) {
                                // Nothing to stream (trailers-only gRPC, empty body): the
                                // server may never poll it, so the request ends here.
                                record.finish(End::Completed);
                                TracedBody::passthrough(body)
                            } else {
                                TracedBody::new(body, record)
                            };
                            Ok(Response::from_parts(parts, body))
                        }
                        Err(e) => {
                            record.fail("service_error");
                            record.finish(End::Completed);
                            Err(e)
                        }
                    });
                }
                StateProj::Passthrough { future } => {
                    let result = ready!(future.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(result.map(|r| r.map(TracedBody::passthrough)));
                }
                StateProj::Rejected { grpc } => {
                    let grpc = *grpc;
                    this.state.set(State::Done);
                    let response = grpc::rejection(grpc, TracedBody::empty());
                    if let Some(mut record) = this.record.take() {
                        record.on_response(&response);
                        record.finish(End::Completed);
                    }
                    return Poll::Ready(Ok(response));
                }
                // Polled after completion: stay pending rather than panic.
                StateProj::Done => return Poll::Pending,
            }
        }
    }
}
