//! Reads Jaeger's JSON trace export (the UI's "Download JSON" and `/api/traces` answers) into
//! infertrace spans.
//!
//! Shape: `{"data": [{"traceID", "spans": [{"traceID", "spanID", "operationName", "references":
//! [{"refType": "CHILD_OF"|"FOLLOWS_FROM", "traceID", "spanID"}], "startTime" (µs), "duration" (µs),
//! "tags": [{"key", "type", "value"}], "processID"}], "processes": {"p1": {"serviceName"}}}]}`.
//! A `CHILD_OF` reference is the parent; `FOLLOWS_FROM` references become links. `span.kind` and
//! `otel.status_code` / `error` tags give kind and status.

use infertrace_analysis::text::Text;
use std::collections::HashMap;

use anyhow::{Context, bail};
use infertrace_analysis::trace::{
    AttrValue, Span, SpanId, SpanKind, SpanLink, StatusCode, TraceId, UNKNOWN_SERVICE, known_key,
};
use serde_json::Value;

/// True when `v` looks like a Jaeger export rather than OTLP JSON.
pub fn looks_like_jaeger(v: &Value) -> bool {
    v.get("data")
        .and_then(Value::as_array)
        .is_some_and(|d| d.iter().any(|t| t.get("spans").is_some()))
}

fn parse_trace_id(s: &str) -> Option<TraceId> {
    // Jaeger drops leading zeros of 64-bit and 128-bit ids; pad back to 32 hex digits.
    if s.len() > 32 {
        return None;
    }
    TraceId::from_hex(&format!("{s:0>32}"))
}

fn parse_span_id(s: &str) -> Option<SpanId> {
    if s.len() > 16 {
        return None;
    }
    SpanId::from_hex(&format!("{s:0>16}"))
}

fn tag_value(tag: &Value) -> Option<AttrValue> {
    let v = tag.get("value")?;
    let ty = tag.get("type").and_then(Value::as_str).unwrap_or("");
    Some(match (ty, v) {
        ("bool", Value::Bool(b)) => AttrValue::Bool(*b),
        ("int64", Value::Number(n)) => AttrValue::Int(n.as_i64()?),
        ("float64", Value::Number(n)) => AttrValue::Double(n.as_f64()?),
        (_, Value::String(s)) => AttrValue::Str(s.as_str().into()),
        (_, Value::Bool(b)) => AttrValue::Bool(*b),
        (_, Value::Number(n)) => n
            .as_i64()
            .map(AttrValue::Int)
            .or_else(|| n.as_f64().map(AttrValue::Double))?,
        _ => return None,
    })
}

/// Converts a Jaeger export into spans. Spans with bad ids are skipped and counted in the
/// returned problem list; a document that is not a Jaeger export is an error.
pub fn spans_from_jaeger(doc: &Value) -> anyhow::Result<(Vec<Span>, Vec<String>)> {
    let Some(traces) = doc.get("data").and_then(Value::as_array) else {
        bail!("not a Jaeger JSON export: no \"data\" array");
    };
    let mut spans = Vec::new();
    let mut problems = Vec::new();
    for trace in traces {
        let mut services: HashMap<&str, Text> = HashMap::new();
        if let Some(procs) = trace.get("processes").and_then(Value::as_object) {
            for (id, p) in procs {
                let name = p
                    .get("serviceName")
                    .and_then(Value::as_str)
                    .unwrap_or(UNKNOWN_SERVICE);
                services.insert(id.as_str(), Text::from(name));
            }
        }
        let unknown = Text::from(UNKNOWN_SERVICE);
        let empty = Vec::new();
        for js in trace
            .get("spans")
            .and_then(Value::as_array)
            .unwrap_or(&empty)
        {
            match convert_span(js, &services, &unknown) {
                Ok(span) => spans.push(span),
                Err(e) => problems.push(format!("{e:#}")),
            }
        }
    }
    Ok((spans, problems))
}

