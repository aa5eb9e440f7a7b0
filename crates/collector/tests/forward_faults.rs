//! The forwarder with a downstream that misbehaves, against real servers over loopback:
//! - poison spans (an attribute nested deeper than any prost-based downstream decodes) are
//!   rejected at ingest and cut out of what is forwarded, so the innocent spans around them
//!   arrive;
//! - spans past a bound (`max_spans_per_trace`), reported rejected to the client, are not
//!   forwarded either;
//! - outage (nothing listening): once the forward queue is full, clients get a retryable refusal
//!   (HTTP 429), never OK then drop; every span answered OK is pending until the downstream comes
//!   back, and then exported;
//! - a heavy sender filling the queue while the downstream is down is refused at its share
//!   (`forward_share`), and a light sender's requests are still taken and analysed;
//! - blackhole (a listener that accepts and never answers): each attempt ends at
//!   `forward.timeout`, attempts and failures are counted as they happen, and the spans are
//!   given up once older than `retry.max_elapsed`, counted from their arrival.
//!
//! Each test prints its figures (`--nocapture` shows them).

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use infertrace_collector::config::{CollectorConfig, ForwardProtocol};
use infertrace_collector::internal_events::{
    ExportLabels, InternalEvents, ReceiverLabels, RefusalLabels,
};
use infertrace_collector::server;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, KeyValueList, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(30);

/// An OTLP/gRPC sink (tonic + prost, prost's recursion limit of 100) recording every request.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Sink {
    async fn start_on(&self, listener: tokio::net::TcpListener) {
        let svc = TraceServiceServer::new(self.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
    }

    fn spans(&self) -> Vec<Span> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| r.resource_spans.iter())
            .flat_map(|rs| rs.scope_spans.iter())
            .flat_map(|ss| ss.spans.iter().cloned())
            .collect()
    }
}

fn exported(events: &InternalEvents, outcome: &'static str) -> u64 {
    events
        .exported_spans
        .get_or_create(&ExportLabels {
            exporter: "otlp_forward",
            outcome,
        })
        .get()
}

fn received(events: &InternalEvents, outcome: &'static str) -> u64 {
    events
        .receiver_spans
        .get_or_create(&ReceiverLabels {
            receiver: "otlp_http",
            outcome,
        })
        .get()
}

fn pending(events: &InternalEvents) -> i64 {
    events.forward_pending_spans.get()
}

/// A key-value list nested `levels` deep.
fn nested(levels: u32) -> AnyValue {
    let mut v = AnyValue {
        value: Some(any_value::Value::StringValue("leaf".into())),
    };
    for _ in 0..levels {
        v = AnyValue {
            value: Some(any_value::Value::KvlistValue(KeyValueList {
                values: vec![KeyValue {
                    key: "k".into(),
                    value: Some(v),
                    key_strindex: 0,
                }],
            })),
        };
    }
    v
}

/// A span of its own trace carrying an attribute nested `levels` deep.
fn poison_span(n: u32, levels: u32) -> Span {
    let r = Req::new(1_000_000 + n, "m", 1, 1, 1);
    let mut s = infertrace_spans(&r, t0()).remove(0);
    s.attributes.push(KeyValue {
        key: "payload".into(),
        value: Some(nested(levels)),
        key_strindex: 0,
    });
    s
}

fn ids(spans: &[Span]) -> Vec<Vec<u8>> {
    let mut ids: Vec<Vec<u8>> = spans.iter().map(|s| s.span_id.clone()).collect();
    ids.sort();
    ids
}

/// A [`Sink`] listening on loopback, and a test config forwarding to it over gRPC.
async fn sink_and_config() -> (Sink, CollectorConfig) {
    let sink = Sink::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink_addr = listener.local_addr().unwrap();
    sink.start_on(listener).await;
    let mut config = test_config();
    config.forward.endpoint = Some(format!("http://{sink_addr}"));
    config.forward.max_batch_delay = Duration::from_millis(50);
    (sink, config)
}

