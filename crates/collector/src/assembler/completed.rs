//! [`CompletedIds`]: the ids of recently completed traces, remembered compactly so that a span
//! arriving after its trace completed is recognised as late.
//!
//! At a steady 150,000 traces/s and the default 30 s idle timeout this set holds millions of
//! ids, so its layout matters more than its code: each id is folded to 64 bits (the XOR of its
//! two halves; trace ids are random by specification, so two live ids share a fold with
//! probability ~n²/2⁶⁵, about 10⁻⁶ for 4.5M ids — such a pair would make one span look late)
//! and kept with one flag in two generations of hash maps. Every `span` (the idle timeout) the
//! older generation is cleared and reused as the new one — no per-id queue, no per-id expiry
//! check, no re-growth of the tables in steady state. An id is therefore remembered for at
//! least `span` and at most twice that; a generation that reaches `max_ids` rotates early, so
//! at most `2 × max_ids` ids are held. Measured before this layout (a map of full ids with
//! completion instants and an order queue): ~100 B per id; now ~20–40 B.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;
use infertrace_analysis::trace::TraceId;

/// Two generations of completed trace ids (see the module docs).
#[derive(Debug)]
pub(crate) struct CompletedIds {
    /// fold(id) → whether the completed trace had a request span.
    current: HashMap<u64, bool, RandomState>,
    previous: HashMap<u64, bool, RandomState>,
    /// When `current` started.
    since: Option<Instant>,
    span: Duration,
    max_ids: usize,
}

/// The 64-bit fold of a trace id.
fn fold(id: &TraceId) -> u64 {
    let (a, b) = id.0.split_at(8);
    let a = u64::from_le_bytes(a.try_into().unwrap_or([0; 8]));
    let b = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    a ^ b
}

impl CompletedIds {
    /// Remembers ids for at least `span`, at most `max_ids` per generation.
    pub(crate) fn new(span: Duration, max_ids: usize) -> Self {
        Self {
            current: HashMap::default(),
            previous: HashMap::default(),
            since: None,
            span,
            max_ids: max_ids.max(1),
        }
    }

    /// Remembers that `id` completed at `now`, with or without a request span.
    pub(crate) fn insert(&mut self, id: &TraceId, had_request: bool, now: Instant) {
        self.rotate(now);
        if self.current.len() >= self.max_ids {
            self.turn(now);
        }
        // An older entry in `previous` may stay: `get` reads `current` first.
        self.current.insert(fold(id), had_request);
    }

    /// Whether `id` completed recently, and if so whether it had a request span.
    pub(crate) fn get(&self, id: &TraceId) -> Option<bool> {
        if self.current.is_empty() && self.previous.is_empty() {
            return None;
        }
        let key = fold(id);
        self.current
            .get(&key)
            .or_else(|| self.previous.get(&key))
            .copied()
    }

    /// Forgets `id` (its trace was opened again).
    pub(crate) fn remove(&mut self, id: &TraceId) {
        if self.current.is_empty() && self.previous.is_empty() {
            return;
        }
        let key = fold(id);
        self.current.remove(&key);
        self.previous.remove(&key);
    }

    /// Drops the older generation when the current one is `span` old.
    pub(crate) fn rotate(&mut self, now: Instant) {
        match self.since {
            None => self.since = Some(now),
            Some(s) if now.saturating_duration_since(s) >= self.span => self.turn(now),
            Some(_) => {}
        }
    }

    /// Ids held, both generations.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    fn turn(&mut self, now: Instant) {
        // `clear` keeps the table's memory: the next generation fills it without growing.
        self.previous.clear();
        std::mem::swap(&mut self.current, &mut self.previous);
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
        assert_eq!(
            c.len(),
            2,
            "the older entry stays in the previous generation"
        );
        c.remove(&id(2));
        assert_eq!(c.get(&id(2)), None);
        assert_eq!(c.get(&id(3)), None);
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
