//! [`TraceAssembler`]: groups spans by trace id and decides when a trace is complete.
//!
//! Rules (time is passed in, so every rule is unit-tested with explicit instants):
//! - A trace with a **request span** (as the dialects recognise one) is complete once the request
//!   span has arrived and the grace period (default 2 s; the pipeline lengthens it while spans
//!   arrive late, [`TraceAssembler::set_grace`]) has passed since the *most recent*
//!   request span arrived, so late children (and the request spans of outer services) are
//!   included. A stream that lasts minutes is fine: its request span is only emitted at its end,
//!   and completion follows that arrival, not a fixed wait.
//! - A trace without one is closed when no span arrived for the idle timeout (default 30 s).
//! - Any trace is closed at its maximum age (default 10 min after its first span).
//! - Bounded: at most `max_spans_per_trace` spans per trace (beyond, spans are dropped and
//!   counted in `dropped_spans_total{reason="max_spans_per_trace"}`; request spans have 64 more
//!   places, so that a trace its slices filled still gets its request) and `max_traces_in_flight`
//!   traces. A new trace that finds the table full never costs an accepted span: the oldest
//!   trace in flight is **closed early** to make room (its grace period shortened; counted in
//!   `traces_closed_early_total`) — first the oldest that has its request span (it is complete
//!   but for late children), else the oldest without one of the service holding the most of
//!   the oldest such traces — by number when the table is full, by memory when the limiter asks
//!   for relief (a sender flooding the table or the memory with traces that never complete gives
//!   up its own, not a light sender's). Early-closed traces are handed out by
//!   the next [`TraceAssembler::poll_some`], like any other.
//! - Memory: the caller reserves memory for a batch (the [`MemoryLimiter`]) and hands the
//!   reservation in as a [`MemoryHold`]; every trace that got spans from the batch keeps a clone,
//!   so the memory is released when the last of those traces completes.
//!
//! **Late spans.** The ids of recently completed traces are remembered (for the idle timeout to
//! twice it, but at most 2 × `max_traces_in_flight` of them, which at high completion rates
//! shortens the time; the `index` module keeps them). A span of such a trace is *late*: it is counted
//! (`late_spans_total`) and handed back by [`TraceAssembler::poll_some`] in [`Ready::late`], so the
//! pipeline can merge it where that is honest: into the stored trace behind
//! `/api/traces/{id}` (its critical path is recomputed), never into the KPIs a second time (its
//! request was already counted). Two kinds of late request span may be requests not counted
//! yet, and **re-open** the trace — a new trace of the same id, holding that span and the
//! trace's late spans not yet handed out (its children, which end and are exported before it),
//! completed like any other and marked [`CompletedTrace::reopened`], so that the pipeline
//! analyses it together with the earlier part it still holds and counts only requests that
//! part did not:
//! - any request span when the earlier part was closed *without* one (idle or max age);
//! - a request span that may be a request of its own (`is_new_request`, the pipeline passes
//!   `dialect::may_be_own_request`: an infertrace,
//!   vLLM or TGI request span — an agent's next LLM call in the same trace, or a service whose
//!   exporter sent after the grace period, counted per service as it would have been on time),
//!   unlike the parts of a request counted already (a disaggregated worker's span, an SGLang
//!   role span, a generic server span around an engine's request). A late generic server span
//!   (a gateway's) stays late; the pipeline counts a request it stands for that its stored
//!   trace did not (`dialect::may_be_late_request`).
//!
//! A span sent twice within one trace is counted once (duplicates are dropped at completion);
//! one re-sent after its trace completed is not counted again by the pipeline.
//!
//! **What a trace holds** is a [`HeldSpans`] (the one owner of a held trace's spans): its
//! decoded spans, or — when all its spans came in one batch and the pipeline analysed them on
//! arrival ([`TraceAssembler::insert_prepared`]) — that analysis, standing for the spans. The
//! assembler is a timing state machine over it: it decides when a trace completes and hands
//! the [`HeldSpans`] back in a [`CompletedTrace`]. If more spans of a prepared trace arrive
//! before it completes, the assembler takes the spans back ([`HeldSpans::into_spans`]) and the
//! trace continues as an ordinary one, analysed again at completion with every span. Only a
//! trace id the assembler does not know is taken as prepared. Prepared traces wait in a queue
//! in arrival order, which is their completion order (one grace period after arrival; arrival
//! instants are kept non-decreasing in the queue), and the trace index knows them completed by
//! sequence number, so completing one touches no table.
//!
//! [`MemoryLimiter`]: crate::limiter::MemoryLimiter

mod id_table;
mod index;
mod table_memory;

use std::any::Any;
use std::collections::{HashMap, VecDeque};

// Trace ids are random by specification; foldhash is several times cheaper than SipHash on
// them and still seeded per process (no hash flooding with chosen ids).
use foldhash::fast::RandomState;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{Span, TraceId};

use crate::held::{HeldSpans, PreparedRun, PreparedTrace};
use crate::internal_events::InternalEvents;
use index::{Known, TraceIndex};

/// How many of the oldest traces without a request span a full table looks at to find the
/// sender holding the most (the one that gives up a trace).
const FAIRNESS_WINDOW: usize = 64;

/// The most age entries that finding the [`FAIRNESS_WINDOW`] looks at, stale ones included
/// (a bound on one early close's cost).
const FAIRNESS_SCAN: usize = 16 * FAIRNESS_WINDOW;

/// What a sender's share of the traces in flight is measured in when one of its traces must
/// close early: their number when the table is full (`max_traces_in_flight`), their memory (the
/// spans they hold) when the limiter asks for relief.
#[derive(Clone, Copy, Debug)]
enum ShareOf {
    Traces,
    Memory,
}

/// Memory held for buffered spans (a limiter reservation): released when the last clone drops.
pub type MemoryHold = Arc<dyn Any + Send + Sync>;

/// The reservations a trace holds: nearly always one (its spans came in one batch), kept
/// inline so a trace costs no allocation for it.
#[derive(Debug, Default)]
pub struct Holds {
    first: Option<MemoryHold>,
    more: Vec<MemoryHold>,
}

impl Holds {
    /// Keeps `hold` unless it is the one added last.
    fn add(&mut self, hold: &MemoryHold) {
        let last = self.more.last().or(self.first.as_ref());
        if last.is_some_and(|l| Arc::ptr_eq(l, hold)) {
            return;
        }
        if self.first.is_none() {
            self.first = Some(hold.clone());
        } else {
            self.more.push(hold.clone());
        }
    }

    /// Reservations held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.more.len()
    }
}

/// Request spans a trace may hold beyond `max_spans_per_trace`: a trace its slices filled
/// (SGLang's per-step spans from every TP rank, which come before the span that stands for
/// the request) still gets its request.
const REQUEST_SPANS_OVER_CAP: usize = 64;

/// Most late spans kept between two polls; more are dropped (`late_span_buffer_full`).
const MAX_LATE_BUFFER: usize = 65_536;

/// What [`TraceAssembler::admit`] makes of a span of a trace not in flight.
enum Admitted {
    /// A late span of a completed trace (kept for the next poll, if the buffer has room).
    Late,
    /// A new trace, but the table is full and cannot make room.
    NoRoom,
    /// A new trace, to be put in the table.
    New(PendingTrace),
}

/// What one [`TraceAssembler::push`] counted: the positions of the spans it kept out, and why.
#[derive(Default)]
struct PushTally {
    kept_out: Vec<usize>,
    over_traces: u64,
    over_spans: u64,
    late: u64,
    late_overflow: u64,
}

impl PushTally {
    /// Adds the counts to the collector's internal metrics.
    fn count(&self, events: &InternalEvents) {
        events.spans_dropped("max_traces_in_flight", self.over_traces);
        events.spans_dropped("max_spans_per_trace", self.over_spans);
        events.spans_dropped("late_span_buffer_full", self.late_overflow);
        if self.late > 0 {
            events.late_spans.inc_by(self.late);
        }
    }
}

/// Adds the spans of one [`TraceAssembler::push`] to their traces: the assembler's fields
/// that every added span updates, borrowed beside the trace it goes to.
struct Arrivals<'a> {
    max_spans: usize,
    hold: Option<&'a MemoryHold>,
    now: Instant,
    waiting: &'a mut usize,
    by_grace: &'a mut VecDeque<(TraceId, Instant)>,
    longest_wait: &'a mut Option<Duration>,
    slack: &'a mut usize,
    tally: &'a mut PushTally,
}

impl Arrivals<'_> {
    /// Adds `span` (at `position` in the batch) to `trace`, unless the trace holds its bound
    /// of spans already (a request span may go past it: it completes the trace). A request
    /// span starts the trace's grace period; any later span of it says how long spans come
    /// after their request (`longest_wait`, which the grace period learns from).
    fn add(&mut self, trace: &mut PendingTrace, position: usize, span: Span, is_request: bool) {
        let cap = self.max_spans
            + if is_request {
                REQUEST_SPANS_OVER_CAP
            } else {
                0
            };
        if trace.spans.len() >= cap {
            self.tally.over_spans += 1;
            self.tally.kept_out.push(position);
            return;
        }
        let now = self.now;
        trace.last_seen = now;
        if let Some(at) = trace.request_at
            && !is_request
        {
            let wait = now.saturating_duration_since(at);
            *self.longest_wait = Some(self.longest_wait.map_or(wait, |l| l.max(wait)));
        }
        if is_request {
            if trace.request_at.is_none() {
                *self.waiting -= 1;
            }
            // One queue entry per arrival time: several request spans of one batch (a trace
            // across services) share it, and duplicates would all look live to `compact`,
            // which then ran on every push.
            if trace.request_at != Some(now) {
                trace.request_at = Some(now);
                self.by_grace.push_back((span.trace_id, now));
            }
        }
        let slack_before = trace.slack_bytes();
        if let Some(h) = self.hold {
            trace.holds.add(h);
        }
        trace.spans.push(span);
        *self.slack = *self.slack + trace.slack_bytes() - slack_before;
    }
}

