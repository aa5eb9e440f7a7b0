//! OTLP/JSON: the protobuf JSON mapping with OTLP's differences (trace and span ids as hex
//! strings, enums as integers, 64-bit integers as decimal strings or numbers, lowerCamelCase
//! keys, unknown keys ignored). `opentelemetry-proto`'s `with-serde` derives implement exactly
//! that mapping, so a body is read into its types and converted with [`from_proto`].
//!
//! One span must not cost the others: a span the parser cannot read — an attribute value nested
//! past its recursion limit (128 levels, ~30 levels of key-value lists), an id that is not hex —
//! is cut out of the body ([`json_spans`](super::json_spans)) and rejected, and the rest is
//! decoded. When a body does not parse whole, every span is parsed on its own and all that fail
//! are cut at once: a hostile body costs about three parses, however many bad spans it holds.
//! An error in a scope or a resource (outside its spans) cuts that scope or resource, its spans
//! rejected, as the protobuf decoder rejects the spans of a resource nested too deep; scopes,
//! then resources, are found the same way (each parsed on its own, all that fail cut at once).
//! Before an element is cut it is rewritten as the [lenient reading](super::json_lenient) allows
//! (`null` fields, enum names, numbers as strings — all valid in the protobuf JSON mapping, all
//! refused by the generated types), and kept when the rewrite reads; so is the envelope. A body
//! costs at most eleven parses. Only an error outside every resource refuses the whole body.

use std::borrow::Cow;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use super::decoded::{DecodeError, Decoded};
use super::json_lenient::{rewrite_lenient, rewrite_lenient_sized};
use super::json_spans::{JsonElement, Level, byte_offset, scan_elements};
use super::reference::from_proto;

