//! OTLP/JSON as the protobuf JSON mapping allows it but `opentelemetry-proto`'s serde types do
//! not read it: `null` for a field (its default value), a field left out that those types
//! require (`values` of an array or key-value list, as Go's encoder leaves out an empty one;
//! `key` of a key-value pair), an enum by its name (`"SPAN_KIND_SERVER"`), an integer or a double
//! written as a string (`"17"`, `"0.5"`), the non-finite doubles `"NaN"`, `"Infinity"` and
//! `"-Infinity"`, and a lone UTF-16 surrogate escape (`"\ud83d"`: the half emoji
//! `JSON.stringify` writes when a string is cut inside one), which becomes `\ufffd`, the
//! replacement character, as Go's decoder reads it. The JSON decoder rewrites a span, scope or
//! resource that does not parse into the form those types read, and keeps it when the rewrite
//! parses, instead of cutting it out.
//!
//! A non-finite double is left out, so its attribute has no value (and is dropped by the
//! decoder): infertrace reads no such number (the analysis ignores them), and a downstream's
//! parser may not read one either. Fields named like the ones rewritten are rewritten wherever
//! they are, unknown fields included (which the parser then ignores). The decoder's byte scan
//! ([`scan_elements`](super::json_spans::scan_elements)) only finds where elements lie; this one
//! also writes, tracking what each container is.
//! The rewrite removes bytes (whitespace, members, quotes) except where it writes a required
//! member that was missing: at most 12 bytes an object (a comma and `"values":[]`).

use super::json_spans::{string_end, unescaped};

/// An enum's names and their numbers.
type EnumNames = &'static [(&'static [u8], u8)];

/// Fields whose value is an integer the generated types read only as a JSON number, and the
/// enum names each accepts.
const INTEGER_FIELDS: &[(&[u8], EnumNames)] = &[
    (
        b"kind",
        &[
            (b"SPAN_KIND_UNSPECIFIED", 0),
            (b"SPAN_KIND_INTERNAL", 1),
            (b"SPAN_KIND_SERVER", 2),
            (b"SPAN_KIND_CLIENT", 3),
            (b"SPAN_KIND_PRODUCER", 4),
            (b"SPAN_KIND_CONSUMER", 5),
        ],
    ),
    (
        b"code",
        &[
            (b"STATUS_CODE_UNSET", 0),
            (b"STATUS_CODE_OK", 1),
            (b"STATUS_CODE_ERROR", 2),
        ],
    ),
    (b"droppedAttributesCount", &[]),
    (b"droppedEventsCount", &[]),
    (b"droppedLinksCount", &[]),
    (b"flags", &[]),
];

/// A member the generated types require (every field is optional in the mapping): its key
/// with the quotes, and the default written when it is missing or `null`.
struct Required {
    key: &'static [u8],
    default: &'static [u8],
}

/// The `values` of an `ArrayValue` or a `KeyValueList`.
const VALUES: Required = Required {
    key: b"\"values\"",
    default: b"[]",
};

/// The `key` of a `KeyValue`.
const KEY: Required = Required {
    key: b"\"key\"",
    default: b"\"\"",
};

/// The field holding a double.
const DOUBLE_FIELD: &[u8] = b"doubleValue";

/// The strings the mapping uses for the non-finite doubles.
const NON_FINITE: [&[u8]; 3] = [b"NaN", b"Infinity", b"-Infinity"];

/// What comes next in the container being read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value, or (at an array's start) its end.
    ValueOrClose,
    /// A value (after a comma in an array, after a colon in an object; at the start, the
    /// element itself).
    Value,
    /// A key, or (at an object's start) its end.
    KeyOrClose,
    /// A key (after a comma in an object).
    Key,
    /// The colon after a key.
    Colon,
    /// A comma or the container's end.
    CommaOrClose,
}

/// One open object or array, in one byte (a body nested a million levels deep holds a million
/// of them).
#[derive(Clone, Copy)]
struct Frame(u8);

