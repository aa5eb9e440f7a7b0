//! [`CompletedIds`]: the ids of recently completed traces, remembered compactly so that a span
//! arriving after its trace completed is recognised as late.
//!
//! Every new trace looks its id up here (a miss, nearly always), and the set holds up to twice
//! `max_traces_in_flight` ids (millions when that limit is raised for high rates), so its layout
//! matters more than its code: each id is kept as a 64-bit hash of the whole id (seeded per
//! process, so two ids share it with probability 2⁻⁶⁴ however they are built — an id with
//! equal halves is as distinct as any; a false match would make one span look late), with one
//! flag and a generation number, in a single hash table of 16-byte entries — one probe per
//! lookup. Every `span` (the idle timeout) a new generation
//! starts and the entries two generations old are purged in one pass (tens of milliseconds for
//! millions of ids, once per `span`, under the assembler's lock). An id is remembered for at
//! least `span` and at most twice that — unless a generation reaches `max_ids` first and ends
//! early, so at most `2 × max_ids` ids are held (at a completion rate above `max_ids / span`
//! ids are then remembered for less than `span`: a span that arrives later still is taken for
//! the start of a new trace, as with the earlier layout's count bound). Measured before this
//! layout (a map of ids with completion instants and an order queue): ~100 B per id and three
//! probes per trace; now ~20–40 B (the table's load factor) and one.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;
use infertrace_analysis::trace::TraceId;

/// Recently completed trace ids (see the module docs).
#[derive(Debug)]
pub(crate) struct CompletedIds {
    /// hash(id) → generation << 1 | whether the completed trace had a request span. The keys
    /// are seeded hashes already, so the map uses them as they are (no second hash).
    ids: HashMap<u64, u64, BuildHasherDefault<PassThrough>>,
    /// Seeds the ids' hash.
    hasher: RandomState,
    /// The current generation.
    generation: u64,
    /// Ids added in the current generation.
    current_len: usize,
    /// When the current generation started.
    since: Option<Instant>,
    span: Duration,
    max_ids: usize,
}

/// The hasher of a map whose `u64` keys are already well-mixed hashes: returns the key.
#[derive(Debug, Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    /// Not used for `u64` keys; mixes anything else in rather than ignore it.
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
}

impl CompletedIds {
    /// The seeded 64-bit hash an id is kept as.
    fn key(&self, id: &TraceId) -> u64 {
        self.hasher.hash_one(u128::from_le_bytes(id.0))
    }
}

impl CompletedIds {
    /// Remembers ids for at least `span`, at most `max_ids` per generation.
    pub(crate) fn new(span: Duration, max_ids: usize) -> Self {
        Self {
            ids: HashMap::default(),
            hasher: RandomState::default(),
            generation: 1,
            current_len: 0,
            since: None,
            span,
            max_ids: max_ids.max(1),
        }
    }

    /// Remembers that `id` completed at `now`, with or without a request span.
    pub(crate) fn insert(&mut self, id: &TraceId, had_request: bool, now: Instant) {
        self.rotate(now);
        if self.current_len >= self.max_ids {
            self.turn(now);
        }
        let value = self.generation << 1 | u64::from(had_request);
        let before = self.ids.insert(self.key(id), value);
        if before.is_none_or(|v| v >> 1 != self.generation) {
            self.current_len += 1;
        }
    }

    /// Whether `id` completed recently, and if so whether it had a request span.
    pub(crate) fn get(&self, id: &TraceId) -> Option<bool> {
        if self.ids.is_empty() {
            return None;
        }
        let v = *self.ids.get(&self.key(id))?;
        (v >> 1 >= self.generation.saturating_sub(1)).then_some(v & 1 == 1)
    }

    /// Forgets `id` (its trace was opened again).
    pub(crate) fn remove(&mut self, id: &TraceId) {
        if let Some(v) = self.ids.remove(&self.key(id))
            && v >> 1 == self.generation
        {
            self.current_len = self.current_len.saturating_sub(1);
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

    /// Ids held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    fn turn(&mut self, now: Instant) {
        self.generation += 1;
        self.current_len = 0;
        let keep_from = self.generation - 1;
        self.ids.retain(|_, v| *v >> 1 >= keep_from);
        self.since = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut c = CompletedIds::new(s, 1000);
        c.insert(&id(1), true, t0);
        c.rotate(t0 + Duration::from_secs(29));
        assert_eq!(c.get(&id(1)), Some(true));
        c.rotate(t0 + s);
        assert_eq!(
            c.get(&id(1)),
            Some(true),
            "still in the previous generation"
        );
        c.rotate(t0 + 2 * s);
        assert_eq!(c.get(&id(1)), None);
    }

    #[test]
    fn flag_and_removal() {
        let t0 = Instant::now();
        let mut c = CompletedIds::new(Duration::from_secs(30), 1000);
        c.insert(&id(2), false, t0);
        assert_eq!(c.get(&id(2)), Some(false));
        c.rotate(t0 + Duration::from_secs(31));
        c.insert(&id(2), true, t0 + Duration::from_secs(31));
        assert_eq!(c.get(&id(2)), Some(true), "the newest completion wins");
        assert_eq!(c.len(), 1, "one entry per id");
        c.remove(&id(2));
        assert_eq!(c.get(&id(2)), None);
        assert_eq!(c.get(&id(3)), None);
    }

    #[test]
    fn ids_with_equal_halves_stay_distinct() {
        let t0 = Instant::now();
        let mut c = CompletedIds::new(Duration::from_secs(30), 1000);
        c.insert(&TraceId([1; 16]), true, t0);
        assert_eq!(c.get(&TraceId([1; 16])), Some(true));
        assert_eq!(c.get(&TraceId([2; 16])), None);
    }

    #[test]
    fn bounded_by_twice_max_ids() {
        let t0 = Instant::now();
        let mut c = CompletedIds::new(Duration::from_secs(30), 10);
        for n in 0..100u8 {
            c.insert(&id(n), true, t0);
            assert!(c.len() <= 20, "{}", c.len());
        }
        assert_eq!(c.get(&id(99)), Some(true));
        assert_eq!(c.get(&id(0)), None);
    }
}
