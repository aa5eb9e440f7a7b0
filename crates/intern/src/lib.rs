//! The one process-wide registry of strings made `'static`, with one budget, and the
//! identity caches and byte equality that infertrace's crates use on those strings.
//!
//! Both halves of infertrace leak a few strings on purpose so that copying them touches no
//! reference count: the layer (`infertrace-tower`) its repeated request values and span names
//! (`&'static str`), the collector's analysis (`infertrace-analysis`) its most popular interned
//! texts (static [`ArcStr`]s). A shared counter incremented and decremented on every copy, by
//! the request threads and by the thread that drops the span or record, costs real CPU; a
//! static string costs nothing to copy or drop. When both run in one process (the demo, the
//! tests), they draw on this one registry: a string is leaked once, both get the same
//! allocation, and the memory the process never gives back has one bound:
//!
//! - a string longer than [`MAX_LEN`] bytes is refused;
//! - at most [`MAX_STRINGS`] distinct strings and [`MAX_BYTES`] bytes of text in all: 1 MiB of
//!   text, plus an [`ArcStr`] header (16 bytes) and allocator rounding per string and the
//!   registry's table, under 1.5 MiB altogether.
//!
//! Past the budget the registry still hands out what it holds and refuses anything new
//! (`None`); callers then keep reference-counted copies. The registry is a mutex around a hash
//! table, meant to be consulted on a caller's own per-thread cache miss, not per use.
//!
//! Two helpers for the same shared strings live here too, so that neither crate copies them:
//! [`same_bytes`] (byte equality for short strings without a `memcmp` call) and the caches keyed
//! by a string's allocation rather than its bytes ([`PairCache`], [`RecentTriple`]).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod bytes;
mod identity;

pub use bytes::same_bytes;
pub use identity::{Identity, PairCache, RecentTriple};

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

pub use arcstr::ArcStr;

/// Longest string the registry makes static, in bytes.
pub const MAX_LEN: usize = 256;

/// Distinct strings the process makes static, ever.
pub const MAX_STRINGS: usize = 8192;

/// Bytes of text the process makes static, ever (the sum of the strings' lengths).
pub const MAX_BYTES: usize = 1 << 20;

/// The process's registry.
static GLOBAL: Registry = Registry::new(MAX_STRINGS, MAX_BYTES);

/// `s` as a `'static` string: the registry's copy, made now if `s` is new. `None` when `s` is
/// longer than [`MAX_LEN`] or the budget is spent; the result is the same `&'static str` (same
/// address) for equal strings on every thread, whichever function made it static.
pub fn static_str(s: &str) -> Option<&'static str> {
    GLOBAL.static_str(s)
}

/// The registry's static [`ArcStr`] equal to `s`: the one already held, else `s` itself, made
/// static in place ([`ArcStr::leak`], so every existing clone of `s` becomes static too) and
/// kept. `None` when `s` is longer than [`MAX_LEN`] or the budget is spent. Compare the result
/// with [`ArcStr::ptr_eq`] to tell whether `s` itself was made static.
pub fn static_arcstr(s: &ArcStr) -> Option<ArcStr> {
    GLOBAL.static_arcstr(s)
}

/// What the registry holds and has refused so far.
pub fn stats() -> Stats {
    GLOBAL.stats()
}

/// Counts of the registry (see [`stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Distinct strings made static.
    pub strings: usize,
    /// Bytes of text made static.
    pub bytes: usize,
    /// Requests refused: strings too long, or new strings past the budget.
    pub refused: u64,
}

/// A registry of static strings with its budget (one per process: [`GLOBAL`]; tests make small
/// ones).
struct Registry {
    max_strings: usize,
    max_bytes: usize,
    table: Mutex<Option<Table>>,
    refused: AtomicU64,
}

/// The strings held (all static, never removed) and their total length.
#[derive(Default)]
struct Table {
    strings: HashSet<ArcStr>,
    bytes: usize,
}

impl Registry {
    const fn new(max_strings: usize, max_bytes: usize) -> Self {
        Self {
            max_strings,
            max_bytes,
            table: Mutex::new(None),
            refused: AtomicU64::new(0),
        }
    }

