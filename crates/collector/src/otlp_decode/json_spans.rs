//! Where each span, scope and resource lies in an OTLP/JSON body, found without parsing it: a
//! byte scan that tracks nesting (iteratively, so no depth is too deep for it) and the keys of
//! the three levels above the spans (`resourceSpans` → `scopeSpans` → `spans`, as the parser
//! reads them). The JSON decoder uses it to cut out the elements that make a whole body
//! undecodable — nested past the parser's recursion limit, or with a field it cannot read —
//! instead of refusing every span with them.

use std::borrow::Cow;
use std::ops::Range;

/// What an element of a body is: a `ResourceSpans`, a `ScopeSpans` or a `Span` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    /// An element of `resourceSpans` (depth 3).
    Resource,
    /// An element of a `scopeSpans` (depth 5).
    Scope,
    /// An element of a `spans` (depth 7).
    Span,
}

impl Level {
    /// The level whose objects sit at `depth`, if any.
    fn at(depth: usize) -> Option<Self> {
        match depth {
            3 => Some(Self::Resource),
            5 => Some(Self::Scope),
            7 => Some(Self::Span),
            _ => None,
        }
    }
}

/// One resource, scope or span object of a body: its bytes and the spans it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct JsonElement {
    /// Resource, scope or span.
    pub level: Level,
    /// The object, `{` to `}` inclusive.
    pub range: Range<usize>,
    /// The span objects in it (1 for a span).
    pub spans: u64,
}

/// The keys on the way to the spans, by the depth of the object that holds them.
fn expected_key(depth: usize, key: &[u8]) -> bool {
    match depth {
        1 => key == b"resourceSpans",
        3 => key == b"scopeSpans",
        5 => key == b"spans",
        _ => false,
    }
}

/// One open object or array.
struct Frame {
    object: bool,
    /// Whether this container lies on the way to the spans (an array of spans, at depth 6, when
    /// it and every container above it do).
    on_path: bool,
    /// In an object: the next string is a key.
    awaiting_key: bool,
    /// In an object on the way: the current key is the expected one.
    key_matches: bool,
}

/// A resource, scope or span object being scanned.
struct Open {
    start: usize,
    spans: u64,
}

/// Every resource, scope and span object of `body` (collected; the decoder visits them with
/// [`scan_elements`] instead, so that a body of millions of spans costs no list of them).
#[cfg(test)]
pub(super) fn json_elements(body: &[u8]) -> Vec<JsonElement> {
    let mut found = Vec::new();
    scan_elements(body, |e| found.push(e));
    found
}

/// Calls `visit` with every resource, scope and span object of `body`, each after what it
/// holds (a span before its scope, a scope before its resource; spans in body order). Best
/// effort on malformed JSON (it never fails: what it cannot follow yields nothing). Returns how
/// many objects and arrays it passed, elements or not (`{` and `[` outside strings, up to where
/// it stopped: the parser stops there too).
pub(super) fn scan_elements(body: &[u8], mut visit: impl FnMut(JsonElement)) -> Containers {
    let mut passed = Containers::default();
    let mut stack: Vec<Frame> = Vec::new();
    // The resource, scope and span being scanned.
    let mut open: [Option<Open>; 3] = [None, None, None];
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'"' => {
                let start = i + 1;
                i = string_end(body, start);
                if let Some(f) = stack.last_mut()
                    && f.object
                    && f.awaiting_key
                {
                    f.awaiting_key = false;
                    let depth = stack.len();
                    let key = body.get(start..i).unwrap_or_default();
                    if let Some(f) = stack.last_mut() {
                        f.key_matches = f.on_path && expected_key(depth, &unescaped(key));
                    }
                }
            }
            c @ (b'{' | b'[') => {
                if c == b'{' {
                    passed.objects += 1;
                } else {
                    passed.arrays += 1;
                }
                let parent_on_path = match stack.last() {
                    None => true,
                    Some(p) if p.object => p.on_path && p.key_matches,
                    Some(p) => p.on_path,
                };
                stack.push(Frame {
                    object: c == b'{',
                    on_path: parent_on_path && stack.len() < 6,
                    awaiting_key: c == b'{',
                    key_matches: false,
                });
                let depth = stack.len();
                if let Some(level) = Level::at(depth)
                    && parent_on_path
                    && c == b'{'
                {
                    open[level as usize] = Some(Open { start: i, spans: 0 });
                }
            }
            c @ (b'}' | b']') => {
                // A bracket that does not close what is open: the parser refuses the body (a
                // syntax error), and nothing past it can be followed.
                if stack.last().is_none_or(|f| f.object != (c == b'}')) {
                    return passed;
                }
                if let Some(level) = Level::at(stack.len())
                    && let Some(o) = open[level as usize].take()
                {
                    let spans = if level == Level::Span {
                        for outer in open.iter_mut().flatten() {
                            outer.spans += 1;
                        }
                        1
                    } else {
                        o.spans
                    };
                    visit(JsonElement {
                        level,
                        range: o.start..i + 1,
                        spans,
                    });
                }
                stack.pop();
            }
            b',' => {
                if let Some(f) = stack.last_mut()
                    && f.object
                {
                    f.awaiting_key = true;
                    f.key_matches = false;
                }
            }
            _ => {}
        }
        i += 1;
    }
    passed
}

/// How many objects and arrays a scan passed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Containers {
    pub objects: usize,
    pub arrays: usize,
}

