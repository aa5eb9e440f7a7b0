//! Allocation-free attribute values and span names for the strings that repeat from request to
//! request (path, route, user agent, host, RPC service and method, the recorder's finish reason,
//! models and error kind, `"{operation} {model}"`).
//!
//! Spans are freed on the batch processor's thread, so a per-request `String` would be
//! allocated on the request's thread and freed on another. Instead:
//!
//! - [`shared_str`] keeps, per thread, the last few values seen for each kind of string as
//!   `Arc<str>`; a repeat costs a comparison and a reference-count increment. Strings longer than
//!   [`MAX_CACHED_LEN`] are not cached (plain allocation), so a thread holds at most
//!   `9 kinds × 4 values × 256 bytes`. The cache keeps a reference, so the span's copy is not
//!   the last one: the batch processor's thread, which drops the span, does not free the string.
//! - [`shared_value`] does the same for the request's arrival attributes (path, route, user
//!   agent, host, RPC service and method) and the layer's default model, but as `'static`
//!   strings: copying one touches no reference count, so the export thread that drops the span
//!   does not contend with the request threads for the count's cache line. Once the process's
//!   budget of static strings is spent, values fall back to [`shared_str`].
//! - [`span_name`] interns `"{operation} {model}"` as `&'static str` (span names must be
//!   `Cow<'static, str>`) while the budget lasts; beyond it (or past 256 bytes), names are
//!   allocated per request as usual.
//!
//! The static strings come from `infertrace_intern`, the one registry of the process, which the
//! collector's analysis shares when both run in one process: leaked on purpose, like `tracing`'s
//! callsite metadata, under one bound (its crate docs). It is consulted only on a miss of the
//! per-thread caches here.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use opentelemetry::StringValue;

/// Kinds of repeated request strings.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Path = 0,
    Route = 1,
    UserAgent = 2,
    Host = 3,
    RpcService = 4,
    RpcMethod = 5,
    FinishReason = 6,
    Model = 7,
    Error = 8,
}

const KINDS: usize = 9;
const WAYS: usize = 4;
/// Longer strings are not cached.
pub(crate) const MAX_CACHED_LEN: usize = 256;

type Ways = [Option<Arc<str>>; WAYS];

