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

/// `doc` as an OTLP/JSON export request with hex ids, when it is one or is one under an envelope
/// above; `None` when it has no `resourceSpans` (or `batches`) where they are looked for.
pub fn as_export_request(doc: &Value) -> Option<Value> {
    let mut request = request_of(doc)?;
    if let Some(resources) = request
        .get_mut("resourceSpans")
        .and_then(Value::as_array_mut)
    {
        resources.iter_mut().for_each(modernise_resource);
    }
    Some(request)
}

/// The export request `doc` holds: `doc` itself, its `batches` (Tempo), or either under `trace`
/// (Tempo v2) or `result` (Jaeger v2).
fn request_of(doc: &Value) -> Option<Value> {
    let object = doc.as_object()?;
    if object.contains_key("resourceSpans") {
        return Some(doc.clone());
    }
    if let Some(batches) = object.get("batches").filter(|b| b.is_array()) {
        let mut request = Map::new();
        request.insert("resourceSpans".into(), batches.clone());
        return Some(Value::Object(request));
    }
    ["trace", "result"]
        .iter()
        .filter_map(|key| object.get(*key))
        .find_map(|inner| {
            let inner = inner.as_object()?;
            (inner.contains_key("resourceSpans") || inner.contains_key("batches"))
                .then(|| request_of(&Value::Object(inner.clone())))
                .flatten()
        })
}

/// One `resourceSpans` element in today's names, its ids in hex.
fn modernise_resource(resource: &mut Value) {
    let Some(resource) = resource.as_object_mut() else {
        return;
    };
    rename(resource, "instrumentationLibrarySpans", "scopeSpans");
    let Some(scopes) = resource.get_mut("scopeSpans").and_then(Value::as_array_mut) else {
        return;
    };
    for scope in scopes.iter_mut().filter_map(Value::as_object_mut) {
        rename(scope, "instrumentationLibrary", "scope");
        let Some(spans) = scope.get_mut("spans").and_then(Value::as_array_mut) else {
            continue;
        };
        for span in spans.iter_mut().filter_map(Value::as_object_mut) {
            hex_ids(span);
            if let Some(links) = span.get_mut("links").and_then(Value::as_array_mut) {
                links
                    .iter_mut()
                    .filter_map(Value::as_object_mut)
                    .for_each(hex_ids);
            }
        }
    }
}

/// Moves `from` to `to` unless `to` is there already.
fn rename(object: &mut Map<String, Value>, from: &str, to: &str) {
    if !object.contains_key(to)
        && let Some(v) = object.remove(from)
    {
        object.insert(to.into(), v);
    }
}

/// A span's or link's ids in hex where they are base64.
fn hex_ids(object: &mut Map<String, Value>) {
    for (key, bytes) in [("traceId", 16), ("spanId", 8), ("parentSpanId", 8)] {
        if let Some(Value::String(id)) = object.get_mut(key)
            && let Some(hex) = base64_id_as_hex(id, bytes)
        {
            *id = hex;
        }
    }
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
    (decoded.len() == bytes).then(|| decoded.iter().map(|b| format!("{b:02x}")).collect())
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
        let doc = json!({"batches": [{
            "resource": {"attributes": []},
            "instrumentationLibrarySpans": [{
                "instrumentationLibrary": {"name": "lib"},
                "spans": [span("AAECAwQFBgcICQoLDA0ODw==", "AAECAwQFBgc=", "")]
            }]
        }]});
        let request = as_export_request(&doc).expect("a request");
        let scope = &request["resourceSpans"][0]["scopeSpans"][0];
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
        for doc in [
            json!({"trace": inner.clone(), "status": "complete"}),
            json!({"result": inner.clone()}),
        ] {
            assert_eq!(as_export_request(&doc), Some(inner.clone()));
        }
        assert_eq!(as_export_request(&inner), Some(inner.clone()));
        assert_eq!(as_export_request(&json!({"data": []})), None);
        assert_eq!(as_export_request(&json!({"trace": {"x": 1}})), None);
        assert_eq!(as_export_request(&json!([1, 2])), None);
    }
}