impl Level {
    /// What an element of this level is parsed in on its own: the envelope down to it.
    fn envelope(self) -> (&'static [u8], &'static [u8]) {
        match self {
            Level::Resource => (br#"{"resourceSpans":["#, b"]}"),
            Level::Scope => (br#"{"resourceSpans":[{"scopeSpans":["#, b"]}]}"),
            Level::Span => (br#"{"resourceSpans":[{"scopeSpans":[{"spans":["#, b"]}]}]}"),
        }
    }

    /// The element in words, for the answer.
    fn what(self) -> &'static str {
        match self {
            Level::Span => "the span",
            Level::Scope => "the spans' scope",
            Level::Resource => "the spans' resource",
        }
    }
}

/// Bytes [`json_decode_bound`] counts per resource, scope or span object: what one becomes
/// once decoded, at most (the generated span is 264 bytes, its vector grows by doubling, and the
/// analysis span made from it is counted too).
pub const JSON_BYTES_PER_ELEMENT: usize = 1024;

/// Bytes [`json_decode_bound`] counts per other object (an attribute, a value, an event, a
/// link...): the largest, a link, is 104 bytes in a vector that grows by doubling; a value is
/// held inside its attribute.
pub const JSON_BYTES_PER_OBJECT: usize = 256;

/// Bytes [`json_decode_bound`] counts per array: what the scans that follow nesting (the
/// element scan, the lenient rewrite, the parser skipping an unknown field) hold per open
/// container, for a body nested a million levels deep (an array's values are counted as
/// objects).
pub const JSON_BYTES_PER_ARRAY: usize = 16;

/// Bytes that decoding an OTLP/JSON body may allocate at most, as a bound for the memory
/// limiter to reserve before decoding: [`JSON_BYTES_PER_ELEMENT`] per resource, scope and span,
/// [`JSON_BYTES_PER_OBJECT`] per other object, [`JSON_BYTES_PER_ARRAY`] per array (brackets
/// inside strings are text, not containers), plus six times the body: at its worst, while an
/// element of a body already rewritten or cut once is parsed alone, decoding holds the body as
/// rebuilt, the element's copy, and a string the parser reads through a scratch buffer that
/// grows by doubling (up to three times the string). One scan of the body; the
/// `json_decode_stays_under_its_bound` test measures the real peak against it.
pub fn json_decode_bound(body: &[u8]) -> usize {
    let mut elements = 0usize;
    let passed = scan_elements(body, |_| elements += 1);
    elements
        .saturating_mul(JSON_BYTES_PER_ELEMENT)
        .saturating_add(
            passed
                .objects
                .saturating_sub(elements)
                .saturating_mul(JSON_BYTES_PER_OBJECT),
        )
        .saturating_add(passed.arrays.saturating_mul(JSON_BYTES_PER_ARRAY))
        .saturating_add(body.len().saturating_mul(6))
}

/// Decodes an OTLP/JSON `ExportTraceServiceRequest` into spans (see the [module rules](super)).
pub fn decode_json(buf: &[u8]) -> Result<Decoded, DecodeError> {
    decode_json_cutting(buf).map(|(decoded, _)| decoded)
}

/// [`decode_json`], also giving the body as decoded when spans, scopes or resources had to be
/// rewritten or cut out of it (each cut one replaced by `{}`, which is rejected like any span
/// without ids): the body to forward, which a downstream's parser can read. `None` when the
/// body was decoded as it came.
pub fn decode_json_cutting(buf: &[u8]) -> Result<(Decoded, Option<Vec<u8>>), DecodeError> {
    // The parser would also read a message from an array of its fields' values; OTLP/JSON
    // is an object.
    if buf.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(DecodeError::Json(
            "an OTLP/JSON request must be a JSON object".to_owned(),
        ));
    }
    let mut error = match parse(buf) {
        Ok(req) => return Ok((from_proto(&req), None)),
        Err(e) => e,
    };
    let mut cuts = Cuts {
        first: None,
        with_their_scope: 0,
    };
    let mut body = Cow::Borrowed(buf);
    // Innermost first: a scope is judged with its unreadable spans already cut, a resource with
    // its unreadable scopes cut. Each level costs one parse of its elements, each on its own,
    // one of the rewrites that might read, and one of the body as fixed (and the envelope's
    // rewrite, last): however many elements are fixed, a body costs at most eleven parses.
    for level in [Level::Span, Level::Scope, Level::Resource] {
        if !cuttable(&error) {
            break;
        }
        // An element whose syntax is broken is not cut: the body is refused.
        let at = byte_offset(&body, error.line(), error.column());
        let Some(Unreadable {
            fixes: unreadable,
            first_cut_error,
            cut_error_at,
        }) = unreadable_elements(&body, level, at)
        else {
            break;
        };
        if unreadable.is_empty() {
            continue;
        }
        let mut error_rewritten = false;
        for (element, fix) in &unreadable {
            if let Fix::Rewrite { .. } = fix {
                error_rewritten |= element.range.contains(&at);
                continue;
            }
            if cuts.first.is_none() && element.range.contains(&at) {
                // The element's own reason (the body's error may be one the lenient reading
                // forgives), where the body's error points.
                let reason = cut_error_at.as_deref().unwrap_or("unreadable");
                let (line, column) = (error.line(), error.column());
                cuts.first = Some(format!(
                    "{} could not be read: {reason} (at line {line} column {column})",
                    level.what()
                ));
            }
            if level != Level::Span {
                cuts.with_their_scope += element.spans;
            }
        }
        // The body's error was in an element the rewrite read: the first cut's own error.
        if let (None, true, Some(e)) = (&cuts.first, error_rewritten, first_cut_error) {
            cuts.first = Some(format!("{} could not be read: {e}", level.what()));
        }
        let fixed_body = with_fixed(&body, &unreadable);
        drop(unreadable);
        // The previous copy goes before the new one is parsed.
        body = Cow::Owned(fixed_body);
        match parse(&body) {
            Ok(req) => return Ok(cuts.decoded(&req, body.into_owned())),
            Err(e) => error = e,
        }
    }
    // An error outside every resource (`"resourceSpans": null`): the whole body rewritten.
    let mut fixed_body = Vec::new();
    if cuttable(&error)
        && rewrite_lenient_sized(&body, &mut fixed_body, 0).is_some()
        && let Ok(req) = parse(&fixed_body)
    {
        return Ok(cuts.decoded(&req, fixed_body));
    }
    Err(DecodeError::Json(error.to_string()))
}

/// What cutting a body took out, for the decoded result.
struct Cuts {
    /// The first cut's reason, for the answer.
    first: Option<String>,
    /// Spans of the scopes and resources cut out (a cut span is rejected by the decoder).
    with_their_scope: u64,
}

impl Cuts {
    /// `req` (parsed from `body`, the body as cut) decoded, its cut spans rejected.
    fn decoded(self, req: &ExportTraceServiceRequest, body: Vec<u8>) -> (Decoded, Option<Vec<u8>>) {
        let mut decoded = from_proto(req);
        if self.first.is_some() {
            decoded.first_error = self.first;
        }
        decoded.rejected = decoded
            .rejected
            .saturating_add(u32::try_from(self.with_their_scope).unwrap_or(u32::MAX));
        (decoded, Some(body))
    }
}

fn parse(body: &[u8]) -> Result<ExportTraceServiceRequest, serde_json::Error> {
    serde_json::from_slice(body)
}

/// Whether an error is one a cut can remove: the parser ran out of recursion (it stops at the
/// container past its limit, inside the element that nests too deep), could not read a value
/// (a data error: an id that is not hex, a number out of range) or a string's content (bytes
/// that are not UTF-8, a control character, a bad escape, a lone surrogate (which the lenient
/// rewrite reads): the string still ends where the scan sees it end). Not any
/// other syntax error — the scan could not be trusted to see the body's structure as the
/// parser does.
fn cuttable(error: &serde_json::Error) -> bool {
    /// serde_json's messages for a string whose content it cannot read.
    const IN_A_STRING: [&str; 5] = [
        "control character",
        "invalid escape",
        "invalid unicode code point",
        "lone leading surrogate",
        "unexpected end of hex escape",
    ];
    let message = error.to_string();
    message.starts_with("recursion limit exceeded")
        || error.classify() == serde_json::error::Category::Data
        || IN_A_STRING.iter().any(|m| message.starts_with(m))
}

/// What becomes of an element the parser cannot read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fix {
    /// Its [lenient rewrite](super::json_lenient), `len` bytes, reads: it replaces the element.
    Rewrite { len: usize },
    /// Nothing reads: it is cut (replaced by `{}`, which is rejected like any span without ids,
    /// or an empty scope or resource).
    Cut,
}

