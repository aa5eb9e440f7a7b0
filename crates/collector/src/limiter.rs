//! The memory limiter: one shared budget of bytes that receivers and the assembler reserve from
//! before they hold data, so the collector refuses work (HTTP 429, gRPC `UNAVAILABLE`) before the
//! process grows past its configured limit, instead of being killed for running out of memory.
//!
//! Accounting is by estimate, not by asking the allocator: receivers reserve the body they hold
//! as it reads it, then an estimate of what decoding allocates ([`DECODED_BYTES_PER_WIRE_BYTE`]
//! for protobuf, [`json_decode_bound`](crate::otlp_decode::json_decode_bound) for JSON), the assembler reserves
//! [`span_footprint`] for every span it buffers. A [`MemoryReservation`] gives its bytes back when
//! dropped, so a refused, failed or finished piece of work can never leak budget.
//!
//! **Per-sender share.** The receivers reserve a request's memory — its body as it is read, the
//! inflated body, the decode bound — in a reservation attributed to its [`Sender`] (the bearer
//! token when authentication is on, else the peer's IP address:
//! [`MemoryLimiter::sender_reservation`]); a body that then waits in the forward queue stays
//! reserved for that sender until it is sent ([`MemoryReservation::split_off`]). Once more than
//! the soft limit (`limits.soft_limit_percent`, default [`SENDER_SHARE_FROM_PERCENT`] %) of the
//! limit is in use, a request may grow only while what its sender *otherwise* holds — its other
//! requests in progress and its bodies in the forward queue — is no more than the sender's fair
//! share: the limit (less the fixed memory, below) ÷ the number of senders holding memory
//! (counted as at least 2, so a sender alone keeps the rest of the limit free for the next
//! one). A request refused so gets the
//! usual retryable answer and is counted with reason `sender_share`. A sender's only request,
//! with nothing of its sender queued, is never refused for the share alone (only for the
//! limit), so a large request still fits whenever the limit has room for it. The spans
//! buffered by the assembler are reserved without a sender and only count towards the total
//! (see `docs/RELIABILITY.md`).
//!
//! **Fixed memory.** What the collector keeps whatever the load — its aggregates: KPI series,
//! critical-path windows, Prometheus label sets — is measured after it was allocated and held as
//! [`FixedMemory`]: counted in the total like any reservation, never refused, and never freed
//! by relief. The soft limit, the relief target and the senders' fair shares apply to the
//! *room* above it (the limit less the fixed memory), so relief only ever asks for what it can
//! free: were the thresholds fractions of the whole limit, aggregates above the relief target
//! would make every relief pass close every buffered trace.
//!
//! ```
//! use infertrace_collector::limiter::MemoryLimiter;
//!
//! let limiter = MemoryLimiter::new(1_000);
//! let mut held = limiter.try_reserve(600).unwrap();
//! assert!(limiter.try_reserve(600).is_none()); // would pass the limit: refused
//! let part = held.split(200).unwrap(); // hand 200 bytes to someone else
//! drop(held);
//! assert_eq!(limiter.used(), 200);
//! drop(part);
//! assert_eq!(limiter.used(), 0);
//! ```

use std::collections::HashMap;
use std::mem::size_of;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{AttrValue, Span, SpanLink};

/// Default memory limit: 512 MiB.
pub const DEFAULT_MEMORY_LIMIT_BYTES: usize = 512 * 1024 * 1024;

/// Estimated bytes a decoded batch occupies per byte of its protobuf encoding: an upper bound
/// for realistic inference traces (the `decoded_footprint_per_wire_byte_is_covered` test below
/// measures [`span_footprint`] of decoded spans ÷ wire bytes; `otlp-blast` prints it too).
pub const DECODED_BYTES_PER_WIRE_BYTE: usize = 3;

/// Default soft limit (percent of the limit — of the room above the [`FixedMemory`] —,
/// `limits.soft_limit_percent`): above it a sender's
/// request may grow only while the sender's other requests hold no more than its fair share
/// (module documentation), and memory relief starts.
pub const SENDER_SHARE_FROM_PERCENT: usize = 75;

/// Default relief target (percent of the limit — of the room above the [`FixedMemory`] —,
/// `limits.relief_target_percent`): past the soft
/// limit ([`MemoryLimiter::soft_limit`]) the pipeline frees what it can give up — the
/// recent-trace ring's oldest traces, buffered traces closed early — until the use would be
/// down to this share of the limit ([`MemoryLimiter::relief_excess`]).
pub const MEMORY_RELIEF_TARGET_PERCENT: usize = 50;

