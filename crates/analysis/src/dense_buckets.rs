//! [`DenseBuckets`]: values over a contiguous range of bucket keys, grown as keys arrive.
//!
//! The KPI sketches and the critical-path windows both add values into log-scale buckets on
//! every request. A sorted vector or a map costs a search per add (a chain of dependent loads,
//! or a hash and a probe); an array indexed by `key − low` costs one increment. The array covers
//! the buckets seen so far and grows with headroom on the side a new key falls; it refuses to
//! grow past `MAX_SPAN` cells, or when fewer than one cell in [`MIN_OCCUPANCY`] would be
//! occupied, so that values spread thin over decades cost their owner its sparse form (a few
//! map or vector entries) and not a mostly empty array.

/// Fewest occupied cells per array cell a [`DenseBuckets`] keeps when it grows: 1 in 8.
pub(crate) const MIN_OCCUPANCY: usize = 8;

/// Values per bucket key over `low..low + len`, at most `MAX_SPAN` cells. A cell handed out by
/// [`get_mut`](Self::get_mut) counts as occupied (callers add to it); cells left at
/// `T::default()` are not reported.
#[derive(Clone, Debug, Default)]
pub(crate) struct DenseBuckets<T, const MAX_SPAN: usize> {
    /// The key of `values[0]`.
    low: i32,
    values: Vec<T>,
    /// Cells handed out.
    occupied: usize,
}

impl<T: Copy + Default + PartialEq, const MAX_SPAN: usize> DenseBuckets<T, MAX_SPAN> {
    /// The value of bucket `key`, the range grown to hold it; `None` when that would span more
    /// than `MAX_SPAN` cells or leave fewer than one in [`MIN_OCCUPANCY`] occupied (the caller
    /// keeps that key elsewhere).
    pub(crate) fn get_mut(&mut self, key: i32) -> Option<&mut T> {
        let at = self.index(key)?;
        let cell = self.values.get_mut(at)?;
        if *cell == T::default() {
            self.occupied += 1;
        }
        Some(cell)
    }

    /// The buckets of `pairs` (ascending keys, each once) in an array over exactly their range;
    /// `None` when that range spans more than `MAX_SPAN` cells or fewer than one in
    /// [`MIN_OCCUPANCY`] would be occupied. (Building it key by key with [`Self::get_mut`]
    /// judges the occupancy of each prefix: the thin low tail of a latency distribution would
    /// refuse keys that the whole set fills densely.)
    pub(crate) fn from_sorted(pairs: &[(i32, T)]) -> Option<Self> {
        let (first, last) = (pairs.first()?.0, pairs.last()?.0);
        let need = i64::from(last) - i64::from(first) + 1;
        if need > MAX_SPAN as i64 || (pairs.len() * MIN_OCCUPANCY) < need as usize {
            return None;
        }
        let mut values = vec![T::default(); usize::try_from(need).ok()?];
        let mut occupied = 0;
        for &(key, v) in pairs {
            let cell = values.get_mut(usize::try_from(i64::from(key) - i64::from(first)).ok()?)?;
            if v != T::default() && *cell == T::default() {
                occupied += 1;
            }
            *cell = v;
        }
        Some(Self {
            low: first,
            values,
            occupied,
        })
    }

    /// Where `key` is in `values`, grown to hold it (see [`Self::get_mut`]).
    fn index(&mut self, key: i32) -> Option<usize> {
        if self.values.is_empty() {
            self.low = key;
            self.values.push(T::default());
            return Some(0);
        }
        let (low, len) = (i64::from(self.low), self.values.len() as i64);
        let at = i64::from(key) - low;
        if (0..len).contains(&at) {
            return usize::try_from(at).ok();
        }
        let (lo, hi) = (low.min(i64::from(key)), (low + len - 1).max(i64::from(key)));
        let need = hi - lo + 1;
        let max = MAX_SPAN as i64;
        if need > max || ((self.occupied as i64 + 1) * MIN_OCCUPANCY as i64) < need {
            return None;
        }
        // Headroom on the side that grew: the next values spread a little more.
        let headroom = (need / 4).min(max - need);
        let (lo, hi) = if at < 0 {
            ((lo - headroom).max(i64::from(i32::MIN)), hi)
        } else {
            (lo, (hi + headroom).min(i64::from(i32::MAX)))
        };
        let mut grown = vec![T::default(); usize::try_from(hi - lo + 1).ok()?];
        let shift = usize::try_from(low - lo).ok()?;
        grown[shift..shift + self.values.len()].copy_from_slice(&self.values);
        self.values = grown;
        self.low = i32::try_from(lo).ok()?;
        usize::try_from(i64::from(key) - lo).ok()
    }

