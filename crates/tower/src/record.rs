//! [`RequestRecord`]: everything the layer keeps about one request while it runs, and the one
//! place where its spans and metrics are emitted when it ends.
//!
//! The hot path only stores instants and counters here. `finish` converts them to wall time once
//! (`wall_arrival + offset`), computes the phases and the end-of-request values, hands them to
//! the layer's span sink as a [`FinishedRequest`] and records the metrics.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, Request, Response, header};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::{Context, KeyValue, StringValue};
use tokio::sync::OwnedSemaphorePermit;

use infertrace_semconv::{gen_ai, infer};

use crate::config::{PhaseSource, Shared};
use crate::counters::RequestEnergy;
use crate::end_attributes::{EndAttributes, StatusCode};
use crate::export::{Sink, SinkSpan, SpanSink};
use crate::finished::{FinishedRequest, PHASE_NAMES, PhaseSpans};
use crate::gaps::GapHistogram;
use crate::grpc::{self, MessageCounter};
use crate::metrics::{MetricKey, RequestMeasurements};
use crate::phases::{Marks, Phases};
use crate::recorder::{RecorderMarks, RequestRecorder};
use crate::request_facts::{ArrivalHeaders, RequestFacts, RequestHead, StartAttributes};
use crate::tick_clock::{self, TickSpan};

/// What every request of a layer uses: its settings and the sink its spans go to.
pub(crate) struct LayerState {
    pub(crate) shared: Shared,
    pub(crate) sink: Sink,
}

impl fmt::Debug for LayerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerState")
            .field("shared", &self.shared)
            .field("sink", &self.sink)
            .finish()
    }
}

/// How a request's life ended, as seen by the layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The response completed (end of body), or the service failed.
    Completed,
    /// The response future or body was dropped before completion: the client went away.
    Cancelled,
}

/// Marks the request failed with `panic` when dropped while a panic unwinds: held around a
/// poll of the inner service's future or body, it fires for a panic out of this request's
/// handler only — whoever catches it later (the runtime, tower-http's `CatchPanicLayer`) and
/// whenever the request is then dropped, and never for a panic elsewhere in the same task.
pub(crate) struct PanicGuard<'a>(pub(crate) Option<&'a mut RequestRecord>);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(record) = self.0.as_mut()
        {
            record.fail("panic");
        }
    }
}

/// One request in flight.
pub(crate) struct RequestRecord {
    state: Arc<LayerState>,
    arrival: Instant,
    wall_arrival: SystemTime,
    recorder: RequestRecorder,
    /// This request's share of the GPU energy (only with GPU telemetry that found GPUs).
    energy: Option<RequestEnergy>,
    facts: RequestFacts,
    /// The request span, until the request ends.
    span: Option<SinkSpan>,
    /// The parent context with the request span's context in it: what the inner future runs
    /// under, and the parent of the phase spans.
    cx: Context,
    queue_depth: Option<usize>,
    admitted: Option<Instant>,
    permit: Option<OwnedSemaphorePermit>,
    http_status: Option<u16>,
    grpc_status: Option<i32>,
    event_stream: bool,
    chunks: u64,
    /// [`tick_clock`] reading at arrival: with the one at the end, the anchors that convert
    /// chunk ticks to time.
    arrival_tick: u64,
    /// [`tick_clock`] reading at the first chunk.
    first_tick: Option<u64>,
    /// [`tick_clock`] reading at the latest chunk.
    last_tick: u64,
    /// Gaps between chunks, in ticks.
    gaps: Option<Box<GapHistogram>>,
    messages: Option<MessageCounter>,
    failure: Option<&'static str>,
    rejected: bool,
    /// It went into the admission queue to wait.
    waited: bool,
    finished: bool,
}

/// The longest frame `data: [DONE]` comes in (`data:[DONE]` to `data: [DONE]\r\n\r\n`).
const SSE_DONE_FRAME_MAX: usize = 16;

