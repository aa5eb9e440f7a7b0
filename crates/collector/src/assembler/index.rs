//! [`TraceIndex`]: every trace id the assembler knows — in flight or recently completed — in one
//! compact table, so that a span's trace is found (or known to be new, or late) with one probe.
//!
//! Every new trace looks its id up here (a miss, nearly always), and the table holds the traces
//! in flight plus up to twice `max_traces_in_flight` completed ids (millions when that limit is
//! raised for high rates), so its layout matters more than its code: each id is kept as a
//! 64-bit hash of the whole id (seeded per process, so two ids share it with probability 2⁻⁶⁴
//! however they are built — an id with equal halves is as distinct as any; a false match would
//! make one span look late), with a 64-bit value, in one open-addressing table of 16-byte
//! entries laid out beside their probes ([`IdTable`]: the lookup of a new id brings in the
//! line its insert writes).
//!
//! The value says what the id is:
//! - a trace in flight as spans (its spans are in the assembler's map);
//! - a **prepared** trace (see the assembler's module docs) with its sequence number in the
//!   assembler's queue of prepared traces. Prepared traces complete in sequence order, so one
//!   counter (`completed_seq`) says which of them have completed: completing one touches no
//!   entry of this table;
//! - a completed trace, with or without a request span, and the generation it completed in.
//!
//! **Forgetting.** Every `span` (the idle timeout) a new generation starts and completed ids two
//! generations old are purged in one pass (tens of milliseconds for millions of ids, once per
//! `span`, under the assembler's lock). A completed id is remembered for at least `span` and at
//! most twice that — unless a generation reaches `max_ids` completions first and ends early, so
//! at most about `2 × max_ids` completed ids are held (at a completion rate above
//! `max_ids / span` ids are then remembered for less than `span`: a span that arrives later
//! still is taken for the start of a new trace). A prepared trace's generation is the one its
//! sequence number completed in: each generation records the first sequence number it
//! completed.

use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;
use infertrace_analysis::trace::TraceId;

use super::id_table::IdTable;

/// What the index knows of a trace id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Known {
    /// In flight, its spans held in the assembler's map.
    Spans,
    /// In flight as a prepared trace with this sequence number.
    Prepared(u64),
    /// Completed recently.
    Completed {
        /// Whether it had a request span.
        had_request: bool,
    },
}

/// Most entries the table is sized for when created (32 MiB of slots, mapped as touched).
const PRESIZE_MAX: usize = 1 << 20;

/// Value layout: `payload << 2 | state`.
const COMPLETED_WITHOUT_REQUEST: u64 = 0;
const COMPLETED_WITH_REQUEST: u64 = 1;
const SPANS: u64 = 2;
const PREPARED: u64 = 3;

/// Trace ids in flight and recently completed (see the module docs).
#[derive(Debug)]
pub(crate) struct TraceIndex {
    /// hash(id) → value, each entry beside its probe (see [`IdTable`]).
    ids: IdTable,
    /// Seeds the ids' hash.
    hasher: RandomState,
    /// The current generation.
    generation: u64,
    /// Completions in the current generation.
    current_len: usize,
    /// When the current generation started.
    since: Option<Instant>,
    span: Duration,
    max_ids: usize,
    /// Prepared traces with a lower sequence number have completed.
    completed_seq: u64,
    /// The first prepared sequence number completed in the previous generation.
    previous_first_seq: u64,
    /// The first prepared sequence number completed in the current generation.
    current_first_seq: u64,
}

impl TraceIndex {
    /// Remembers completed ids for at least `span`, at most `max_ids` completions per
    /// generation.
    pub(crate) fn new(span: Duration, max_ids: usize) -> Self {
        Self {
            // Sized for the traces in flight up front (capped: the table still grows beyond),
            // so that a collector filling up does not rehash a table of millions repeatedly.
            ids: IdTable::with_capacity(max_ids.min(PRESIZE_MAX)),
            hasher: RandomState::default(),
            generation: 1,
            current_len: 0,
            since: None,
            span,
            max_ids: max_ids.max(1),
            completed_seq: 0,
            previous_first_seq: 0,
            current_first_seq: 0,
        }
    }

    /// The seeded 64-bit hash an id is kept as.
    fn key(&self, id: &TraceId) -> u64 {
        self.hasher.hash_one(u128::from_le_bytes(id.0))
    }

    /// What is known of `id`.
    pub(crate) fn get(&self, id: &TraceId) -> Option<Known> {
        if self.ids.is_empty() {
            return None;
        }
        let v = self.ids.get(self.key(id))?;
        let payload = v >> 2;
        match v & 3 {
            SPANS => Some(Known::Spans),
            PREPARED if payload >= self.completed_seq => Some(Known::Prepared(payload)),
            PREPARED => (payload >= self.previous_first_seq)
                .then_some(Known::Completed { had_request: true }),
            state => (payload >= self.generation.saturating_sub(1)).then_some(Known::Completed {
                had_request: state == COMPLETED_WITH_REQUEST,
            }),
        }
    }

    /// `id` is in flight as spans.
    pub(crate) fn set_spans(&mut self, id: &TraceId) {
        self.ids.insert(self.key(id), SPANS);
    }

    /// `id` is in flight as the prepared trace `seq`.
    pub(crate) fn set_prepared(&mut self, id: &TraceId, seq: u64) {
        self.ids.insert(self.key(id), seq << 2 | PREPARED);
    }