/// Assembly bounds and timings.
#[derive(Clone, Debug, PartialEq)]
pub struct AssemblerConfig {
    /// Wait after the last request span's arrival.
    pub grace: Duration,
    /// Close a trace without a request span after this long with no new span.
    pub idle_timeout: Duration,
    /// Close any trace this long after its first span.
    pub max_age: Duration,
    /// Spans kept per trace.
    pub max_spans_per_trace: usize,
    /// Traces assembled at once (also bounds the completed ids remembered: twice this).
    pub max_traces_in_flight: usize,
}

impl Default for AssemblerConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
            max_age: Duration::from_secs(600),
            max_spans_per_trace: 10_000,
            max_traces_in_flight: 100_000,
        }
    }
}

/// Why a trace was closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// Its request span arrived and the grace period passed.
    Grace,
    /// No request span and no new span for the idle timeout.
    Idle,
    /// It reached the maximum age.
    MaxAge,
    /// The collector is shutting down (or a caller flushed).
    Flush,
    /// Closed before its time to make room for a new trace (`max_traces_in_flight`).
    Early,
}

/// A closed trace, ready for analysis.
#[derive(Debug)]
pub(crate) struct CompletedTrace {
    /// The trace id.
    pub trace_id: TraceId,
    /// Its spans (in arrival order), or the analysis made when they all arrived together.
    pub held: HeldSpans,
    /// Why it was closed.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "what the assembler decided, for tests")
    )]
    pub reason: CloseReason,
    /// Whether a request span was seen.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "what the assembler decided, for tests")
    )]
    pub has_request: bool,
    /// Memory held for the spans; dropping it (with the spans) releases the reservation.
    pub holds: Holds,
    /// Re-opened by a late request span (see the module docs): whether the trace's earlier
    /// part had a request. Its spans are to be analysed with that part's.
    pub reopened: Option<bool>,
    /// When its grace period began (its latest request span arrived); `None` without one.
    /// A span of it arriving later says how long the wait would have had to be.
    pub grace_from: Option<Instant>,
}

/// What [`TraceAssembler::poll`] hands back.
#[derive(Debug, Default)]
pub(crate) struct Ready {
    /// Traces closed by this poll.
    pub completed: Vec<CompletedTrace>,
    /// Spans that arrived after their trace was completed, since the last poll.
    pub late: Vec<Span>,
    /// The longest wait, since the last poll, from a trace's request span to a later span of it
    /// that arrived in time (while the trace waited for its grace period): what keeps a grace
    /// period learned from late spans once it holds them.
    pub longest_wait: Option<Duration>,
}

#[derive(Debug)]
struct PendingTrace {
    spans: Vec<Span>,
    first_seen: Instant,
    last_seen: Instant,
    request_at: Option<Instant>,
    holds: Holds,
    /// Re-opened by a late request span: whether the earlier part had a request.
    reopened: Option<bool>,
}

impl CompletedTrace {
    /// As [`PendingTrace::slack_bytes`], for a trace closed with its spans (a prepared trace's
    /// are counted whole by its reservation).
    fn slack_bytes(&self) -> usize {
        let spans = match &self.held {
            HeldSpans::Decoded(spans) => {
                (spans.capacity() - spans.len()) * std::mem::size_of::<Span>()
            }
            HeldSpans::Prepared(_) => 0,
        };
        spans + self.holds.more.capacity() * std::mem::size_of::<MemoryHold>()
    }
}

impl PendingTrace {
    /// Bytes allocated for this trace beyond what its spans' reservations cover: spare span
    /// slots (the vector grows by doubling) and the extra holds' vector.
    fn slack_bytes(&self) -> usize {
        (self.spans.capacity() - self.spans.len()) * std::mem::size_of::<Span>()
            + self.holds.more.capacity() * std::mem::size_of::<MemoryHold>()
    }
}

/// Groups spans into traces and closes them by the rules in the module docs.
pub(crate) struct TraceAssembler {
    config: AssemblerConfig,
    is_request: fn(&Span) -> bool,
    is_new_request: fn(&Span) -> bool,
    events: InternalEvents,
    /// Traces in flight as spans.
    traces: HashMap<TraceId, PendingTrace, RandomState>,
    /// Prepared traces in arrival order, which is also their completion order; the first has
    /// sequence number `prepared_base`.
    prepared: VecDeque<PreparedSlot>,
    prepared_base: u64,
    /// Prepared traces in flight (slots not handed over to `traces`).
    prepared_live: usize,
    /// (trace, first_seen) in first-seen order; entries of closed traces are skipped lazily.
    by_age: VecDeque<(TraceId, Instant)>,
    /// (trace, request arrival) in arrival order; stale entries are skipped lazily.
    by_grace: VecDeque<(TraceId, Instant)>,
    /// Every trace id in flight or recently completed.
    index: TraceIndex,
    late: Vec<Span>,
    /// The longest wait since the last poll (see [`Ready::longest_wait`]).
    longest_wait: Option<Duration>,
    /// Traces closed early to make room, for the next poll.
    early: Vec<CompletedTrace>,
    /// Traces were closed early for memory and wait in `early` for the next poll, which
    /// releases their memory: until then no more are closed for it.
    memory_relief_pending: bool,
    /// Traces in flight without a request span (the only ones the idle scan looks for).
    waiting: usize,
    last_idle_scan: Option<Instant>,
    /// Earliest idle deadline found by the last scan (`None`: scan at the next poll).
    next_idle_due: Option<Instant>,
    /// Where the tables' own memory is held (see `table_memory.rs`); `None`: not counted.
    table_memory: Option<crate::limiter::FixedMemory>,
    /// When the sparse tables were last looked at for shrinking.
    tables_shrunk_at: Option<Instant>,
    /// The sum of [`PendingTrace::slack_bytes`] over `traces`, kept as they change, so that
    /// the tables are measured after every batch without visiting every trace.
    slack: usize,
    /// The same for the traces closed early that wait in `early` for the next poll.
    early_slack: usize,
}

/// A prepared trace in the assembler's queue.
#[derive(Debug)]
struct PreparedSlot {
    id: TraceId,
    /// Its arrival (with its request span).
    at: Instant,
    /// `None` once more spans came and the trace moved to the map of span traces. The hold
    /// is on the last slot of its batch only: slots complete in queue order and a batch's are
    /// consecutive, so the batch's reservation is released when its last trace completes (or
    /// later, with a trace that left the queue as spans), and inserting a trace costs no
    /// reference-count increment per trace (an atomic on the hot path).
    held: Option<(Box<PreparedTrace>, Option<MemoryHold>)>,
}

impl std::fmt::Debug for TraceAssembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceAssembler")
            .field("config", &self.config)
            .field(
                "traces_in_flight",
                &(self.traces.len() + self.prepared_live),
            )
            .finish_non_exhaustive()
    }
}

impl TraceAssembler {
    /// A new assembler. `is_request` says whether a span is a request span (the completion
    /// signal), `is_new_request` whether such a span, arriving after its trace completed with a
    /// request, is a request of its own rather than part of one counted (the pipeline passes
    /// the dialects' rules).
    pub fn new(
        config: AssemblerConfig,
        events: InternalEvents,
        is_request: fn(&Span) -> bool,
        is_new_request: fn(&Span) -> bool,
    ) -> Self {
        Self {
            index: TraceIndex::new(config.idle_timeout, config.max_traces_in_flight),
            config,
            is_request,
            is_new_request,
            events,
            traces: HashMap::default(),
            prepared: VecDeque::new(),
            prepared_base: 0,
            prepared_live: 0,
            by_age: VecDeque::new(),
            by_grace: VecDeque::new(),
            late: Vec::new(),
            longest_wait: None,
            early: Vec::new(),
            memory_relief_pending: false,
            waiting: 0,
            last_idle_scan: None,
            next_idle_due: None,
            table_memory: None,
            tables_shrunk_at: None,
            slack: 0,
            early_slack: 0,
        }
    }

    /// Traces being assembled.
    pub fn traces_in_flight(&self) -> usize {
        self.traces.len() + self.prepared_live
    }

    /// Spans being held, over all traces.
    #[cfg(test)]
    pub fn spans_in_flight(&self) -> usize {
        let prepared: usize = self
            .prepared
            .iter()
            .filter_map(|s| s.held.as_ref())
            .map(|(p, _)| p.span_count())
            .sum();
        self.traces.values().map(|t| t.spans.len()).sum::<usize>() + prepared
    }