/// Whether an SSE frame carries data: anything but comment lines (`: keep-alive`, axum's
/// `Sse::keep_alive`), blank lines and OpenAI's `data: [DONE]` end sentinel. Only frames made
/// of those alone are left out, so an event split over frames still counts.
#[cold]
fn sse_carries_data(frame: &[u8]) -> bool {
    frame.split(|&b| b == b'\n').any(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        !(line.is_empty()
            || line.starts_with(b":")
            || line == b"data: [DONE]"
            || line == b"data:[DONE]")
    })
}

/// Room for `infer.phase` plus every `gpu.*`, `host.*` and `process.*` window attribute.
const PHASE_ATTRIBUTES_WITH_COUNTERS: usize = 20;

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl RequestRecord {
    /// Starts tracing `req`: reads what it is (operation, model, protocol), extracts the parent
    /// context, starts the request span at `arrival`, and puts a [`RequestRecorder`] in the
    /// request extensions.
    pub(crate) fn start<B>(
        state: Arc<LayerState>,
        arrival: Instant,
        arrival_tick: u64,
        req: &mut Request<B>,
    ) -> Box<Self> {
        let wall_arrival = SystemTime::now();
        let headers = ArrivalHeaders::scan(req.headers());
        let head = RequestHead {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
        };
        let facts = state.shared.request_facts(&head, &headers);
        let parent = crate::propagation::extract(req.headers(), headers.context);
        let attributes = StartAttributes::read(req, &headers, &facts);
        let span = state
            .sink
            .start(facts.span_name(), wall_arrival, attributes, &parent);
        let cx = parent.with_remote_span_context(span.span_context().clone());
        let shared = &state.shared;
        let energy = shared.gpu.as_ref().and_then(|g| g.begin_request());
        let recorder =
            RequestRecorder::with_anchor_and_energy(arrival, arrival, arrival_tick, energy.clone());
        req.extensions_mut().insert(recorder.clone());
        if shared.record_metrics {
            shared.metrics.active_requests.add(1, &[]);
        }
        Box::new(Self {
            state,
            arrival,
            wall_arrival,
            recorder,
            energy,
            facts,
            span: Some(span),
            cx,
            queue_depth: None,
            admitted: None,
            permit: None,
            http_status: None,
            grpc_status: None,
            event_stream: false,
            chunks: 0,
            arrival_tick,
            first_tick: None,
            last_tick: 0,
            gaps: None,
            messages: None,
            failure: None,
            rejected: false,
            waited: false,
            finished: false,
        })
    }

    /// Whether the request is a gRPC call.
    pub(crate) fn grpc(&self) -> bool {
        self.facts.grpc
    }

    /// The context the inner service runs under.
    pub(crate) fn context(&self) -> &Context {
        &self.cx
    }

    /// Admission-queue length at arrival.
    pub(crate) fn set_queue_depth(&mut self, depth: usize) {
        self.queue_depth = Some(depth);
    }

    /// The admission queue let the request in at `at`; the slot is held until the end.
    pub(crate) fn admitted(&mut self, permit: OwnedSemaphorePermit, at: Instant) {
        self.admitted = Some(at);
        self.permit = Some(permit);
    }

    /// The request waits in the admission queue (its wait, until [`admitted`](Self::admitted)
    /// or its end, is the queue phase).
    pub(crate) fn waiting(&mut self) {
        self.waited = true;
    }

    /// The admission queue was full.
    pub(crate) fn reject(&mut self) {
        self.rejected = true;
    }

    /// The inner service or the body failed.
    pub(crate) fn fail(&mut self, kind: &'static str) {
        self.failure.get_or_insert(kind);
    }

    /// Reads the response head: status, trailers-only `grpc-status`, stream content types.
    pub(crate) fn on_response<B>(&mut self, response: &Response<B>) {
        self.http_status = Some(response.status().as_u16());
        // One pass over the headers for the two the layer reads.
        let (mut content_type, mut grpc_status) = (None, None);
        for (name, value) in response.headers() {
            if name == header::CONTENT_TYPE {
                content_type.get_or_insert(value);
            } else if name == grpc::GRPC_STATUS {
                grpc_status.get_or_insert(value);
            }
        }
        if let Some(code) = grpc_status {
            self.grpc_status = Some(grpc::status_code(code));
        }
        if self.facts.grpc || content_type.is_some_and(grpc::is_grpc_content_type) {
            self.facts.grpc = true;
            self.messages = Some(MessageCounter::default());
        } else {
            self.event_stream =
                content_type.is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        }
    }

    /// One non-empty data frame went out. `bytes` is its first contiguous piece and `len` its
    /// full length (they differ only for non-contiguous buffers, where a gRPC frame then counts
    /// as one message). After the first chunk this reads only the tick clock.
    #[inline]
    pub(crate) fn on_data(&mut self, bytes: &[u8], len: usize) {
        // Only a frame that starts a comment, or is as short as `data: [DONE]`, is read: one
        // byte compare on every other streamed chunk.
        if self.event_stream
            && bytes.len() == len
            && (bytes.first() == Some(&b':') || len <= SSE_DONE_FRAME_MAX)
            && !sse_carries_data(bytes)
        {
            // A keep-alive comment or the `[DONE]` sentinel: no token, no chunk, no gap.
            return;
        }
        self.chunks += match &mut self.messages {
            Some(counter) if bytes.len() == len => counter.feed(bytes),
            _ => 1,
        };
        let now = tick_clock::ticks();
        if self.first_tick.is_none() {
            self.first_tick = Some(now);
            self.last_tick = now;
            return;
        }
        self.gaps
            .get_or_insert_with(Box::default)
            .record(now.saturating_sub(self.last_tick));
        self.last_tick = self.last_tick.max(now);
    }

    /// Trailers went out (gRPC status lives here for streams).
    pub(crate) fn on_trailers(&mut self, trailers: &HeaderMap) {
        if let Some(code) = grpc::status(trailers) {
            self.grpc_status = Some(code);
        }
    }

    fn offset(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.arrival)
    }

    fn wall(&self, offset: Duration) -> SystemTime {
        self.wall_arrival + offset
    }

    /// The attributes of the phase span `name` over `[s, e]` (offsets from arrival), with GPU
    /// telemetry: `infer.phase`, then the GPU / host / process window statistics. Without it,
    /// `None`: `infer.phase` alone, written where the span is built.
    fn phase_attributes(
        &self,
        name: &'static str,
        s: Duration,
        e: Duration,
    ) -> Option<Vec<KeyValue>> {
        let gpu = self.state.shared.gpu.as_ref()?;
        let mut attrs = Vec::with_capacity(PHASE_ATTRIBUTES_WITH_COUNTERS);
        attrs.push(KeyValue::new(infer::PHASE, name));
        gpu.phase_attributes(
            self.arrival + s,
            self.arrival + e,
            self.energy.as_ref(),
            &mut attrs,
        );
        Some(attrs)
    }

    /// The request's outcome and error type, from the response status as the collector reads
    /// it (`infer::outcome::of_grpc_status`, `of_http_status`): the service's own refusal is a
    /// rejection like the admission queue's, a client's cancel a cancel, anything else non-OK
    /// an error, its type the handler's own word first, then a body that failed after it, then
    /// the status.
    fn outcome(
        &self,
        how: End,
        handler_error: Option<&Arc<str>>,
    ) -> (&'static str, Option<Cow<'static, str>>) {
        let said = self
            .grpc_status
            .and_then(|c| infer::outcome::of_grpc_status(c.into()))
            .or_else(|| {
                self.http_status
                    .and_then(|c| infer::outcome::of_http_status(c.into()))
            });
        let rejected = self.rejected || said == Some(infer::outcome::REJECTED);
        let client_cancelled = said == Some(infer::outcome::CANCELLED);
        let error_type: Option<Cow<'static, str>> = if rejected {
            None
        } else if let Some(kind) = handler_error {
            Some(Cow::Owned(kind.to_string()))
        } else if let Some(kind) = self.failure {
            Some(Cow::Borrowed(kind))
        } else if client_cancelled {
            None
        } else if let Some(code) = self.grpc_status.filter(|c| *c != 0) {
            Some(Cow::Borrowed(grpc::status_name(code)))
        } else {
            self.http_status
                .filter(|s| *s >= 400)
                .map(|s| Cow::Owned(s.to_string()))
        };
        let outcome = if rejected {
            infer::outcome::REJECTED
        } else if error_type.is_some() {
            infer::outcome::ERROR
        } else if how == End::Cancelled || client_cancelled {
            infer::outcome::CANCELLED
        } else {
            infer::outcome::OK
        };
        (outcome, error_type)
    }

    /// Whether the request was answered with a client error or a refusal (an HTTP 4xx but a
    /// client's 499, a gRPC client-error status, a rejection): the engine most likely never
    /// worked on it. A server error (5xx, INTERNAL, DEADLINE_EXCEEDED) may have cost the engine
    /// its time.
    fn refused(&self, outcome: &str) -> bool {
        outcome == infer::outcome::REJECTED
            || (outcome == infer::outcome::ERROR
                && (self.grpc_status.is_some_and(grpc::is_client_error)
                    || (!self.facts.grpc
                        && self.http_status.is_some_and(|s| (400..500).contains(&s)))))
    }

    /// The status the span reports: gRPC's code, or where none went out CANCELLED for a client
    /// that cancelled (as gRPC servers report it) and OK for a response with headers only; else
    /// the HTTP status.
    fn status(&self, outcome: &str) -> Option<StatusCode> {
        if !self.facts.grpc {
            return self.http_status.map(StatusCode::Http);
        }
        match self.grpc_status {
            Some(code) => Some(code),
            None if outcome == infer::outcome::CANCELLED => Some(grpc::CANCELLED),
            None => self.http_status.map(|_| 0),
        }
        .map(StatusCode::Grpc)
    }

    /// The child spans of the phases that ran, with their GPU telemetry.
    fn phase_spans(&self, phases: &Phases) -> PhaseSpans {
        let mut spans = PhaseSpans::default();
        let intervals = [
            phases.queue,
            phases.prefill,
            phases.decode,
            phases.inference,
        ];
        for (i, interval) in intervals.into_iter().enumerate() {
            if let Some((s, e)) = interval {
                let attributes = self.phase_attributes(PHASE_NAMES[i], s, e);
                spans.set(i, self.wall(s), self.wall(e), attributes);
            }
        }
        spans
    }

    /// Ends the request now. Idempotent.
    pub(crate) fn finish(&mut self, how: End) {
        if self.finished {
            return;
        }
        self.finished = true;
        let end = Instant::now();
        let end_tick = tick_clock::ticks();
        let end_offset = self.offset(end);
        // Chunk ticks convert with this request's own pair of anchors.
        let ticks = TickSpan::new(self.arrival, self.arrival_tick, end, end_tick);
        let first_chunk = self.first_tick.map(|t| ticks.offset(t));
        let last_chunk = self.first_tick.map(|_| ticks.offset(self.last_tick));
        let marks = self.recorder.marks_at(end, end_tick);
        let strings = self.recorder.strings();

        let (outcome, error_type) = self.outcome(how, strings.error);

        let streamed = match self.recorder.stream_flag() {
            Some(s) => s,
            None => self.event_stream || (self.facts.grpc && self.chunks >= 2),
        };
        let phases = if self.rejected {
            Phases::default()
        } else {
            Phases::compute(&Marks {
                source: Some(self.state.shared.phase_source),
                scheduled: marks.scheduled,
                first_token: marks.first_token,
                last_token: marks.last_token,
                admitted: self.admitted.map(|t| self.offset(t)),
                never_admitted: self.waited && self.admitted.is_none(),
                responded: self.http_status.is_some(),
                refused: self.refused(outcome),
                ok: outcome == infer::outcome::OK,
                prefill_only: self.facts.operation == gen_ai::operation::EMBEDDINGS,
                first_chunk,
                last_chunk,
                streamed,
                end: end_offset,
            })
        };
        let measurements = self.measurements(&phases, &marks, end_offset);

        let request_model: Option<StringValue> = strings
            .request_model
            .map(|m| StringValue::from(Arc::clone(m)))
            .or_else(|| self.facts.request_model.clone());
        let response_model = strings.model.map(|m| StringValue::from(Arc::clone(m)));
        let model_for_name = request_model.clone().or_else(|| response_model.clone());

        let gaps = self.gaps.as_ref().map(|g| {
            let s = |v: Option<u64>| v.map(|t| secs(ticks.duration(t)));
            (s(g.quantile(0.50)), s(g.quantile(0.99)), s(g.max()))
        });
        let end_wall = self.wall(end_offset);
        match self.span.take() {
            Some(span) if span.is_recording() => {
                // The request model may only be known now (recorder), which also renames the
                // span.
                let model_changed = match (&self.facts.request_model, &model_for_name) {
                    (Some(old), Some(new)) => old.as_str() != new.as_str(),
                    (None, Some(_)) => true,
                    _ => false,
                };
                let late_model = model_for_name.as_ref().filter(|_| model_changed).map(|m| {
                    let name = crate::interning::span_name(&self.facts.operation, m.as_str());
                    (name, m.clone())
                });
                let end_attributes = EndAttributes {
                    response_model,
                    max_tokens: marks.max_tokens,
                    // Known when the handler said so or a response went out.
                    streamed: self
                        .recorder
                        .stream_flag()
                        .or(self.http_status.map(|_| streamed)),
                    response_id: strings.response_id.cloned(),
                    finish_reason: strings.finish_reason.cloned(),
                    input_tokens: marks.input_tokens,
                    output_tokens: marks.output_tokens,
                    cache_read_input_tokens: marks.cache_read_input_tokens,
                    status: self.status(outcome),
                    queue: measurements.queue,
                    ttft: measurements.ttft,
                    prefill: measurements.prefill,
                    decode: measurements.decode,
                    inference: match (measurements.prefill, measurements.decode) {
                        (Some(p), Some(d)) => Some(p + d),
                        (Some(p), None) => Some(p),
                        _ => phases.inference.map(duration_secs),
                    },
                    e2e: measurements.e2e,
                    tpot: measurements.tpot,
                    time_to_first_chunk: first_chunk.map(secs),
                    gaps,
                    chunks: self.chunks,
                    outcome,
                    phase_source: phases.source.map(PhaseSource::as_str),
                    queue_depth: self.queue_depth,
                    error_type: error_type.clone(),
                };
                let phase_spans = if span.span_context().is_sampled() {
                    self.phase_spans(&phases)
                } else {
                    PhaseSpans::default()
                };
                let finished = FinishedRequest {
                    end: end_wall,
                    late_model,
                    end_attributes,
                    phases: phase_spans,
                };
                self.state.sink.finish(span, finished, &self.cx);
            }
            Some(span) => self.state.sink.end(span, end_wall),
            None => {}
        }
        if let Some(energy) = &self.energy {
            energy.end();
        }

        if self.state.shared.record_metrics {
            let key = MetricKey {
                operation: self.facts.operation.clone(),
                outcome,
                model: model_for_name,
                error_type,
            };
            let metrics = &self.state.shared.metrics;
            metrics.record(&measurements, key);
            metrics.active_requests.add(-1, &[]);
        }
        // Free the admission slot only now: the engine is busy until the stream ends.
        self.permit = None;
    }

    /// What the request span and the metrics report of `phases`: their durations, TTFT, and
    /// TPOT = decode / (output tokens − 1). Without engine usage, a stream split at its chunks
    /// counts its chunks as its tokens (one token per SSE event / gRPC message).
    fn measurements(
        &self,
        phases: &Phases,
        marks: &RecorderMarks,
        end: Duration,
    ) -> RequestMeasurements {
        let token_count = marks
            .output_tokens
            .or(phases.chunks_are_tokens.then_some(self.chunks));
        let tpot = match (phases.decode, token_count) {
            (Some(decode), Some(n)) if n >= 2 => Some(duration_secs(decode) / (n - 1) as f64),
            _ => None,
        };
        RequestMeasurements {
            e2e: secs(end),
            ttft: phases.time_to_first_token.map(secs),
            tpot,
            queue: phases.queue.map(duration_secs),
            prefill: phases.prefill.map(duration_secs),
            decode: phases.decode.map(duration_secs),
            input_tokens: marks.input_tokens,
            output_tokens: marks.output_tokens,
        }
    }
}

/// The length of a phase `(start, end)`, seconds.
fn duration_secs((start, end): (Duration, Duration)) -> f64 {
    secs(end.saturating_sub(start))
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        self.finish(End::Cancelled);
    }
}