/// Who a request's memory is held for, for the per-sender share (module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sender {
    /// A bearer token, by the first 8 bytes of its SHA-256 (the token itself is not kept).
    Token(u64),
    /// A peer IP address (authentication off).
    Peer(IpAddr),
}

/// How much of one shared budget each sender holds — bytes of request memory here, places in
/// the forward queue there (`forward::share`) — and the fair share both rules compare it with.
#[derive(Debug, Default)]
pub(crate) struct SenderCounts(HashMap<Sender, usize>);

impl SenderCounts {
    /// What `sender` holds now.
    pub(crate) fn held(&self, sender: Sender) -> usize {
        self.0.get(&sender).copied().unwrap_or(0)
    }

    /// How many senders hold some now (a sender is counted exactly while it holds some).
    pub(crate) fn senders(&self) -> usize {
        self.0.len()
    }

    /// `sender`'s fair share of `budget`: the budget ÷ the senders holding some, `sender`
    /// included, counted as at least 2 (so that a sender alone leaves room for the next).
    pub(crate) fn fair_share(&self, sender: Sender, budget: usize) -> usize {
        let senders = self.0.len() + usize::from(!self.0.contains_key(&sender));
        budget / senders.max(2)
    }

    /// `sender` holds `amount` more.
    pub(crate) fn add(&mut self, sender: Sender, amount: usize) {
        if amount > 0 {
            *self.0.entry(sender).or_insert(0) += amount;
        }
    }

    /// `sender` holds `amount` less (never below nothing).
    pub(crate) fn remove(&mut self, sender: Sender, amount: usize) {
        if let Some(held) = self.0.get_mut(&sender) {
            *held = held.saturating_sub(amount);
            if *held == 0 {
                self.0.remove(&sender);
            }
        }
    }
}

/// Heap bookkeeping counted per allocation in [`span_footprint`] (allocator header and rounding).
const ALLOCATION_OVERHEAD: usize = 16;

/// A shared memory budget. Cheap to clone: clones share the same budget.
#[derive(Clone, Debug)]
pub struct MemoryLimiter {
    state: Arc<LimiterState>,
}

#[derive(Debug)]
struct LimiterState {
    limit: usize,
    /// The soft limit and the relief target, percent of `limit`.
    soft_percent: usize,
    target_percent: usize,
    used: AtomicUsize,
    /// Bytes of `used` held as [`FixedMemory`].
    fixed: AtomicUsize,
    refusals: AtomicU64,
    /// Bytes each sender's requests hold now.
    senders: Mutex<SenderCounts>,
}

/// Why a reservation could not grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The limit would be passed.
    Limit,
    /// The sender's other requests hold more than its fair share, and the limit is nearly
    /// full (module documentation).
    SenderShare,
    /// The reservation would pass the room (the limit less the aggregates): it could not be
    /// granted even with nothing else held, so retrying cannot help.
    NeverFits,
}

impl Default for MemoryLimiter {
    /// A limiter of [`DEFAULT_MEMORY_LIMIT_BYTES`].
    fn default() -> Self {
        Self::new(DEFAULT_MEMORY_LIMIT_BYTES)
    }
}

impl MemoryLimiter {
    /// A limiter that lets at most `limit_bytes` be reserved at once, with the default soft
    /// limit and relief target.
    pub fn new(limit_bytes: usize) -> Self {
        Self::with_thresholds(
            limit_bytes,
            SENDER_SHARE_FROM_PERCENT,
            MEMORY_RELIEF_TARGET_PERCENT,
        )
    }

    /// A limiter of `limit_bytes` whose soft limit is `soft_percent` % of it and whose memory
    /// relief frees down to `target_percent` % (both clamped to 100; the config checks them).
    pub fn with_thresholds(limit_bytes: usize, soft_percent: usize, target_percent: usize) -> Self {
        Self {
            state: Arc::new(LimiterState {
                limit: limit_bytes,
                soft_percent: soft_percent.min(100),
                target_percent: target_percent.min(100),
                used: AtomicUsize::new(0),
                fixed: AtomicUsize::new(0),
                refusals: AtomicU64::new(0),
                senders: Mutex::default(),
            }),
        }
    }

    /// The configured limit in bytes.
    pub fn limit(&self) -> usize {
        self.state.limit
    }