/// Posts `req` over OTLP/HTTP (JSON or protobuf), expects 200 and returns the partial
/// success's rejected spans and message.
async fn export(http: SocketAddr, req: &ExportTraceServiceRequest, json: bool) -> (i64, String) {
    let (status, body) = if json {
        post(http, "application/json", serde_json::to_vec(req).unwrap()).await
    } else {
        post(http, "application/x-protobuf", req.encode_to_vec()).await
    };
    assert_eq!(status, 200);
    if json {
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        (
            v["partialSuccess"]["rejectedSpans"].as_i64().unwrap_or(0),
            v["partialSuccess"]["errorMessage"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        )
    } else {
        let p = ExportTraceServiceResponse::decode(body)
            .unwrap()
            .partial_success
            .unwrap_or_default();
        (p.rejected_spans, p.error_message)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_spans_are_refused_and_the_innocent_ones_around_them_arrive() {
    let (sink, config) = sink_and_config().await;
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();

    // 1,000 innocent spans in 10 requests of 100, each with one poison span among them:
    // 200 levels deep as protobuf; as JSON 20 levels (read, and rejected for its nesting) and
    // 200 levels (past the JSON parser's own limit: cut out of the body, and rejected).
    let mut innocent = Vec::new();
    for k in 0..10u32 {
        let mut spans: Vec<Span> = (0..25)
            .flat_map(|j| infertrace_spans(&Req::new(k * 25 + j + 1, "m", 1, 1, 1), t0()))
            .collect();
        innocent.extend(spans.iter().cloned());
        let json = k % 5 == 4;
        let levels = if k == 4 { 20 } else { 200 };
        spans.insert(50, poison_span(k, levels));
        let req = request("llm", spans);
        if !json {
            // What a prost-based downstream makes of this request as it is: nothing.
            assert!(ExportTraceServiceRequest::decode(&req.encode_to_vec()[..]).is_err());
        }
        let partial = export(http, &req, json).await;
        assert_eq!(
            partial.0, 1,
            "request {k}: the poison span is reported rejected"
        );
        let why = if json && levels == 200 {
            "could not be read: recursion limit exceeded"
        } else {
            "16 levels"
        };
        assert!(partial.1.contains(why), "{}", partial.1);
    }
    assert_eq!(innocent.len(), 1000);
    let events = c.events().clone();
    eventually(WAIT, "1,000 spans forwarded", || sink.spans().len() >= 1000).await;
    eventually(WAIT, "1,000 spans counted as exported", || {
        exported(&events, "ok") == 1000
    })
    .await;
    assert_eq!(
        ids(&sink.spans()),
        ids(&innocent),
        "exactly the innocent spans"
    );
    assert_eq!(events.dropped("invalid_span"), 10);
    assert_eq!(received(&events, "rejected"), 10);
    assert_eq!(exported(&events, "failed"), 0);
    assert_eq!(pending(&events), 0);
    eprintln!(
        "poison: sent 1010 spans (10 poison) in 10 requests; downstream received {} spans, \
         {} requests; rejected at ingest: {}",
        sink.spans().len(),
        sink.0.lock().unwrap().len(),
        events.dropped("invalid_span"),
    );
    c.stop().await.unwrap();
}

/// A protobuf key and length prefix: field `field`, length-delimited, around `bytes`.
fn wrap(field: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

/// An unknown field (number 99) nesting `depth` groups.
fn groups(depth: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..depth {
        prost::encoding::encode_key(99, prost::encoding::WireType::StartGroup, &mut out);
    }
    for _ in 0..depth {
        prost::encoding::encode_key(99, prost::encoding::WireType::EndGroup, &mut out);
    }
    out
}

/// Posts a protobuf body over OTLP/HTTP, expects 200, and returns its partial success.
async fn post_partial(
    http: SocketAddr,
    body: Vec<u8>,
) -> opentelemetry_proto::tonic::collector::trace::v1::ExportTracePartialSuccess {
    let (status, answer) = post(http, "application/x-protobuf", body).await;
    assert_eq!(status, 200);
    ExportTraceServiceResponse::decode(answer)
        .unwrap()
        .partial_success
        .unwrap_or_default()
}

/// Where a poison marker is put: a string field the collector does not read.
const MARK: &str = "\u{1}POISON\u{1}";

/// `bytes` with the first marker's middle made invalid UTF-8 (same length).
fn spoil(mut bytes: Vec<u8>) -> Vec<u8> {
    let at = bytes
        .windows(MARK.len())
        .position(|w| w == MARK.as_bytes())
        .expect("the marker is in the body");
    bytes[at + 1..at + 4].copy_from_slice(&[0xff, 0xfe, 0xfd]);
    bytes
}

/// Spans whose fields the collector does not read would make a prost-based forward target
/// refuse the whole batch: invalid UTF-8 in a custom attribute's value or key, `trace_state`,
/// a status message, an event's name, a link's `trace_state`, a scope's name, and an unknown
/// field nesting groups to prost's limit counted from the span's depth. With forwarding on each
/// is rejected at ingest (partial success) and left out; the innocent spans arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_with_unread_fields_a_downstream_refuses_are_left_out() {
    use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
    use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
    use opentelemetry_proto::tonic::trace::v1::{ScopeSpans, Status};
    let (sink, config) = sink_and_config().await;
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();
    type Poison = (&'static str, fn(&mut Span));
    let poisons: [Poison; 6] = [
        ("an attribute value", |s| {
            s.attributes
                .push(kv("x.custom", any_value::Value::StringValue(MARK.into())))
        }),
        ("an attribute key", |s| {
            s.attributes.push(kv(MARK, any_value::Value::IntValue(1)))
        }),
        ("trace_state", |s| s.trace_state = MARK.into()),
        ("a status message", |s| {
            s.status = Some(Status {
                message: MARK.into(),
                code: 2,
            })
        }),
        ("an event name", |s| {
            s.events = vec![Event {
                name: MARK.into(),
                ..Default::default()
            }]
        }),
        ("a link's trace_state", |s| {
            s.links = vec![Link {
                trace_id: vec![7; 16],
                span_id: vec![7; 8],
                trace_state: MARK.into(),
                ..Default::default()
            }]
        }),
    ];
    let mut innocent = Vec::new();
    let mut k = 0u32;
    // 100 innocent spans (25 traces) for request `k`, remembered in `innocent`.
    let batch = |k: u32, innocent: &mut Vec<Span>| -> Vec<Span> {
        let spans: Vec<Span> = (0..25)
            .flat_map(|j| infertrace_spans(&Req::new(k * 25 + j + 1, "m", 1, 1, 1), t0()))
            .collect();
        innocent.extend(spans.iter().cloned());
        spans
    };
    for (what, poison) in poisons {
        let mut spans = batch(k, &mut innocent);
        let mut bad = poison_span(k, 0);
        poison(&mut bad);
        spans.insert(50, bad);
        let body = spoil(request("llm", spans).encode_to_vec());
        assert!(
            ExportTraceServiceRequest::decode(&body[..]).is_err(),
            "{what}"
        );
        let p = post_partial(http, body).await;
        assert_eq!(p.rejected_spans, 1, "{what}: {}", p.error_message);
        assert!(
            p.error_message.contains("not valid UTF-8"),
            "{what}: {}",
            p.error_message
        );
        k += 1;
    }
    // A scope whose name is not UTF-8: its span is rejected, the other scope's arrive.
    let mut req = request("llm", batch(k, &mut innocent));
    let mut scoped = poison_span(k, 0);
    scoped.name = "scoped".into();
    req.resource_spans[0].scope_spans.push(ScopeSpans {
        scope: Some(InstrumentationScope {
            name: MARK.into(),
            ..Default::default()
        }),
        spans: vec![scoped],
        ..Default::default()
    });
    let body = spoil(req.encode_to_vec());
    let p = post_partial(http, body).await;
    assert_eq!(p.rejected_spans, 1, "the scope's span: {}", p.error_message);
    k += 1;
    // Groups in an unknown field: 97 deep inside a span is as deep as prost goes from there
    // (the span sits 3 messages deep), 98 is refused; the body as a whole is under the
    // collector's own limit of 100 for groups, so it is read.
    for (depth, rejected) in [(97, 0), (98, 1)] {
        let spans = batch(k, &mut innocent);
        let mut grouped = poison_span(k, 0).encode_to_vec();
        grouped.extend(groups(depth));
        let resource = opentelemetry_proto::tonic::resource::v1::Resource {
            attributes: vec![kv(
                "service.name",
                any_value::Value::StringValue("llm".into()),
            )],
            ..Default::default()
        };
        let mut scope_spans = Vec::new();
        for s in &spans {
            scope_spans.extend(wrap(2, &s.encode_to_vec()));
        }
        scope_spans.extend(wrap(2, &grouped));
        let mut resource_spans = wrap(1, &resource.encode_to_vec());
        resource_spans.extend(wrap(2, &scope_spans));
        let body = wrap(1, &resource_spans);
        assert_eq!(
            ExportTraceServiceRequest::decode(&body[..]).is_err(),
            rejected == 1,
            "prost at depth {depth}"
        );
        if rejected == 0 {
            // This one is valid and arrives too.
            innocent.push(Span::decode(&grouped[..]).unwrap());
        }
        let p = post_partial(http, body).await;
        assert_eq!(
            p.rejected_spans, rejected,
            "depth {depth}: {}",
            p.error_message
        );
        k += 1;
    }
    let events = c.events().clone();
    let expected = innocent.len();
    eventually(WAIT, "the innocent spans forwarded", || {
        sink.spans().len() >= expected
    })
    .await;
    eventually(WAIT, "counted as exported", || {
        exported(&events, "ok") == expected as u64
    })
    .await;
    assert_eq!(
        ids(&sink.spans()),
        ids(&innocent),
        "exactly the innocent spans"
    );
    assert_eq!(exported(&events, "failed"), 0);
    eprintln!(
        "unread poison: {k} requests, {expected} innocent spans forwarded, {} rejected at ingest",
        events.dropped("invalid_span")
    );
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_rejected_for_a_bound_are_not_forwarded() {
    let (sink, mut config) = sink_and_config().await;
    config.limits.max_spans_per_trace = 10;
    // The 15-span traces stay in flight for the whole test.
    config.assembly.grace = Duration::from_secs(60);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();

    // Per request: a whole trace (analysed on arrival, dropped from the batch before the rest
    // is pushed), a trace of 15 spans (the last 5 past the bound) and another whole trace;
    // once forwarded, a request of one more span of the 15-span trace: nothing in it to
    // forward, and nothing left pending.
    let events = c.events().clone();
    let mut expected = Vec::new();
    for (k, json) in [(0u32, false), (1, true)] {
        let big = Req::new(100 + k, "m", 1, 1, 1);
        let mut big_spans = infertrace_spans(&big, t0());
        for n in 0..11u8 {
            let mut extra = big_spans[0].clone();
            extra.span_id[4..].copy_from_slice(&[0xe0 + n; 4]);
            extra.name = format!("extra {n}");
            big_spans.push(extra);
        }
        let first = infertrace_spans(&Req::new(10 * k + 1, "m", 1, 1, 1), t0());
        let last = infertrace_spans(&Req::new(10 * k + 2, "m", 1, 1, 1), t0());
        expected.extend(first.iter().cloned());
        expected.extend(big_spans[..10].iter().cloned());
        expected.extend(last.iter().cloned());
        let mut one_more = big_spans[4].clone();
        one_more.span_id[4..].copy_from_slice(&[0xee; 4]);
        let spans: Vec<Span> = first.into_iter().chain(big_spans).chain(last).collect();
        let req = request("llm", spans);
        let (rejected, _) = export(http, &req, json).await;
        assert_eq!(rejected, 5, "json: {json}");
        eventually(WAIT, "the kept spans exported", || {
            exported(&events, "ok") == expected.len() as u64
        })
        .await;
        let (rejected, _) = export(http, &request("llm", vec![one_more]), json).await;
        assert_eq!(rejected, 1, "json: {json}");
        eventually(WAIT, "nothing pending", || {
            events.forward_pending_bytes.get() == 0
        })
        .await;
    }
    assert_eq!(
        ids(&sink.spans()),
        ids(&expected),
        "exactly the spans the collector kept"
    );
    assert_eq!(events.dropped("max_spans_per_trace"), 12);
    assert_eq!(exported(&events, "ok"), 36);
    assert_eq!(pending(&events), 0);
    c.stop().await.unwrap();
}

/// Config for the fault tests: a small queue, one batch in flight, fast retries.
fn fault_config(endpoint: SocketAddr, protocol: ForwardProtocol) -> CollectorConfig {
    let mut config = test_config();
    config.forward.endpoint = Some(format!("http://{endpoint}"));
    config.forward.protocol = protocol;
    config.forward.queue_size = 8;
    config.forward.max_in_flight = 2;
    config.forward.max_batch_spans = 8;
    config.forward.max_batch_delay = Duration::from_millis(1);
    config.forward.retry.initial_backoff = Duration::from_millis(20);
    config.forward.retry.max_backoff = Duration::from_millis(100);
    config
}

/// A downstream that is down (a port with nothing listening, returned for a later recovery)
/// and [`fault_config`] for it over gRPC, with an age budget long enough that nothing is given
/// up during a test.
fn outage_config() -> (SocketAddr, CollectorConfig) {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut config = fault_config(dead, ForwardProtocol::Grpc);
    config.forward.retry.max_elapsed = Duration::from_secs(600);
    (dead, config)
}

/// Sends `requests` requests of 4 spans one after another; returns (accepted, refused with 429)
/// requests.
async fn send(http: SocketAddr, first: u32, requests: u32) -> (u32, u32) {
    let (mut ok, mut refused) = (0, 0);
    for k in first..first + requests {
        let r = Req::new(k + 1, "m", 1, 1, 1);
        let (status, _) = post(
            http,
            "application/x-protobuf",
            request("llm", infertrace_spans(&r, t0())).encode_to_vec(),
        )
        .await;
        match status {
            200 => ok += 1,
            429 => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    (ok, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_refuses_when_the_queue_is_full_and_drains_on_recovery() {
    // A port with nothing listening (it is listened on again for the recovery).
    let (dead, config) = outage_config();
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();
    let events = c.events().clone();

    let started = Instant::now();
    let (ok, refused) = send(http, 0, 60).await;
    // At most: 8 queued + 2 batches of up to 8 spans in flight + 1 being formed.
    // One sender alone is refused at its share, 6 of the 8 places (see `forward::share`).
    assert!(refused > 0, "a queue of 8 must fill up");
    assert!(ok >= 6, "{ok} accepted");
    let accepted = received(&events, "accepted");
    assert_eq!(accepted, u64::from(ok) * 4);
    let queue_refused =
        |e: &InternalEvents| e.dropped("forward_backpressure") + e.dropped("forward_share");
    assert_eq!(queue_refused(&events), u64::from(refused) * 4);
    assert_eq!(received(&events, "refused"), u64::from(refused) * 4);
    // Nothing answered OK was dropped: all of it is pending.
    assert_eq!(exported(&events, "ok") + exported(&events, "failed"), 0);
    assert_eq!(pending(&events), accepted as i64);
    assert!(events.forward_pending_bytes.get() > 0);
    // gRPC clients get UNAVAILABLE (retryable), counted the same way.
    let mut grpc = TraceServiceClient::connect(format!("http://{}", c.grpc_addr.unwrap()))
        .await
        .unwrap();
    let r = Req::new(500, "m", 1, 1, 1);
    let status = grpc
        .export(request("llm", infertrace_spans(&r, t0())))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status.message().contains("forward queue is nearly full"),
        "{}",
        status.message()
    );
    assert_eq!(queue_refused(&events), u64::from(refused) * 4 + 4);
    let attempts_down = events.forward_attempts("retryable");
    assert!(attempts_down > 0);
    eprintln!(
        "outage: 60 requests of 4 spans in {:?}: {ok} accepted ({accepted} spans, all pending), \
         {refused} refused with 429 and 1 gRPC export with UNAVAILABLE ({} spans counted \
         forward_share or forward_backpressure); {attempts_down} failed attempts so far",
        started.elapsed(),
        queue_refused(&events),
    );

    // Recovery: the downstream comes up on that port; the queue drains, new data is taken.
    let sink = Sink::default();
    let listener = tokio::net::TcpListener::bind(dead).await.unwrap();
    sink.start_on(listener).await;
    let recovering = Instant::now();
    eventually(WAIT, "the queue drains", || {
        exported(&events, "ok") == accepted
    })
    .await;
    let drained_in = recovering.elapsed();
    assert_eq!(pending(&events), 0);
    assert_eq!(events.forward_pending_bytes.get(), 0);
    assert_eq!(sink.spans().len() as u64, accepted);
    let (ok2, refused2) = send(http, 1000, 5).await;
    assert_eq!((ok2, refused2), (5, 0));
    eventually(WAIT, "new data exported", || {
        exported(&events, "ok") == accepted + 20
    })
    .await;
    assert_eq!(exported(&events, "failed"), 0);
    assert_eq!(events.dropped("forward_failed"), 0);
    eprintln!(
        "outage recovery: {accepted} pending spans exported {drained_in:?} after the downstream \
         came back; 0 failed; {} attempts ok, {} retryable failures in all",
        events.forward_attempts("ok"),
        events.forward_attempts("retryable"),
    );
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_attempts_time_out_and_spans_are_given_up_by_age() {
    for protocol in [ForwardProtocol::Grpc, ForwardProtocol::Http] {
        // Accepts connections, reads nothing, answers nothing; keeps them open.
        let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hole_addr = hole.local_addr().unwrap();
        let held = Arc::new(Mutex::new(Vec::new()));
        let h = held.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok((socket, _)) = hole.accept().await {
                h.lock().unwrap().push(socket);
            }
        });
        let timeout = Duration::from_millis(300);
        let max_elapsed = Duration::from_secs(2);
        let mut config = fault_config(hole_addr, protocol);
        config.forward.timeout = timeout;
        config.forward.retry.max_elapsed = max_elapsed;
        let c = server::run(config, std::future::pending()).await.unwrap();
        let http = c.http_addr.unwrap();
        let events = c.events().clone();

        let started = Instant::now();
        let (ok, refused) = send(http, 0, 6).await;
        assert_eq!((ok, refused), (6, 0), "{protocol:?}: the queue has room");
        let accepted = received(&events, "accepted");
        assert_eq!(accepted, 24);
        // Attempts end at the timeout and are counted as they do, well before any give-up.
        eventually(WAIT, "timeouts counted", || {
            events.forward_attempts("timeout") >= 2
        })
        .await;
        let first_timeouts = started.elapsed();
        // Every span is pending or failed (read twice, not atomically: eventually equal).
        eventually(WAIT, "every span pending or failed", || {
            exported(&events, "failed") as i64 + pending(&events) == accepted as i64
        })
        .await;
        // Given up once older than max_elapsed (from arrival), all counted.
        eventually(WAIT, "every span given up", || {
            exported(&events, "failed") == accepted
        })
        .await;
        let given_up = started.elapsed();
        assert!(given_up >= max_elapsed, "{given_up:?}");
        assert_eq!(events.dropped("forward_failed"), accepted);
        assert_eq!(pending(&events), 0);
        assert_eq!(events.forward_pending_bytes.get(), 0);
        assert_eq!(exported(&events, "ok"), 0);
        let timeouts = events.forward_attempts("timeout");
        // In flight 2 at a time, each attempt ending at the 300 ms timeout, for ~2 s.
        assert!(timeouts >= 3, "{protocol:?}: {timeouts} timeouts");
        eprintln!(
            "blackhole {protocol:?}: 24 spans in 6 requests; first 2 attempts timed out after \
             {first_timeouts:?} (forward.timeout {timeout:?}); all 24 counted failed after \
             {given_up:?} (max_elapsed {max_elapsed:?} from arrival); {timeouts} attempts \
             timed out, {} other failures; {} connections held",
            events.forward_attempts("retryable"),
            held.lock().unwrap().len(),
        );
        c.stop().await.unwrap();
        acceptor.abort();
    }
}

/// A connection that stops answering while the downstream is healthy (a half-dead path: the
/// first connection is held open and never read, later ones reach the sink) is left after the
/// attempt times out: the next attempt connects anew and the spans arrive, rather than every
/// attempt timing out on it until the spans are given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stops_answering_is_replaced() {
    let sink = Sink::default();
    let sink_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink_addr = sink_listener.local_addr().unwrap();
    sink.start_on(sink_listener).await;
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    let relay_task = tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut socket, _)) = relay.accept().await {
            if std::mem::take(&mut first) {
                h.lock().unwrap().push(socket);
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut upstream) = tokio::net::TcpStream::connect(sink_addr).await {
                    let _ = tokio::io::copy_bidirectional(&mut socket, &mut upstream).await;
                }
            });
        }
    });
    let mut config = fault_config(relay_addr, ForwardProtocol::Grpc);
    config.forward.timeout = Duration::from_millis(500);
    config.forward.retry.max_elapsed = Duration::from_secs(25);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let events = c.events().clone();
    let started = Instant::now();
    let (ok, refused) = send(c.http_addr.unwrap(), 0, 4).await;
    assert_eq!((ok, refused), (4, 0));
    let accepted = received(&events, "accepted");
    eventually(
        WAIT,
        "every span exported after the dead connection",
        || exported(&events, "ok") == accepted,
    )
    .await;
    assert!(
        events.forward_attempts("timeout") >= 1,
        "the first connection was the dead one"
    );
    assert_eq!(exported(&events, "failed"), 0);
    assert_eq!(sink.spans().len() as u64, accepted);
    eprintln!(
        "dead connection: {accepted} spans delivered {:?} after they were sent, over a new \
         connection after {} timed-out attempts",
        started.elapsed(),
        events.forward_attempts("timeout")
    );
    c.stop().await.unwrap();
    relay_task.abort();
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_closing_connections_is_retried_not_given_up() {
    for protocol in [ForwardProtocol::Grpc, ForwardProtocol::Http] {
        // Accepts each connection, reads what the client sends first and closes it, as a load
        // balancer without a healthy backend does.
        let closer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closer.local_addr().unwrap();
        let acceptor = tokio::spawn(async move {
            while let Ok((mut socket, _)) = closer.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = socket.read(&mut buf).await;
                });
            }
        });
        let mut config = fault_config(addr, protocol);
        config.forward.retry.max_elapsed = Duration::from_secs(600);
        let c = server::run(config, std::future::pending()).await.unwrap();
        let events = c.events().clone();
        let (ok, _) = send(c.http_addr.unwrap(), 0, 2).await;
        assert_eq!(ok, 2);
        eventually(WAIT, "attempts retried", || {
            events.forward_attempts("retryable") >= 3
        })
        .await;
        assert_eq!(
            events.forward_attempts("permanent"),
            0,
            "{protocol:?}: a closed connection is a transport failure, retried"
        );
        assert_eq!(
            exported(&events, "failed"),
            0,
            "{protocol:?}: nothing given up"
        );
        acceptor.abort();
        c.stop().await.unwrap();
    }
}

