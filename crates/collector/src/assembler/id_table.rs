//! [`IdTable`]: 64-bit hashed ids to 64-bit values, with each entry next to its neighbours.
//!
//! The trace index looks every new trace up (a miss, nearly always) and then inserts it. In a
//! table of millions of ids both are cache misses; the assembler issues the lookups of a whole
//! batch first ([`TraceAssembler::warm_index`](super::TraceAssembler::warm_index)) so that they
//! overlap. A SwissTable (`std`'s `HashMap`) keeps its control bytes and its entries in two
//! arrays far apart: the lookup warms the control bytes, and the insert still misses on the
//! entry it writes. Here the
//! entries are the table: open addressing with linear probing over 16-byte `(key, value)`
//! pairs, four to a cache line, so the lookup brings in the line the insert writes.
//!
//! Keys are seeded hashes already (no second hash); key 0 marks an empty slot, so a hash of 0
//! is stored as 1 (a collision of probability 2⁻⁶⁴, like any other of the 64-bit hash). The
//! table grows past [`MAX_LOAD_NUM`]`/`[`MAX_LOAD_DEN`] full (linear probing stays short: a miss
//! probes ~2–3 entries on average at that load, mostly in one line). [`IdTable::retain`] deletes
//! in place, shifting entries back (no tombstones).

/// An empty slot.
const EMPTY: u64 = 0;
/// Grows when more than 5/8 of the slots would be full.
const MAX_LOAD_NUM: usize = 5;
const MAX_LOAD_DEN: usize = 8;
/// The smallest table.
const MIN_SLOTS: usize = 16;

/// Hashed ids → values; see the module docs.
#[derive(Debug)]
pub(crate) struct IdTable {
    /// `(key, value)`; `key == EMPTY` for an empty slot. A power of two long.
    slots: Vec<(u64, u64)>,
    len: usize,
}

impl IdTable {
    /// A table holding `n` entries before it grows.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            slots: vec![(EMPTY, 0); slots_for(n)],
            len: 0,
        }
    }

    /// Entries held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Bytes of the slots.
    pub(crate) fn bytes(&self) -> usize {
        self.slots.len() * size_of::<(u64, u64)>()
    }

    /// The value of `key`.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<u64> {
        let key = stored(key);
        let mask = self.mask();
        let mut i = home(key, mask);
        loop {
            let (k, v) = self.slots[i];
            if k == key {
                return Some(v);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Sets the value of `key`.
    pub(crate) fn insert(&mut self, key: u64, value: u64) {
        if (self.len + 1) * MAX_LOAD_DEN > self.slots.len() * MAX_LOAD_NUM {
            self.grow();
        }
        if place(&mut self.slots, stored(key), value) {
            self.len += 1;
        }
    }

    /// Twice the slots, every entry placed again.
    fn grow(&mut self) {
        let bigger = vec![(EMPTY, 0); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, bigger);
        for (k, v) in old {
            if k != EMPTY {
                place(&mut self.slots, k, v);
            }
        }
    }

    /// Keeps the entries whose value `keep` accepts, in place: each deletion shifts the entries
    /// after it in its cluster back where their probe allows, so no lookup ever crosses a gap.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        let Some(start) = self.slots.iter().position(|(k, _)| *k == EMPTY) else {
            return; // never: the load is bounded
        };
        let mask = self.mask();
        // From the empty slot round to it: no cluster crosses it, and every shift moves an
        // entry back to a slot this scan has not passed yet, or to the slot it is looking at.
        let mut at = (start + 1) & mask;
        let mut seen = 0;
        while seen < self.slots.len() - 1 {
            let (k, v) = self.slots[at];
            if k != EMPTY && !keep(v) {
                self.remove_at(at);
                self.len -= 1;
                continue; // look again at what moved into `at`
            }
            at = (at + 1) & mask;
            seen += 1;
        }
    }

    /// Empties slot `i`, shifting the rest of its cluster back (Knuth's algorithm R).
    fn remove_at(&mut self, mut i: usize) {
        let mask = self.mask();
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let (k, _) = self.slots[j];
            if k == EMPTY {
                break;
            }
            let h = home(k, mask);
            // The entry at `j` may move to `i` unless its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < h && h <= j
            } else {
                i < h || h <= j
            };
            if !stays {
                self.slots[i] = self.slots[j];
                i = j;
            }
        }
        self.slots[i] = (EMPTY, 0);
    }
}

