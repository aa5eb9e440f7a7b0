//! Caches keyed by the *identity* of shared strings (their allocations), not their bytes.
//!
//! Interned strings repeat by allocation: the records and segments of one series carry the same
//! `Arc`s. A lookup keyed by addresses then costs two or three pointer comparisons instead of
//! hashing and comparing the strings. Each cache holds clones of its keys, so an address it
//! compares cannot be freed and reused by another string while cached; a miss is only slower,
//! never wrong: the caller looks the key up its usual way and stores the result.

use std::fmt;

use arcstr::ArcStr;

/// A shared string whose allocation identifies it (equal addresses mean the same string).
pub trait Identity: Clone {
    /// The address of the string's allocation.
    fn address(&self) -> usize;
}

impl Identity for ArcStr {
    fn address(&self) -> usize {
        self.as_ptr() as usize
    }
}

/// A small direct-mapped cache from a pair of shared strings (e.g. service and span name) to a
/// value: the critical-path aggregates look a key up per segment, and a batch's segments share
/// their strings' allocations.
#[derive(Clone)]
pub struct PairCache<K, V> {
    slots: Vec<Option<(K, K, V)>>,
}

/// Slots of a [`PairCache`] (a power of two).
const PAIR_CACHE_SLOTS: usize = 64;

impl<K, V> Default for PairCache<K, V> {
    fn default() -> Self {
        Self { slots: Vec::new() }
    }
}

impl<K, V> fmt::Debug for PairCache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PairCache").finish_non_exhaustive()
    }
}

impl<K: Identity, V> PairCache<K, V> {
    fn slot(a: &K, b: &K) -> usize {
        let mixed = (a.address() ^ b.address().rotate_left(21)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> 58) & (PAIR_CACHE_SLOTS - 1)
    }

    /// The value cached for exactly these two allocations.
    #[inline]
    pub fn get(&self, a: &K, b: &K) -> Option<&V> {
        match self.slots.get(Self::slot(a, b))? {
            Some((x, y, v)) if x.address() == a.address() && y.address() == b.address() => Some(v),
            _ => None,
        }
    }

    /// Caches `value` for these two allocations (replacing whatever shared their slot).
    pub fn insert(&mut self, a: &K, b: &K, value: V) {
        if self.slots.is_empty() {
            self.slots.resize_with(PAIR_CACHE_SLOTS, || None);
        }
        let slot = Self::slot(a, b);
        self.slots[slot] = Some((a.clone(), b.clone(), value));
    }

    /// Forgets every cached value (what they pointed at changed).
    pub fn clear(&mut self) {
        self.slots.clear();
    }
}

/// The value remembered for the last triple of shared strings seen (e.g. service, model and
/// operation): consecutive records are nearly always of one series, so most lookups of a
/// series skip hashing three strings.
#[derive(Clone, Debug)]
pub struct RecentTriple<K, V> {
    last: Option<(K, K, K, V)>,
}

impl<K, V> Default for RecentTriple<K, V> {
    fn default() -> Self {
        Self { last: None }
    }
}

impl<K: Identity, V> RecentTriple<K, V> {
    /// The value remembered for exactly these three allocations.
    #[inline]
    pub fn get(&self, a: &K, b: &K, c: &K) -> Option<&V> {
        match &self.last {
            Some((x, y, z, v))
                if x.address() == a.address()
                    && y.address() == b.address()
                    && z.address() == c.address() =>
            {
                Some(v)
            }
            _ => None,
        }
    }

    /// Remembers `value` for these three strings (forgetting the previous triple).
    pub fn set(&mut self, a: &K, b: &K, c: &K, value: V) {
        self.last = Some((a.clone(), b.clone(), c.clone(), value));
    }

    /// Forgets the remembered triple (what it pointed at moved).
    pub fn clear(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_cache_hits_only_the_same_allocations() {
        let (a, b) = (ArcStr::from("svc"), ArcStr::from("span"));
        let mut cache = PairCache::default();
        assert_eq!(cache.get(&a, &b), None);
        cache.insert(&a, &b, 7);
        assert_eq!(cache.get(&a, &b), Some(&7));
        assert_eq!(
            cache.get(&a.clone(), &b.clone()),
            Some(&7),
            "clones share the allocation"
        );
        // Equal bytes in another allocation miss (the caller then looks it up by value).
        assert_eq!(cache.get(&ArcStr::from("svc"), &b), None);
        assert_eq!(cache.get(&b, &a), None);
        // The cache holds clones, so the addresses it compares stay allocated.
        assert_eq!(
            ArcStr::strong_count(&a),
            Some(2),
            "the caller's and the cache's"
        );
        drop(a);
        let slot = cache.slots.iter().flatten().next().unwrap();
        assert_eq!(
            ArcStr::strong_count(&slot.0),
            Some(1),
            "the cache's own clone"
        );
        assert_eq!(slot.0, "svc");
    }

    #[test]
    fn recent_triple_remembers_one_triple() {
        let (a, b, c) = (ArcStr::from("s"), ArcStr::from("m"), ArcStr::from("o"));
        let mut recent = RecentTriple::default();
        recent.set(&a, &b, &c, 1);
        assert_eq!(recent.get(&a, &b, &c), Some(&1));
        assert_eq!(recent.get(&a, &c, &b), None);
        assert_eq!(recent.get(&a, &b, &ArcStr::from("o")), None);
        recent.clear();
        assert_eq!(recent.get(&a, &b, &c), None);
    }
}