fn convert_span(
    js: &Value,
    services: &HashMap<&str, Text>,
    unknown: &Text,
) -> anyhow::Result<Span> {
    let str_field = |k: &str| js.get(k).and_then(Value::as_str);
    let trace_id = str_field("traceID")
        .and_then(parse_trace_id)
        .context("span with a missing or bad traceID")?;
    let span_id = str_field("spanID")
        .and_then(parse_span_id)
        .context("span with a missing or bad spanID")?;
    let start_us = js
        .get("startTime")
        .and_then(Value::as_u64)
        .context("span without a startTime")?;
    let dur_us = js.get("duration").and_then(Value::as_u64).unwrap_or(0);
    let mut parent = None;
    let mut links = Vec::new();
    for r in js
        .get("references")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(t), Some(s)) = (
            r.get("traceID")
                .and_then(Value::as_str)
                .and_then(parse_trace_id),
            r.get("spanID")
                .and_then(Value::as_str)
                .and_then(parse_span_id),
        ) else {
            continue;
        };
        match r.get("refType").and_then(Value::as_str) {
            Some("CHILD_OF") if parent.is_none() && t == trace_id => parent = Some(s),
            _ => links.push(SpanLink {
                trace_id: t,
                span_id: s,
            }),
        }
    }
    let mut kind = SpanKind::Unspecified;
    let mut status = StatusCode::Unset;
    let mut attributes = Vec::new();
    for tag in js
        .get("tags")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(key) = tag.get("key").and_then(Value::as_str) else {
            continue;
        };
        let Some(value) = tag_value(tag) else {
            continue;
        };
        match key {
            "span.kind" => {
                kind = match value.as_str() {
                    Some("server") => SpanKind::Server,
                    Some("client") => SpanKind::Client,
                    Some("producer") => SpanKind::Producer,
                    Some("consumer") => SpanKind::Consumer,
                    Some("internal") => SpanKind::Internal,
                    _ => SpanKind::Unspecified,
                }
            }
            "otel.status_code" => {
                status = match value.as_str() {
                    Some("ERROR") => StatusCode::Error,
                    Some("OK") => StatusCode::Ok,
                    _ => status,
                }
            }
            "error" if value == AttrValue::Bool(true) => status = StatusCode::Error,
            _ => {
                if let Some(k) = known_key(key.as_bytes()) {
                    attributes.push((k, value));
                }
            }
        }
    }
    let service = js
        .get("processID")
        .and_then(Value::as_str)
        .and_then(|p| services.get(p))
        .unwrap_or(unknown)
        .clone();
    Ok(Span {
        trace_id,
        span_id,
        parent_span_id: parent,
        name: str_field("operationName").unwrap_or("").into(),
        service,
        kind,
        start_unix_nano: start_us.saturating_mul(1000),
        end_unix_nano: start_us.saturating_add(dur_us).saturating_mul(1000),
        status,
        attributes,
        links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_a_jaeger_export() {
        let doc = serde_json::json!({"data": [{
            "traceID": "abc",
            "spans": [
                {"traceID": "abc", "spanID": "1", "operationName": "chat m", "references": [],
                 "startTime": 1_000_000, "duration": 500_000, "processID": "p1",
                 "tags": [{"key": "span.kind", "type": "string", "value": "server"},
                          {"key": "gen_ai.request.model", "type": "string", "value": "m"},
                          {"key": "ignored.key", "type": "string", "value": "x"},
                          {"key": "error", "type": "bool", "value": true}]},
                {"traceID": "abc", "spanID": "2", "operationName": "decode",
                 "references": [{"refType": "CHILD_OF", "traceID": "abc", "spanID": "1"}],
                 "startTime": 1_100_000, "duration": 400_000, "processID": "p1", "tags": []},
                {"traceID": "abc", "spanID": "zz", "operationName": "bad", "startTime": 1}
            ],
            "processes": {"p1": {"serviceName": "svc"}}
        }]});
        assert!(looks_like_jaeger(&doc));
        let (spans, problems) = spans_from_jaeger(&doc).unwrap();
        assert_eq!(spans.len(), 2);
        assert_eq!(problems.len(), 1);
        let root = &spans[0];
        assert_eq!(root.kind, SpanKind::Server);
        assert_eq!(root.status, StatusCode::Error);
        assert_eq!(&*root.service, "svc");
        assert_eq!(root.attributes.len(), 1);
        assert_eq!(root.start_unix_nano, 1_000_000_000);
        assert_eq!(root.end_unix_nano, 1_500_000_000);
        assert_eq!(spans[1].parent_span_id, Some(root.span_id));
        assert_eq!(root.trace_id.to_hex(), format!("{:0>32}", "abc"));
    }
}
