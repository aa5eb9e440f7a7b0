//! OTLP/JSON traces under another envelope, as trace stores give them back, rewritten into an
//! OTLP/JSON export request for `analyze`:
//!
//! - Grafana Tempo's `GET /api/traces/<id>`: `{"batches": [<resourceSpans>…]}`;
//! - Tempo's `GET /api/v2/traces/<id>`: `{"trace": {"resourceSpans": […]}, …}`;
//! - Jaeger v2's `GET /api/v3/traces/<id>`: `{"result": {"resourceSpans": […]}}`;
//! - OTLP before 0.15 (Tempo 1.x): `instrumentationLibrarySpans` and `instrumentationLibrary`
//!   for today's `scopeSpans` and `scope`.
//!
//! Ids may be base64, as protobuf's own JSON printer writes them (Tempo does), where OTLP/JSON
//! takes hex. The lengths tell them apart: a trace id is 32 hex digits or 24 base64 characters
//! (22 unpadded), a span id 16 or 12 (11).

use base64::Engine;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::{DecodePaddingMode, general_purpose};
use serde_json::{Map, Value};

/// Rewrites `doc` in place into an OTLP/JSON export request with hex ids, where it is one under
/// an envelope above or spells it the older ways; returns whether anything changed. A document
/// that holds no export request is left as it is.
pub fn normalise(doc: &mut Value) -> bool {
    let mut changed = open_envelope(doc);
    if let Some(resources) = doc.get_mut("resourceSpans").and_then(Value::as_array_mut) {
        for resource in resources {
            changed |= modernise_resource(resource);
        }
    }
    changed
}

/// Replaces `doc` by the export request it holds: its `batches` (Tempo), or what `trace`
/// (Tempo v2) or `result` (Jaeger v2) holds. Returns whether it did.
fn open_envelope(doc: &mut Value) -> bool {
    let Some(object) = doc.as_object_mut() else {
        return false;
    };
    if object.contains_key("resourceSpans") {
        return false;
    }
    if object.get("batches").is_some_and(Value::is_array) {
        let batches = object.remove("batches").unwrap_or_default();
        *doc = Value::Object(Map::from_iter([("resourceSpans".to_owned(), batches)]));
        return true;
    }
    let holds_one = |v: &Value| {
        v.get("resourceSpans")
            .or_else(|| v.get("batches"))
            .is_some()
    };
    let Some(mut inner) = ["trace", "result"]
        .into_iter()
        .find(|key| object.get(*key).is_some_and(holds_one))
        .and_then(|key| object.remove(key))
    else {
        return false;
    };
    open_envelope(&mut inner);
    *doc = inner;
    true
}

/// One `resourceSpans` element in today's names, its ids in hex; whether anything changed.
fn modernise_resource(resource: &mut Value) -> bool {
    let Some(resource) = resource.as_object_mut() else {
        return false;
    };
    let mut changed = rename(resource, "instrumentationLibrarySpans", "scopeSpans");
    let Some(scopes) = resource.get_mut("scopeSpans").and_then(Value::as_array_mut) else {
        return changed;
    };
    for scope in scopes.iter_mut().filter_map(Value::as_object_mut) {
        changed |= rename(scope, "instrumentationLibrary", "scope");
        let Some(spans) = scope.get_mut("spans").and_then(Value::as_array_mut) else {
            continue;
        };
        for span in spans.iter_mut().filter_map(Value::as_object_mut) {
            changed |= hex_ids(span);
            if let Some(links) = span.get_mut("links").and_then(Value::as_array_mut) {
                for link in links.iter_mut().filter_map(Value::as_object_mut) {
                    changed |= hex_ids(link);
                }
            }
        }
    }
    changed
}

/// Moves `from` to `to` unless `to` is there already; whether it did.
fn rename(object: &mut Map<String, Value>, from: &str, to: &str) -> bool {
    if object.contains_key(to) {
        return false;
    }
    let Some(v) = object.remove(from) else {
        return false;
    };
    object.insert(to.into(), v);
    true
}

