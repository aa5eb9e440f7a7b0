//! Identity caches: tiny caches keyed by the *allocations* of interned [`Text`]s rather than
//! their bytes, for the Prometheus recorder's per-record series lookups. A hit is a pointer
//! comparison; a miss is only slower, never wrong. Each cache holds clones of its keys, so an
//! address it compares cannot be freed and reused meanwhile. (`infertrace-analysis` keeps its
//! own for its KPI and critical-path windows: identity caches are no public API.)

use std::fmt;

use infertrace_analysis::text::Text;

/// A small direct-mapped cache from a (service, span name) pair of shared strings to a value,
/// keyed by the strings' identity (their allocations), not their bytes: the critical-path
/// aggregates look a key up per segment, and the segments of a batch share their service and
/// (interned) name allocations, so a hit costs two pointer comparisons instead of hashing and
/// comparing both strings. Each slot holds clones of its strings, so an address it compares
/// cannot be freed and reused by another string while cached. A miss is only slower, never
/// wrong: the caller looks the pair up its usual way and may [`insert`](Self::insert) it.
#[derive(Clone)]
pub(crate) struct PairCache<V> {
    slots: Vec<Option<(Text, Text, V)>>,
}

/// Slots of a [`PairCache`] (a power of two).
const PAIR_CACHE_SLOTS: usize = 64;

impl<V> Default for PairCache<V> {
    fn default() -> Self {
        Self { slots: Vec::new() }
    }
}

impl<V> fmt::Debug for PairCache<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PairCache").finish_non_exhaustive()
    }
}

impl<V> PairCache<V> {
    fn slot(service: &Text, name: &Text) -> usize {
        let a = service.as_ptr() as usize;
        let b = name.as_ptr() as usize;
        let mixed = (a ^ b.rotate_left(21)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> 58) & (PAIR_CACHE_SLOTS - 1)
    }

    /// The value cached for exactly these two allocations.
    #[inline]
    pub(crate) fn get(&self, service: &Text, name: &Text) -> Option<&V> {
        match self.slots.get(Self::slot(service, name))? {
            Some((s, n, v)) if Text::ptr_eq(s, service) && Text::ptr_eq(n, name) => Some(v),
            _ => None,
        }
    }

    /// Caches `value` for these two allocations (replacing whatever shared their slot).
    pub(crate) fn insert(&mut self, service: &Text, name: &Text, value: V) {
        if self.slots.is_empty() {
            self.slots.resize_with(PAIR_CACHE_SLOTS, || None);
        }
        let slot = Self::slot(service, name);
        self.slots[slot] = Some((service.clone(), name.clone(), value));
    }
}

/// The value remembered for the last (service, model, operation) seen, found again by the
/// identity of the three texts (interned, so the next record of the same series carries the
/// same allocations): the KPI windows and the Prometheus recorder look a series up per record,
/// and consecutive records are nearly always of one series, so most skip hashing three strings.
/// It holds clones, so an address it compares cannot be freed and reused meanwhile; a miss is
/// only slower (the caller looks the series up its usual way and [`set`](Self::set)s it).
#[derive(Clone, Debug)]
pub(crate) struct RecentTriple<V> {
    last: Option<(Text, Text, Text, V)>,
}

impl<V> Default for RecentTriple<V> {
    fn default() -> Self {
        Self { last: None }
    }
}

impl<V> RecentTriple<V> {
    /// The value remembered for exactly these three allocations.
    #[inline]
    pub(crate) fn get(&self, a: &Text, b: &Text, c: &Text) -> Option<&V> {
        match &self.last {
            Some((x, y, z, v))
                if Text::ptr_eq(x, a) && Text::ptr_eq(y, b) && Text::ptr_eq(z, c) =>
            {
                Some(v)
            }
            _ => None,
        }
    }

    /// Remembers `value` for these three texts (forgetting the previous triple).
    pub(crate) fn set(&mut self, a: &Text, b: &Text, c: &Text, value: V) {
        self.last = Some((a.clone(), b.clone(), c.clone(), value));
    }

    /// Forgets the remembered triple (what it pointed at moved).
    pub(crate) fn clear(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_triple_hits_only_the_same_three_allocations() {
        let (a, b, c) = (Text::from("svc"), Text::from("m"), Text::from("chat"));
        let mut recent = RecentTriple::default();
        assert_eq!(recent.get(&a, &b, &c), None);
        recent.set(&a, &b, &c, 3usize);
        assert_eq!(recent.get(&a.clone(), &b, &c), Some(&3));
        assert_eq!(
            recent.get(&Text::from("svc"), &b, &c),
            None,
            "equal text elsewhere"
        );
        assert_eq!(recent.get(&a, &c, &b), None, "order matters");
        recent.clear();
        assert_eq!(recent.get(&a, &b, &c), None);
    }

    #[test]
    fn pair_cache_hits_only_the_same_allocations() {
        let mut cache = PairCache::default();
        let service = Text::from("engine");
        let name = Text::from("decode");
        assert_eq!(cache.get(&service, &name), None);
        cache.insert(&service, &name, 7u32);
        assert_eq!(cache.get(&service, &name), Some(&7));
        assert_eq!(cache.get(&service.clone(), &name.clone()), Some(&7));
        // Equal strings in other allocations are a miss (the caller looks them up), not a hit.
        assert_eq!(cache.get(&Text::from("engine"), &name), None);
        assert_eq!(cache.get(&service, &Text::from("decode")), None);
    }
}