    /// The trace `id`, in flight as spans, completed at `now`, with or without a request span.
    pub(crate) fn set_completed(&mut self, id: &TraceId, had_request: bool, now: Instant) {
        self.count_completion(now);
        let state = if had_request {
            COMPLETED_WITH_REQUEST
        } else {
            COMPLETED_WITHOUT_REQUEST
        };
        self.ids.insert(self.key(id), self.generation << 2 | state);
    }

    /// The prepared traces below `seq` have left the queue; `completed` of them (the others had
    /// become span traces) completed at `now`.
    pub(crate) fn prepared_completed_below(&mut self, seq: u64, completed: bool, now: Instant) {
        // Counted first: a generation this completion starts is the one it completed in.
        if completed {
            self.count_completion(now);
        }
        self.completed_seq = seq;
    }

    fn count_completion(&mut self, now: Instant) {
        self.rotate(now);
        self.current_len += 1;
        if self.current_len >= self.max_ids {
            self.turn(now);
        }
    }

    /// Starts a new generation when the current one is `span` old.
    pub(crate) fn rotate(&mut self, now: Instant) {
        match self.since {
            None => self.since = Some(now),
            Some(s) if now.saturating_duration_since(s) >= self.span => self.turn(now),
            Some(_) => {}
        }
    }

    /// Ids held, in flight and completed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Bytes of the table, all its slots: ids land in slots spread over the whole table, so a
    /// few thousand make every page resident, and the table never shrinks.
    pub(crate) fn table_bytes(&self) -> usize {
        self.ids.bytes()
    }

    fn turn(&mut self, now: Instant) {
        self.generation += 1;
        self.current_len = 0;
        self.previous_first_seq = self.current_first_seq;
        self.current_first_seq = self.completed_seq;
        let keep_from = self.generation - 1;
        let keep_seq = self.previous_first_seq;
        self.ids.retain(|v| match v & 3 {
            SPANS => true,
            PREPARED => v >> 2 >= keep_seq,
            _ => v >> 2 >= keep_from,
        });
        self.since = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DONE: Option<Known> = Some(Known::Completed { had_request: true });

    fn id(n: u8) -> TraceId {
        let mut b = [0u8; 16];
        b[0] = n;
        b[15] = 0x5a;
        TraceId(b)
    }

    #[test]
    fn remembered_for_at_least_span_and_at_most_twice() {
        let t0 = Instant::now();
        let s = Duration::from_secs(30);
        let mut c = TraceIndex::new(s, 1000);
        c.set_completed(&id(1), true, t0);
        c.rotate(t0 + Duration::from_secs(29));
        assert_eq!(c.get(&id(1)), DONE);
        c.rotate(t0 + s);
        assert_eq!(c.get(&id(1)), DONE, "still in the previous generation");
        c.rotate(t0 + 2 * s);
        assert_eq!(c.get(&id(1)), None);
    }

    #[test]
    fn states_and_the_newest_wins() {
        let t0 = Instant::now();
        let mut c = TraceIndex::new(Duration::from_secs(30), 1000);
        c.set_spans(&id(2));
        assert_eq!(c.get(&id(2)), Some(Known::Spans));
        c.set_completed(&id(2), false, t0);
        assert_eq!(c.get(&id(2)), Some(Known::Completed { had_request: false }));
        c.rotate(t0 + Duration::from_secs(31));
        c.set_prepared(&id(2), 0);
        assert_eq!(c.get(&id(2)), Some(Known::Prepared(0)));
        assert_eq!(c.len(), 1, "one entry per id");
        assert_eq!(c.get(&id(3)), None);
    }

    #[test]
    fn prepared_traces_complete_by_sequence_number_without_a_probe() {
        let t0 = Instant::now();
        let s = Duration::from_secs(30);
        let mut c = TraceIndex::new(s, 1000);
        for n in 0..4u8 {
            c.set_prepared(&id(n), u64::from(n));
        }
        c.prepared_completed_below(1, true, t0);
        c.prepared_completed_below(2, true, t0);
        assert_eq!(c.get(&id(0)), DONE);
        assert_eq!(c.get(&id(1)), DONE);
        assert_eq!(c.get(&id(2)), Some(Known::Prepared(2)));
        // Generation 2 starts; 0 and 1 completed in generation 1, still remembered.
        c.rotate(t0 + s);
        c.prepared_completed_below(3, true, t0 + s);
        assert_eq!(c.get(&id(0)), DONE);
        assert_eq!(c.get(&id(2)), DONE);
        // Generation 3: those of generation 1 are forgotten, those of 2 are not, those in flight
        // stay whatever their age.
        c.rotate(t0 + 2 * s);
        assert_eq!(c.get(&id(0)), None);
        assert_eq!(c.get(&id(1)), None);
        assert_eq!(c.get(&id(2)), DONE);
        assert_eq!(c.get(&id(3)), Some(Known::Prepared(3)));
        assert_eq!(c.len(), 2, "purged");
    }

    #[test]
    fn ids_with_equal_halves_stay_distinct() {
        let t0 = Instant::now();
        let mut c = TraceIndex::new(Duration::from_secs(30), 1000);
        c.set_completed(&TraceId([1; 16]), true, t0);
        assert_eq!(c.get(&TraceId([1; 16])), DONE);
        assert_eq!(c.get(&TraceId([2; 16])), None);
    }

    #[test]
    fn bounded_by_twice_max_ids() {
        let t0 = Instant::now();
        let mut c = TraceIndex::new(Duration::from_secs(30), 10);
        for n in 0..100u8 {
            c.set_completed(&id(n), true, t0);
            assert!(c.len() <= 20, "{}", c.len());
        }
        assert_eq!(c.get(&id(99)), DONE);
        assert_eq!(c.get(&id(0)), None);
    }
}
