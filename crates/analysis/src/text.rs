//! [`Text`]: the immutable, cheaply cloned string of span names and string attribute values.
//!
//! Collectors see the same few names and values (model, operation, outcome, route, phase
//! names) in every trace. Decoders intern them ([`Interner`]), so a span holds an 8-byte
//! shared pointer ([`arcstr::ArcStr`]) instead of its own heap copy: no allocation per value
//! on the hot path, a smaller footprint per buffered span, and a clone is a reference-count
//! increment — or nothing at all for the values seen over and over, which the interner makes
//! *static* (see [`Interner`]): their clones and drops touch no shared counter, where atomic
//! increments and decrements on every name and value of every span would cost real CPU at full
//! ingest rate (figures in docs/PERFORMANCE.md).

use std::borrow::Borrow;
use std::fmt;
use std::hash::BuildHasher;
use std::ops::Deref;
use std::sync::Arc;

use arcstr::ArcStr;
use serde::{Serialize, Serializer};

/// An immutable shared string (an [`ArcStr`] that reads like a `&str`).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Text(ArcStr);

impl Text {
    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Text {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Self(ArcStr::from(s))
    }
}

impl From<&Arc<str>> for Text {
    fn from(s: &Arc<str>) -> Self {
        Self(ArcStr::from(&**s))
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Self(ArcStr::from(s))
    }
}

impl Text {
    /// Whether two texts are the same allocation (not merely equal strings).
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        ArcStr::ptr_eq(&a.0, &b.0)
    }

    /// A text that is static from the start, for constants: never freed, so cloning and
    /// dropping it touches no shared counter.
    pub fn leaked(s: &str) -> Self {
        let t = Self::from(s);
        let _: &'static str = t.0.leak();
        t
    }

    /// Whether clones and drops of this text skip reference counting (see [`Interner`]).
    pub fn is_static(&self) -> bool {
        ArcStr::is_static(&self.0)
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Text {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Longest text an [`Interner`] hands out: longer strings are cut, at a character boundary, to
/// at most this many bytes (and counted, see [`Interner::take_truncated`]). Span names, service
/// names and the attribute values the analysis keeps become labels and dimensions; a 1 MiB
/// model name must not become a 1 MiB label on every Prometheus series.
pub const MAX_TEXT_LEN: usize = 256;

/// Most strings an array attribute keeps: a longer array keeps its first this many and is
/// counted as cut with the texts ([`Interner::take_truncated`]). The kept arrays (finish
/// reasons) hold one string per choice; a body of millions of empty strings must not cost the
/// collector 16 bytes of memory for each 4 bytes on the wire.
pub const MAX_ARRAY_ITEMS: usize = 64;

/// Strings longer than this are not interned (they are rarely repeated).
pub const MAX_INTERNED_LEN: usize = 96;

/// Distinct strings an [`Interner`] holds before it starts over (bounds its memory when
/// values are not repeated after all).
pub const MAX_INTERNED: usize = 4096;

/// Hands out one shared [`Text`] per distinct short string. Bounded: past [`MAX_INTERNED`]
/// entries it forgets everything and starts over, so a stream of unique values costs what
/// copying them would, never unbounded memory.
#[derive(Default)]
pub struct Interner {
    table: hashbrown::HashTable<Text>,
    hasher: foldhash::fast::RandomState,
    fresh_bytes: usize,
    /// Strings cut to [`MAX_TEXT_LEN`] since the last [`Interner::take_truncated`].
    truncated: u64,
    /// A direct-mapped cache in front of the table, indexed by length and three bytes: the
    /// same few values arrive span after span, and a hit here costs one comparison instead of
    /// hashing every byte and probing the table. Sized [`RECENT_SLOTS`] on first use.
    recent: Vec<Option<Text>>,
    /// Hits of each front-cache slot's string since it took the slot (see [`promote`]).
    recent_hits: Vec<u32>,
}

/// Front-cache hits after which an interned string is made static (see [`promote`]).
const PROMOTE_AFTER_HITS: u32 = 64;

/// Distinct strings the whole process may make static, ever: the budget of the process's one
/// registry of static strings (`infertrace_intern`), which the layer (`infertrace-tower`)
/// shares when it runs in the same process. Never freed, hence the bound (with one on their
/// total bytes, under 1.5 MiB in all): past it, strings stay counted.
pub const MAX_STATIC_TEXTS: usize = infertrace_intern::MAX_STRINGS;

/// Makes a popular interned string static ([`ArcStr::leak`]): from then on, cloning or
/// dropping it (every span and record that carries it does both) touches no shared counter.
/// Returns the process's static text for it when another thread (or the layer) made one first
/// (the caller uses that one instead of `t`); `None` when `t` itself was made static, or
/// nothing was done because the process's budget of static strings is spent (see
/// [`MAX_STATIC_TEXTS`]).
fn promote(t: &Text) -> Option<Text> {
    if t.is_static() {
        return None;
    }
    let shared = infertrace_intern::static_arcstr(&t.0)?;
    (!ArcStr::ptr_eq(&shared, &t.0)).then_some(Text(shared))
}

/// Slots of [`Interner`]'s front cache (a power of two).
const RECENT_SLOTS: usize = 256;

/// The front-cache slot of a string: its length and first, middle and last bytes.
fn recent_slot(bytes: &[u8]) -> usize {
    let n = bytes.len();
    let (first, middle, last) = match n {
        0 => (0, 0, 0),
        _ => (bytes[0], bytes[n / 2], bytes[n - 1]),
    };
    let mix =
        n.wrapping_mul(31) ^ usize::from(first) << 2 ^ usize::from(middle) << 4 ^ usize::from(last);
    mix & (RECENT_SLOTS - 1)
}

pub(crate) use infertrace_intern::same_bytes;

/// A [`Text`] is identified by its allocation: the identity caches of
/// [`infertrace_intern`] compare texts by address.
impl infertrace_intern::Identity for Text {
    fn address(&self) -> usize {
        self.as_ptr() as usize
    }
}

/// Heap bytes charged per string allocated (the `Arc` header and allocator slack).
const STRING_OVERHEAD: usize = 32;

impl std::fmt::Debug for Interner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interner")
            .field("len", &self.table.len())
            .finish_non_exhaustive()
    }
}

