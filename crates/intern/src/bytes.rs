//! [`same_bytes`]: byte equality tuned for the short strings of names, keys and values.

/// Byte equality in 8-byte words: for the short strings of span names, keys and values, an
/// inline word loop beats a call to `memcmp`. The tail under eight bytes is compared as two
/// overlapping 4-byte halves (or byte by byte under four), so it is no `memcmp` call either.
#[inline]
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (wa, wb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (wa.remainder(), wb.remainder());
    wa.zip(wb).all(|(x, y)| x == y) && same_tail(ra, rb)
}

/// [`same_bytes`] for two slices of the same length under eight.
#[inline]
fn same_tail(a: &[u8], b: &[u8]) -> bool {
    #[inline(always)]
    fn half(s: &[u8], at: usize) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&s[at..at + 4]);
        u32::from_ne_bytes(w)
    }
    let n = a.len();
    if n >= 4 {
        half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4)
    } else {
        a.iter().zip(b).all(|(x, y)| x == y)
    }
}

#[cfg(test)]
mod tests {
    use super::same_bytes;

    #[test]
    fn same_bytes_is_byte_equality_at_every_length_and_position() {
        // Every length through three words, a difference at every position (so each word, the
        // overlapping tail and both 4-byte halves are exercised), and unequal lengths.
        for n in 0..=24usize {
            let a: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
            assert!(same_bytes(&a, &a.clone()), "len {n}");
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x01;
                assert!(!same_bytes(&a, &b), "len {n}, differs at {at}");
            }
            let mut longer = a.clone();
            longer.push(0);
            assert!(!same_bytes(&a, &longer), "len {n} against {}", n + 1);
        }
    }
}
