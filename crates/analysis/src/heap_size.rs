//! What the standard containers the aggregates use cost on the heap, for the collector's memory
//! accounting: the `approx_memory_bytes` estimates of the KPI windows, the critical-path windows
//! and the collector's Prometheus recorder are built from these.

use std::collections::HashMap;
use std::mem::size_of;

/// The strong and weak counts in front of every `Arc`'s value.
pub const ARC_HEADER_BYTES: usize = 2 * size_of::<usize>();

/// Bytes of an `Arc<str>` of `len` bytes: its counts and the string, rounded up to the
/// allocation's 8-byte alignment.
pub fn arc_str_bytes(len: usize) -> usize {
    (ARC_HEADER_BYTES + len).next_multiple_of(align_of::<usize>())
}

/// Bytes of a `HashMap` (hashbrown's layout) whose `capacity()` is `capacity`, of entries of
/// `entry` bytes: a power-of-two number of buckets (at most 7/8 used from eight on, all but one
/// below), each with its entry and a control byte, and a group of 16 trailing control bytes.
pub fn map_table_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    buckets * (entry + 1) + 16
}

/// Bytes of an index of lists (a `HashMap` of `Vec`s): its table ([`map_table_bytes`]) and
/// each list's buffer, from its capacity.
pub fn list_map_bytes<K, V, S>(map: &HashMap<K, Vec<V>, S>) -> usize {
    map_table_bytes(map.capacity(), size_of::<(K, Vec<V>)>())
        + map
            .values()
            .map(|list| list.capacity() * size_of::<V>())
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_map_table_is_sized_from_its_capacity_as_hashbrown_lays_it_out() {
        // hashbrown's capacities are 3, 7, 14, 28…: buckets 4, 8, 16, 32….
        for (entries, buckets) in [(1, 4), (4, 8), (8, 16), (20, 32), (100, 128)] {
            let map: HashMap<u64, u64> = (0..entries).map(|i| (i, i)).collect();
            let entry = size_of::<(u64, u64)>();
            assert_eq!(
                map_table_bytes(map.capacity(), entry),
                buckets * (entry + 1) + 16,
                "{entries} entries, capacity {}",
                map.capacity()
            );
        }
        assert_eq!(map_table_bytes(0, 16), 0);
    }

    #[test]
    fn an_index_of_lists_adds_each_list_buffer() {
        let mut map: HashMap<u64, Vec<usize>> = HashMap::new();
        map.insert(1, Vec::with_capacity(3));
        map.insert(2, vec![7]);
        let lists: usize = map
            .values()
            .map(|l| l.capacity() * size_of::<usize>())
            .sum();
        assert_eq!(
            list_map_bytes(&map),
            map_table_bytes(map.capacity(), size_of::<(u64, Vec<usize>)>()) + lists
        );
    }

    #[test]
    fn an_arc_str_is_rounded_to_its_alignment() {
        assert_eq!(arc_str_bytes(0), 16);
        assert_eq!(arc_str_bytes(1), 24);
        assert_eq!(arc_str_bytes(8), 24);
        assert_eq!(arc_str_bytes(9), 32);
    }
}