impl Frame {
    const OBJECT: u8 = 1;
    /// A member or element has been written in it (the next one needs a comma).
    const WRITTEN: u8 = 2;
    /// An object that requires [`VALUES`] (an `ArrayValue` or a `KeyValueList`).
    const NEEDS_VALUES: u8 = 4;
    /// An object that requires [`KEY`] (a `KeyValue`).
    const NEEDS_KEY: u8 = 8;
    /// The required member has been written.
    const REQUIRED_SEEN: u8 = 16;
    /// An array of `KeyValue`s.
    const KEY_VALUES: u8 = 32;
    /// A `KeyValueList` (its `values` are `KeyValue`s).
    const KVLIST: u8 = 64;

    fn has(self, flag: u8) -> bool {
        self.0 & flag != 0
    }

    fn object(self) -> bool {
        self.has(Self::OBJECT)
    }

    /// The member this object requires, if any.
    fn required(self) -> Option<&'static Required> {
        if self.has(Self::NEEDS_VALUES) {
            Some(&VALUES)
        } else if self.has(Self::NEEDS_KEY) {
            Some(&KEY)
        } else {
            None
        }
    }

    /// The frame of a container that is the value of `field` in `self` (or an element of it).
    fn child(self, object: bool, field: &[u8]) -> Self {
        let mut child = if object { Self::OBJECT } else { 0 };
        if object && self.object() && matches!(field, b"arrayValue" | b"kvlistValue") {
            child |= Self::NEEDS_VALUES;
            if field == b"kvlistValue" {
                child |= Self::KVLIST;
            }
        } else if object && !self.object() && self.has(Self::KEY_VALUES) {
            child |= Self::NEEDS_KEY;
        } else if !object
            && self.object()
            && (field == b"attributes" || (field == b"values" && self.has(Self::KVLIST)))
        {
            child |= Self::KEY_VALUES;
        }
        Self(child)
    }
}