impl Interner {
    /// The shared [`Text`] for `s`.
    pub fn intern(&mut self, s: &str) -> Text {
        self.intern_utf8(s.as_bytes())
            .unwrap_or_else(|_| Text::from(s))
    }

    /// The shared [`Text`] for UTF-8 `bytes` (as decoders read them off the wire), or the
    /// UTF-8 error. Bytes already held were validated when they were first seen, so a hit
    /// skips validation.
    pub fn intern_utf8(&mut self, bytes: &[u8]) -> Result<Text, std::str::Utf8Error> {
        if bytes.len() > MAX_INTERNED_LEN {
            let s = std::str::from_utf8(bytes)?;
            let s = self.truncate(s);
            self.note_fresh(s.len());
            return Ok(Text::from(s));
        }
        let Self {
            table,
            hasher,
            fresh_bytes,
            truncated: _,
            recent,
            recent_hits,
        } = self;
        if recent.is_empty() {
            recent.resize(RECENT_SLOTS, None);
            recent_hits.resize(RECENT_SLOTS, 0);
        }
        let at = recent_slot(bytes);
        let slot = &mut recent[at];
        if let Some(t) = slot
            && same_bytes(t.as_bytes(), bytes)
        {
            if !t.is_static() {
                // One attempt per string and slot: past the budget, counting goes on idle.
                let hits = &mut recent_hits[at];
                *hits = hits.saturating_add(1);
                if *hits == PROMOTE_AFTER_HITS
                    && let Some(shared) = promote(t)
                {
                    let hash = hasher.hash_one(bytes);
                    if let Some(entry) = table.find_mut(hash, |e| same_bytes(e.as_bytes(), bytes)) {
                        *entry = shared.clone();
                    }
                    *t = shared;
                }
            }
            return Ok(t.clone());
        }
        recent_hits[at] = 0;
        let hash = hasher.hash_one(bytes);
        if let Some(t) = table.find(hash, |t| same_bytes(t.as_bytes(), bytes)) {
            *slot = Some(t.clone());
            return Ok(t.clone());
        }
        let t = Text::from(std::str::from_utf8(bytes)?);
        if table.len() >= MAX_INTERNED {
            table.clear();
        }
        table.insert_unique(hash, t.clone(), |t| hasher.hash_one(t.as_bytes()));
        *fresh_bytes += bytes.len() + STRING_OVERHEAD;
        *slot = Some(t.clone());
        Ok(t)
    }