/// Slots for `n` entries within the load limit.
fn slots_for(n: usize) -> usize {
    (n.saturating_mul(MAX_LOAD_DEN) / MAX_LOAD_NUM + 1)
        .max(MIN_SLOTS)
        .next_power_of_two()
}

/// The key as stored: 0 is the empty mark.
#[inline]
fn stored(key: u64) -> u64 {
    if key == EMPTY { 1 } else { key }
}

/// The first slot `key` probes.
#[inline]
fn home(key: u64, mask: usize) -> usize {
    // The high bits: the low ones of a multiplicative hash are its weakest.
    (key.rotate_left(32) as usize) & mask
}

/// Puts `(key, value)` in `slots` (not full); `true` when the key is new.
fn place(slots: &mut [(u64, u64)], key: u64, value: u64) -> bool {
    let mask = slots.len() - 1;
    let mut i = home(key, mask);
    loop {
        let slot = &mut slots[i];
        if slot.0 == key {
            slot.1 = value;
            return false;
        }
        if slot.0 == EMPTY {
            *slot = (key, value);
            return true;
        }
        i = (i + 1) & mask;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Get(u64),
        Retain(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct keys, some of them 0 and 1 (the empty mark and its stand-in), and keys
        // that share a home slot: long clusters, wrap-around, overwrites.
        let key = prop_oneof![
            0u64..4,
            (0u64..64).prop_map(|k| k << 32),
            (0u64..16).prop_map(|k| (k << 32) | 0xffff_ffff),
            any::<u64>(),
        ];
        prop_oneof![
            6 => (key.clone(), any::<u64>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => key.prop_map(Op::Get),
            1 => (1u64..5).prop_map(Op::Retain),
        ]
    }

    proptest! {
        /// Every lookup answers what a `HashMap` answers, after any inserts, overwrites, growth
        /// and in-place deletions.
        #[test]
        fn answers_what_a_hash_map_answers(ops in prop::collection::vec(op(), 0..400)) {
            let mut table = IdTable::with_capacity(0);
            let mut reference: HashMap<u64, u64> = HashMap::new();
            let mut seen = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        table.insert(k, v);
                        reference.insert(stored(k), v);
                        seen.push(k);
                    }
                    Op::Get(k) => prop_assert_eq!(table.get(k), reference.get(&stored(k)).copied()),
                    Op::Retain(m) => {
                        table.retain(|v| v % m != 0);
                        reference.retain(|_, v| *v % m != 0);
                    }
                }
                prop_assert_eq!(table.len(), reference.len());
            }
            for k in seen {
                prop_assert_eq!(table.get(k), reference.get(&stored(k)).copied());
            }
            let occupied = table.slots.iter().filter(|(k, _)| *k != EMPTY).count();
            prop_assert_eq!(occupied, table.len());
        }
    }

    #[test]
    fn sized_up_front_and_grown_within_the_load_limit() {
        let mut t = IdTable::with_capacity(1000);
        let slots = t.slots.len();
        assert!(slots * MAX_LOAD_NUM >= 1000 * MAX_LOAD_DEN);
        for k in 1..=1000u64 {
            t.insert(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k);
        }
        assert_eq!(t.slots.len(), slots, "no growth up to the size asked for");
        for k in 1001..=5000u64 {
            t.insert(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k);
        }
        assert_eq!(t.len(), 5000);
        assert!(t.len() * MAX_LOAD_DEN <= t.slots.len() * MAX_LOAD_NUM);
        t.retain(|v| v % 2 == 0);
        assert_eq!(t.len(), 2500);
        assert!((1..=5000u64).all(|k| {
            let got = t.get(k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            got == (k % 2 == 0).then_some(k)
        }));
    }
}