    /// Adds spans received at `now`. `hold` is the memory reservation covering them (kept until
    /// every trace holding one of the spans completes). Late spans are kept for the next
    /// [`poll`](Self::poll). Spans past a bound (`max_spans_per_trace`, a table that cannot make
    /// room, a full late-span buffer) are not kept and counted; returns their positions in
    /// `spans` (ascending), for the receiver to report them rejected and the forwarder to leave
    /// them out (never answered OK and then dropped, never reported rejected and then sent on).
    pub fn push(&mut self, spans: Vec<Span>, hold: Option<MemoryHold>, now: Instant) -> Vec<usize> {
        let mut tally = PushTally::default();
        let early_before = self.early.len();
        let is_request_span = self.is_request;
        let mut spans = spans.into_iter().enumerate().peekable();
        while let Some((position, span)) = spans.next() {
            let id = span.trace_id;
            let is_request = is_request_span(&span);
            let known = self.index.get(&id);
            if let Some(Known::Prepared(seq)) = known {
                // More spans of a prepared trace: it continues as a span trace.
                self.unprepare(id, seq);
            }
            // Only a trace the index knows to be in flight is looked up in the map.
            let in_flight = matches!(known, Some(Known::Spans | Known::Prepared(_)));
            let found = if in_flight {
                self.traces.get_mut(&id)
            } else {
                None
            };
            let trace = match found {
                Some(t) => t,
                None => match self.admit(&span, known, is_request, now, &mut tally) {
                    Admitted::Late => {
                        tally.late += 1;
                        if self.late.len() < MAX_LATE_BUFFER {
                            self.late.push(span);
                        } else {
                            tally.late_overflow += 1;
                            tally.kept_out.push(position);
                        }
                        continue;
                    }
                    Admitted::NoRoom => {
                        tally.over_traces += 1;
                        tally.kept_out.push(position);
                        continue;
                    }
                    Admitted::New(pending) => {
                        let trace = self.traces.entry(id).or_insert(pending);
                        self.slack += trace.slack_bytes();
                        trace
                    }
                },
            };
            let mut to = Arrivals {
                max_spans: self.config.max_spans_per_trace,
                hold: hold.as_ref(),
                now,
                waiting: &mut self.waiting,
                by_grace: &mut self.by_grace,
                longest_wait: &mut self.longest_wait,
                slack: &mut self.slack,
                tally: &mut tally,
            };
            to.add(trace, position, span, is_request);
            // The spans of one trace usually arrive together: those that follow go to the same
            // entry without another lookup in a map of (at full rate) a million traces.
            while let Some((position, next)) = spans.next_if(|(_, s)| s.trace_id == id) {
                let is_request = is_request_span(&next);
                to.add(trace, position, next, is_request);
            }
        }
        self.events
            .traces_closed_early("max_traces_in_flight", self.early.len() - early_before);
        tally.count(&self.events);
        self.events
            .traces_in_flight
            .set(self.traces_in_flight() as i64);
        self.compact();
        tally.kept_out
    }

    /// Whether a span of a trace not in flight (`known` by the index as completed, or not at
    /// all) starts a new one, and the trace if so, registered in the index and the age queue
    /// (the caller puts it in the table). A request span after its trace completed with a
    /// request is a request of its own (counted once: see the module docs), which takes back
    /// its spans that came just before it (a request's children end first) from the late spans
    /// not handed out yet; any other span of a completed trace is late. A full table that
    /// cannot make room takes no new trace.
    fn admit(
        &mut self,
        span: &Span,
        known: Option<Known>,
        is_request: bool,
        now: Instant,
        tally: &mut PushTally,
    ) -> Admitted {
        let reopened = match known {
            Some(Known::Completed { had_request })
                if is_request && (!had_request || (self.is_new_request)(span)) =>
            {
                Some(had_request)
            }
            _ => None,
        };
        if matches!(known, Some(Known::Completed { .. })) && reopened.is_none() {
            return Admitted::Late;
        }
        if self.traces.len() + self.prepared_live >= self.config.max_traces_in_flight
            && !self.make_room(ShareOf::Traces, now)
        {
            return Admitted::NoRoom;
        }
        let id = span.trace_id;
        // An inference trace is typically a request span and three phases.
        let mut spans = Vec::with_capacity(4);
        if reopened.is_some() {
            // Up to the trace's bound; those past it are counted dropped.
            let max_spans = self.config.max_spans_per_trace;
            let (mut back, rest): (Vec<Span>, Vec<Span>) = std::mem::take(&mut self.late)
                .into_iter()
                .partition(|s: &Span| s.trace_id == id);
            tally.over_spans += back.len().saturating_sub(max_spans) as u64;
            back.truncate(max_spans);
            self.late = rest;
            spans = back;
        }
        self.index.set_spans(&id);
        self.by_age.push_back((id, now));
        self.waiting += 1;
        Admitted::New(PendingTrace {
            spans,
            first_seen: now,
            last_seen: now,
            request_at: None,
            holds: Holds::default(),
            reopened,
        })
    }