/// JSON's whitespace (not the form feed Rust's ASCII whitespace also counts).
fn is_json_space(b: &u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Where the rewrite goes: the bytes, or only their count (to size a buffer exactly first).
pub(super) trait Sink {
    /// Appends `bytes`.
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Counts what would be written.
#[derive(Default)]
struct Count(usize);

impl Sink for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

/// Appends `element`, one JSON object, to `out` rewritten (see the [module](self)): members
/// whose value is `null` left out (a required one written with its default), required members
/// that are missing written, enum names and numeric strings written as numbers where the field
/// is a number, non-finite doubles left out, lone surrogates replaced, whitespace dropped.
/// Returns whether anything was rewritten; `false` too when the element's structure (brackets,
/// colons, commas) is not an object's (what was appended is then unspecified: the caller
/// truncates it). Strings and literals are copied, not checked: the parse that follows judges
/// them.
pub(super) fn rewrite_lenient(element: &[u8], out: &mut impl Sink) -> bool {
    let mut rewritten = false;
    let mut stack: Vec<Frame> = Vec::new();
    let mut expect = Expect::Value;
    // The key of the member whose value comes next (its bytes with the quotes).
    let mut key: &[u8] = &[];
    let mut i = 0;
    loop {
        while element.get(i).is_some_and(is_json_space) {
            i += 1;
        }
        let Some(&c) = element.get(i) else {
            return false;
        };
        match (c, expect) {
            (b',', Expect::CommaOrClose) => {
                let object = stack.last().is_some_and(|f| f.object());
                expect = if object { Expect::Key } else { Expect::Value };
                i += 1;
            }
            (b':', Expect::Colon) => {
                expect = Expect::Value;
                i += 1;
            }
            (b'}' | b']', Expect::CommaOrClose | Expect::KeyOrClose | Expect::ValueOrClose) => {
                let object = c == b'}';
                let closes_its_kind = match expect {
                    Expect::KeyOrClose => object,
                    Expect::ValueOrClose => !object,
                    _ => stack.last().is_some_and(|f| f.object() == object),
                };
                let Some(frame) = stack.pop().filter(|_| closes_its_kind) else {
                    return false;
                };
                if let Some(required) = frame.required()
                    && !frame.has(Frame::REQUIRED_SEEN)
                {
                    if frame.has(Frame::WRITTEN) {
                        out.put(b",");
                    }
                    write_member(out, required.key, required.default);
                    rewritten = true;
                }
                out.put(&[c]);
                i += 1;
                if stack.is_empty() {
                    // The element ends here; nothing may follow it.
                    return rewritten && element[i..].iter().all(is_json_space);
                }
                expect = Expect::CommaOrClose;
            }
            (b'"', Expect::KeyOrClose | Expect::Key) => {
                let end = string_end(element, i + 1);
                if end >= element.len() {
                    return false;
                }
                key = &element[i..=end];
                expect = Expect::Colon;
                i = end + 1;
            }
            (_, Expect::Value | Expect::ValueOrClose) => {
                let (value, next) = match value_token(element, i) {
                    Some(v) => v,
                    None => return false,
                };
                i = next;
                let Some(frame) = stack.last_mut() else {
                    // The element itself: an object.
                    if c != b'{' {
                        return false;
                    }
                    out.put(b"{");
                    stack.push(Frame(Frame::OBJECT));
                    expect = Expect::KeyOrClose;
                    continue;
                };
                let field = if frame.object() {
                    unescaped(&key[1..key.len() - 1])
                } else {
                    Default::default()
                };
                let required = frame
                    .required()
                    .filter(|r| *field == r.key[1..r.key.len() - 1]);
                if required.is_some() {
                    frame.0 |= Frame::REQUIRED_SEEN;
                }
                let write = match (frame.object(), required) {
                    (false, _) => Some(value),
                    (true, Some(r)) if value == b"null" => Some(r.default),
                    // A key the parser cannot read stays, with its member, for the parse to
                    // refuse.
                    (true, _) if value == b"null" && !readable_key(key) => Some(value),
                    (true, _) => member_value(&field, value),
                };
                let Some(write) = write else {
                    rewritten = true;
                    expect = Expect::CommaOrClose;
                    continue;
                };
                rewritten |= write != value;
                if frame.has(Frame::WRITTEN) {
                    out.put(b",");
                }
                frame.0 |= Frame::WRITTEN;
                rewritten |= if frame.object() {
                    write_member(out, key, write)
                } else {
                    write_token(out, write)
                };
                expect = match c {
                    b'{' | b'[' => {
                        let child = frame.child(c == b'{', &field);
                        stack.push(child);
                        if c == b'{' {
                            Expect::KeyOrClose
                        } else {
                            Expect::ValueOrClose
                        }
                    }
                    _ => Expect::CommaOrClose,
                };
            }
            _ => return false,
        }
    }
}

/// [`rewrite_lenient`] appended to `out` after growing it by exactly the rewrite's length plus
/// `then` bytes (what the caller appends next), so that it never doubles: the rewrite's length,
/// or `None` when there is nothing to rewrite or the structure is broken (`out` unchanged).
pub(super) fn rewrite_lenient_sized(
    element: &[u8],
    out: &mut Vec<u8>,
    then: usize,
) -> Option<usize> {
    let mut count = Count::default();
    if !rewrite_lenient(element, &mut count) {
        return None;
    }
    out.reserve_exact(count.0 + then);
    rewrite_lenient(element, out);
    Some(count.0)
}

/// Whether the parser reads `key` (a string with its quotes): it is left out with its `null`
/// only then, so that a member the parser would refuse still fails the parse.
fn readable_key(key: &[u8]) -> bool {
    // Read into nothing, so that a long key is not copied.
    std::str::from_utf8(key).is_ok() && serde_json::from_slice::<serde::de::IgnoredAny>(key).is_ok()
}

/// Writes `"key":value` (`key` with its quotes), as [`write_token`] writes each; whether a lone
/// surrogate was replaced.
fn write_member(out: &mut impl Sink, key: &[u8], value: &[u8]) -> bool {
    let replaced = write_token(out, key);
    out.put(b":");
    replaced | write_token(out, value)
}

/// Writes `token` (a value or a key: a string with its quotes, or any other token as it is),
/// each lone UTF-16 surrogate escape in a string replaced by `\ufffd` (the same length).
/// Returns whether it replaced any.
fn write_token(out: &mut impl Sink, token: &[u8]) -> bool {
    let mut replaced = false;
    let mut from = 0;
    let mut i = 0;
    while token.first() == Some(&b'"') && i < token.len() {
        if token[i] != b'\\' {
            i += 1;
            continue;
        }
        let (lone, len) = match escaped_unit(token, i) {
            Some(0xD800..=0xDBFF) => match escaped_unit(token, i + 6) {
                // A pair, passed whole.
                Some(0xDC00..=0xDFFF) => (false, 12),
                _ => (true, 6),
            },
            Some(0xDC00..=0xDFFF) => (true, 6),
            Some(_) => (false, 6),
            // Another escape (`\n`, `\\`...).
            None => (false, 2),
        };
        if lone {
            out.put(&token[from..i]);
            out.put(b"\\ufffd");
            replaced = true;
            from = i + 6;
        }
        i += len;
    }
    out.put(&token[from..]);
    replaced
}

/// The UTF-16 code unit of the `\uXXXX` escape at `i`, if there is one.
fn escaped_unit(s: &[u8], i: usize) -> Option<u16> {
    let hex = s.get(i..i + 6)?.strip_prefix(b"\\u")?;
    hex.iter().try_fold(0u16, |unit, b| {
        Some(unit << 4 | (*b as char).to_digit(16)? as u16)
    })
}

/// The value token at `i` — a string with its quotes, an opening bracket, or a literal (number,
/// `true`, `false`, `null`) — and where it ends. `None` when there is none.
fn value_token(element: &[u8], i: usize) -> Option<(&[u8], usize)> {
    match element[i] {
        b'"' => {
            let end = string_end(element, i + 1);
            (end < element.len()).then(|| (&element[i..=end], end + 1))
        }
        b'{' | b'[' => Some((&element[i..=i], i + 1)),
        _ => {
            let len = element[i..]
                .iter()
                .position(|b| is_json_space(b) || matches!(b, b',' | b':' | b']' | b'}' | b'"'))
                .unwrap_or(element.len() - i);
            (len > 0).then(|| (&element[i..i + len], i + len))
        }
    }
}

/// What to write for the value of the member `field`: `None` to leave the member out (a
/// `null`, a non-finite double), else the value as the generated types read it.
fn member_value<'v>(field: &[u8], value: &'v [u8]) -> Option<&'v [u8]> {
    if value == b"null" {
        return None;
    }
    let Some(text) = value
        .strip_prefix(b"\"")
        .and_then(|v| v.strip_suffix(b"\""))
    else {
        return Some(value);
    };
    if field == DOUBLE_FIELD {
        if NON_FINITE.contains(&text) {
            return None;
        }
        return Some(if is_json_number(text) { text } else { value });
    }
    let Some((_, names)) = INTEGER_FIELDS.iter().find(|(f, _)| *f == field) else {
        return Some(value);
    };
    if let Some((_, number)) = names.iter().find(|(name, _)| *name == text) {
        return Some(DIGITS[usize::from(*number)]);
    }
    Some(if is_json_integer(text) { text } else { value })
}