/// The elements of `level` in `body` that the parser cannot read, each parsed on its own inside
/// the envelope down to its level, so that it sits at the depth it has in the body (the
/// parser's recursion limit counts from the top), with what to do with each; in body order.
/// Only the decision is kept, not the rewrite: [`with_fixed`] writes it again, so that no more
/// than one element's copy is held at a time (in a buffer of its exact size). Also the parser's
/// error in the first element cut (its position left out: it would count from the envelope,
/// not the body). `None` when an element that cannot be read is not well-formed JSON either: a
/// cut would hide a syntax error, so the body is refused.
fn unreadable_elements(body: &[u8], level: Level, at: usize) -> Option<Unreadable> {
    let (prefix, suffix) = level.envelope();
    let mut unreadable = Vec::new();
    let mut first_cut_error = None;
    let mut cut_error_at = None;
    let mut alone = Vec::new();
    let mut well_formed = true;
    scan_elements(body, |e| {
        if e.level != level || !well_formed {
            return;
        }
        let element = &body[e.range.clone()];
        alone.clear();
        alone.reserve_exact(prefix.len() + element.len() + suffix.len());
        alone.extend_from_slice(prefix);
        alone.extend_from_slice(element);
        alone.extend_from_slice(suffix);
        let error = match parse(&alone) {
            Err(error) if cuttable(&error) => error,
            _ => return,
        };
        alone.truncate(prefix.len());
        let rewritten = rewrite_lenient_sized(element, &mut alone, suffix.len());
        alone.extend_from_slice(suffix);
        let rewrite_error = match rewritten.map(|len| (len, parse(&alone))) {
            Some((len, Ok(_))) => {
                unreadable.push((e, Fix::Rewrite { len }));
                return;
            }
            Some((_, Err(rewrite_error))) => Some(rewrite_error),
            None => None,
        };
        if !well_formed_json(element) {
            well_formed = false;
            return;
        }
        let holds_at = e.range.contains(&at);
        if first_cut_error.is_none() || holds_at {
            // Why it is cut: the error left once the lenient spellings are read (a string
            // `kind` is no reason when the element also nests too deep).
            let message = rewrite_error.as_ref().unwrap_or(&error).to_string();
            let without_position = message.rsplit_once(" at line ").map_or(&*message, |m| m.0);
            if holds_at {
                cut_error_at = Some(without_position.to_owned());
            }
            first_cut_error.get_or_insert_with(|| without_position.to_owned());
        }
        let fix = Fix::Cut;
        unreadable.push((e, fix));
    });
    well_formed.then_some(Unreadable {
        fixes: unreadable,
        first_cut_error,
        cut_error_at,
    })
}

/// The elements of a level that the parser cannot read, with what becomes of each, and the
/// parser's error in the first one cut.
struct Unreadable {
    fixes: Vec<(JsonElement, Fix)>,
    first_cut_error: Option<String>,
    /// The parser's error in the element cut that holds the body's error, if one does.
    cut_error_at: Option<String>,
}

/// Whether `element` is JSON whose only errors, if any, are inside strings (what a cut may
/// remove): its syntax as the parser sees it when it reads the element into nothing.
fn well_formed_json(element: &[u8]) -> bool {
    match serde_json::from_slice::<serde::de::IgnoredAny>(element) {
        Ok(_) => true,
        Err(e) => e.classify() != serde_json::error::Category::Syntax || cuttable(&e),
    }
}