    /// Moves the prepared trace `seq` (of `id`) to the map of span traces, with its spans
    /// decoded again, its arrival as first and last seen and its request arrival, and its
    /// memory hold; its queue slot stays as its grace entry.
    fn unprepare(&mut self, id: TraceId, seq: u64) {
        let Some(slot) = seq
            .checked_sub(self.prepared_base)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.prepared.get_mut(i))
        else {
            return;
        };
        let Some((prepared, hold)) = slot.held.take() else {
            return;
        };
        let at = slot.at;
        self.prepared_live -= 1;
        let mut holds = Holds::default();
        if let Some(hold) = &hold {
            holds.add(hold);
        }
        let trace = PendingTrace {
            spans: HeldSpans::Prepared(prepared).into_spans(),
            first_seen: at,
            last_seen: at,
            request_at: Some(at),
            holds,
            reopened: None,
        };
        self.slack += trace.slack_bytes();
        if let Some(replaced) = self.traces.insert(id, trace) {
            self.slack -= replaced.slack_bytes();
        }
        self.index.set_spans(&id);
        // Out of order by at most the grace period: max age may close it that much late.
        self.by_age.push_back((id, at));
    }

    /// Starts a trace for each of `runs` whose trace is new (not in flight, not completed with
    /// a request) while the bounds allow: it holds the run's analysis instead of its spans, and
    /// `taken[i]` is set for each span `i` of the run, which the caller then drops. The spans
    /// of the other runs are for the caller to [`push`](Self::push) (their analyses are
    /// dropped). Each run holds a request span: the trace completes after the grace period.
    pub fn insert_prepared(
        &mut self,
        runs: Vec<PreparedRun>,
        taken: &mut [bool],
        hold: &MemoryHold,
        now: Instant,
    ) {
        let mut inserted = false;
        let early_before = self.early.len();
        for run in runs {
            let end = run.start + run.len;
            if end <= taken.len() && self.insert_one(run.trace_id, run.prepared, run.len, now) {
                taken[run.start..end].fill(true);
                inserted = true;
            }
        }
        // The batch's reservation rides on its last slot (see `PreparedSlot::held`).
        if inserted
            && let Some(PreparedSlot {
                held: Some((_, last)),
                ..
            }) = self.prepared.back_mut()
        {
            *last = Some(hold.clone());
        }
        self.events
            .traces_closed_early("max_traces_in_flight", self.early.len() - early_before);
        self.events
            .traces_in_flight
            .set(self.traces_in_flight() as i64);
    }

    /// Looks every id of `ids` up in the trace index, discarding the answers, so that the
    /// lookups that follow find their table entries in cache. A new trace's entry is a cold
    /// miss in a table of millions of ids; in this tight loop the processor overlaps many of
    /// those misses, where one lookup per iteration of a longer loop waits for each in turn.
    pub fn warm_index<'a>(&self, ids: impl Iterator<Item = &'a TraceId>) {
        for id in ids {
            std::hint::black_box(self.index.get(id));
        }
    }

    /// Prepared traces in flight.
    pub fn prepared_in_flight(&self) -> usize {
        self.prepared_live
    }

    /// The memory the spans of `id` would take back if `id` is a prepared trace in flight
    /// ([`PreparedTrace::span_bytes`]; pushing a span of it makes the assembler take them
    /// back), else 0.
    pub fn prepared_span_bytes(&self, id: &TraceId) -> usize {
        let Some(Known::Prepared(seq)) = self.index.get(id) else {
            return 0;
        };
        seq.checked_sub(self.prepared_base)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.prepared.get(i))
            .and_then(|slot| slot.held.as_ref())
            .map_or(0, |(p, _)| p.span_bytes())
    }

    /// Whether [`insert_prepared`](Self::insert_prepared) would take a run of `len` spans of
    /// trace `id`. A full table is no reason not to: inserting closes the oldest trace early.
    pub fn would_take(&self, id: &TraceId, len: usize) -> bool {
        if len > self.config.max_spans_per_trace
            || self.config.max_traces_in_flight == 0
            || self.config.grace >= self.config.max_age
        {
            return false;
        }
        // Only a new trace. In flight: the caller pushes the spans to it. Completed: the spans
        // are late, or (a request not counted yet) re-open the trace, which the span path
        // sorts out span by span.
        self.index.get(id).is_none()
    }

    /// Starts a trace holding `prepared` (standing for `len` spans, one a request span) when
    /// `id` is new and the bounds allow; `false` leaves everything as it was.
    fn insert_one(
        &mut self,
        id: TraceId,
        prepared: Box<PreparedTrace>,
        len: usize,
        now: Instant,
    ) -> bool {
        // (A prepared trace completes at its grace period, so that must come before max age.)
        if !self.would_take(&id, len) {
            return false;
        }
        if self.traces_in_flight() >= self.config.max_traces_in_flight
            && !self.make_room(ShareOf::Traces, now)
        {
            return false;
        }
        let seq = self.prepared_base + self.prepared.len() as u64;
        self.index.set_prepared(&id, seq);
        // Receiver threads take their instant before analysing a batch, so one may insert a
        // little after another with a later instant: the queue stays in due order.
        let at = self.prepared.back().map_or(now, |last| now.max(last.at));
        self.prepared.push_back(PreparedSlot {
            id,
            at,
            held: Some((prepared, None)),
        });
        self.prepared_live += 1;
        true
    }

    /// Closes every trace due at `now` and returns them with the late spans since the last poll.
    #[cfg(test)]
    pub fn poll(&mut self, now: Instant) -> Ready {
        self.poll_some(now, usize::MAX)
    }

    /// Like [`poll`](Self::poll), but closes at most about `max` of the traces due by their
    /// grace period (those due by idle timeout or max age all close): a caller that analyses
    /// what it gets polls again while it gets that many, so each round's vector stays small
    /// (and reused by the allocator) rather than one vector of every trace due at once.
    pub fn poll_some(&mut self, now: Instant, max: usize) -> Ready {
        let grace = self.config.grace;
        let due = self.by_grace.partition_point(|&(_, at)| at + grace <= now)
            + self.prepared.partition_point(|s| s.at + grace <= now);
        let mut completed = Vec::with_capacity(due.min(max) + self.early.len());
        completed.append(&mut self.early);
        self.early_slack = 0;
        self.memory_relief_pending = false;
        // Prepared traces, in arrival order, which is due order; no table is touched.
        while let Some(slot) = self.prepared.front() {
            if slot.at + grace > now || completed.len() >= max {
                break;
            }
            if let Some(t) = self.close_prepared_front(CloseReason::Grace, now) {
                completed.push(t);
            }
        }
        // Grace: request arrival order is also due order.
        while let Some(&(id, at)) = self.by_grace.front() {
            if at + self.config.grace > now || completed.len() >= max {
                break;
            }
            self.by_grace.pop_front();
            let current = self
                .traces
                .get(&id)
                .is_some_and(|t| t.request_at == Some(at));
            if current && let Some(t) = self.close(id, CloseReason::Grace, now) {
                // Traces usually complete in the order they started: drop the age entry now
                // rather than leave it for a compaction pass over the whole queue.
                if self.by_age.front().is_some_and(|(front, _)| *front == id) {
                    self.by_age.pop_front();
                }
                completed.push(t);
            }
        }
        // Max age: first-seen order is also due order.
        while let Some(&(id, first)) = self.by_age.front() {
            if first + self.config.max_age > now {
                break;
            }
            self.by_age.pop_front();
            let current = self.traces.get(&id).is_some_and(|t| t.first_seen == first);
            if current && let Some(t) = self.close(id, CloseReason::MaxAge, now) {
                completed.push(t);
            }
        }
        // Idle: a scan, when the earliest idle deadline seen by the last scan has passed, and at
        // most every idle_timeout / 64 (a trace closes at most ~1.6% of the timeout late).
        let min_gap = (self.config.idle_timeout / 64).max(Duration::from_millis(1));
        let gap_ok = self.last_idle_scan.is_none_or(|t| now >= t + min_gap);
        if self.waiting == 0 {
            // Nothing to find: the scan would walk every trace in flight for none.
            self.next_idle_due = None;
        } else if gap_ok && self.next_idle_due.is_none_or(|d| now >= d) {
            self.last_idle_scan = Some(now);
            let idle = self.config.idle_timeout;
            let mut next_due: Option<Instant> = None;
            let mut due = Vec::new();
            for (id, t) in &self.traces {
                if t.request_at.is_some() {
                    continue;
                }
                let d = t.last_seen + idle;
                if d <= now {
                    due.push(*id);
                } else {
                    next_due = Some(next_due.map_or(d, |n| n.min(d)));
                }
            }
            // New traces and new spans only move deadlines later, so this is a lower bound.
            self.next_idle_due = next_due;
            for id in due {
                if let Some(t) = self.close(id, CloseReason::Idle, now) {
                    completed.push(t);
                }
            }
        }
        self.forget_completed(now);
        self.events
            .traces_in_flight
            .set(self.traces_in_flight() as i64);
        debug_assert_eq!(
            self.waiting,
            self.traces
                .values()
                .filter(|t| t.request_at.is_none())
                .count()
        );
        Ready {
            completed,
            late: std::mem::take(&mut self.late),
            longest_wait: self.longest_wait.take(),
        }
    }

    /// Pops the oldest prepared slot and closes its trace for `reason`: the prepared trace it
    /// holds, or — when more spans turned it into a span trace — that trace, if this slot is
    /// still its grace entry. `None` when the slot closed nothing (or the queue is empty).
    fn close_prepared_front(
        &mut self,
        reason: CloseReason,
        now: Instant,
    ) -> Option<CompletedTrace> {
        let slot = self.prepared.pop_front()?;
        self.prepared_base += 1;
        let done = slot.held.is_some();
        self.index
            .prepared_completed_below(self.prepared_base, done, now);
        match slot.held {
            Some((prepared, hold)) => {
                self.prepared_live -= 1;
                Some(CompletedTrace {
                    trace_id: slot.id,
                    held: HeldSpans::Prepared(prepared),
                    reason,
                    has_request: true,
                    holds: Holds {
                        first: hold,
                        more: Vec::new(),
                    },
                    reopened: None,
                    grace_from: Some(slot.at),
                })
            }
            None => {
                let current = self
                    .traces
                    .get(&slot.id)
                    .is_some_and(|t| t.request_at == Some(slot.at));
                if current {
                    self.close(slot.id, reason, now)
                } else {
                    None
                }
            }
        }
    }

    /// Closes the oldest trace in flight early ([`CloseReason::Early`]) so that a new one fits:
    /// the oldest with its request span (prepared or not) if any, else the oldest without one
    /// of the sender holding the largest `share` of such traces. The trace waits in `early` for
    /// the next poll. `false` when nothing was in flight.
    fn make_room(&mut self, share: ShareOf, now: Instant) -> bool {
        // Traces with their request span, in request-arrival order: two queues, each in order.
        loop {
            let prepared_at = self.prepared.front().map(|s| s.at);
            let grace_at = self.by_grace.front().map(|&(_, at)| at);
            let closed = match (prepared_at, grace_at) {
                (None, None) => break,
                (Some(p), g) if g.is_none_or(|g| p <= g) => {
                    self.close_prepared_front(CloseReason::Early, now)
                }
                _ => match self.by_grace.pop_front() {
                    Some((id, at)) => {
                        let current = self
                            .traces
                            .get(&id)
                            .is_some_and(|t| t.request_at == Some(at));
                        if current {
                            self.close(id, CloseReason::Early, now)
                        } else {
                            None
                        }
                    }
                    None => break,
                },
            };
            if let Some(t) = closed {
                return self.closed_early(t);
            }
        }
        // Only traces without a request span are left: the oldest of the sender holding the
        // most of them (see `FAIRNESS_WINDOW`).
        match self.oldest_of_the_largest_service(share) {
            Some(id) => match self.close(id, CloseReason::Early, now) {
                Some(t) => self.closed_early(t),
                None => false,
            },
            None => false,
        }
    }

    /// Among the oldest [`FAIRNESS_WINDOW`] traces without a request span, the oldest one of
    /// the service that holds the largest `share` of them: a sender flooding the table (or the
    /// memory) with traces that never complete gives up its own, not a light sender's. Its age
    /// entry goes with it: left behind, the flooding sender's closed traces would pile up
    /// behind a light sender's oldest trace until that one was all the window saw. Stale
    /// entries (traces closed another way) are dropped at the front.
    fn oldest_of_the_largest_service(&mut self, share: ShareOf) -> Option<TraceId> {
        while let Some(&(id, first)) = self.by_age.front() {
            if self.traces.get(&id).is_some_and(|t| t.first_seen == first) {
                break;
            }
            self.by_age.pop_front();
        }
        let at = self.largest_services_oldest(share)?;
        self.by_age.remove(at).map(|(id, _)| id)
    }

    /// The age-queue index of the oldest trace of the service holding the largest `share` of
    /// the [`FAIRNESS_WINDOW`] oldest live traces (stale entries passed over, at most
    /// [`FAIRNESS_SCAN`] entries looked at).
    fn largest_services_oldest(&self, share: ShareOf) -> Option<usize> {
        let live = self
            .by_age
            .iter()
            .enumerate()
            .take(FAIRNESS_SCAN)
            .filter_map(|(at, (id, first))| {
                let trace = self.traces.get(id).filter(|t| t.first_seen == *first)?;
                Some((at, trace))
            })
            .take(FAIRNESS_WINDOW);
        // (service, its share of the window, the index of its oldest), in order of first
        // appearance.
        let mut services: Vec<(&Text, usize, usize)> = Vec::new();
        for (at, trace) in live {
            let Some(service) = trace.spans.first().map(|s| &s.service) else {
                continue;
            };
            let weight = match share {
                ShareOf::Traces => 1,
                // Spans held, for their memory: O(1) under the lock, where summing each span's
                // footprint would walk up to 64 × `max_spans_per_trace` spans per close.
                ShareOf::Memory => trace.spans.len(),
            };
            match services.iter_mut().find(|(s, _, _)| *s == service) {
                Some(entry) => entry.1 += weight,
                None => services.push((service, weight, at)),
            }
        }
        // The largest; among equals the one seen first, whose oldest trace is the oldest.
        let mut pick: Option<(usize, usize)> = None;
        for &(_, count, at) in &services {
            if pick.is_none_or(|(most, _)| count > most) {
                pick = Some((count, at));
            }
        }
        pick.map(|(_, at)| at)
    }

    /// Closes early the oldest `n` traces in flight (chosen as when the table is full, see
    /// [`make_room`](Self::make_room)), so that the next poll hands them out and the memory
    /// they hold is released: the memory limiter's relief, before any request is refused. Does
    /// nothing while traces closed for it earlier still wait for that poll. Returns how many it
    /// closed (counted as `traces_closed_early_total{reason="memory"}`).
    pub fn close_oldest_for_memory(&mut self, n: usize, now: Instant) -> usize {
        if self.memory_relief_pending || n == 0 {
            return 0;
        }
        let mut closed = 0;
        while closed < n && self.make_room(ShareOf::Memory, now) {
            closed += 1;
        }
        self.memory_relief_pending = closed > 0;
        self.events.traces_closed_early("memory", closed);
        self.events
            .traces_in_flight
            .set(self.traces_in_flight() as i64);
        closed
    }

    fn closed_early(&mut self, trace: CompletedTrace) -> bool {
        self.early_slack += trace.slack_bytes();
        self.early.push(trace);
        true
    }

    /// The grace period from now on (the pipeline learns it from late spans, within the
    /// configured bounds): traces waiting complete one new grace period after their request
    /// span arrived.
    pub fn set_grace(&mut self, grace: Duration) {
        self.config.grace = grace;
    }

    /// Closes every trace now, whatever its state (shutdown).
    pub fn flush(&mut self, now: Instant) -> Ready {
        let mut completed = Vec::with_capacity(self.traces_in_flight() + self.early.len());
        completed.append(&mut self.early);
        self.early_slack = 0;
        self.memory_relief_pending = false;
        for slot in std::mem::take(&mut self.prepared) {
            self.prepared_base += 1;
            let done = slot.held.is_some();
            self.index
                .prepared_completed_below(self.prepared_base, done, now);
            if let Some((prepared, hold)) = slot.held {
                completed.push(CompletedTrace {
                    trace_id: slot.id,
                    held: HeldSpans::Prepared(prepared),
                    reason: CloseReason::Flush,
                    has_request: true,
                    holds: Holds {
                        first: hold,
                        more: Vec::new(),
                    },
                    reopened: None,
                    grace_from: Some(slot.at),
                });
            }
        }
        self.prepared_live = 0;
        let ids: Vec<TraceId> = self.traces.keys().copied().collect();
        completed.extend(
            ids.into_iter()
                .filter_map(|id| self.close(id, CloseReason::Flush, now)),
        );
        self.by_age.clear();
        self.by_grace.clear();
        self.events.traces_in_flight.set(0);
        Ready {
            completed,
            late: std::mem::take(&mut self.late),
            longest_wait: self.longest_wait.take(),
        }
    }

    fn close(&mut self, id: TraceId, reason: CloseReason, now: Instant) -> Option<CompletedTrace> {
        let mut t = self.traces.remove(&id)?;
        self.slack -= t.slack_bytes();
        let duplicates = drop_duplicate_spans(&mut t.spans);
        if duplicates > 0 {
            self.events.duplicate_spans.inc_by(duplicates as u64);
        }
        let has_request = t.request_at.is_some();
        self.waiting -= usize::from(!has_request);
        self.index.set_completed(&id, has_request, now);
        Some(CompletedTrace {
            trace_id: id,
            held: HeldSpans::Decoded(t.spans),
            reason,
            has_request,
            holds: t.holds,
            reopened: t.reopened,
            grace_from: t.request_at,
        })
    }

    /// Forgets completed ids older than the idle timeout (see [`TraceIndex`]).
    fn forget_completed(&mut self, now: Instant) {
        self.index.rotate(now);
    }

    /// Drops stale queue entries when they outnumber live traces (amortised O(1) per push).
    fn compact(&mut self) {
        let live = self.traces.len();
        if self.by_age.len() > 2 * live + 1024 {
            let traces = &self.traces;
            self.by_age
                .retain(|(id, first)| traces.get(id).is_some_and(|t| t.first_seen == *first));
        }
        if self.by_grace.len() > 2 * live + 1024 {
            let traces = &self.traces;
            self.by_grace
                .retain(|(id, at)| traces.get(id).is_some_and(|t| t.request_at == Some(*at)));
        }
    }
}