/// POSTs one protobuf request of trace `k` from the loopback address `from` (HTTP/1.1 on a raw
/// socket bound to it: the collector tells senders apart by peer address); returns the status.
async fn post_from(from: IpAddr, to: SocketAddr, k: u32) -> u16 {
    let body = request("llm", infertrace_spans(&Req::new(k, "m", 1, 1, 1), t0())).encode_to_vec();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut s = socket.connect(to).await.unwrap();
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-protobuf\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&body).await.unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_filling_the_queue_is_refused_its_share_and_another_still_gets_in() {
    let (_dead, config) = outage_config();
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();
    let events = c.events().clone();
    let refused = |reason: &'static str| {
        events
            .requests_refused
            .get_or_create(&RefusalLabels {
                receiver: "otlp_http",
                reason,
            })
            .get()
    };

    // The heavy sender (127.0.0.2) sends until it is refused: two batches of two requests are
    // stuck in flight, then the queue takes six of its eight places before the share stops it.
    let heavy: IpAddr = [127, 0, 0, 2].into();
    let mut heavy_ok = 0;
    let mut heavy_status = 0;
    for k in 1..=40 {
        heavy_status = post_from(heavy, http, k).await;
        if heavy_status != 200 {
            break;
        }
        heavy_ok += 1;
    }
    assert_eq!(heavy_status, 429, "the heavy sender is refused at last");
    assert_eq!(refused("forward_share"), 1);
    assert_eq!(refused("sender_share"), 0, "memory is not short");
    assert_eq!(refused("forward_backpressure"), 0, "the queue is not full");
    // The light sender (127.0.0.1) still gets in: the places the heavy one left, then the queue
    // is full and everyone is refused alike.
    let mut light_ok = 0;
    for k in 1001..1005 {
        match post_from([127, 0, 0, 1].into(), http, k).await {
            200 => light_ok += 1,
            429 => break,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(light_ok, 2, "the two places the heavy sender left");
    assert_eq!(refused("forward_backpressure"), 1, "then the queue is full");
    // The light sender's requests were analysed as well as queued.
    eventually(WAIT, "every accepted trace analysed", || {
        c.pipeline().requests_recorded() == (heavy_ok + light_ok) as u64
    })
    .await;
    eprintln!(
        "forward share: the heavy sender got {heavy_ok} requests in before its share stopped it; \
         the light sender then got {light_ok} in (without the share rule: 0)"
    );
    c.stop().await.unwrap();
}