/// A key's bytes as the parser reads them: escapes (`spa\u006es`) decoded. A key longer than
/// [`MAX_KEY_TO_UNESCAPE`] is left as it is: it cannot be any key the decoder looks for, and
/// decoding it would copy it.
pub(super) fn unescaped(key: &[u8]) -> Cow<'_, [u8]> {
    if key.len() > MAX_KEY_TO_UNESCAPE || !key.contains(&b'\\') {
        return Cow::Borrowed(key);
    }
    let quoted = [b"\"", key, b"\""].concat();
    match serde_json::from_slice::<String>(&quoted) {
        Ok(k) => Cow::Owned(k.into_bytes()),
        Err(_) => Cow::Borrowed(key),
    }
}

/// The longest key [`unescaped`] decodes: each of the keys the decoders look for
/// (`droppedAttributesCount` the longest, 22 bytes) fully escaped, 6 bytes a character.
const MAX_KEY_TO_UNESCAPE: usize = 6 * 22;

/// The index of the closing quote of the string whose content starts at `start` (or the end of
/// the body).
pub(super) fn string_end(body: &[u8], start: usize) -> usize {
    let mut i = start;
    while i < body.len() {
        match body[i] {
            b'\\' => i += 2,
            b'"' => return i,
            _ => i += 1,
        }
    }
    body.len()
}

/// The byte offset of a 1-based `line` and `column` as `serde_json` reports an error position
/// (its column counts bytes; 0 on an empty line or at the end).
pub(super) fn byte_offset(body: &[u8], line: usize, column: usize) -> usize {
    let line_start = if line <= 1 {
        0
    } else {
        body.iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(line - 2)
            .map_or(body.len(), |(at, _)| at + 1)
    };
    (line_start + column.saturating_sub(1)).min(body.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `AnyValue` of key-value lists nested `levels` deep (four JSON levels each).
    fn deep(levels: usize) -> String {
        let open = r#"{"kvlistValue":{"values":[{"key":"k","value":"#.repeat(levels);
        let close = "}]}}".repeat(levels);
        format!(r#"{open}{{"stringValue":"x"}}{close}"#)
    }

    #[test]
    fn finds_every_resource_scope_and_span() {
        let body = format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"spans","value":{{"arrayValue":{{"values":[{{"stringValue":"[{{"}}]}}}}}}]}},
              "scopeSpans":[{{"scope":{{"name":"s"}},"spans":[{{"name":"a \"}}{{\" b"}},{{"name":"b","attributes":[{{"key":"d","value":{}}}]}}]}}]}},
              {{"scopeSpans":[{{"spans":[{{"name":"c"}}]}}]}}]}}"#,
            deep(3)
        );
        let all = json_elements(body.as_bytes());
        let spans: Vec<&JsonElement> = all.iter().filter(|e| e.level == Level::Span).collect();
        let names: Vec<&str> = spans
            .iter()
            .map(|s| &body[s.range.clone()][..14.min(s.range.len())])
            .collect();
        assert_eq!(
            names,
            [r#"{"name":"a \"}"#, r#"{"name":"b","a"#, r#"{"name":"c"}"#]
        );
        for s in &all {
            let v: serde_json::Value = serde_json::from_str(&body[s.range.clone()]).unwrap();
            assert!(v.is_object());
        }
        // Resources and scopes hold their spans' count, after them.
        let outer: Vec<(Level, u64)> = all
            .iter()
            .filter(|e| e.level != Level::Span)
            .map(|e| (e.level, e.spans))
            .collect();
        assert_eq!(
            outer,
            [
                (Level::Scope, 2),
                (Level::Resource, 2),
                (Level::Scope, 1),
                (Level::Resource, 1)
            ]
        );
    }

    #[test]
    fn any_depth_is_scanned() {
        let body = format!(
            r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"attributes":[{{"key":"d","value":{}}}]}},{{"name":"ok"}}]}}]}}]}}"#,
            deep(100_000)
        );
        let spans: Vec<JsonElement> = json_elements(body.as_bytes())
            .into_iter()
            .filter(|e| e.level == Level::Span)
            .collect();
        assert_eq!(spans.len(), 2);
        let first = &body[spans[0].range.clone()];
        assert!(first.starts_with(r#"{"attributes""#) && first.ends_with("}]}}}]}"));
        assert_eq!(&body[spans[1].range.clone()], r#"{"name":"ok"}"#);
    }

    #[test]
    fn only_the_keys_the_parser_reads_lead_to_spans() {
        // snake_case keys are ignored by the parser: no span there.
        let body = r#"{"resource_spans":[{"scopeSpans":[{"spans":[{"name":"x"}]}]}]}"#;
        assert!(json_elements(body.as_bytes()).is_empty());
        // An escaped key is the key it spells.
        let body = r#"{"resourceSpans":[{"scopeSpans":[{"spa\u006es":[{"name":"x"}]}]}]}"#;
        let spans = json_elements(body.as_bytes())
            .into_iter()
            .filter(|e| e.level == Level::Span)
            .count();
        assert_eq!(spans, 1);
    }

    #[test]
    fn a_bracket_that_closes_nothing_open_stops_the_scan() {
        let body = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"]]}]}]}"#;
        assert!(
            json_elements(body.as_bytes())
                .iter()
                .all(|e| e.level != Level::Span)
        );
    }

    #[test]
    fn offsets() {
        let body = b"{\n  \"a\": 1,\n  \"b\": [{\"x\":1},{\"y\":2}]\n}";
        assert_eq!(byte_offset(body, 1, 1), 0);
        assert_eq!(body[byte_offset(body, 3, 3)], b'"');
        assert_eq!(byte_offset(body, 3, 100), body.len());
    }
}
