//! What memory relief may free: the reservations the assembler's traces hold, counted exactly
//! (not estimated from the limiter's use, which also holds the bodies of requests still being
//! read and decoded — memory that closing traces cannot free).
//!
//! Memory relief, in the order it acts (its home is spread over the modules that own what it
//! frees):
//! 1. past the soft limit the limiter asks for the bytes above the relief target
//!    ([`MemoryLimiter::relief_excess`](crate::limiter::MemoryLimiter::relief_excess)), and
//!    each sender's share of new requests applies (`limiter.rs`);
//! 2. at the tick the recent-trace ring gives way first (`shrink_to`, in this module's parent);
//! 3. then the oldest buffered traces are closed early, the flooding service's first
//!    ([`traces_to_close`] here, `relieve_memory` in the parent,
//!    `TraceAssembler::close_oldest_for_memory`), never below [`ASSEMBLER_KEEPS_PERCENT`] of
//!    the room;
//! 4. what is still short refuses new requests, retryable (the receivers);
//! 5. apart from the limiter, near the process's bound the allocator returns freed memory at
//!    once (`resident.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::assembler::MemoryHold;
use crate::limiter::MemoryReservation;

/// The share of the room (the limit less the aggregates) the assembler's traces always keep:
/// relief closes none while they hold less. When what fills the memory is requests in transit,
/// they are refused (retryable) until it drains, rather than the buffered traces closed before
/// their late spans arrive.
pub(super) const ASSEMBLER_KEEPS_PERCENT: usize = 25;

/// The bytes of the reservations handed to the assembler and not yet released.
#[derive(Debug, Default)]
pub(super) struct AssembledBytes(Arc<AtomicUsize>);

impl AssembledBytes {
    /// `reservation` as the assembler's hold, counted until its last clone is dropped.
    pub(super) fn hold(&self, reservation: MemoryReservation) -> MemoryHold {
        self.0.fetch_add(reservation.bytes(), Ordering::Relaxed);
        Arc::new(Counted {
            reservation,
            of: self.0.clone(),
        })
    }

    /// Bytes held now.
    pub(super) fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A reservation counted in [`AssembledBytes`] while it lives.
struct Counted {
    reservation: MemoryReservation,
    of: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.of
            .fetch_sub(self.reservation.bytes(), Ordering::Relaxed);
    }
}

/// How many of `traces` in flight to close for memory relief: in proportion to the `excess`
/// over the relief target, of the `held` bytes the assembler holds above what it keeps
/// (`keeps`); none when it holds no more than that.
pub(super) fn traces_to_close(traces: usize, excess: usize, held: usize, keeps: usize) -> usize {
    let freeable = held.saturating_sub(keeps);
    if freeable == 0 {
        return 0;
    }
    let excess = excess.min(freeable);
    // ceil(traces × excess / held), in u128: traces × bytes can pass u64 on paper.
    let n = (traces as u128 * excess as u128).div_ceil(held as u128);
    usize::try_from(n).unwrap_or(traces).min(traces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::MemoryLimiter;

    #[test]
    fn the_assembled_bytes_are_counted_until_the_last_hold_is_dropped() {
        let limiter = MemoryLimiter::new(1 << 20);
        let mut r = limiter.empty_reservation();
        assert!(r.try_grow(1_000));
        let bytes = AssembledBytes::default();
        let hold = bytes.hold(r);
        let other = hold.clone();
        assert_eq!(bytes.get(), 1_000);
        drop(hold);
        assert_eq!(bytes.get(), 1_000, "another trace still holds it");
        drop(other);
        assert_eq!((bytes.get(), limiter.used()), (0, 0));
    }

    #[test]
    fn relief_closes_in_proportion_and_never_below_what_the_assembler_keeps() {
        // 100 traces holding 80 MB, keeping 20: 30 MB over the target closes 38.
        assert_eq!(traces_to_close(100, 30 << 20, 80 << 20, 20 << 20), 38);
        // Past what can be freed: only down to what it keeps (60 of 80 MB: 75 traces).
        assert_eq!(traces_to_close(100, 200 << 20, 80 << 20, 20 << 20), 75);
        // Holding less than it keeps (the excess is requests in transit): none.
        assert_eq!(traces_to_close(100, 30 << 20, 5 << 20, 20 << 20), 0);
        assert_eq!(traces_to_close(0, 30 << 20, 80 << 20, 0), 0);
    }
}