    /// Bytes reserved right now.
    pub fn used(&self) -> usize {
        self.state.used.load(Ordering::Relaxed)
    }

    /// Bytes that can still be reserved.
    pub fn available(&self) -> usize {
        self.limit().saturating_sub(self.used())
    }

    /// How many reservations were refused so far.
    pub fn refusals(&self) -> u64 {
        self.state.refusals.load(Ordering::Relaxed)
    }

    /// Reserves `bytes`, or returns `None` (and counts a refusal) when that would pass the limit.
    /// The bytes are given back when the returned reservation is dropped.
    pub fn try_reserve(&self, bytes: usize) -> Option<MemoryReservation> {
        if self.grow_used(bytes) {
            Some(MemoryReservation {
                limiter: self.clone(),
                bytes,
                sender: None,
                refused: None,
            })
        } else {
            None
        }
    }

    /// A reservation of zero bytes, to grow later.
    pub fn empty_reservation(&self) -> MemoryReservation {
        MemoryReservation {
            limiter: self.clone(),
            bytes: 0,
            sender: None,
            refused: None,
        }
    }

    /// A reservation of zero bytes for one request of `sender`, to grow later: it is held to
    /// the sender's share (module documentation).
    pub fn sender_reservation(&self, sender: Sender) -> MemoryReservation {
        MemoryReservation {
            limiter: self.clone(),
            bytes: 0,
            sender: Some(sender),
            refused: None,
        }
    }

    /// The soft limit, percent of the limit (default [`SENDER_SHARE_FROM_PERCENT`]).
    pub fn soft_percent(&self) -> usize {
        self.state.soft_percent
    }

    /// The use above which the per-sender share applies and memory relief starts: the fixed
    /// memory plus the soft percentage of the room above it (of the limit when none is held).
    pub fn soft_limit(&self) -> usize {
        self.fixed_plus_percent_of_room(self.state.soft_percent)
    }

    /// `percent` % of the room (the limit less the fixed memory).
    pub fn percent_of_room(&self, percent: usize) -> usize {
        let part = self.room() as u128 * percent as u128 / 100;
        usize::try_from(part).unwrap_or(usize::MAX)
    }

    /// Bytes to free for memory relief: past the soft limit, the use above the relief target
    /// (the fixed memory plus [`MEMORY_RELIEF_TARGET_PERCENT`] % of the room above it, by
    /// default); 0 below the soft limit.
    pub fn relief_excess(&self) -> usize {
        let used = self.used();
        if used < self.soft_limit() {
            return 0;
        }
        used.saturating_sub(self.fixed_plus_percent_of_room(self.state.target_percent))
    }

    /// Bytes held as [`FixedMemory`] now.
    pub fn fixed(&self) -> usize {
        self.state.fixed.load(Ordering::Relaxed)
    }

    /// The room the thresholds and shares apply to: the limit less the fixed memory.
    fn room(&self) -> usize {
        self.limit().saturating_sub(self.fixed())
    }

    fn fixed_plus_percent_of_room(&self, percent: usize) -> usize {
        self.percent_of_room(percent).saturating_add(self.fixed())
    }

    /// A [`FixedMemory`] of zero bytes, to set later.
    pub fn fixed_memory(&self) -> FixedMemory {
        FixedMemory {
            limiter: self.clone(),
            bytes: 0,
        }
    }

    /// Bytes `sender`'s requests hold now.
    pub fn sender_used(&self, sender: Sender) -> usize {
        self.senders().held(sender)
    }

    /// How many senders hold request memory now.
    pub fn active_senders(&self) -> usize {
        self.senders().senders()
    }