/// A span's or link's ids in hex where they are base64; whether any was.
fn hex_ids(object: &mut Map<String, Value>) -> bool {
    let mut changed = false;
    for (key, bytes) in [("traceId", 16), ("spanId", 8), ("parentSpanId", 8)] {
        if let Some(Value::String(id)) = object.get_mut(key)
            && let Some(hex) = base64_id_as_hex(id, bytes)
        {
            *id = hex;
            changed = true;
        }
    }
    changed
}

/// Base64 that pads or not, as protobuf JSON printers differ.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// `id` in hex when it is the base64 of `bytes` bytes (its length is no hex id's).
fn base64_id_as_hex(id: &str, bytes: usize) -> Option<String> {
    let padded = bytes.div_ceil(3) * 4;
    let unpadded = (bytes * 4).div_ceil(3);
    if id.len() != padded && id.len() != unpadded {
        return None;
    }
    let decoded = BASE64
        .decode(id)
        .or_else(|_| general_purpose::URL_SAFE_NO_PAD.decode(id.trim_end_matches('=')))
        .ok()?;
    (decoded.len() == bytes).then(|| hex::encode(decoded))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn span(trace: &str, span: &str, parent: &str) -> Value {
        json!({"traceId": trace, "spanId": span, "parentSpanId": parent, "name": "s",
               "startTimeUnixNano": "1", "endTimeUnixNano": "2"})
    }

    #[test]
    fn base64_ids_become_hex_and_hex_ids_stay() {
        // 0x000102…0f and 0x0001020304050607 in base64.
        assert_eq!(
            base64_id_as_hex("AAECAwQFBgcICQoLDA0ODw==", 16).as_deref(),
            Some("000102030405060708090a0b0c0d0e0f")
        );
        assert_eq!(
            base64_id_as_hex("AAECAwQFBgcICQoLDA0ODw", 16).as_deref(),
            Some("000102030405060708090a0b0c0d0e0f")
        );
        assert_eq!(
            base64_id_as_hex("AAECAwQFBgc=", 8).as_deref(),
            Some("0001020304050607")
        );
        assert_eq!(
            base64_id_as_hex("000102030405060708090a0b0c0d0e0f", 16),
            None
        );
        assert_eq!(base64_id_as_hex("0001020304050607", 8), None);
        assert_eq!(base64_id_as_hex("", 8), None);
        assert_eq!(base64_id_as_hex("!!!!!!!!!!!!", 8), None);
    }

    #[test]
    fn tempos_batches_with_base64_ids_and_old_names_read_as_a_request() {
        let mut doc = json!({"batches": [{
            "resource": {"attributes": []},
            "instrumentationLibrarySpans": [{
                "instrumentationLibrary": {"name": "lib"},
                "spans": [span("AAECAwQFBgcICQoLDA0ODw==", "AAECAwQFBgc=", "")]
            }]
        }]});
        assert!(normalise(&mut doc));
        let scope = &doc["resourceSpans"][0]["scopeSpans"][0];
        assert_eq!(scope["scope"]["name"], "lib");
        assert_eq!(
            scope["spans"][0]["traceId"],
            "000102030405060708090a0b0c0d0e0f"
        );
        assert_eq!(scope["spans"][0]["spanId"], "0001020304050607");
        assert_eq!(scope["spans"][0]["parentSpanId"], "");
    }

    #[test]
    fn tempo_v2_and_jaeger_v2_envelopes_are_opened() {
        let inner = json!({"resourceSpans": [{"scopeSpans": [{"spans": [
            span("000102030405060708090a0b0c0d0e0f", "0001020304050607", "")
        ]}]}]});
        for mut doc in [
            json!({"trace": inner.clone(), "status": "complete"}),
            json!({"result": inner.clone()}),
        ] {
            assert!(normalise(&mut doc));
            assert_eq!(doc, inner);
        }
        // Nothing to do for an export request as it is, or for what holds none.
        for mut doc in [
            inner.clone(),
            json!({"data": []}),
            json!({"trace": {"x": 1}}),
            json!([1, 2]),
        ] {
            let before = doc.clone();
            assert!(!normalise(&mut doc));
            assert_eq!(doc, before);
        }
    }
}