/// The enum numbers as JSON text.
const DIGITS: [&[u8]; 6] = [b"0", b"1", b"2", b"3", b"4", b"5"];

/// Whether `s` is a JSON integer: `-?(0|[1-9][0-9]*)`.
fn is_json_integer(s: &[u8]) -> bool {
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    match digits {
        [b'0'] => true,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// Whether `s` is a JSON number: an integer, then an optional fraction and exponent.
fn is_json_number(s: &[u8]) -> bool {
    let end_of_integer = s
        .iter()
        .position(|b| matches!(b, b'.' | b'e' | b'E'))
        .unwrap_or(s.len());
    let (integer, mut rest) = s.split_at(end_of_integer);
    if !is_json_integer(integer) {
        return false;
    }
    if let Some(fraction) = rest.strip_prefix(b".") {
        let digits = fraction.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return false;
        }
        rest = &fraction[digits..];
    }
    if let Some(exponent) = rest.strip_prefix(b"e").or_else(|| rest.strip_prefix(b"E")) {
        let digits = exponent
            .strip_prefix(b"+")
            .or_else(|| exponent.strip_prefix(b"-"))
            .unwrap_or(exponent);
        return !digits.is_empty() && digits.iter().all(u8::is_ascii_digit);
    }
    rest.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The most bytes the rewrite adds to an object: a comma and `"values":[]`.
    const MAX_GROWTH_PER_OBJECT: usize = 12;

    fn rewrite(s: &str) -> Option<String> {
        let mut out = Vec::new();
        rewrite_lenient(s.as_bytes(), &mut out).then(|| String::from_utf8(out).unwrap())
    }

    #[test]
    fn nulls_enum_names_and_numeric_strings_are_rewritten() {
        assert_eq!(
            rewrite(
                r#"{ "traceId": "01", "parentSpanId": null, "kind": "SPAN_KIND_SERVER",
                "droppedAttributesCount": "3", "status": {"code": "STATUS_CODE_ERROR", "message": null},
                "attributes": [{"key": "a", "value": {"doubleValue": "NaN"}},
                               {"key": "b", "value": {"doubleValue": "-2.5e-3"}},
                               {"key": "c", "value": null}], "events": null }"#
            )
            .as_deref(),
            Some(
                r#"{"traceId":"01","kind":2,"droppedAttributesCount":3,"status":{"code":2},"attributes":[{"key":"a","value":{}},{"key":"b","value":{"doubleValue":-2.5e-3}},{"key":"c"}]}"#
            )
        );
    }

    #[test]
    fn what_is_not_the_mappings_is_left_as_it_is() {
        // Nothing to rewrite: no rewrite (whitespace alone does not count).
        assert_eq!(rewrite(r#"{ "kind": 2, "a": [1, null, "x"] }"#), None);
        // Strings that are not a number or a known name stay strings (and still fail).
        assert_eq!(
            rewrite(r#"{"kind":"SERVER","code":"01","flags":"+1","doubleValue":"1.","x":null}"#)
                .as_deref(),
            Some(r#"{"kind":"SERVER","code":"01","flags":"+1","doubleValue":"1."}"#)
        );
        // An attribute whose key is "kind" is not the span's kind.
        assert_eq!(
            rewrite(r#"{"key":"kind","value":{"stringValue":"SPAN_KIND_SERVER"},"n":null}"#)
                .as_deref(),
            Some(r#"{"key":"kind","value":{"stringValue":"SPAN_KIND_SERVER"}}"#)
        );
        // An escaped key is read as the parser reads it.
        assert_eq!(
            rewrite(r#"{"\u006bind":"SPAN_KIND_CLIENT"}"#).as_deref(),
            Some(r#"{"\u006bind":3}"#)
        );
    }

    #[test]
    fn malformed_elements_are_not_rewritten() {
        for bad in [
            r#"{"a" null}"#,
            r#"{"a":null"#,
            r#"{"a":null]"#,
            r#"["a",null]"#,
            r#"{"a":null}}"#,
            r#"{"a":null} x"#,
            r#"{"a":[null}"#,
            r#"{"a":null,}"#,
            r#"{"a":null,,"b":1}"#,
            r#"{"a":"unterminated"#,
            r#"{"a"#,
            r#"{null:1,"a":null}"#,
            "",
        ] {
            assert_eq!(rewrite(bad), None, "{bad}");
        }
    }

    #[test]
    fn required_members_are_written_where_missing_or_null() {
        // As Go's encoder writes an empty array, list and key: left out.
        assert_eq!(
            rewrite(
                r#"{"attributes":[{"key":"a","value":{"arrayValue":{}}},{"value":{"intValue":"1"}},
                {"key":null,"value":{"kvlistValue":{"values":[{"value":{"arrayValue":{"values":null}}}]}}}]}"#
            )
            .as_deref(),
            Some(
                r#"{"attributes":[{"key":"a","value":{"arrayValue":{"values":[]}}},{"value":{"intValue":"1"},"key":""},{"key":"","value":{"kvlistValue":{"values":[{"value":{"arrayValue":{"values":[]}},"key":""}]}}}]}"#
            )
        );
        // An array value's elements are values, not key-value pairs; other arrays are left.
        assert_eq!(
            rewrite(
                r#"{"arrayValue":{"values":[{"intValue":"1"}]},"events":[{"name":"e"}],"x":null}"#
            )
            .as_deref(),
            Some(r#"{"arrayValue":{"values":[{"intValue":"1"}]},"events":[{"name":"e"}]}"#)
        );
    }

    #[test]
    fn the_rewrite_grows_only_by_required_members() {
        let e = r#"{"kind":"SPAN_KIND_CONSUMER","flags":"4294967295","doubleValue":"1E+300"}"#;
        let out = rewrite(e).unwrap();
        assert!(out.len() < e.len(), "{out}");
        assert_eq!(out, r#"{"kind":5,"flags":4294967295,"doubleValue":1E+300}"#);
        // The most an object grows: a comma and an empty `values`.
        let e = r#"{"kvlistValue":{"x":1}}"#;
        let out = rewrite(e).unwrap();
        assert_eq!(out, r#"{"kvlistValue":{"x":1,"values":[]}}"#);
        assert_eq!(out.len() - e.len(), MAX_GROWTH_PER_OBJECT);
        // The count agrees with what is written.
        let mut count = Count::default();
        assert!(rewrite_lenient(e.as_bytes(), &mut count));
        assert_eq!(count.0, out.len());
    }

    #[test]
    fn lone_surrogates_become_the_replacement_character() {
        // Half an emoji (as `JSON.stringify` writes a string cut inside one), a low half
        // alone, a high half before another escape; a whole pair, an escaped backslash
        // before `u`, and other escapes stay as they are.
        assert_eq!(
            rewrite(r#"{"a":"cut \ud83d","b":"\uDE00x","c":"\ud83d\u0041","d":"\ud83d\ude00 \\ud83d \n\""}"#)
                .as_deref(),
            Some(r#"{"a":"cut \ufffd","b":"\ufffdx","c":"\ufffd\u0041","d":"\ud83d\ude00 \\ud83d \n\""}"#)
        );
        // In a key, and in an array; nothing else to rewrite.
        assert_eq!(
            rewrite(r#"{"\udc00":["\ud800"]}"#).as_deref(),
            Some(r#"{"\ufffd":["\ufffd"]}"#)
        );
        assert_eq!(rewrite(r#"{"a":"\ud83d\ude00","b":"\u+d83"}"#), None);
    }

    #[test]
    fn what_would_make_invalid_json_valid_is_left_for_the_parse_to_refuse() {
        // A form feed is not JSON whitespace.
        assert_eq!(rewrite("{\"a\":null,\x0c\"b\":1}"), None);
        assert_eq!(rewrite("{\"a\":null}\x0c"), None);
        // A null member whose key the parser cannot read is kept, so the parse still fails.
        for key in ["a\x01b", "\\q", "\\ud8x0"] {
            let out = rewrite(&format!(r#"{{"kind":"SPAN_KIND_SERVER","{key}":null}}"#)).unwrap();
            assert_eq!(out, format!(r#"{{"kind":2,"{key}":null}}"#));
            assert!(
                serde_json::from_str::<serde_json::Value>(&out).is_err(),
                "{key}"
            );
        }
    }

    #[test]
    fn json_numbers_are_recognised() {
        for yes in ["0", "-0", "12", "1.5", "-0.25e10", "1E-3", "7e+2"] {
            assert!(is_json_number(yes.as_bytes()), "{yes}");
        }
        for no in [
            "", "-", "01", "1.", ".5", "+1", "1e", "1e+", "0x10", "1.5.2", " 1",
        ] {
            assert!(!is_json_number(no.as_bytes()), "{no}");
        }
        assert!(is_json_integer(b"-17") && !is_json_integer(b"1.0"));
    }
}