    /// `s` cut at a character boundary to at most [`MAX_TEXT_LEN`] bytes (counted when cut).
    pub fn truncate<'a>(&mut self, s: &'a str) -> &'a str {
        if s.len() <= MAX_TEXT_LEN {
            return s;
        }
        self.truncated += 1;
        let mut end = MAX_TEXT_LEN;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        &s[..end]
    }

    /// Strings cut by [`truncate`](Self::truncate) since the last call, then zero.
    pub fn take_truncated(&mut self) -> u64 {
        std::mem::take(&mut self.truncated)
    }

    /// Counts `n` more cut texts: ones a decoder cut itself (a string past [`MAX_TEXT_LEN`], an
    /// array past [`MAX_ARRAY_ITEMS`]), or a count taken with
    /// [`take_truncated`](Self::take_truncated) and given back.
    pub fn count_truncated(&mut self, n: u64) {
        self.truncated += n;
    }

    /// Counts a string of `len` bytes allocated outside the table (a value never interned).
    pub fn note_fresh(&mut self, len: usize) {
        self.fresh_bytes += len + STRING_OVERHEAD;
    }

    /// Heap bytes of the strings allocated since the last call (new distinct values, long or
    /// unshared ones), then zero: what a decoder's caller adds to its memory reservation, as
    /// spans that share a string do not each pay for it.
    pub fn take_fresh_bytes(&mut self) -> usize {
        std::mem::take(&mut self.fresh_bytes)
    }

    /// Gives back bytes taken with [`take_fresh_bytes`](Self::take_fresh_bytes) that belong
    /// to the caller of the next take (a decode in between is charged elsewhere).
    pub fn restore_fresh_bytes(&mut self, bytes: usize) {
        self.fresh_bytes += bytes;
    }

    /// Distinct strings held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_texts_are_cut_at_a_character_boundary_and_counted() {
        let mut i = Interner::default();
        let long = format!("{}é{}", "a".repeat(MAX_TEXT_LEN - 1), "b".repeat(1000));
        let t = i.intern(&long);
        assert_eq!(
            t.len(),
            MAX_TEXT_LEN - 1,
            "cut before the two-byte character"
        );
        assert!(long.starts_with(t.as_str()));
        let exact = "c".repeat(MAX_TEXT_LEN);
        assert_eq!(i.intern(&exact).as_str(), exact);
        assert_eq!(i.take_truncated(), 1);
        assert_eq!(i.take_truncated(), 0);
        assert!(i.intern_utf8(&[b'x'; 300][..]).is_ok());
        assert_eq!(i.take_truncated(), 1);
        assert!(
            i.intern_utf8(&[0xff; 300][..]).is_err(),
            "invalid UTF-8 stays an error"
        );
    }

    #[test]
    fn popular_strings_become_static_once_per_process() {
        // A text no other test interns (tests share the process-wide registry).
        const VALUE: &str = "a value only this test interns";
        let mut i = Interner::default();
        let first = i.intern(VALUE);
        assert!(!first.is_static(), "a new string is counted");
        for _ in 0..PROMOTE_AFTER_HITS {
            let _ = i.intern(VALUE);
        }
        let later = i.intern(VALUE);
        assert!(
            later.is_static() && first.is_static(),
            "the one allocation is static"
        );
        assert!(Text::ptr_eq(&first, &later));
        assert_eq!(later, VALUE);
        // Clones and drops of a static text are free and it stays readable.
        let copies: Vec<Text> = (0..10).map(|_| later.clone()).collect();
        drop(copies);
        drop(first);
        assert_eq!(later.as_str(), VALUE);
        // Another thread's interner adopts the process's static text instead of making its
        // own copy static (the budget counts distinct strings).
        let theirs = std::thread::spawn(|| {
            let mut other = Interner::default();
            for _ in 0..=PROMOTE_AFTER_HITS + 1 {
                let _ = other.intern(VALUE);
            }
            other.intern(VALUE)
        })
        .join()
        .unwrap();
        assert!(Text::ptr_eq(&theirs, &later), "one static copy per text");
        // A string seen once is not promoted; a constant is static from the start.
        assert!(!i.intern("rare value").is_static());
        assert!(Text::leaked("unknown").is_static());
    }

    #[test]
    fn static_texts_are_the_layers_static_strings() {
        // The layer (infertrace-tower) makes its strings static with `static_str`; the
        // interner's promotion adopts that allocation, and the reverse.
        const LAYER_FIRST: &str = "made static by the layer first";
        const ANALYSIS_FIRST: &str = "made static by the analysis first";
        let layers = infertrace_intern::static_str(LAYER_FIRST).unwrap();
        let mut i = Interner::default();
        for s in [LAYER_FIRST, ANALYSIS_FIRST] {
            for _ in 0..=PROMOTE_AFTER_HITS + 1 {
                let _ = i.intern(s);
            }
        }
        let (ours, first) = (i.intern(LAYER_FIRST), i.intern(ANALYSIS_FIRST));
        assert!(ours.is_static() && first.is_static());
        assert!(std::ptr::eq(ours.as_ptr(), layers.as_ptr()));
        let layers = infertrace_intern::static_str(ANALYSIS_FIRST).unwrap();
        assert!(std::ptr::eq(first.as_ptr(), layers.as_ptr()));
    }

    #[test]
    fn reads_like_a_str() {
        let t = Text::from("decode");
        assert_eq!(t, "decode");
        assert_eq!(t.len(), 6);
        assert_eq!(format!("{t}/{t:?}"), "decode/\"decode\"");
        assert_eq!(
            serde_json::to_string(&t).ok().as_deref(),
            Some("\"decode\"")
        );
    }

    #[test]
    fn interning_shares_and_is_bounded() {
        let mut i = Interner::default();
        let a = i.intern("llama");
        let b = i.intern("llama");
        assert!(Text::ptr_eq(&a, &b));
        let long = "x".repeat(MAX_INTERNED_LEN + 1);
        assert_eq!(i.intern(&long), long.as_str());
        assert_eq!(i.len(), 1, "long strings are not kept");
        for n in 0..MAX_INTERNED + 10 {
            let _ = i.intern(&n.to_string());
        }
        assert!(i.len() <= MAX_INTERNED);
        assert_eq!(i.intern("llama"), "llama");
        let _ = i.take_fresh_bytes();
        let _ = i.intern("llama");
        assert_eq!(i.take_fresh_bytes(), 0, "a hit allocates nothing");
        let _ = i.intern("new value");
        assert_eq!(i.take_fresh_bytes(), 9 + STRING_OVERHEAD);
        assert!(i.intern_utf8(b"\xff\xfe").is_err());
        assert!(i.intern_utf8(&[0xff; MAX_INTERNED_LEN + 1]).is_err());
        assert_eq!(
            i.intern_utf8("décode".as_bytes()).ok().as_deref(),
            Some("décode")
        );
    }

    #[test]
    fn the_front_cache_returns_the_same_strings_as_the_table() {
        // Strings that share a front-cache slot, alternating, and ones that do not.
        let words: Vec<String> = (0..2000).map(|n| format!("v{n}-{}", n % 7)).collect();
        let mut i = Interner::default();
        let first: Vec<Text> = words.iter().map(|w| i.intern(w)).collect();
        let collisions = words
            .iter()
            .filter(|w| recent_slot(w.as_bytes()) == recent_slot(words[0].as_bytes()))
            .count();
        assert!(collisions > 2, "some words share a slot");
        for _ in 0..3 {
            for (w, t) in words.iter().zip(&first) {
                let again = i.intern(w);
                assert_eq!(again, w.as_str());
                assert!(Text::ptr_eq(&again, t), "{w}");
            }
        }
        assert_eq!(
            i.take_fresh_bytes(),
            words
                .iter()
                .map(|w| w.len() + STRING_OVERHEAD)
                .sum::<usize>()
        );
        for (a, b) in [
            ("", ""),
            ("abcdefgh", "abcdefgh"),
            ("abcdefghi", "abcdefghj"),
        ] {
            assert_eq!(same_bytes(a.as_bytes(), b.as_bytes()), a == b);
        }
        assert!(!same_bytes(b"abc", b"abcd"));
    }
}