    fn static_str(&self, s: &str) -> Option<&'static str> {
        self.get_or_insert(s, || ArcStr::from(s))
            .as_ref()
            .map(ArcStr::leak)
    }

    fn static_arcstr(&self, s: &ArcStr) -> Option<ArcStr> {
        self.get_or_insert(s, || s.clone())
    }

    /// The held string equal to `s`, else `make()` made static and held, if the budget allows.
    fn get_or_insert(&self, s: &str, make: impl FnOnce() -> ArcStr) -> Option<ArcStr> {
        if s.len() > MAX_LEN {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // Nothing below panics while holding the lock (short of an allocation failure), so a
        // poisoned table is still consistent.
        let mut guard = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let table = guard.get_or_insert_with(Table::default);
        if let Some(held) = table.strings.get(s) {
            return Some(held.clone());
        }
        if table.strings.len() >= self.max_strings || table.bytes + s.len() > self.max_bytes {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let new = make();
        let _: &'static str = new.leak();
        table.bytes += s.len();
        table.strings.insert(new.clone());
        Some(new)
    }

    fn stats(&self) -> Stats {
        let guard = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let (strings, bytes) = guard
            .as_ref()
            .map_or((0, 0), |t| (t.strings.len(), t.bytes));
        Stats {
            strings,
            bytes,
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_and_byte_budgets_are_honoured() {
        let r = Registry::new(2, 1024);
        let one = r.static_str("one");
        assert_eq!(one, Some("one"));
        assert_eq!(r.static_str("two"), Some("two"));
        assert_eq!(r.static_str("three"), None, "two strings at most");
        let again = r.static_str("one");
        assert!(
            std::ptr::eq(one.unwrap(), again.unwrap()),
            "a full registry still hands out what it holds"
        );
        assert_eq!(
            r.stats(),
            Stats {
                strings: 2,
                bytes: 6,
                refused: 1
            }
        );

        let r = Registry::new(100, 10);
        assert!(r.static_str("12345").is_some());
        assert_eq!(r.static_str("123456"), None, "5 + 6 bytes > 10");
        assert!(r.static_arcstr(&ArcStr::from("abcde")).is_some(), "5 + 5");
        assert_eq!(r.static_str("x"), None);
        assert_eq!(r.static_arcstr(&ArcStr::from("y")), None);
        assert_eq!(r.static_str("abcde"), Some("abcde"));
        assert_eq!(
            r.stats(),
            Stats {
                strings: 2,
                bytes: 10,
                refused: 3
            }
        );
    }

    #[test]
    fn too_long_strings_are_refused() {
        let r = Registry::new(10, 1 << 20);
        let long = "x".repeat(MAX_LEN + 1);
        assert_eq!(r.static_str(&long), None);
        assert_eq!(r.static_arcstr(&ArcStr::from(long.as_str())), None);
        let exact = "y".repeat(MAX_LEN);
        assert_eq!(r.static_str(&exact), Some(exact.as_str()));
        assert_eq!(r.stats().strings, 1);
        assert_eq!(r.stats().refused, 2);
        assert_eq!(static_str(&long), None, "the process's registry too");
    }

    #[test]
    fn one_address_per_string_across_threads() {
        const S: &str = "intern test: one address across threads";
        let here = static_str(S).unwrap();
        let theirs: Vec<&'static str> = (0..4)
            .map(|_| std::thread::spawn(|| static_str(S).unwrap()))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        for t in theirs {
            assert!(std::ptr::eq(here, t));
        }
        // A copy of the string elsewhere in memory finds the same static one.
        let copy = String::from(S);
        assert!(std::ptr::eq(here, static_str(&copy).unwrap()));
        assert!(stats().strings >= 1);
    }

    #[test]
    fn str_and_arcstr_callers_share_one_allocation() {
        // The layer's path first, then the analysis's.
        const A: &str = "intern test: str first";
        let s = static_str(A).unwrap();
        let t = ArcStr::from(A);
        let shared = static_arcstr(&t).unwrap();
        assert!(
            !ArcStr::ptr_eq(&shared, &t),
            "the held one, not a second copy"
        );
        assert!(!ArcStr::is_static(&t), "t itself is left alone");
        assert!(std::ptr::eq(s.as_ptr(), shared.as_ptr()));
        assert_eq!(ArcStr::as_static(&shared), Some(s));

        // The analysis's path first: its own allocation is made static in place.
        const B: &str = "intern test: arcstr first";
        let t = ArcStr::from(B);
        let clone = t.clone();
        let shared = static_arcstr(&t).unwrap();
        assert!(ArcStr::ptr_eq(&shared, &t));
        assert!(ArcStr::is_static(&clone), "existing clones are static too");
        let s = static_str(B).unwrap();
        assert!(std::ptr::eq(s.as_ptr(), t.as_ptr()));
    }

    #[test]
    fn concurrent_use_admits_exactly_the_budget_and_agrees_on_addresses() {
        const THREADS: usize = 8;
        const WORDS: usize = 300;
        const BUDGET: usize = 100;
        let r = &Registry::new(BUDGET, 1 << 20);
        let words: Vec<String> = (0..WORDS).map(|n| format!("word {n}")).collect();
        let results: Vec<Vec<Option<usize>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let words = &words;
                    scope.spawn(move || {
                        // Each thread in its own order, half of them through the ArcStr path.
                        let mut out = vec![None; WORDS];
                        for i in 0..WORDS {
                            let at = (i * 7 + t * 37) % WORDS;
                            let w = &words[at];
                            out[at] = if t % 2 == 0 {
                                r.static_str(w).map(|s| s.as_ptr() as usize)
                            } else {
                                r.static_arcstr(&ArcStr::from(w.as_str()))
                                    .map(|s| s.as_ptr() as usize)
                            };
                        }
                        out
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // The budget only fills, so a string is either static for every thread, at one address,
        // or refused to every thread.
        let mut admitted = 0;
        for w in 0..WORDS {
            let first = results[0][w];
            assert!(results.iter().all(|r| r[w] == first), "{}", words[w]);
            admitted += usize::from(first.is_some());
        }
        assert_eq!(admitted, BUDGET);
        assert_eq!(r.stats().strings, BUDGET);
        assert_eq!(r.stats().refused, ((WORDS - BUDGET) * THREADS) as u64);
    }
}