/// Whether two of `spans` share a span id (see [`drop_duplicate_spans`]): the pipeline leaves
/// such a trace to be assembled as spans rather than analysed on arrival. Pairwise for the
/// usual few spans, hashed past that.
pub(crate) fn has_duplicate_span_ids(spans: &[Span]) -> bool {
    const PAIRWISE: usize = 16;
    if spans.len() <= PAIRWISE {
        return (1..spans.len()).any(|i| spans[..i].iter().any(|s| s.span_id == spans[i].span_id));
    }
    let mut seen = foldhash::HashSet::with_capacity_and_hasher(spans.len(), Default::default());
    !spans.iter().all(|s| seen.insert(s.span_id))
}

/// Drops the spans whose span id an earlier span of the trace has (OTLP: a span id is unique
/// in its trace), keeping the first and the order; returns how many it dropped. A client that
/// sends a batch again (a retry after a timeout) would otherwise count its requests twice
/// while the trace is assembled. Costs one [`has_duplicate_span_ids`] when there are none.
fn drop_duplicate_spans(spans: &mut Vec<Span>) -> usize {
    if !has_duplicate_span_ids(spans) {
        return 0;
    }
    let before = spans.len();
    let mut seen = foldhash::HashSet::with_capacity_and_hasher(before, Default::default());
    spans.retain(|s| seen.insert(s.span_id));
    before - spans.len()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::held::{Analysed, SpanSource};
    use infertrace_analysis::text::Text;
    use infertrace_analysis::trace::{SpanId, SpanKind};

    fn span(trace: u8, id: u8, name: &str) -> Span {
        Span {
            trace_id: TraceId([trace; 16]),
            span_id: SpanId([id; 8]),
            parent_span_id: None,
            name: name.into(),
            service: Text::from("svc"),
            kind: SpanKind::Internal,
            start_unix_nano: 1,
            end_unix_nano: 2,
            status: Default::default(),
            attributes: Vec::new(),
            links: Vec::new(),
        }
    }

    fn is_request(s: &Span) -> bool {
        s.name == "request" || is_new_request(s)
    }

    fn is_new_request(s: &Span) -> bool {
        s.name == "call"
    }

    fn assembler(config: AssemblerConfig) -> (TraceAssembler, InternalEvents) {
        let events = InternalEvents::default();
        (
            TraceAssembler::new(config, events.clone(), is_request, is_new_request),
            events,
        )
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn duplicate_spans_are_dropped_keeping_the_first_and_the_order() {
        for n in [5usize, 40] {
            // Spans 0..n, then every third again (with another name), then span 1 again.
            let mut spans: Vec<Span> = (0..n)
                .map(|i| {
                    let mut s = span(1, i as u8 + 1, "first");
                    s.start_unix_nano = i as u64;
                    s
                })
                .collect();
            for i in (0..n).step_by(3) {
                spans.push(span(1, i as u8 + 1, "again"));
            }
            spans.push(span(1, 2, "again"));
            let dropped = drop_duplicate_spans(&mut spans);
            assert_eq!(dropped, n.div_ceil(3) + 1, "{n} spans");
            let starts: Vec<u64> = spans.iter().map(|s| s.start_unix_nano).collect();
            assert_eq!(starts, (0..n as u64).collect::<Vec<_>>(), "{n} spans");
            assert!(spans.iter().all(|s| &*s.name == "first"), "{n} spans");
        }
    }

    #[test]
    fn request_trace_completes_after_grace() {
        let (mut a, events) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        a.push(vec![span(1, 1, "queue")], None, t0);
        a.push(vec![span(1, 2, "request")], None, t0 + secs(1.0));
        assert_eq!(events.traces_in_flight.get(), 1);
        assert!(
            a.poll(t0 + secs(2.9)).completed.is_empty(),
            "grace counts from the request"
        );
        a.push(vec![span(1, 3, "decode")], None, t0 + secs(2.95));
        let done = a.poll(t0 + secs(3.0)).completed;
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].reason, CloseReason::Grace);
        assert_eq!(
            done[0].held.span_count(),
            3,
            "the child inside the grace period is included"
        );
        assert!(done[0].has_request);
        assert_eq!(a.traces_in_flight(), 0);
        assert_eq!(events.traces_in_flight.get(), 0);
    }

    #[test]
    fn a_second_request_span_restarts_grace() {
        let (mut a, _) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        a.push(vec![span(1, 1, "request")], None, t0);
        a.push(vec![span(1, 2, "request")], None, t0 + secs(1.5));
        assert!(a.poll(t0 + secs(2.0)).completed.is_empty());
        assert_eq!(a.poll(t0 + secs(3.5)).completed.len(), 1);
    }

    #[test]
    fn long_stream_completes_from_its_request_span_not_its_start() {
        let (mut a, _) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        // A five-minute stream: an engine span arrives early, the request span at the end.
        a.push(vec![span(1, 1, "tokenize")], None, t0);
        for i in 1..30 {
            a.push(
                vec![span(1, 10 + i, "step")],
                None,
                t0 + secs(10.0 * i as f64),
            );
            assert!(a.poll(t0 + secs(10.0 * i as f64)).completed.is_empty());
        }
        a.push(vec![span(1, 2, "request")], None, t0 + secs(300.0));
        assert!(a.poll(t0 + secs(301.0)).completed.is_empty());
        let done = a.poll(t0 + secs(302.0)).completed;
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].held.span_count(), 31);
    }

    #[test]
    fn trace_without_request_closes_on_idle() {
        let (mut a, _) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        a.push(vec![span(2, 1, "db")], None, t0);
        a.push(vec![span(2, 2, "db")], None, t0 + secs(10.0));
        assert!(
            a.poll(t0 + secs(39.0)).completed.is_empty(),
            "idle counts from the last span"
        );
        let done = a.poll(t0 + secs(40.0)).completed;
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].reason, CloseReason::Idle);
        assert!(!done[0].has_request);
    }

    #[test]
    fn busy_trace_closes_at_max_age() {
        let cfg = AssemblerConfig {
            max_age: secs(60.0),
            ..Default::default()
        };
        let (mut a, _) = assembler(cfg);
        let t0 = Instant::now();
        let mut closed = None;
        for i in 0..13 {
            let now = t0 + secs(5.0 * i as f64);
            a.push(vec![span(3, i, "chatty")], None, now);
            let done = a.poll(now).completed;
            if !done.is_empty() {
                closed = Some((i, done));
                break;
            }
        }
        let (i, done) = closed.expect("closed by max age");
        assert_eq!(i, 12, "at 60 s");
        assert_eq!(done[0].reason, CloseReason::MaxAge);
        assert_eq!(done[0].held.span_count(), 13);
    }

    #[test]
    fn late_spans_are_counted_and_handed_back() {
        let (mut a, events) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        a.push(vec![span(1, 1, "request")], None, t0);
        assert_eq!(a.poll(t0 + secs(2.0)).completed.len(), 1);
        a.push(
            vec![span(1, 2, "decode"), span(1, 3, "request")],
            None,
            t0 + secs(3.0),
        );
        assert_eq!(
            a.traces_in_flight(),
            0,
            "late spans do not reopen a counted trace"
        );
        let ready = a.poll(t0 + secs(3.1));
        assert_eq!(ready.late.len(), 2);
        assert_eq!(events.late_spans.get(), 2);
        assert!(a.poll(t0 + secs(3.2)).late.is_empty(), "handed back once");
    }

    #[test]
    fn a_late_request_of_its_own_reopens_the_trace_with_its_children() {
        let (mut a, events) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        a.push(vec![span(1, 1, "call")], None, t0);
        assert_eq!(a.poll(t0 + secs(2.0)).completed.len(), 1);
        // The next call's child came a batch before it; a part of the first came too.
        a.push(
            vec![span(1, 2, "decode"), span(1, 3, "request")],
            None,
            t0 + secs(3.0),
        );
        a.push(vec![span(1, 4, "call")], None, t0 + secs(3.05));
        assert_eq!(a.traces_in_flight(), 1);
        let ready = a.poll(t0 + secs(3.1));
        assert!(ready.completed.is_empty());
        assert!(ready.late.is_empty(), "taken back by the re-opened trace");
        let done = a.poll(t0 + secs(5.1)).completed;
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].held.span_count(), 3);
        assert_eq!(events.late_spans.get(), 2);
    }

    #[test]
    fn late_spans_past_the_bound_of_a_reopened_trace_are_counted_dropped() {
        let cfg = AssemblerConfig {
            max_spans_per_trace: 2,
            ..Default::default()
        };
        let (mut a, events) = assembler(cfg);
        let t0 = Instant::now();
        a.push(vec![span(1, 1, "call")], None, t0);
        assert_eq!(a.poll(t0 + secs(2.0)).completed.len(), 1);
        let children: Vec<Span> = (2..6).map(|i| span(1, i, "decode")).collect();
        a.push(children, None, t0 + secs(3.0));
        a.push(vec![span(1, 9, "call")], None, t0 + secs(3.05));
        assert_eq!(events.dropped("max_spans_per_trace"), 2);
        let done = a.poll(t0 + secs(5.1)).completed;
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].held.span_count(), 3, "two taken back and the call");
    }

    /// The running sum of the traces' slack (which the tables' measure reads after every
    /// batch) equals a walk of every trace through growth past several doublings, extra
    /// holds, a prepared trace continued as spans, a re-opened trace, closes, early closes
    /// for memory and a flush.
    #[test]
    fn the_running_slack_equals_a_walk_of_the_traces() {
        let (mut a, _) = assembler(AssemblerConfig::default());
        let walk = |a: &TraceAssembler| {
            a.traces
                .values()
                .map(PendingTrace::slack_bytes)
                .sum::<usize>()
        };
        let t0 = Instant::now();
        let mut at = t0;
        for round in 0..6u8 {
            // Traces 1..=20 get 1..=20 spans a round, each round under a hold of its own.
            let spans: Vec<Span> = (1..=20u8)
                .flat_map(|t| (0..t).map(move |i| span(t, round * 20 + i + 1, "slice")))
                .collect();
            let hold: MemoryHold = Arc::new(());
            a.push(spans, Some(hold), at);
            assert_eq!(a.slack, walk(&a), "round {round}");
            at += secs(0.01);
        }
        assert!(a.slack > 0);
        // A prepared trace continued as spans.
        push_run(
            &mut a,
            vec![span(30, 1, "request"), span(30, 2, "queue")],
            0,
            2,
            at,
        );
        a.push(vec![span(30, 3, "decode")], None, at);
        assert_eq!(a.slack, walk(&a), "continued");
        // A trace with a request, closed at its grace, then re-opened by a new call.
        a.push(vec![span(31, 1, "call")], None, at);
        assert!(!a.poll(at + secs(2.0)).completed.is_empty());
        assert_eq!(a.slack, walk(&a), "closed at grace");
        a.push(vec![span(31, 2, "decode")], None, at + secs(2.5));
        a.push(vec![span(31, 3, "call")], None, at + secs(2.6));
        assert_eq!(a.slack, walk(&a), "re-opened");
        assert_eq!(a.close_oldest_for_memory(5, at + secs(2.7)), 5);
        assert_eq!(a.slack, walk(&a), "closed for memory");
        let early: usize = a.early.iter().map(CompletedTrace::slack_bytes).sum();
        assert!(early > 0);
        assert_eq!(a.early_slack, early, "waiting for the poll");
        a.poll(at + secs(2.7));
        assert_eq!(a.early_slack, 0, "handed out");
        a.flush(at + secs(2.8));
        assert_eq!(a.slack, 0, "flushed");
    }

    #[test]
    fn a_request_span_has_places_beyond_the_span_cap() {
        let config = AssemblerConfig {
            max_spans_per_trace: 3,
            ..AssemblerConfig::default()
        };
        let (mut a, events) = assembler(config);
        let t0 = Instant::now();
        let mut spans: Vec<Span> = (1..=5).map(|n| span(1, n, "slice")).collect();
        spans.push(span(1, 6, "request"));
        let kept_out = a.push(spans, None, t0);
        assert_eq!(kept_out, [3, 4], "two slices over the cap, not the request");
        assert_eq!(events.dropped("max_spans_per_trace"), 2);
        let done = a.poll(t0 + secs(2.0)).completed;
        assert!(done[0].has_request);
        assert_eq!(done[0].held.span_count(), 4);
    }

    #[test]
    fn request_span_after_idle_close_starts_a_new_trace() {
        let (mut a, events) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        a.push(vec![span(1, 1, "engine")], None, t0);
        assert_eq!(a.poll(t0 + secs(30.0)).completed.len(), 1);
        a.push(vec![span(1, 2, "request")], None, t0 + secs(31.0));
        assert_eq!(a.traces_in_flight(), 1);
        assert_eq!(events.late_spans.get(), 0);
        let done = a.poll(t0 + secs(33.0)).completed;
        assert_eq!(done.len(), 1);
        assert!(done[0].has_request);
    }

    #[test]
    fn completed_ids_are_forgotten_after_twice_the_idle_timeout() {
        let (mut a, events) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        a.push(vec![span(1, 1, "request")], None, t0);
        a.poll(t0 + secs(2.0));
        a.poll(t0 + secs(32.0));
        a.push(vec![span(1, 2, "x")], None, t0 + secs(33.0));
        assert_eq!(events.late_spans.get(), 1, "still remembered after 31 s");
        a.poll(t0 + secs(62.0));
        a.push(vec![span(1, 3, "request")], None, t0 + secs(63.0));
        assert_eq!(
            events.late_spans.get(),
            1,
            "a new trace with a reused id after 60 s"
        );
        assert_eq!(a.traces_in_flight(), 1);
    }

    #[test]
    fn span_cap_drops_and_a_full_table_closes_the_oldest_early() {
        let cfg = AssemblerConfig {
            max_spans_per_trace: 3,
            max_traces_in_flight: 2,
            ..Default::default()
        };
        let (mut a, events) = assembler(cfg);
        let t0 = Instant::now();
        let batch: Vec<Span> = (0..5).map(|i| span(1, i, "x")).collect();
        a.push(batch, None, t0);
        a.push(
            vec![span(2, 1, "x"), span(3, 1, "x"), span(3, 2, "x")],
            None,
            t0 + secs(0.1),
        );
        assert_eq!(a.traces_in_flight(), 2);
        assert_eq!(a.spans_in_flight(), 3, "traces 2 and 3");
        assert_eq!(events.dropped("max_spans_per_trace"), 2);
        assert_eq!(
            events.dropped("max_traces_in_flight"),
            0,
            "nothing accepted is lost"
        );
        assert_eq!(events.closed_early("max_traces_in_flight"), 1);
        let done = a.poll(t0 + secs(0.2)).completed;
        assert_eq!(
            done.len(),
            1,
            "the early-closed trace comes with the next poll"
        );
        assert_eq!(done[0].trace_id, TraceId([1; 16]));
        assert_eq!(done[0].reason, CloseReason::Early);
        assert_eq!(done[0].held.span_count(), 3);
    }

    #[test]
    fn a_sender_flooding_the_table_gives_up_its_own_traces_not_a_light_senders() {
        let cfg = AssemblerConfig {
            max_traces_in_flight: 4,
            ..Default::default()
        };
        let (mut a, events) = assembler(cfg);
        let t0 = Instant::now();
        let from = |service: &str, trace: u8, id: u8| {
            let mut s = span(trace, id, "x");
            s.service = Text::from(service);
            s
        };
        // The light sender's trace is the oldest; none of these has its request span yet. Far
        // more heavy traces than the fairness window close while it waits.
        a.push(vec![from("light", 1, 1)], None, t0);
        for trace in 2..=200 {
            a.push(
                vec![from("heavy", trace, 1)],
                None,
                t0 + secs(0.001 * f64::from(trace)),
            );
        }
        let done = a.poll(t0 + secs(0.5)).completed;
        assert_eq!(done.len(), 196, "200 traces into a table of 4");
        assert!(
            done.into_iter().all(|t| t.reason == CloseReason::Early
                && t.held.into_spans().iter().all(|s| s.service == "heavy")),
            "only the heavy sender's traces were closed early"
        );
        assert_eq!(events.dropped("max_traces_in_flight"), 0);
        // The light sender's trace is still assembling and completes as usual.
        a.push(
            vec![from("light", 1, 3), span(1, 2, "request")],
            None,
            t0 + secs(0.6),
        );
        let done = a.poll(t0 + secs(3.0)).completed;
        let light = done
            .iter()
            .find(|t| t.trace_id == TraceId([1; 16]))
            .expect("the light trace completes");
        assert_eq!(light.reason, CloseReason::Grace);
        assert_eq!(light.held.span_count(), 3);
    }

    #[test]
    fn a_full_table_closes_traces_with_their_request_first_oldest_first() {
        let cfg = AssemblerConfig {
            max_traces_in_flight: 3,
            ..Default::default()
        };
        let (mut a, events) = assembler(cfg);
        let t0 = Instant::now();
        // 1: no request span yet (oldest); 2 and 3: complete but in their grace period.
        a.push(vec![span(1, 1, "x")], None, t0);
        a.push(vec![span(2, 1, "request")], None, t0 + secs(0.1));
        a.push(vec![span(3, 1, "request")], None, t0 + secs(0.2));
        a.push(vec![span(4, 1, "request")], None, t0 + secs(0.3));
        a.push(vec![span(5, 1, "request")], None, t0 + secs(0.4));
        let done = a.poll(t0 + secs(0.5)).completed;
        let ids: Vec<u8> = done.iter().map(|t| t.trace_id.0[0]).collect();
        assert_eq!(ids, [2, 3], "request traces go first, oldest first");
        assert!(
            done.iter()
                .all(|t| t.reason == CloseReason::Early && t.has_request)
        );
        a.push(vec![span(6, 1, "x")], None, t0 + secs(0.6));
        a.push(vec![span(7, 1, "x")], None, t0 + secs(0.7));
        let done = a.poll(t0 + secs(0.8)).completed;
        let ids: Vec<u8> = done.iter().map(|t| t.trace_id.0[0]).collect();
        assert_eq!(ids, [4, 5], "then the newer request traces");
        a.push(vec![span(8, 1, "x")], None, t0 + secs(0.9));
        let done = a.poll(t0 + secs(1.0)).completed;
        let ids: Vec<u8> = done.iter().map(|t| t.trace_id.0[0]).collect();
        assert_eq!(ids, [1], "only then the oldest without a request span");
        assert!(!done[0].has_request);
        assert_eq!(events.closed_early("max_traces_in_flight"), 5);
        assert_eq!(events.dropped("max_traces_in_flight"), 0);
        assert_eq!(a.traces_in_flight(), 3);
        // A late child of an early-closed trace is a late span, as after any close.
        a.push(vec![span(2, 9, "x")], None, t0 + secs(1.1));
        assert_eq!(a.poll(t0 + secs(1.2)).late.len(), 1);
    }

    #[test]
    fn memory_relief_closes_the_oldest_once_until_the_next_poll() {
        let (mut a, events) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        for id in 1..=6 {
            a.push(
                vec![span(id, 1, "request")],
                None,
                t0 + secs(0.1 * f64::from(id)),
            );
        }
        assert_eq!(a.close_oldest_for_memory(2, t0 + secs(1.0)), 2);
        assert_eq!(
            a.close_oldest_for_memory(2, t0 + secs(1.0)),
            0,
            "the first two still wait for the poll that releases their memory"
        );
        let done = a.poll(t0 + secs(1.1)).completed;
        let ids: Vec<u8> = done.iter().map(|t| t.trace_id.0[0]).collect();
        assert_eq!(ids, [1, 2], "oldest first");
        assert!(done.iter().all(|t| t.reason == CloseReason::Early));
        assert_eq!(
            a.close_oldest_for_memory(10, t0 + secs(1.2)),
            4,
            "then again"
        );
        assert_eq!(events.closed_early("memory"), 6);
        assert_eq!(events.closed_early("max_traces_in_flight"), 0);
        assert_eq!(a.traces_in_flight(), 0);
        assert_eq!(a.poll(t0 + secs(1.3)).completed.len(), 4);
        assert_eq!(
            a.close_oldest_for_memory(1, t0 + secs(1.4)),
            0,
            "nothing left"
        );
    }

    #[test]
    fn memory_relief_takes_from_the_sender_holding_the_most_memory() {
        // "wide": two traces of 40 spans each; "many": ten traces of one span. None has its
        // request span. By number "many" holds the most, by memory "wide" does.
        let setup = |max_traces_in_flight| {
            let (mut a, events) = assembler(AssemblerConfig {
                max_traces_in_flight,
                ..Default::default()
            });
            let t0 = Instant::now();
            let from = |service: &str, trace: u8, id: u8| {
                let mut s = span(trace, id, "x");
                s.service = Text::from(service);
                s
            };
            a.push((1..=40).map(|i| from("wide", 1, i)).collect(), None, t0);
            for trace in 2..=11 {
                a.push(vec![from("many", trace, 1)], None, t0 + secs(0.01));
            }
            a.push(
                (1..=40).map(|i| from("wide", 12, i)).collect(),
                None,
                t0 + secs(0.02),
            );
            (a, events, t0)
        };
        let services = |done: Vec<CompletedTrace>| -> Vec<Text> {
            done.into_iter()
                .map(|t| t.held.into_spans()[0].service.clone())
                .collect()
        };
        // Memory relief: the wide sender's oldest trace, though the many-trace sender's is
        // just as old and it holds five times the traces.
        let (mut a, events, t0) = setup(100);
        assert_eq!(a.close_oldest_for_memory(1, t0 + secs(0.1)), 1);
        let done = a.poll(t0 + secs(0.2)).completed;
        assert_eq!(services(done), ["wide"]);
        assert_eq!(events.closed_early("memory"), 1);
        // A full table: the many-trace sender's oldest (the table's share is by number).
        let (mut a, events, t0) = setup(12);
        a.push(vec![span(13, 1, "x")], None, t0 + secs(0.1));
        let done = a.poll(t0 + secs(0.2)).completed;
        assert_eq!(services(done), ["many"]);
        assert_eq!(events.closed_early("max_traces_in_flight"), 1);
    }

    #[test]
    fn request_spans_of_one_batch_make_one_grace_entry() {
        // A trace across services (router, prefill and decode workers) brings several request
        // spans in one batch: one grace-queue entry, so the queue stays the size of the table
        // (duplicates all looked live, and compaction then ran on every push).
        let (mut a, _) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        for t in 0..=255u8 {
            let spans = (1..=3).map(|i| span(t, i, "request")).collect();
            a.push(spans, None, t0 + secs(f64::from(t) * 1e-3));
        }
        assert_eq!(a.traces_in_flight(), 256);
        assert_eq!(a.by_grace.len(), 256);
        let done = a.poll(t0 + secs(3.0)).completed;
        assert_eq!(done.len(), 256);
        assert!(
            done.iter()
                .all(|t| t.has_request && t.reason == CloseReason::Grace)
        );
    }

    #[test]
    fn flush_closes_everything() {
        let (mut a, _) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        a.push(vec![span(1, 1, "request"), span(2, 1, "x")], None, t0);
        let ready = a.flush(t0);
        assert_eq!(ready.completed.len(), 2);
        assert!(
            ready
                .completed
                .iter()
                .all(|t| t.reason == CloseReason::Flush)
        );
        assert_eq!(a.traces_in_flight(), 0);
        assert!(a.poll(t0 + secs(100.0)).completed.is_empty());
    }

    struct Guard(Arc<AtomicUsize>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn memory_is_released_when_the_last_trace_of_a_batch_completes() {
        let (mut a, _) = assembler(AssemblerConfig::default());
        let released = Arc::new(AtomicUsize::new(0));
        let hold: MemoryHold = Arc::new(Guard(released.clone()));
        let t0 = Instant::now();
        a.push(
            vec![span(1, 1, "request"), span(1, 2, "x"), span(2, 1, "y")],
            Some(hold),
            t0,
        );
        let done = a.poll(t0 + secs(2.0)).completed;
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].holds.len(), 1, "one clone per trace, not per span");
        drop(done);
        assert_eq!(
            released.load(Ordering::SeqCst),
            0,
            "trace 2 still holds the batch"
        );
        let done = a.poll(t0 + secs(30.0)).completed;
        drop(done);
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }

    /// A trace held as prepared: no analysis (the assembler never reads it), its spans in a
    /// compact copy of their own.
    fn kept(spans: &[Span]) -> Box<PreparedTrace> {
        Box::new(PreparedTrace {
            analysed: Analysed::default(),
            source: SpanSource::compact(spans).expect("a few spans"),
            span_bytes: 100 * spans.len(),
        })
    }

    fn prepared(config: AssemblerConfig) -> (TraceAssembler, InternalEvents) {
        assembler(config)
    }

    fn is_prepared(t: &CompletedTrace) -> bool {
        matches!(t.held, HeldSpans::Prepared(_))
    }

    /// `spans` as the pipeline hands them over with one prepared run over `start..start +
    /// len`: the run first, then the spans not taken. Returns the spans taken.
    fn push_run(
        a: &mut TraceAssembler,
        spans: Vec<Span>,
        start: usize,
        len: usize,
        now: Instant,
    ) -> Vec<Span> {
        let run = PreparedRun {
            trace_id: spans[start].trace_id,
            start,
            len,
            prepared: kept(&spans[start..start + len]),
        };
        let mut taken = vec![false; spans.len()];
        let hold: MemoryHold = Arc::new(());
        a.insert_prepared(vec![run], &mut taken, &hold, now);
        let (taken, rest): (Vec<_>, Vec<_>) = spans.into_iter().zip(&taken).partition(|(_, t)| **t);
        a.push(rest.into_iter().map(|(s, _)| s).collect(), None, now);
        taken.into_iter().map(|(s, _)| s).collect()
    }

    #[test]
    fn a_prepared_run_stands_for_its_spans_until_completion() {
        let (mut a, _) = prepared(AssemblerConfig::default());
        let t0 = Instant::now();
        let spans = vec![
            span(9, 1, "other"),
            span(1, 1, "request"),
            span(1, 2, "queue"),
            span(2, 1, "db"),
        ];
        let handed_back = push_run(&mut a, spans, 1, 2, t0);
        assert_eq!(
            handed_back.len(),
            2,
            "the run's spans go back to the caller"
        );
        assert!(handed_back.iter().all(|s| s.trace_id == TraceId([1; 16])));
        assert_eq!(a.traces_in_flight(), 3);
        assert_eq!(a.spans_in_flight(), 4);
        assert!(a.poll(t0 + secs(1.9)).completed.is_empty(), "same grace");
        let done = a.poll(t0 + secs(2.0)).completed;
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].trace_id, TraceId([1; 16]));
        assert!(is_prepared(&done[0]));
        assert!(done[0].has_request);
        assert_eq!(done[0].held.span_count(), 2);
    }

    #[test]
    fn more_spans_turn_a_prepared_trace_back_into_spans() {
        let (mut a, _) = prepared(AssemblerConfig::default());
        let t0 = Instant::now();
        push_run(
            &mut a,
            vec![span(1, 1, "request"), span(1, 2, "queue")],
            0,
            2,
            t0,
        );
        a.push(vec![span(1, 3, "decode")], None, t0 + secs(1.0));
        assert_eq!(a.spans_in_flight(), 3);
        let done = a.poll(t0 + secs(2.0)).completed;
        assert_eq!(done.len(), 1);
        assert!(!is_prepared(&done[0]));
        let spans = done.into_iter().next().map(|t| t.held.into_spans());
        let names: Vec<&str> = spans.iter().flatten().map(|s| &*s.name).collect();
        assert_eq!(names, ["request", "queue", "decode"], "arrival order kept");
    }

    #[test]
    fn every_completed_trace_gives_its_spans_back_whichever_way_it_was_held() {
        let (mut a, _) = prepared(AssemblerConfig::default());
        let t0 = Instant::now();
        let one = vec![span(1, 1, "request"), span(1, 2, "queue")];
        let two = vec![span(2, 1, "request"), span(2, 2, "decode")];
        push_run(&mut a, one.clone(), 0, 2, t0);
        a.push(two.clone(), None, t0);
        let mut done = a.poll(t0 + secs(2.0)).completed;
        done.sort_by_key(|t| t.trace_id.0[0]);
        assert!(is_prepared(&done[0]) && !is_prepared(&done[1]));
        let back: Vec<Vec<Span>> = done.into_iter().map(|t| t.held.into_spans()).collect();
        assert_eq!(back, [one, two]);
    }

    #[test]
    fn a_prepared_run_of_a_known_trace_is_pushed_as_spans() {
        let (mut a, events) = prepared(AssemblerConfig::default());
        let t0 = Instant::now();
        // In flight: the run joins the trace as spans.
        a.push(vec![span(1, 9, "gateway")], None, t0);
        let back = push_run(&mut a, vec![span(1, 1, "request")], 0, 1, t0 + secs(0.5));
        assert!(back.is_empty());
        let done = a.poll(t0 + secs(2.5)).completed;
        assert_eq!(done.len(), 1);
        assert!(!is_prepared(&done[0]));
        assert_eq!(done[0].held.span_count(), 2);
        // Completed with a request: the run is late.
        let back = push_run(&mut a, vec![span(1, 2, "request")], 0, 1, t0 + secs(3.0));
        assert!(back.is_empty());
        assert_eq!(events.late_spans.get(), 1);
        assert_eq!(a.poll(t0 + secs(3.1)).late.len(), 1);
        // Closed without a request (idle): pushed as spans, as the span path decides span by
        // span which are late and where the new trace starts.
        a.push(vec![span(2, 1, "engine")], None, t0);
        assert_eq!(a.poll(t0 + secs(31.0)).completed.len(), 1);
        let back = push_run(&mut a, vec![span(2, 2, "request")], 0, 1, t0 + secs(32.0));
        assert!(back.is_empty());
        let done = a.poll(t0 + secs(34.0)).completed;
        assert!(!is_prepared(&done[0]));
        assert!(done[0].has_request);
    }

    #[test]
    fn spans_after_a_prepared_trace_completed_are_late_until_it_is_forgotten() {
        let (mut a, events) = prepared(AssemblerConfig::default());
        let t0 = Instant::now();
        push_run(&mut a, vec![span(1, 1, "request")], 0, 1, t0);
        push_run(&mut a, vec![span(2, 1, "request")], 0, 1, t0 + secs(0.5));
        let done = a.poll(t0 + secs(2.0)).completed;
        assert_eq!(done.len(), 1, "in arrival order");
        assert_eq!(done[0].trace_id, TraceId([1; 16]));
        assert_eq!(a.traces_in_flight(), 1);
        a.push(vec![span(1, 2, "decode")], None, t0 + secs(2.1));
        assert_eq!(events.late_spans.get(), 1);
        assert_eq!(a.traces_in_flight(), 1, "not reopened");
        assert_eq!(a.poll(t0 + secs(2.5)).completed.len(), 1);
        a.poll(t0 + secs(32.0));
        a.push(vec![span(1, 3, "x")], None, t0 + secs(33.0));
        assert_eq!(
            events.late_spans.get(),
            2,
            "remembered for the idle timeout"
        );
        a.poll(t0 + secs(62.0));
        a.push(vec![span(1, 4, "request")], None, t0 + secs(63.0));
        assert_eq!(
            events.late_spans.get(),
            2,
            "forgotten after twice the idle timeout"
        );
        assert_eq!(a.traces_in_flight(), 1);
    }

    #[test]
    fn poll_some_closes_the_due_traces_in_rounds() {
        let (mut a, _) = prepared(AssemblerConfig::default());
        let t0 = Instant::now();
        for t in 1..=7u8 {
            push_run(&mut a, vec![span(t, 1, "request")], 0, 1, t0);
        }
        a.push(vec![span(8, 1, "request")], None, t0);
        a.push(vec![span(9, 1, "request")], None, t0);
        let rounds: Vec<usize> = (0..5)
            .map(|_| a.poll_some(t0 + secs(2.0), 3).completed.len())
            .collect();
        assert_eq!(rounds, [3, 3, 3, 0, 0]);
        assert_eq!(a.traces_in_flight(), 0);
    }

    #[test]
    fn flush_closes_prepared_traces_too() {
        let (mut a, _) = prepared(AssemblerConfig::default());
        let t0 = Instant::now();
        push_run(&mut a, vec![span(1, 1, "request")], 0, 1, t0);
        push_run(&mut a, vec![span(2, 1, "request")], 0, 1, t0);
        a.push(vec![span(2, 2, "decode")], None, t0);
        a.push(vec![span(3, 1, "db")], None, t0);
        let done = a.flush(t0).completed;
        assert_eq!(done.len(), 3);
        assert_eq!(done.iter().filter(|t| is_prepared(t)).count(), 1);
        assert!(done.iter().all(|t| t.reason == CloseReason::Flush));
        assert_eq!(a.traces_in_flight(), 0);
        assert!(a.poll(t0 + secs(100.0)).completed.is_empty());
    }

    #[test]
    fn a_prepared_run_over_the_span_bound_is_pushed_as_spans_and_a_full_table_makes_room() {
        let cfg = AssemblerConfig {
            max_spans_per_trace: 2,
            max_traces_in_flight: 1,
            ..Default::default()
        };
        let (mut a, events) = prepared(cfg);
        let t0 = Instant::now();
        let name = |i| if i == 0 { "request" } else { "slice" };
        let spans: Vec<Span> = (0..3).map(|i| span(1, i, name(i))).collect();
        assert!(push_run(&mut a, spans, 0, 3, t0).is_empty());
        assert_eq!(events.dropped("max_spans_per_trace"), 1);
        assert_eq!(a.spans_in_flight(), 2);
        assert_eq!(
            push_run(&mut a, vec![span(2, 1, "request")], 0, 1, t0).len(),
            1
        );
        assert_eq!(events.dropped("max_traces_in_flight"), 0);
        assert_eq!(events.closed_early("max_traces_in_flight"), 1);
        assert_eq!(
            a.prepared_in_flight(),
            1,
            "the new trace is in, as prepared"
        );
        // A third, prepared, closes the prepared one early.
        assert_eq!(
            push_run(&mut a, vec![span(3, 1, "request")], 0, 1, t0).len(),
            1
        );
        let done = a.poll(t0).completed;
        let ids: Vec<u8> = done.iter().map(|t| t.trace_id.0[0]).collect();
        assert_eq!(ids, [1, 2]);
        assert!(is_prepared(&done[1]));
        assert_eq!(a.traces_in_flight(), 1);
    }

    #[test]
    fn stale_queue_entries_are_compacted() {
        let (mut a, _) = assembler(AssemblerConfig::default());
        let t0 = Instant::now();
        for i in 0..5000u32 {
            let mut s = span(0, 1, "request");
            s.trace_id.0[..4].copy_from_slice(&i.to_le_bytes());
            let now = t0 + Duration::from_millis(i as u64);
            a.push(vec![s], None, now);
            a.poll(now);
        }
        assert!(
            a.by_age.len() <= 2 * a.traces.len() + 1025,
            "{}",
            a.by_age.len()
        );
    }
}
