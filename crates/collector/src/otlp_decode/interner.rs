//! The per-thread [`Interner`] the decoders make their texts with, and what it counts (fresh
//! bytes for the memory limiter, truncated texts).

use std::cell::RefCell;

use infertrace_analysis::text::{Interner, Text};
use infertrace_semconv as sc;

use super::decoded::DecodeError;

thread_local! {
    /// Each receiver thread's interner (see the module rules).
    static INTERNER: RefCell<Interner> = RefCell::default();
}

/// Runs `f` with this thread's interner.
pub(super) fn with_interner<R>(f: impl FnOnce(&mut Interner) -> R) -> R {
    INTERNER.with(|i| match i.try_borrow_mut() {
        Ok(mut i) => f(&mut i),
        // Not reentrant in practice; a fresh interner keeps it correct if it ever were.
        Err(_) => f(&mut Interner::default()),
    })
}

/// Runs `f` with this thread's interner for decoding spans that were already accounted for
/// (a prepared trace's spans decoded again): strings new to the interner meanwhile are not
/// charged to the next request this thread decodes.
pub(crate) fn with_text_interner<R>(f: impl FnOnce(&mut Interner) -> R) -> R {
    with_interner(|interner| {
        let pending = interner.take_fresh_bytes();
        let truncated = interner.take_truncated();
        let out = f(interner);
        interner.take_fresh_bytes();
        interner.take_truncated();
        interner.restore_fresh_bytes(pending);
        interner.count_truncated(truncated);
        out
    })
}

/// Heap bytes of the strings this thread's decoders allocated since the last call (see
/// [`Interner::take_fresh_bytes`]): call it right after decoding a request, on the same thread,
/// and reserve it with the request's spans.
pub fn take_fresh_text_bytes() -> usize {
    with_interner(Interner::take_fresh_bytes)
}

/// Strings this thread's decoders cut to [`MAX_TEXT_LEN`](infertrace_analysis::text::MAX_TEXT_LEN)
/// since the last call: call it right after decoding a request, on the same thread, and count
/// them (`texts_truncated_total`).
pub fn take_truncated_texts() -> u64 {
    with_interner(Interner::take_truncated)
}

/// A string attribute value, validated as UTF-8: interned unless its key holds a per-request
/// unique value.
pub(super) fn intern_value(
    key: &'static str,
    value: &[u8],
    interner: &mut Interner,
) -> Result<Text, DecodeError> {
    if key == sc::gen_ai::REQUEST_ID {
        let s = std::str::from_utf8(value).map_err(|_| DecodeError::InvalidUtf8)?;
        let s = interner.truncate(s);
        interner.note_fresh(s.len());
        Ok(Text::from(s))
    } else {
        interner
            .intern_utf8(value)
            .map_err(|_| DecodeError::InvalidUtf8)
    }
}