    fn senders(&self) -> std::sync::MutexGuard<'_, SenderCounts> {
        self.state.senders.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Grows a request of `sender` that holds `own` bytes by `bytes`, applying the share rule.
    fn grow_for(&self, sender: Sender, own: usize, bytes: usize) -> Result<(), Refused> {
        let mut senders = self.senders();
        let others = senders.held(sender).saturating_sub(own);
        let fair = senders.fair_share(sender, self.room());
        let soft = self.soft_limit();
        if self.used().saturating_add(bytes) > soft && others > fair {
            self.state.refusals.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::SenderShare);
        }
        if !self.grow_used(bytes) {
            return Err(Refused::Limit);
        }
        senders.add(sender, bytes);
        Ok(())
    }

    /// Takes `bytes` off `sender`'s count (the bytes themselves are released by the caller).
    fn unattribute(&self, sender: Sender, bytes: usize) {
        if bytes > 0 {
            self.senders().remove(sender, bytes);
        }
    }

    /// Adds `bytes` (already reserved) to `sender`'s count.
    fn attribute(&self, sender: Sender, bytes: usize) {
        if bytes > 0 {
            self.senders().add(sender, bytes);
        }
    }

    fn grow_used(&self, bytes: usize) -> bool {
        let limit = self.limit();
        let updated = self
            .state
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= limit)
            });
        if updated.is_err() {
            self.state.refusals.fetch_add(1, Ordering::Relaxed);
        }
        updated.is_ok()
    }

    fn release(&self, bytes: usize) {
        self.state.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    fn same_budget(&self, other: &MemoryLimiter) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

/// Bytes held from a [`MemoryLimiter`]; given back when dropped.
#[derive(Debug)]
pub struct MemoryReservation {
    limiter: MemoryLimiter,
    bytes: usize,
    /// The sender these bytes are counted for ([`MemoryLimiter::sender_reservation`]).
    sender: Option<Sender>,
    /// Why the last refused growth was refused.
    refused: Option<Refused>,
}

impl MemoryReservation {
    /// Bytes this reservation holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The limit of the limiter it reserves from.
    pub fn limit(&self) -> usize {
        self.limiter.limit()
    }

    /// The most a request can ever reserve from it: the limit less the fixed memory (the
    /// aggregates, never freed for a request). Above it a request is refused for good (413),
    /// not told to retry.
    pub fn room(&self) -> usize {
        self.limiter.room()
    }

    /// Reserves `bytes` more into this reservation; `false` (nothing changed) if over the limit,
    /// over the room, or, for a sender's reservation, over its share ([`refused`](Self::refused)
    /// says which).
    pub fn try_grow(&mut self, bytes: usize) -> bool {
        let grown = match self.sender {
            _ if self.bytes.saturating_add(bytes) > self.room() => {
                self.limiter.state.refusals.fetch_add(1, Ordering::Relaxed);
                Err(Refused::NeverFits)
            }
            None => match self.limiter.grow_used(bytes) {
                true => Ok(()),
                false => Err(Refused::Limit),
            },
            Some(sender) => self.limiter.grow_for(sender, self.bytes, bytes),
        };
        match grown {
            Ok(()) => self.bytes += bytes,
            Err(why) => self.refused = Some(why),
        }
        grown.is_ok()
    }

    /// Sets this reservation to `bytes` without checking the limit: for memory already
    /// allocated that the limiter must count (the recent-trace ring, after a merge). Past
    /// the limit, every later reservation is refused until it shrinks again.
    pub fn set_unchecked(&mut self, bytes: usize) {
        if bytes <= self.bytes {
            self.shrink(self.bytes - bytes);
            return;
        }
        let more = bytes - self.bytes;
        self.limiter.state.used.fetch_add(more, Ordering::AcqRel);
        if let Some(sender) = self.sender {
            self.limiter.attribute(sender, more);
        }
        self.bytes = bytes;
    }

    /// Why the last growth that failed was refused (`None` when none failed).
    pub fn refused(&self) -> Option<Refused> {
        self.refused
    }

    /// Gives `bytes` back to the limiter now (at most what is held).
    pub fn shrink(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        if let Some(sender) = self.sender {
            self.limiter.unattribute(sender, bytes);
        }
        self.limiter.release(bytes);
    }

    /// Moves `bytes` of this reservation into a new one (for handing part of the budget to
    /// another owner); `None` if this reservation holds fewer bytes. The new one has no sender:
    /// the bytes stop counting towards this one's sender.
    pub fn split(&mut self, bytes: usize) -> Option<MemoryReservation> {
        (bytes <= self.bytes).then(|| {
            self.bytes -= bytes;
            if let Some(sender) = self.sender {
                self.limiter.unattribute(sender, bytes);
            }
            MemoryReservation {
                limiter: self.limiter.clone(),
                bytes,
                sender: None,
                refused: None,
            }
        })
    }

    /// Moves `bytes` of this reservation into a new one that keeps counting them for the same
    /// sender (for memory that outlives the request but is still held on its sender's behalf,
    /// such as a body waiting in the forward queue); `None` if this reservation holds fewer.
    pub fn split_off(&mut self, bytes: usize) -> Option<MemoryReservation> {
        (bytes <= self.bytes).then(|| {
            self.bytes -= bytes;
            MemoryReservation {
                limiter: self.limiter.clone(),
                bytes,
                sender: self.sender,
                refused: None,
            }
        })
    }

    /// The sender these bytes count for (`None` for a reservation without one).
    pub fn sender(&self) -> Option<Sender> {
        self.sender
    }

    /// Takes `other`'s bytes into this reservation (and into this one's sender's count, if
    /// any). Fails, giving `other` back unchanged, when it comes from a different limiter.
    pub fn merge(&mut self, mut other: MemoryReservation) -> Result<(), MemoryReservation> {
        if !self.limiter.same_budget(&other.limiter) {
            return Err(other);
        }
        let bytes = std::mem::take(&mut other.bytes);
        if let Some(sender) = other.sender {
            self.limiter.unattribute(sender, bytes);
        }
        if let Some(sender) = self.sender {
            self.limiter.attribute(sender, bytes);
        }
        self.bytes += bytes;
        Ok(())
    }
}

impl Drop for MemoryReservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            if let Some(sender) = self.sender {
                self.limiter.unattribute(sender, self.bytes);
            }
            self.limiter.release(self.bytes);
        }
    }
}