    /// Grows the range to hold `key` without handing its cell out (see [`Self::get_mut`] for
    /// when it refuses); whether `key` is now covered.
    pub(crate) fn reach(&mut self, key: i32) -> bool {
        self.index(key).is_some()
    }

    /// Whether `key` is within the array's current range (a [`Self::get_mut`] of it cannot fail).
    #[inline]
    pub(crate) fn covers(&self, key: i32) -> bool {
        ((i64::from(key) - i64::from(self.low)) as u64) < self.values.len() as u64
    }

    /// The buckets holding a value, by ascending key.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (i32, &T)> {
        let (zero, low) = (T::default(), i64::from(self.low));
        self.values
            .iter()
            .enumerate()
            .filter(move |(_, v)| **v != zero)
            // In range by construction: every cell lies between keys that were asked for.
            .filter_map(move |(i, v)| Some((i32::try_from(low + i as i64).ok()?, v)))
    }

    /// Buckets holding a value.
    pub(crate) fn occupied(&self) -> usize {
        self.occupied
    }

    /// Forgets every value, keeping the allocation.
    pub(crate) fn clear(&mut self) {
        self.values.clear();
        self.occupied = 0;
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.values.capacity() * std::mem::size_of::<T>()
    }

    /// Cells in the array.
    #[cfg(test)]
    pub(crate) fn span(&self) -> usize {
        self.values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_a_map_would_and_refuses_to_grow_wide_or_thin() {
        let mut d = DenseBuckets::<u64, 64>::default();
        let mut reference = std::collections::BTreeMap::new();
        let mut refused = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % 100) as i32 - 50;
            match d.get_mut(key) {
                Some(v) => {
                    *v += 1;
                    *reference.entry(key).or_insert(0u64) += 1;
                }
                None => refused.push(key),
            }
        }
        let got: Vec<(i32, u64)> = d.iter().map(|(k, v)| (k, *v)).collect();
        let want: Vec<(i32, u64)> = reference.into_iter().collect();
        assert_eq!(got, want, "ascending, every value");
        assert!(d.span() <= 64);
        assert!(
            !refused.is_empty(),
            "a range of 100 keys does not fit in 64 cells"
        );
        assert_eq!(d.occupied(), got.len());

        // Two keys far apart, then one a third of the way: too empty an array to grow.
        let mut thin = DenseBuckets::<u64, 1024>::default();
        assert!(thin.get_mut(0).is_some());
        assert!(thin.get_mut(500).is_none());
        assert!(thin.get_mut(7).is_some(), "1 in 8 occupied is fine");
        assert!(thin.span() <= 16);

        // Built at once from sorted pairs: judged on the whole range, not key by key.
        let tail_then_body: Vec<(i32, u64)> =
            [0, 20].into_iter().chain(21..40).map(|k| (k, 1)).collect();
        let built = DenseBuckets::<u64, 64>::from_sorted(&tail_then_body).expect("21 of 40 cells");
        assert_eq!(
            built.iter().map(|(k, v)| (k, *v)).collect::<Vec<_>>(),
            tail_then_body
        );
        assert_eq!(built.occupied(), tail_then_body.len());
        let mut by_key = DenseBuckets::<u64, 64>::default();
        assert!(by_key.get_mut(0).is_some());
        assert!(
            by_key.get_mut(20).is_none(),
            "2 keys over 21 cells, judged alone"
        );
        assert!(
            DenseBuckets::<u64, 64>::from_sorted(&[(0, 1), (40, 1)]).is_none(),
            "too thin"
        );
        assert!(
            DenseBuckets::<u64, 8>::from_sorted(&(0..9).map(|k| (k, 1)).collect::<Vec<_>>())
                .is_none(),
            "too wide"
        );
        assert!(DenseBuckets::<u64, 8>::from_sorted(&[]).is_none());

        // The ends of the key range are reported, not overflowed.
        let mut ends = DenseBuckets::<u64, 8>::default();
        for key in [i32::MAX, i32::MAX - 1, i32::MIN, i32::MIN + 1] {
            if let Some(v) = ends.get_mut(key) {
                *v += 1;
            }
        }
        let keys: Vec<i32> = ends.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec![i32::MAX - 1, i32::MAX]);
        ends.clear();
        assert_eq!(ends.iter().count(), 0);
        assert_eq!(ends.occupied(), 0);
    }
}