type StaticWays = [Option<&'static str>; WAYS];

thread_local! {
    static STATICS: RefCell<[StaticWays; KINDS]> = RefCell::new(Default::default());
    static VALUES: RefCell<[Ways; KINDS]> = RefCell::new(Default::default());
    static NAMES: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
}

/// `ways` (a kind's recently seen values, newest first): the one equal to `s`, else the value
/// `make` gives, kept as the newest (if it gives one).
fn way_lookup<T: Clone>(
    ways: &mut [Option<T>; WAYS],
    s: &str,
    bytes: impl Fn(&T) -> &[u8],
    make: impl FnOnce() -> Option<T>,
) -> Option<T> {
    if let Some(hit) = ways
        .iter()
        .flatten()
        .find(|v| same_bytes(bytes(v), s.as_bytes()))
    {
        return Some(hit.clone());
    }
    let value = make()?;
    ways.rotate_right(1);
    ways[0] = Some(value.clone());
    Some(value)
}

/// `s` as an attribute value: a `'static` string (copied without touching a reference count,
/// which another thread would otherwise decrement when it drops the span) while the process's
/// budget of static strings lasts, else as [`shared_str`] does.
pub(crate) fn shared_value(kind: Kind, s: &str) -> StringValue {
    if s.len() > MAX_CACHED_LEN {
        return StringValue::from(Arc::<str>::from(s));
    }
    let local = STATICS.with(|cell| {
        let mut all = cell.try_borrow_mut().ok()?;
        way_lookup(
            &mut all[kind as usize],
            s,
            |v| v.as_bytes(),
            || infertrace_intern::static_str(s),
        )
    });
    match local {
        Some(v) => StringValue::from(v),
        None => StringValue::from(shared_str(kind, s)),
    }
}

/// `s` as a shared string, reusing this thread's copy when `s` was seen recently.
pub(crate) fn shared_str(kind: Kind, s: &str) -> Arc<str> {
    if s.len() > MAX_CACHED_LEN {
        return Arc::from(s);
    }
    VALUES
        .with(|cell| {
            let mut all = cell.try_borrow_mut().ok()?;
            way_lookup(
                &mut all[kind as usize],
                s,
                |v| v.as_bytes(),
                || Some(Arc::from(s)),
            )
        })
        .unwrap_or_else(|| Arc::from(s))
}

pub(crate) use infertrace_intern::same_bytes;

fn is_name(name: &str, operation: &str, model: &str) -> bool {
    let name = name.as_bytes();
    name.len() == operation.len() + 1 + model.len()
        && same_bytes(&name[..operation.len()], operation.as_bytes())
        && same_bytes(&name[name.len() - model.len()..], model.as_bytes())
        && name.get(operation.len()) == Some(&b' ')
}

/// `"{operation} {model}"`, interned (see the module docs).
pub(crate) fn span_name(operation: &str, model: &str) -> Cow<'static, str> {
    let local = NAMES.with(|cell| {
        cell.try_borrow()
            .ok()
            .and_then(|names| names.iter().copied().find(|n| is_name(n, operation, model)))
    });
    if let Some(name) = local {
        return Cow::Borrowed(name);
    }
    let name = format!("{operation} {model}");
    let Some(name) = infertrace_intern::static_str(&name) else {
        return Cow::Owned(name);
    };
    NAMES.with(|cell| {
        if let Ok(mut names) = cell.try_borrow_mut()
            && names.len() < 64
        {
            names.push(name);
        }
    });
    Cow::Borrowed(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_values_are_shared_and_bounded() {
        let a = shared_value(Kind::Host, "static-test.example");
        let b = shared_value(Kind::Host, "static-test.example");
        assert_eq!(a.as_str(), "static-test.example");
        assert!(std::ptr::eq(a.as_str().as_ptr(), b.as_str().as_ptr()));
        // The static copy is the process's one (the analysis's, when it runs here too); the
        // registry's budget is tested in infertrace-intern.
        let registry = infertrace_intern::static_str("static-test.example").unwrap();
        assert!(std::ptr::eq(a.as_str().as_ptr(), registry.as_ptr()));
        // Long values are not made static.
        let long = "y".repeat(MAX_CACHED_LEN + 1);
        assert_eq!(shared_value(Kind::Path, &long).as_str(), long);
    }

    #[test]
    fn repeated_values_share_one_allocation() {
        let a = shared_str(Kind::Path, "/v1/chat/completions");
        let b = shared_str(Kind::Path, "/v1/chat/completions");
        assert_eq!(&*a, "/v1/chat/completions");
        assert!(Arc::ptr_eq(&a, &b));
        // Another kind keeps its own copy; other values do not evict within the ways.
        let c = shared_str(Kind::Route, "/v1/chat/completions");
        assert!(!Arc::ptr_eq(&a, &c));
        for p in ["/a", "/b", "/c"] {
            shared_str(Kind::Path, p);
        }
        let d = shared_str(Kind::Path, "/v1/chat/completions");
        assert!(Arc::ptr_eq(&a, &d));
        let long = "x".repeat(MAX_CACHED_LEN + 1);
        assert_eq!(&*shared_str(Kind::UserAgent, &long), long);
    }

    #[test]
    fn span_names_are_interned_and_exact() {
        let a = span_name("chat", "llama-3.1-8b");
        assert_eq!(a, "chat llama-3.1-8b");
        assert!(matches!(a, Cow::Borrowed(_)));
        let b = std::thread::spawn(|| span_name("chat", "llama-3.1-8b"))
            .join()
            .unwrap();
        assert!(std::ptr::eq(a.as_ptr(), b.as_ptr()), "one copy per process");
        let registry = infertrace_intern::static_str("chat llama-3.1-8b").unwrap();
        assert!(
            std::ptr::eq(a.as_ptr(), registry.as_ptr()),
            "the registry's copy"
        );
        // Prefix/suffix look-alikes are different names.
        assert_eq!(span_name("chat", "llama"), "chat llama");
        assert_eq!(span_name("chat llama", "3.1-8b"), "chat llama 3.1-8b");
        assert!(!is_name("chat xllama", "chat", "llama"));
    }
}