/// Memory held in a [`MemoryLimiter`] that nothing can give back on demand: the aggregates,
/// measured after they were allocated (module documentation). Never refused; the thresholds
/// and shares apply to the room above it. Given back when dropped.
#[derive(Debug)]
pub struct FixedMemory {
    limiter: MemoryLimiter,
    bytes: usize,
}

impl FixedMemory {
    /// Sets what this holds to `bytes` (without checking the limit: the memory is already
    /// allocated). Past the limit, every reservation is refused until it shrinks again.
    pub fn set(&mut self, bytes: usize) {
        let state = &self.limiter.state;
        if bytes >= self.bytes {
            let more = bytes - self.bytes;
            state.fixed.fetch_add(more, Ordering::AcqRel);
            state.used.fetch_add(more, Ordering::AcqRel);
        } else {
            let less = self.bytes - bytes;
            state.used.fetch_sub(less, Ordering::AcqRel);
            state.fixed.fetch_sub(less, Ordering::AcqRel);
        }
        self.bytes = bytes;
    }

    /// Bytes this holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for FixedMemory {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// Estimated heap + inline bytes one decoded [`Span`] occupies, for the assembler's reservations.
///
/// Counts the `Span` struct, the capacity of its attribute and link vectors, and 16 bytes of
/// allocator overhead per heap allocation. Strings are not counted here: names and string
/// values are shared [`Text`]s, and the decoders report the bytes of the strings they allocate
/// per request (`IngestBatch::text_bytes`), which the pipeline reserves with the spans. The
/// service name is shared by all spans of a resource. An infertrace request span with 18 kept
/// attributes comes to about 850 bytes, a phase span with two attributes to about 230 bytes
/// (the `Span` struct alone is 120 bytes).
pub fn span_footprint(span: &Span) -> usize {
    let mut bytes = size_of::<Span>();
    if span.attributes.capacity() > 0 {
        bytes += span.attributes.capacity() * size_of::<(&'static str, AttrValue)>()
            + ALLOCATION_OVERHEAD;
    }
    for (_, value) in &span.attributes {
        bytes += match value {
            AttrValue::Str(_) => 0,
            AttrValue::StrArray(items) if items.capacity() > 0 => {
                items.capacity() * size_of::<Text>() + ALLOCATION_OVERHEAD
            }
            AttrValue::StrArray(_) => 0,
            AttrValue::Int(_) | AttrValue::Double(_) | AttrValue::Bool(_) => 0,
        };
    }
    if span.links.capacity() > 0 {
        bytes += span.links.capacity() * size_of::<SpanLink>() + ALLOCATION_OVERHEAD;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use infertrace_analysis::trace::{SpanId, SpanKind, StatusCode, TraceId};

    #[test]
    fn relief_excess_is_what_brings_use_to_half_once_past_the_soft_limit() {
        let limiter = MemoryLimiter::new(1000);
        let held = limiter.try_reserve(740).unwrap();
        assert_eq!(limiter.relief_excess(), 0, "under 75 %");
        let more = limiter.try_reserve(60).unwrap();
        assert_eq!(limiter.relief_excess(), 300, "800 in use, down to 500");
        drop((held, more));
        assert_eq!(limiter.relief_excess(), 0);
        // Configured thresholds (`limits.soft_limit_percent`, `relief_target_percent`).
        let limiter = MemoryLimiter::with_thresholds(1000, 90, 20);
        let held = limiter.try_reserve(850).unwrap();
        assert_eq!((limiter.soft_limit(), limiter.relief_excess()), (900, 0));
        let more = limiter.try_reserve(100).unwrap();
        assert_eq!(limiter.relief_excess(), 750, "950 in use, down to 200");
        drop((held, more));
    }

    #[test]
    fn thresholds_apply_to_the_room_above_the_fixed_memory() {
        let limiter = MemoryLimiter::new(1000);
        let mut fixed = limiter.fixed_memory();
        fixed.set(600);
        assert_eq!((limiter.used(), limiter.fixed()), (600, 600));
        // 400 of room: soft limit at 600 + 300, relief target at 600 + 200.
        assert_eq!(limiter.soft_limit(), 900);
        let data = limiter.try_reserve(250).unwrap();
        assert_eq!(limiter.relief_excess(), 0, "850 in use");
        let more = limiter.try_reserve(100).unwrap();
        // Fractions of the whole limit would ask for 450 (down to 500) of 350 freeable bytes.
        assert_eq!(limiter.relief_excess(), 150, "950 in use, down to 800");
        // Fixed memory is never refused; past the limit it leaves no room at all.
        fixed.set(1100);
        assert!(limiter.try_reserve(1).is_none());
        assert_eq!(limiter.relief_excess(), 350, "every freeable byte");
        fixed.set(100);
        assert_eq!((limiter.used(), limiter.soft_limit()), (450, 775));
        drop((data, more, fixed));
        assert_eq!((limiter.used(), limiter.fixed()), (0, 0));
    }

    #[test]
    fn reserve_refuses_past_the_limit_and_releases_on_drop() {
        let limiter = MemoryLimiter::new(100);
        let a = limiter.try_reserve(60).unwrap();
        assert_eq!(limiter.used(), 60);
        assert_eq!(limiter.available(), 40);
        assert!(limiter.try_reserve(41).is_none());
        assert_eq!(limiter.refusals(), 1);
        let b = limiter.try_reserve(40).unwrap();
        assert_eq!(limiter.available(), 0);
        drop(a);
        assert_eq!(limiter.used(), 40);
        drop(b);
        assert_eq!(limiter.used(), 0);
        assert!(limiter.try_reserve(usize::MAX).is_none());
    }

    #[test]
    fn split_merge_grow_shrink_keep_the_total_exact() {
        let limiter = MemoryLimiter::new(1_000);
        let mut r = limiter.try_reserve(500).unwrap();
        let part = r.split(200).unwrap();
        assert!(r.split(301).is_none());
        assert_eq!((r.bytes(), part.bytes(), limiter.used()), (300, 200, 500));
        r.merge(part).unwrap();
        assert_eq!((r.bytes(), limiter.used()), (500, 500));
        assert!(r.try_grow(500));
        assert!(!r.try_grow(1));
        assert_eq!(limiter.used(), 1_000);
        // Unchecked: counted even past the limit, which then refuses everything.
        let mut measured = limiter.empty_reservation();
        measured.set_unchecked(300);
        assert_eq!((limiter.used(), limiter.available()), (1_300, 0));
        assert!(limiter.try_reserve(1).is_none());
        measured.set_unchecked(100);
        assert_eq!(limiter.used(), 1_100);
        drop(measured);
        r.shrink(400);
        r.shrink(10_000); // clamps to what is held
        assert_eq!((r.bytes(), limiter.used()), (0, 0));
        let mut empty = limiter.empty_reservation();
        assert!(empty.try_grow(10));
        drop(empty);
        assert_eq!(limiter.used(), 0);
    }

    #[test]
    fn sender_counts_share_a_budget_among_the_senders_holding_some() {
        let a = Sender::Peer(IpAddr::from([127, 0, 0, 1]));
        let b = Sender::Peer(IpAddr::from([127, 0, 0, 2]));
        let mut counts = SenderCounts::default();
        // Alone, a sender's share is half: room is left for the next.
        assert_eq!(counts.fair_share(a, 100), 50);
        counts.add(a, 30);
        assert_eq!(counts.fair_share(a, 100), 50);
        assert_eq!(counts.fair_share(b, 100), 50, "b would be the second");
        counts.add(b, 0);
        assert_eq!(counts.senders(), 1, "holding nothing is not holding");
        counts.add(b, 5);
        counts.add(Sender::Token(7), 1);
        assert_eq!(counts.fair_share(a, 99), 33);
        counts.remove(a, 40);
        assert_eq!((counts.held(a), counts.senders()), (0, 2), "gone at zero");
        counts.remove(b, 2);
        assert_eq!(counts.held(b), 3);
    }

    #[test]
    fn a_request_growing_by_nothing_leaves_its_sender_uncounted() {
        // An empty HTTP body grows its reservation by 0 bytes: its sender holds nothing and must
        // not count among the senders that divide the limit (it stayed counted, with 0 bytes,
        // before the counts had one home).
        let limiter = MemoryLimiter::new(1_000);
        let sender = Sender::Peer([10, 0, 0, 3].into());
        let mut r = limiter.sender_reservation(sender);
        assert!(r.try_grow(0));
        assert_eq!(
            (limiter.active_senders(), limiter.sender_used(sender)),
            (0, 0)
        );
        drop(r);
        assert_eq!(limiter.active_senders(), 0);
    }

    #[test]
    fn past_the_soft_limit_a_sender_over_its_share_is_refused_and_others_are_not() {
        let limiter = MemoryLimiter::new(1_000);
        let heavy = Sender::Peer([10, 0, 0, 1].into());
        let light = Sender::Peer([10, 0, 0, 2].into());
        // Under 75 % in use nobody is refused for the share: six requests of 125 bytes.
        let mut held: Vec<_> = (0..6)
            .map(|_| {
                let mut r = limiter.sender_reservation(heavy);
                assert!(r.try_grow(125));
                r
            })
            .collect();
        assert_eq!((limiter.used(), limiter.sender_used(heavy)), (750, 750));
        // A seventh would pass 75 % while the sender's other requests hold 750 > 1000 / 2.
        let mut seventh = limiter.sender_reservation(heavy);
        assert!(!seventh.try_grow(125));
        assert_eq!(seventh.refused(), Some(Refused::SenderShare));
        assert_eq!(limiter.refusals(), 1);
        // Another sender still gets memory, up to the limit itself.
        let mut other = limiter.sender_reservation(light);
        assert!(other.try_grow(200));
        assert_eq!(limiter.active_senders(), 2);
        assert!(!other.try_grow(100));
        assert_eq!(other.refused(), Some(Refused::Limit));
        // A single request of a sender is never refused for the share, only for the limit.
        drop(other);
        held.truncate(1);
        let mut big = limiter.sender_reservation(heavy);
        assert!(
            big.try_grow(800),
            "one request may take what the limit has left"
        );
        assert_eq!(limiter.sender_used(heavy), 925);
        // Shrink, split, merge and drop keep the per-sender count exact.
        big.shrink(100);
        let part = big.split(200).unwrap();
        assert_eq!(limiter.sender_used(heavy), 625);
        big.merge(part).unwrap();
        assert_eq!(limiter.sender_used(heavy), 825);
        // `split_off` keeps the bytes counting for the sender until the part is dropped.
        let queued = big.split_off(300).unwrap();
        assert_eq!((queued.sender(), queued.bytes()), (Some(heavy), 300));
        assert!(big.split_off(526).is_none());
        drop(big);
        assert_eq!(limiter.sender_used(heavy), 300 + 125);
        drop((queued, held, seventh));
        assert_eq!((limiter.used(), limiter.active_senders()), (0, 0));
    }

    #[test]
    fn merge_across_limiters_is_refused() {
        let one = MemoryLimiter::new(100);
        let two = MemoryLimiter::new(100);
        let mut a = one.try_reserve(10).unwrap();
        let b = two.try_reserve(20).unwrap();
        let b = a.merge(b).unwrap_err();
        assert_eq!((a.bytes(), b.bytes()), (10, 20));
        assert_eq!((one.used(), two.used()), (10, 20));
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        let limiter = MemoryLimiter::new(10_000);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let limiter = limiter.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for _ in 0..10_000 {
                        if let Some(r) = limiter.try_reserve(7) {
                            held.push(r);
                        }
                        assert!(limiter.used() <= 10_000);
                        if held.len() > 300 {
                            held.clear();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(limiter.used(), 0);
    }

    /// A request span with 20 attributes (16 kept) and three phase spans with two each, as the
    /// middleware emits them: the decoded footprint per wire byte stays under the constant.
    #[test]
    fn decoded_footprint_per_wire_byte_is_covered() {
        use infertrace_semconv as sc;
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as PSpan};
        use prost::Message;

        let kv = |key: &str, value: Value| KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            key_strindex: 0,
        };
        let s = |v: &str| Value::StringValue(v.into());
        let mut spans = Vec::new();
        for i in 0..50u8 {
            let trace_id = vec![i + 1; 16];
            let mut attributes = vec![
                kv(sc::gen_ai::OPERATION_NAME, s("chat")),
                kv(sc::gen_ai::REQUEST_MODEL, s("llama-3.1-8b")),
                kv(sc::gen_ai::RESPONSE_MODEL, s("llama-3.1-8b")),
                kv(sc::gen_ai::USAGE_INPUT_TOKENS, Value::IntValue(812)),
                kv(sc::gen_ai::USAGE_OUTPUT_TOKENS, Value::IntValue(212)),
                kv(sc::net::HTTP_ROUTE, s("/v1/chat/completions")),
                kv(sc::infer::OUTCOME, s("ok")),
                kv("user_agent.original", s("python-httpx/0.27")),
                kv("server.address", s("10.0.0.12")),
                kv("url.path", s("/v1/chat/completions")),
                kv("server.port", Value::IntValue(8000)),
            ];
            for key in [
                sc::latency::TIME_IN_QUEUE,
                sc::latency::TIME_TO_FIRST_TOKEN,
                sc::latency::E2E,
                sc::infer::TIME_PER_OUTPUT_TOKEN,
                sc::infer::INTER_TOKEN_LATENCY_P50,
                sc::infer::INTER_TOKEN_LATENCY_P99,
                sc::infer::INTER_TOKEN_LATENCY_MAX,
                sc::infer::TIME_TO_FIRST_CHUNK,
                sc::infer::STREAM_CHUNKS,
            ] {
                attributes.push(kv(key, Value::DoubleValue(0.123)));
            }
            spans.push(PSpan {
                trace_id: trace_id.clone(),
                span_id: vec![1; 8],
                name: "chat llama-3.1-8b".into(),
                kind: 2,
                start_time_unix_nano: 1_700_000_000_000_000_000,
                end_time_unix_nano: 1_700_000_001_000_000_000,
                attributes,
                ..Default::default()
            });
            for (j, phase) in ["queue", "prefill", "decode"].into_iter().enumerate() {
                spans.push(PSpan {
                    trace_id: trace_id.clone(),
                    span_id: vec![j as u8 + 2; 8],
                    parent_span_id: vec![1; 8],
                    name: phase.into(),
                    kind: 1,
                    start_time_unix_nano: 1_700_000_000_000_000_000,
                    end_time_unix_nano: 1_700_000_000_500_000_000,
                    attributes: vec![
                        kv(sc::infer::PHASE, s(phase)),
                        kv(sc::gpu::UTILIZATION_MEAN, Value::DoubleValue(0.8)),
                    ],
                    ..Default::default()
                });
            }
        }
        let wire = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec();
        let decoded = crate::otlp_decode::decode_protobuf(&wire).unwrap();
        assert_eq!(decoded.spans.len(), 200);
        let footprint: usize = decoded.spans.iter().map(span_footprint).sum();
        let ratio = footprint as f64 / wire.len() as f64;
        assert!(
            ratio > 1.0 && ratio <= DECODED_BYTES_PER_WIRE_BYTE as f64,
            "decoded/wire = {ratio:.2}"
        );
        // Memory per buffered span stays under 1 KiB (the issue's target).
        assert!(footprint / decoded.spans.len() < 1024);
    }

    #[test]
    fn span_footprint_counts_owned_heap_memory() {
        let bare = Span {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([2; 8]),
            parent_span_id: None,
            name: "".into(),
            service: Text::from("svc"),
            kind: SpanKind::Server,
            start_unix_nano: 1,
            end_unix_nano: 2,
            status: StatusCode::Unset,
            attributes: Vec::new(),
            links: Vec::new(),
        };
        assert_eq!(span_footprint(&bare), size_of::<Span>());
        let long = "x".repeat(200);
        let mut span = bare.clone();
        span.name = "strings are reserved per request, not per span".into();
        span.attributes = Vec::with_capacity(2);
        span.attributes
            .push(("a", AttrValue::Str(long.as_str().into())));
        span.attributes.push((
            "b",
            AttrValue::StrArray(vec!["stop".into(), long.as_str().into()]),
        ));
        let expected = size_of::<Span>()
            + (2 * size_of::<(&str, AttrValue)>() + 16)
            + (2 * size_of::<Text>() + 16);
        assert_eq!(span_footprint(&span), expected);
    }
}
