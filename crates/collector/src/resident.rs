//! The process's resident memory against the bound the memory limit states
//! (`limits.memory_limit_bytes` plus [`OVERHEAD`]). The limiter holds what the collector
//! reserves; the allocator may keep memory resident after it is freed, to reuse it (mimalloc
//! returns it after a delay, which spares page faults at full rate), and under heavy churn
//! with the limiter full, or with a small limit, that kept memory alone passed the overhead
//! (docs/RELIABILITY.md). So at every assembly tick the resident set is read, and while it is
//! within [`RETURN_WITHIN`] of the bound the allocator is told to return what it keeps at once
//! (slower: memory is then faulted in again), and once it is back below, that it may keep it
//! again — through the hook the binary installs ([`set_return_freed_memory`]): the allocator
//! is the binary's choice, not this library's. Kept memory is not held in the limiter: new
//! data reuses it without growing the process.

use std::sync::OnceLock;

/// What the process may hold beyond `limits.memory_limit_bytes`: its code, thread stacks,
/// runtime and connection buffers, and memory the allocator keeps for a while.
pub const OVERHEAD: usize = 64 << 20;

/// How close to the bound the resident set may come before the allocator is told to return
/// what it keeps at once.
pub const RETURN_WITHIN: usize = 32 << 20;

/// How far below where it started the resident set must fall before the allocator may keep
/// freed memory again (so that a set hovering there does not switch it at every tick).
pub const KEEP_BELOW: usize = 16 << 20;

/// The hook that tells the allocator whether to return the freed memory it keeps.
static RETURN_FREED: OnceLock<fn(bool)> = OnceLock::new();

/// Installs `hook`: called with `true` at every tick while the resident set is within
/// [`RETURN_WITHIN`] of the bound (return freed memory now), and with `false` at the first
/// tick it is [`KEEP_BELOW`] below that again, or cannot be read (keep it again, as before). The `infertrace` binary has mimalloc purge
/// at once meanwhile. Only the first call installs one.
pub fn set_return_freed_memory(hook: fn(bool)) {
    let _ = RETURN_FREED.set(hook);
}

/// The process's resident set, bytes, as sysinfo reads it (as the GPU crate's host sampler
/// does); `None` where it cannot (there the watch does nothing).
pub fn resident_bytes() -> Option<usize> {
    use sysinfo::{ProcessRefreshKind, ProcessesToUpdate, System};
    let pid = sysinfo::get_current_pid().ok()?;
    let mut system = System::new();
    system.refresh_processes_specifics(
        ProcessesToUpdate::Some(&[pid]),
        false,
        ProcessRefreshKind::nothing().with_memory(),
    );
    usize::try_from(system.process(pid)?.memory()).ok()
}

/// Reads the resident set and tells the allocator what to do with the memory it keeps (see the
/// module docs).
pub(crate) struct ResidentWatch {
    /// Where the allocator is told to return what it keeps.
    return_from: usize,
    read: fn() -> Option<usize>,
    hook: Option<fn(bool)>,
    /// Whether the allocator was last told to return what it keeps.
    returning: bool,
}

impl ResidentWatch {
    /// A watch of what `read` says is resident, against the bound of `limit`, telling the
    /// installed hook.
    pub(crate) fn new(limit: usize, read: fn() -> Option<usize>) -> Self {
        Self::with_hook(limit, read, RETURN_FREED.get().copied())
    }

    fn with_hook(limit: usize, read: fn() -> Option<usize>, hook: Option<fn(bool)>) -> Self {
        Self {
            return_from: limit.saturating_add(OVERHEAD).saturating_sub(RETURN_WITHIN),
            read,
            hook,
            returning: false,
        }
    }

    /// Reads the resident set and tells the allocator to return what it keeps while the set
    /// is within [`RETURN_WITHIN`] of the bound (and, once, when it is [`KEEP_BELOW`] below
    /// that again). Returns the resident set, whether the allocator is returning memory now,
    /// and whether it just started to (for a log line); without a hook installed nothing is
    /// returned, and the answer says so.
    pub(crate) fn check(&mut self) -> Option<(usize, bool, bool)> {
        let Some(resident) = (self.read)() else {
            self.tell(false);
            return None;
        };
        let returning = if self.returning {
            resident > self.return_from.saturating_sub(KEEP_BELOW)
        } else {
            resident > self.return_from
        };
        let was = self.returning;
        self.tell(returning);
        Some((resident, self.returning, self.returning && !was))
    }

    /// Tells the hook, if any: at every tick while returning, and once when that ends.
    fn tell(&mut self, returning: bool) {
        let Some(hook) = self.hook else {
            return;
        };
        if returning || self.returning {
            hook(returning);
        }
        self.returning = returning;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_resident_set_is_read() {
        let rss = resident_bytes().expect("the resident set");
        assert!(rss > 1 << 20, "{rss}");
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            // What VmRSS says, within what a moment's allocations move it.
            let kib: usize = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0);
            assert!(
                kib * 1024 / 2 < rss && rss < kib * 1024 * 2,
                "{rss} vs {kib} KiB"
            );
        }
    }

    /// The allocator is told to return what it keeps at every tick while the resident set is
    /// within `RETURN_WITHIN` of the bound, and once to keep it when it is `KEEP_BELOW` below
    /// that; not at all while it stays below. Without a hook, nothing is reported returned.
    #[test]
    fn the_allocator_returns_memory_only_near_the_bound() {
        static RESIDENT: AtomicUsize = AtomicUsize::new(0);
        static TOLD: Mutex<Vec<bool>> = Mutex::new(Vec::new());
        fn read() -> Option<usize> {
            Some(RESIDENT.load(Ordering::Relaxed))
        }
        fn hook(now: bool) {
            TOLD.lock().unwrap().push(now);
        }
        let limit = 128 << 20;
        let from = limit + OVERHEAD - RETURN_WITHIN;
        let mut watch = ResidentWatch::with_hook(limit, read, Some(hook));
        let mut tick = |resident: usize| {
            RESIDENT.store(resident, Ordering::Relaxed);
            watch.check().unwrap()
        };
        assert_eq!(tick(limit), (limit, false, false));
        assert_eq!(tick(from), (from, false, false));
        assert!(TOLD.lock().unwrap().is_empty());
        assert_eq!(tick(from + 1), (from + 1, true, true));
        assert_eq!(tick(from + 2), (from + 2, true, false));
        // Hovering just below where it started: still returning.
        assert_eq!(tick(from - 1), (from - 1, true, false));
        assert_eq!(tick(from - KEEP_BELOW), (from - KEEP_BELOW, false, false));
        assert_eq!(
            tick(from - KEEP_BELOW - 1),
            (from - KEEP_BELOW - 1, false, false)
        );
        assert_eq!(*TOLD.lock().unwrap(), [true, true, true, false]);
        let mut unhooked = ResidentWatch::with_hook(limit, read, None);
        RESIDENT.store(from + 1, Ordering::Relaxed);
        assert_eq!(unhooked.check(), Some((from + 1, false, false)));
    }
}