/// `body` with each element of `fixes` (in body order, not overlapping) rewritten or cut, in a
/// buffer of exactly its size (a rewrite may add a little; a vector that grew by doubling
/// could take twice the body).
fn with_fixed(body: &[u8], fixes: &[(JsonElement, Fix)]) -> Vec<u8> {
    let size = fixes.iter().fold(body.len(), |size, (element, fix)| {
        let written = match fix {
            Fix::Rewrite { len } => *len,
            Fix::Cut => 2,
        };
        size - element.range.len() + written
    });
    let mut out = Vec::with_capacity(size);
    let mut from = 0;
    for (element, fix) in fixes {
        let range = element.range.clone();
        out.extend_from_slice(&body[from..range.start]);
        match fix {
            // The same rewrite that was decided on, into the room counted for it.
            Fix::Rewrite { .. } => {
                rewrite_lenient(&body[range.clone()], &mut out);
            }
            Fix::Cut => out.extend_from_slice(b"{}"),
        }
        from = range.end;
    }
    out.extend_from_slice(&body[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use infertrace_analysis::trace::{AttrValue, SpanId, SpanKind, StatusCode, TraceId};
    use infertrace_semconv as sc;

    /// An OTLP/JSON body as the OpenTelemetry SDKs write it (ids hex, enums integers, int64 as
    /// strings), with an unknown key thrown in.
    const BODY: &str = r#"{
      "resourceSpans": [{
        "resource": {"attributes": [
          {"key": "service.name", "value": {"stringValue": "vllm-a"}},
          {"key": "host.name", "value": {"stringValue": "h1"}}
        ]},
        "scopeSpans": [{
          "scope": {"name": "vllm"},
          "spans": [{
            "traceId": "5B8EFFF798038103D269B633813FC60C",
            "spanId": "EEE19B7EC3C1B174",
            "parentSpanId": "",
            "name": "llm_request",
            "kind": 2,
            "startTimeUnixNano": "1544712660000000000",
            "endTimeUnixNano": 1544712661000000000,
            "attributes": [
              {"key": "gen_ai.latency.time_in_queue", "value": {"doubleValue": 0.25}},
              {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "17"}},
              {"key": "gen_ai.request.stream", "value": {"boolValue": true}},
              {"key": "gen_ai.response.finish_reasons", "value": {"arrayValue": {"values": [{"stringValue": "stop"}]}}},
              {"key": "dropped.attr", "value": {"stringValue": "x"}}
            ],
            "links": [{"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "0000000000000001"}],
            "status": {"code": 2, "message": "boom"},
            "someFutureField": {"x": 1}
          }, {
            "traceId": "00000000000000000000000000000000",
            "spanId": "EEE19B7EC3C1B175",
            "name": "bad",
            "startTimeUnixNano": "1",
            "endTimeUnixNano": "2"
          }]
        }]
      }]
    }"#;

    #[test]
    fn decodes_the_otlp_json_mapping() {
        let d = decode_json(BODY.as_bytes()).unwrap();
        assert_eq!(d.rejected, 1);
        assert_eq!(d.spans.len(), 1);
        let s = &d.spans[0];
        assert_eq!(
            s.trace_id,
            TraceId::from_hex("5b8efff798038103d269b633813fc60c").unwrap()
        );
        assert_eq!(s.span_id, SpanId::from_hex("eee19b7ec3c1b174").unwrap());
        assert_eq!(s.parent_span_id, None);
        assert_eq!(&*s.service, "vllm-a");
        assert_eq!(s.kind, SpanKind::Server);
        assert_eq!(s.status, StatusCode::Error);
        assert_eq!(s.start_unix_nano, 1_544_712_660_000_000_000);
        assert_eq!(s.end_unix_nano, 1_544_712_661_000_000_000);
        assert_eq!(s.attr_f64(sc::latency::TIME_IN_QUEUE), Some(0.25));
        assert_eq!(
            s.attr(sc::gen_ai::USAGE_COMPLETION_TOKENS),
            Some(&AttrValue::Int(17))
        );
        assert_eq!(
            s.attr(sc::gen_ai::REQUEST_STREAM),
            Some(&AttrValue::Bool(true))
        );
        assert_eq!(
            s.attr(sc::gen_ai::RESPONSE_FINISH_REASONS),
            Some(&AttrValue::StrArray(vec!["stop".into()]))
        );
        assert_eq!(s.attributes.len(), 4);
        assert_eq!(s.links.len(), 1);
    }

    #[test]
    fn malformed_json_is_an_error() {
        assert!(matches!(
            decode_json(b"{\"resourceSpans\": ["),
            Err(DecodeError::Json(_))
        ));
        // A span the parser cannot read is cut out and rejected, not the body.
        let d =
            decode_json(br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}"#)
                .unwrap();
        assert_eq!((d.spans.len(), d.rejected), (0, 1));
        assert_eq!(decode_json(b"{}").unwrap(), Decoded::default());
    }

    /// A body of `good` valid spans and, after every tenth, one made of `poison` (its JSON).
    fn body_with(good: usize, poison: &str) -> String {
        let mut spans = Vec::new();
        for k in 0..good {
            spans.push(format!(
                r#"{{"traceId":"{:032x}","spanId":"{:016x}","name":"s","startTimeUnixNano":"1","endTimeUnixNano":"2"}}"#,
                k + 1,
                k + 1
            ));
            if k % 10 == 9 {
                spans.push(poison.to_owned());
            }
        }
        format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"svc"}}}}]}},"scopeSpans":[{{"spans":[{}]}}]}}]}}"#,
            spans.join(",")
        )
    }

    fn nested(levels: usize) -> String {
        let open = r#"{"kvlistValue":{"values":[{"key":"k","value":"#.repeat(levels);
        format!(r#"{open}{{"stringValue":"x"}}{}"#, "}]}}".repeat(levels))
    }

    #[test]
    fn spans_nested_past_the_parser_limit_are_cut_not_the_request() {
        for levels in [29, 30, 200, 100_000] {
            let deep = format!(
                r#"{{"traceId":"{:032x}","spanId":"{:016x}","name":"deep","startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{{"key":"d","value":{}}}]}}"#,
                999,
                999,
                nested(levels)
            );
            // Many deep spans, but for the largest body.
            let good = if levels > 1000 { 100 } else { 300 };
            let body = body_with(good, &deep);
            let (d, cut) = decode_json_cutting(body.as_bytes()).unwrap();
            assert_eq!(
                (d.spans.len(), d.rejected as usize),
                (good, good / 10),
                "{levels} levels"
            );
            assert!(d.spans.iter().all(|s| &*s.name == "s"));
            // Under the parser's limit the spans are rejected for their nesting, as read;
            // past it they are cut out, and the body to forward parses.
            match cut {
                None => assert!(levels < 30, "{levels}"),
                Some(cut) => {
                    let again = decode_json(&cut).unwrap();
                    assert_eq!(
                        (again.spans.len(), again.rejected as usize),
                        (good, good / 10)
                    );
                    assert!(
                        d.first_error.unwrap().contains("recursion limit"),
                        "{levels}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_span_the_parser_cannot_read_is_cut_and_the_others_kept() {
        let bad_id = r#"{"traceId":"not-hex","spanId":"0000000000000001","startTimeUnixNano":"1","endTimeUnixNano":"2"}"#;
        let (d, cut) = decode_json_cutting(body_with(30, bad_id).as_bytes()).unwrap();
        assert_eq!((d.spans.len(), d.rejected), (30, 3));
        assert!(
            d.first_error
                .unwrap()
                .starts_with("the span could not be read")
        );
        assert_eq!(decode_json(&cut.unwrap()).unwrap().spans.len(), 30);
        // Any number of such spans: all are cut at once.
        let many = body_with(10_000, bad_id);
        let (d, cut) = decode_json_cutting(many.as_bytes()).unwrap();
        assert_eq!((d.spans.len(), d.rejected), (10_000, 1_000));
        assert_eq!(decode_json(&cut.unwrap()).unwrap().rejected, 1_000);
        // An error outside every resource still refuses the body.
        let envelope =
            body_with(10, "{}").replace(r#""resourceSpans":["#, r#""resourceSpans":[7,"#);
        assert!(matches!(
            decode_json(envelope.as_bytes()),
            Err(DecodeError::Json(_))
        ));
    }

    #[test]
    fn a_resource_the_parser_cannot_read_rejects_its_spans_and_keeps_the_others() {
        let good = body_with(20, "{}");
        let service = r#"{"key":"service.name","value":{"stringValue":"svc"}}"#;
        let deep = good.replace(
            service,
            &format!(r#"{{"key":"d","value":{}}}"#, nested(200)),
        );
        // Two resources: the first nested too deep (its 22 spans rejected), the second fine.
        let resources = |body: &str| {
            let start = body.find('[').unwrap() + 1;
            body[start..body.len() - 2].to_owned()
        };
        let two = format!(
            r#"{{"resourceSpans":[{},{}]}}"#,
            resources(&deep),
            resources(&good)
        );
        let (d, cut) = decode_json_cutting(two.as_bytes()).unwrap();
        // The good resource's two `{}` spans are rejected as usual.
        assert_eq!(
            (d.spans.len(), d.rejected),
            (20, 22 + 2),
            "{:?}",
            d.first_error
        );
        assert!(
            d.first_error
                .unwrap()
                .contains("resource could not be read"),
            "first error"
        );
        let again = decode_json(&cut.unwrap()).unwrap();
        assert_eq!(again.spans.len(), 20);
        // Any number of such resources: all are cut at once, the good ones kept.
        let mut many = vec![resources(&deep); 40];
        many.insert(17, resources(&good));
        let many = format!(r#"{{"resourceSpans":[{}]}}"#, many.join(","));
        let (d, cut) = decode_json_cutting(many.as_bytes()).unwrap();
        assert_eq!((d.spans.len(), d.rejected), (20, 40 * 22 + 2));
        let again = decode_json(&cut.unwrap()).unwrap();
        assert_eq!((again.spans.len(), again.rejected), (20, 2));
    }

    #[test]
    fn spans_scopes_and_resources_that_cannot_be_read_are_all_cut_in_one_body() {
        let bad_id = r#"{"traceId":"not-hex","spanId":"0000000000000001","startTimeUnixNano":"1","endTimeUnixNano":"2"}"#;
        let span = |k: usize| {
            format!(
                r#"{{"traceId":"{k:032x}","spanId":"{k:016x}","name":"s","startTimeUnixNano":"1","endTimeUnixNano":"2"}}"#
            )
        };
        // A scope whose own attributes cannot be read (a non-numeric int), a scope with one
        // bad span among good ones, and a resource with a bad attribute, 30 times over.
        let bad_scope = format!(
            r#"{{"scope":{{"name":"x","attributes":[{{"key":"n","value":{{"intValue":"seven"}}}}]}},"spans":[{},{}]}}"#,
            span(1),
            span(2)
        );
        let mixed_scope = format!(r#"{{"spans":[{},{bad_id},{}]}}"#, span(3), span(4));
        let good_resource =
            format!(r#"{{"scopeSpans":[{bad_scope},{mixed_scope},{mixed_scope}]}}"#);
        let bad_resource = format!(
            r#"{{"resource":{{"attributes":[{{"key":"n","value":{{"doubleValue":"x"}}}}]}},"scopeSpans":[{mixed_scope}]}}"#
        );
        let mut resources = Vec::new();
        for _ in 0..30 {
            resources.push(good_resource.clone());
            resources.push(bad_resource.clone());
        }
        let body = format!(r#"{{"resourceSpans":[{}]}}"#, resources.join(","));
        let (d, cut) = decode_json_cutting(body.as_bytes()).unwrap();
        // Per round: 4 good spans kept; 2 bad spans (cut, then rejected as empty), the bad
        // scope's 2 and the bad resource's 3 rejected.
        assert_eq!((d.spans.len(), d.rejected), (30 * 4, 30 * (2 + 2 + 3)));
        assert!(
            d.first_error
                .unwrap()
                .starts_with("the spans' scope could not be read"),
            "the first error in the body is the first scope's"
        );
        let again = decode_json(&cut.unwrap()).unwrap();
        assert_eq!((again.spans.len(), again.rejected), (30 * 4, 30 * 2));
    }

    #[test]
    fn a_span_with_a_string_the_parser_cannot_read_is_cut_and_a_lone_surrogate_read() {
        let span = |k: usize, model: &[u8]| -> Vec<u8> {
            [
                format!(
                    r#"{{"traceId":"{k:032x}","spanId":"{k:016x}","name":"s","startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{{"key":"gen_ai.request.model","value":{{"stringValue":""#
                )
                .as_bytes(),
                model,
                br#""}}]}"#,
            ]
            .concat()
        };
        for bad in [
            &br"escape \q"[..],
            br"bad hex \ud8x3",
            b"tab\tinside",
            b"not utf-8 \xc3\x28",
        ] {
            let spans = [span(1, b"m"), span(2, bad), span(3, b"m"), span(4, b"m")].join(&b","[..]);
            let (prefix, suffix) = Level::Span.envelope();
            let body = [prefix, &spans, suffix].concat();
            let label = String::from_utf8_lossy(bad);
            let (d, cut) = decode_json_cutting(&body).unwrap();
            assert_eq!((d.spans.len(), d.rejected), (3, 1), "{label}");
            assert!(
                d.first_error
                    .unwrap()
                    .starts_with("the span could not be read"),
                "{label}"
            );
            assert_eq!(
                decode_json(&cut.unwrap()).unwrap().spans.len(),
                3,
                "{label}"
            );
        }
        // A lone surrogate (half an emoji, as `JSON.stringify` cuts one) is read as the
        // replacement character, and the span kept.
        for (half, read) in [
            (&br"cut emoji \ud83d"[..], "cut emoji \u{fffd}"),
            (br"half \ud83dX", "half \u{fffd}X"),
        ] {
            let spans = [span(1, b"m"), span(2, half)].join(&b","[..]);
            let (prefix, suffix) = Level::Span.envelope();
            let (d, fixed) = decode_json_cutting(&[prefix, &spans, suffix].concat()).unwrap();
            assert_eq!((d.spans.len(), d.rejected), (2, 0), "{read}");
            assert_eq!(
                d.spans[1].attr(sc::gen_ai::REQUEST_MODEL),
                Some(&AttrValue::Str(read.into())),
            );
            assert_eq!(decode_json(&fixed.unwrap()).unwrap(), d);
        }
        // A string error outside every resource still refuses the body.
        assert!(decode_json(br#"{"resourceSpans":[],"x\q":1}"#).is_err());
    }

    #[test]
    fn only_an_object_is_a_request() {
        let body = body_with(3, "");
        assert_eq!(
            decode_json(format!(" \n{body}").as_bytes())
                .unwrap()
                .spans
                .len(),
            3
        );
        let fields = body
            .trim_start_matches(r#"{"resourceSpans":"#)
            .trim_end_matches('}');
        for not_an_object in [format!("[{fields}]"), String::new(), "  ".to_owned()] {
            assert!(matches!(
                decode_json(not_an_object.as_bytes()),
                Err(DecodeError::Json(_))
            ));
        }
    }

    #[test]
    fn spans_under_an_escaped_key_are_cut_like_any() {
        let deep = format!(
            r#"{{"traceId":"{:032x}","spanId":"{:016x}","name":"deep","startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{{"key":"d","value":{}}}]}}"#,
            1,
            1,
            nested(40)
        );
        let body = body_with(20, &deep).replace(r#""spans":"#, r#""spa\u006es":"#);
        let d = decode_json(body.as_bytes()).unwrap();
        assert_eq!((d.spans.len(), d.rejected), (20, 2), "{:?}", d.first_error);
    }

    #[test]
    fn a_span_read_on_its_own_is_judged_at_its_depth_in_the_body() {
        // The parser's limit counts from the top of the body: the deepest value a span can
        // hold there is found by the parser itself, and one level more is cut.
        let span = |levels: usize| {
            format!(
                r#"{{"traceId":"{:032x}","spanId":"{:016x}","name":"deep","startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{{"key":"d","value":{}}}]}}"#,
                1,
                1,
                nested(levels)
            )
        };
        let readable = (1..40)
            .take_while(|&l| {
                decode_json_cutting(
                    body_with(0, "")
                        .replace("[]", &format!("[{}]", span(l)))
                        .as_bytes(),
                )
                .is_ok_and(|(_, cut)| cut.is_none())
            })
            .last()
            .unwrap();
        assert!((25..35).contains(&readable), "{readable}");
        // Beside a span the whole-body parse stops at (not hex), the deepest readable one is
        // read (and rejected for its nesting, as always) and the next deeper one cut.
        let bad_id = r#"{"traceId":"not-hex","spanId":"0000000000000001","startTimeUnixNano":"1","endTimeUnixNano":"2"}"#;
        for (levels, read) in [(readable, true), (readable + 1, false)] {
            let body =
                body_with(10, bad_id).replacen(bad_id, &format!("{bad_id},{}", span(levels)), 1);
            let (d, cut) = decode_json_cutting(body.as_bytes()).unwrap();
            assert_eq!((d.spans.len(), d.rejected), (10, 2), "{levels} levels");
            let cut = String::from_utf8(cut.unwrap()).unwrap();
            assert_eq!(cut.contains(r#""name":"deep""#), read, "{levels} levels");
        }
    }

    #[test]
    fn only_the_span_the_parser_stopped_in_is_cut() {
        // Span 1 carries an unknown field nested 130 deep, which the parser skips without a
        // depth limit: valid. Span 2 nests a value past the limit: the one cut.
        let unknown = format!(
            r#"{{"traceId":"{:032x}","spanId":"{:016x}","name":"s","startTimeUnixNano":"1","endTimeUnixNano":"2","x":{}{}}}"#,
            1,
            1,
            "[".repeat(130),
            "]".repeat(130)
        );
        let deep = format!(
            r#"{{"traceId":"{:032x}","spanId":"{:016x}","name":"deep","startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{{"key":"d","value":{}}}]}}"#,
            2,
            2,
            nested(30)
        );
        let body =
            format!(r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{unknown},{deep}]}}]}}]}}"#);
        let d = decode_json(body.as_bytes()).unwrap();
        assert_eq!((d.spans.len(), d.rejected), (1, 1), "{:?}", d.first_error);
        assert_eq!(&*d.spans[0].name, "s");
        // A syntax error is not repaired: the scan cannot be trusted to see the structure.
        let broken = body_with(20, "{}").replacen(r#""name":"s""#, r#""name":"s"""#, 1);
        assert!(matches!(
            decode_json(broken.as_bytes()),
            Err(DecodeError::Json(_))
        ));
    }

    #[test]
    fn what_the_json_mapping_allows_is_read_not_cut() {
        // As hand-written encoders and other languages' SDKs write it: nulls for unset fields,
        // enum names, integers and doubles as strings, a NaN.
        let lenient = r#"{"traceId":"00000000000000000000000000000abc","spanId":"0000000000000abc",
            "parentSpanId":null,"traceState":null,"name":"lenient","kind":"SPAN_KIND_SERVER",
            "startTimeUnixNano":"1","endTimeUnixNano":"2","droppedAttributesCount":"0",
            "attributes":[{"key":"gen_ai.latency.time_in_queue","value":{"doubleValue":"0.5"}},
                          {"key":"gen_ai.latency.time_to_first_token","value":{"doubleValue":"NaN"}},
                          {"key":"gen_ai.request.model","value":{"stringValue":null}}],
            "events":null,"links":null,"status":{"code":"STATUS_CODE_ERROR","message":null}}"#;
        let body = body_with(30, lenient);
        let (d, fixed) = decode_json_cutting(body.as_bytes()).unwrap();
        assert_eq!((d.spans.len(), d.rejected), (33, 0), "{:?}", d.first_error);
        assert_eq!(d.first_error, None);
        let s = d.spans.iter().find(|s| &*s.name == "lenient").unwrap();
        assert_eq!((s.kind, s.status), (SpanKind::Server, StatusCode::Error));
        assert_eq!(s.parent_span_id, None);
        assert_eq!(s.attr_f64(sc::latency::TIME_IN_QUEUE), Some(0.5));
        // The NaN and the null string leave their attributes without a value: dropped.
        assert_eq!(s.attributes.len(), 1);
        // What is forwarded is the body as read: it parses whole, as it is.
        let fixed = fixed.unwrap();
        assert!(parse(&fixed).is_ok());
        assert_eq!(decode_json(&fixed).unwrap(), d);
        // A scope or resource written the same way is read too.
        let scope_and_resource = body_with(10, "{}")
            .replace(
                r#""scopeSpans":[{"#,
                r#""scopeSpans":[{"scope":{"name":"s","droppedAttributesCount":null},"#,
            )
            .replace(
                r#""resource":{"#,
                r#""resource":{"droppedAttributesCount":"1","#,
            );
        let (d, fixed) = decode_json_cutting(scope_and_resource.as_bytes()).unwrap();
        // The `{}` span is rejected for its missing ids, as it always is.
        assert_eq!((d.spans.len(), d.rejected), (10, 1), "{:?}", d.first_error);
        assert!(parse(&fixed.unwrap()).is_ok());
    }

    #[test]
    fn a_syntax_error_behind_a_data_error_refuses_the_body_not_a_cut() {
        // The parser stops at the bad id; the missing colon after it must not vanish with a
        // cut span (or a cut scope).
        for broken in [
            r#"{"traceId":"zz","x" 1}"#,
            r#"{"traceId":"zz","spanId":"0000000000000001","x":[1 2]}"#,
        ] {
            let body = body_with(20, broken);
            assert!(
                matches!(decode_json(body.as_bytes()), Err(DecodeError::Json(_))),
                "{broken}"
            );
        }
        let scope = body_with(5, "{}").replacen(r#""scopeSpans":[{"#, r#""scopeSpans":[null,{"#, 1);
        let scope = scope.replacen(r#"]}]}"#, r#"]}],"x" 1}]}"#, 1);
        assert!(decode_json(scope.as_bytes()).is_err(), "{scope}");
        // A string error is still cut: its string ends where the scan sees it end.
        let body = body_with(20, r#"{"traceId":"zz","name":"tab\tinside\q"}"#);
        assert_eq!(decode_json(body.as_bytes()).unwrap().spans.len(), 20);
    }

    #[test]
    fn a_span_both_lenient_and_unreadable_is_cut() {
        // The rewrite reads the null, but the id is still not hex: cut, and the error is the
        // parser's.
        let bad = r#"{"traceId":"not-hex","spanId":"0000000000000001","parentSpanId":null,"startTimeUnixNano":"1","endTimeUnixNano":"2"}"#;
        let lenient = r#"{"traceId":"00000000000000000000000000000abc","spanId":"0000000000000abc","parentSpanId":null,"startTimeUnixNano":"1","endTimeUnixNano":"2"}"#;
        let body = body_with(20, &format!("{lenient},{bad}"));
        let (d, fixed) = decode_json_cutting(body.as_bytes()).unwrap();
        assert_eq!((d.spans.len(), d.rejected), (22, 2));
        let first = d.first_error.unwrap();
        assert!(
            first.starts_with("the span could not be read") && !first.contains("null"),
            "the null was read; the error is the id's: {first}"
        );
        assert!(!first.contains(" at line "), "{first}");
        let again = decode_json(&fixed.unwrap()).unwrap();
        assert_eq!((again.spans.len(), again.rejected), (22, 2));
    }

    /// A span cut for its nesting is reported for its nesting, also when it spells `kind` as a
    /// string (which the lenient reading forgives, but which the strict parse meets first).
    #[test]
    fn a_span_cut_for_its_nesting_says_so_whatever_else_it_spells_leniently() {
        let deep = |kind: &str| {
            format!(
                r#"{{"traceId":"{:032x}","spanId":"{:016x}","name":"deep",{kind}"startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{{"key":"d","value":{}}}]}}"#,
                999,
                999,
                nested(200)
            )
        };
        for kind in ["", r#""kind":2,"#, r#""kind":"SPAN_KIND_SERVER","#] {
            let body = body_with(20, &deep(kind));
            let d = decode_json(body.as_bytes()).unwrap();
            assert_eq!((d.spans.len(), d.rejected), (20, 2), "{kind}");
            let first = d.first_error.unwrap_or_default();
            assert!(
                first.starts_with("the span could not be read: recursion limit exceeded"),
                "{kind}: {first}"
            );
        }
    }
}
