//! Splitting an encoded `ExportTraceServiceRequest` into requests of at most a given size, on
//! the wire: a downstream refuses a message past its limit (4 MiB by default in grpc-go and
//! tonic) whole, so the forwarder sends a large request (or a merged batch) in parts. Each
//! part holds whole `ResourceSpans`; one too large is split into parts that each carry its
//! resource (and every field but its scope spans) and a run of its `ScopeSpans`, and a
//! `ScopeSpans` too large likewise, each part with its scope, a run of its spans. A span is
//! never split: one larger than the limit goes alone. Every byte but the repeated fields'
//! framing is kept as it came.

use super::wire::{LEN, Reader};

/// The repeated field descended at each level: the request's `resource_spans` (1), a
/// `ResourceSpans`'s `scope_spans` (2), a `ScopeSpans`'s `spans` (2).
const LEVELS: [u32; 3] = [1, 2, 2];

/// `body` in requests of at most `max_bytes` each where it can be (see the module docs), in
/// order; `None` when it is no larger than that, or is not a readable request.
pub fn split_request(body: &[u8], max_bytes: usize) -> Option<Vec<Vec<u8>>> {
    if body.len() <= max_bytes {
        return None;
    }
    split_message(body, 0, max_bytes)
}

/// The bytes a length-delimited field of `field` with a payload of `len` bytes takes.
fn field_len(field: u32, len: usize) -> usize {
    prost::encoding::key_len(field) + prost::encoding::encoded_len_varint(len as u64) + len
}

fn put_field(field: u32, payload: &[u8], out: &mut Vec<u8>) {
    prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// `payload`, a message at `level`, as payloads of at most `max` bytes where it can be: each
/// with every field but the level's repeated one (its head), and a run of its elements.
fn split_message(payload: &[u8], level: usize, max: usize) -> Option<Vec<Vec<u8>>> {
    let repeated = LEVELS[level];
    let mut head = Vec::new();
    let mut elements = Vec::new();
    let mut r = Reader::new(payload);
    loop {
        let from = r.pos;
        let Some((field, wire)) = r.key().ok()? else {
            break;
        };
        if field == repeated && wire == LEN {
            elements.push(r.bytes().ok()?);
        } else {
            r.skip(field, wire).ok()?;
            head.extend_from_slice(&payload[from..r.pos]);
        }
    }
    // What one part has room for after its head; an element past it is split one level down
    // (into elements that fit with their own framing), unless it is a span.
    let room = max.saturating_sub(head.len());
    let mut units: Vec<std::borrow::Cow<'_, [u8]>> = Vec::with_capacity(elements.len());
    for element in elements {
        if field_len(repeated, element.len()) <= room || level + 1 == LEVELS.len() {
            units.push(element.into());
            continue;
        }
        let framing = field_len(repeated, element.len()) - element.len();
        let inner = room.saturating_sub(framing).max(1);
        units.extend(
            split_message(element, level + 1, inner)?
                .into_iter()
                .map(Into::into),
        );
    }
    let mut parts = Vec::new();
    let mut part = head.clone();
    let mut filled = false;
    for unit in units {
        if filled && part.len() + field_len(repeated, unit.len()) > max {
            parts.push(std::mem::replace(&mut part, head.clone()));
        }
        put_field(repeated, &unit, &mut part);
        filled = true;
    }
    parts.push(part);
    Some(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{
        AnyValue, InstrumentationScope, KeyValue, any_value,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;

    fn span(n: u32, pad: usize) -> Span {
        Span {
            trace_id: vec![1; 16],
            span_id: n.to_be_bytes().repeat(2),
            name: format!("s{n}"),
            attributes: vec![KeyValue {
                key: "pad".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue("x".repeat(pad))),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// `resources` resources of `scopes` scopes of `spans` spans, each span ~`pad` bytes.
    fn request(resources: u32, scopes: u32, spans: u32, pad: usize) -> ExportTraceServiceRequest {
        let mut n = 0;
        let resource_spans = (0..resources)
            .map(|r| ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue(format!("svc{r}"))),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                scope_spans: (0..scopes)
                    .map(|s| ScopeSpans {
                        scope: Some(InstrumentationScope {
                            name: format!("scope{s}"),
                            ..Default::default()
                        }),
                        spans: (0..spans)
                            .map(|_| {
                                n += 1;
                                span(n, pad)
                            })
                            .collect(),
                        schema_url: "https://example/schema".into(),
                    })
                    .collect(),
                schema_url: String::new(),
            })
            .collect();
        ExportTraceServiceRequest { resource_spans }
    }

    /// Every span with its resource's service and its scope, in order.
    fn flat(req: &ExportTraceServiceRequest) -> Vec<(String, String, String, Vec<u8>)> {
        let mut out = Vec::new();
        for rs in &req.resource_spans {
            let service = format!("{:?}", rs.resource);
            for ss in &rs.scope_spans {
                let scope = format!("{:?} {}", ss.scope, ss.schema_url);
                for s in &ss.spans {
                    out.push((
                        service.clone(),
                        scope.clone(),
                        s.name.clone(),
                        s.span_id.clone(),
                    ));
                }
            }
        }
        out
    }

    fn check(req: &ExportTraceServiceRequest, max: usize) -> usize {
        let body = req.encode_to_vec();
        let parts = split_request(&body, max).expect("split");
        let mut joined = Vec::new();
        for part in &parts {
            let decoded = ExportTraceServiceRequest::decode(&part[..]).expect("a request");
            let spans: usize = decoded
                .resource_spans
                .iter()
                .flat_map(|rs| &rs.scope_spans)
                .map(|ss| ss.spans.len())
                .sum();
            assert!(part.len() <= max || spans == 1, "{} > {max}", part.len());
            joined.extend(flat(&decoded));
        }
        assert_eq!(
            joined,
            flat(req),
            "every span once, in order, with its resource and scope"
        );
        parts.len()
    }

    #[test]
    fn requests_split_at_each_level_keep_every_span_with_its_resource_and_scope() {
        // Many small resources: whole resources per part.
        assert!(check(&request(40, 1, 10, 100), 8 << 10) > 1);
        // One resource, many scopes: the resource repeated in each part.
        assert!(check(&request(1, 40, 10, 100), 8 << 10) > 1);
        // One scope of many spans: the scope repeated in each part.
        let parts = check(&request(1, 1, 1_000, 100), 16 << 10);
        assert!((8..=10).contains(&parts), "{parts}");
        // A span larger than the limit goes alone.
        assert_eq!(check(&request(1, 1, 3, 10_000), 4 << 10), 3);
    }

    #[test]
    fn a_request_within_the_limit_or_unreadable_is_not_split() {
        let body = request(2, 2, 2, 10).encode_to_vec();
        assert!(split_request(&body, body.len()).is_none());
        assert!(split_request(&[0x0a, 0xff, 0xff, 0xff], 2).is_none());
    }
}
