//! The names critical seconds are aggregated under.

/// The name a span's critical seconds are aggregated under (the windows' and the Prometheus
/// series' `span`): its name without a last word that is a request's id — `0x` and hex digits,
/// or at least 8 hex digits — and without a trailing `(host:… | pid:…)` (with or without a
/// space before it: SGLang writes `Tokenizer(host:…)`), so that spans named
/// per request or per process share one key. SGLang names them so: `"decode Req 1a2b3c4d"` →
/// `"decode Req"`, `"Bootstrap Room 0x5f3e"` → `"Bootstrap Room"`,
/// `"Scheduler [TP 1] (host:1a2b3c4d | pid:522)"` → `"Scheduler [TP 1]"`. One trace's path
/// keeps the names as they are.
pub fn aggregate_name(name: &str) -> &str {
    if let Some((head, _)) = name.split_once("(host:")
        && name.ends_with(')')
        && !head.trim().is_empty()
    {
        return head.trim();
    }
    let Some((head, last)) = name.trim_end().rsplit_once(' ') else {
        return name;
    };
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    let is_id = match last.strip_prefix("0x") {
        Some(digits) => hex(digits),
        None => last.len() >= 8 && hex(last),
    };
    match head.trim() {
        head if is_id && !head.is_empty() => head,
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::aggregate_name;

    #[test]
    fn a_trailing_request_id_is_cut_from_the_aggregated_name() {
        for (name, key) in [
            ("decode Req 1a2b3c4d", "decode Req"),
            (" Req 9f8e7d6c", "Req"),
            ("Bootstrap Room 0x5f3e", "Bootstrap Room"),
            ("Bootstrap Room 0x0", "Bootstrap Room"),
            ("POST /v1/chat 0123456789abcdef", "POST /v1/chat"),
            (
                "Scheduler [TP 1] (host:1a2b3c4d | pid:522)",
                "Scheduler [TP 1]",
            ),
            ("Tokenizer (host:1a2b3c4d | pid:7)", "Tokenizer"),
            ("Tokenizer(host:1a2b3c4d | pid:100)", "Tokenizer"),
        ] {
            assert_eq!(aggregate_name(name), key, "{name:?}");
        }
        // Not an id: fewer than 8 hex digits, a non-hex word, nothing before it.
        for name in [
            "decode",
            "llm_request",
            "Req 1a2b",
            "GET /models",
            "deadbeef00",
            "0x1f",
            "(host:1a2b3c4d | pid:7)",
        ] {
            assert_eq!(aggregate_name(name), name, "{name:?}");
        }
        assert_eq!(
            aggregate_name("prefill Req abcdefgh"),
            "prefill Req abcdefgh"
        );
    }
}
