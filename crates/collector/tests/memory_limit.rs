//! The memory limit is a limit: what a request can make the collector hold is reserved before it
//! is allocated, so hostile bodies are refused instead of growing the process. This binary holds
//! one test only, so that the peak RSS it reads (`VmHWM`) is the probes' alone.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use infertrace_collector::server;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use support::*;

/// The allocator the `infertrace` binary runs with: how much freed memory stays resident is
/// the allocator's (glibc keeps 64 KiB pieces in per-thread arenas; mimalloc returns them).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MIB: usize = 1024 * 1024;
/// The memory limit of every probe.
const LIMIT: usize = 128 * MIB;
/// What the process may hold beyond the limit: the allocator's retained pages, hyper's and the
/// runtime's buffers, the test's own client threads and the collector's fixed structures.
const FIXED_OVERHEAD: usize = 64 * MIB;

/// Peak resident set of this process so far, bytes.
fn peak_rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// One HTTP/1.1 POST sending `send` bytes of a body that declares `declared`, then waiting;
/// returns the status line's code (0 when the connection was cut before an answer).
fn slow_post(addr: SocketAddr, declared: usize, send: usize, chunk: &'static [u8]) -> u16 {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return 0;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\n\
         Content-Length: {declared}\r\n\r\n"
    );
    let Ok(mut writer) = stream.try_clone() else {
        return 0;
    };
    let sender = std::thread::spawn(move || {
        if writer.write_all(head.as_bytes()).is_err() {
            return;
        }
        let mut left = send;
        while left > 0 {
            let n = left.min(chunk.len());
            if writer.write_all(&chunk[..n]).is_err() {
                return;
            }
            left -= n;
        }
        // ...and stop, the body one byte short, the connection left open.
        std::thread::sleep(Duration::from_secs(60));
    });
    drop(sender); // detached: it ends with the connection
    let mut answer = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        match stream.read(&mut answer[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    std::str::from_utf8(&answer[..got])
        .ok()
        .and_then(|s| s.strip_prefix("HTTP/1.1 "))
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// POSTs a protobuf body shared with other requests (no copy per request); the status.
async fn post_bytes(addr: SocketAddr, body: Bytes) -> u16 {
    let req = http::Request::post(format!("http://{addr}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(Full::new(body))
        .unwrap();
    client()
        .request(req)
        .await
        .map_or(0, |r| r.status().as_u16())
}

/// A protobuf `ExportTraceServiceRequest` of one span whose `gen_ai.response.finish_reasons`
/// holds `n` empty strings, encoded by hand in one buffer (building it with prost would take
/// this process, whose peak RSS the test reads, far more memory than the body).
fn span_with_string_array(n: usize) -> Vec<u8> {
    fn varint(mut v: usize, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn varint_len(v: usize) -> usize {
        let mut probe = Vec::new();
        varint(v, &mut probe);
        probe.len()
    }
    // A length-delimited field's size around a payload of `len` bytes.
    let field = |len: usize| 1 + varint_len(len) + len;
    let key = b"gen_ai.response.finish_reasons";
    let array = 4 * n; // values(1) = AnyValue { string_value(1) = "" }: 0a 02 0a 00
    let any_value = field(array);
    let key_value = field(key.len()) + field(any_value);
    let fixed = 1 + 8;
    let span = field(16) + field(8) + field(4) + 2 * fixed + field(key_value);
    let scope_spans = field(span);
    let resource_spans = field(scope_spans);
    let mut out = Vec::with_capacity(field(resource_spans));
    fn open(out: &mut Vec<u8>, tag: u8, len: usize) {
        out.push(tag);
        varint(len, out);
    }
    open(&mut out, 0x0a, resource_spans); // request.resource_spans (1)
    open(&mut out, 0x12, scope_spans); // resource_spans.scope_spans (2)
    open(&mut out, 0x12, span); // scope_spans.spans (2)
    open(&mut out, 0x0a, 16); // span.trace_id (1)
    out.extend_from_slice(&[0xa7; 16]);
    open(&mut out, 0x12, 8); // span.span_id (2)
    out.extend_from_slice(&[0xb3; 8]);
    open(&mut out, 0x2a, 4); // span.name (5)
    out.extend_from_slice(b"chat");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    out.push(0x39); // span.start_time_unix_nano (7, fixed64)
    out.extend_from_slice(&(now - 1_000_000_000).to_le_bytes());
    out.push(0x41); // span.end_time_unix_nano (8, fixed64)
    out.extend_from_slice(&now.to_le_bytes());
    open(&mut out, 0x4a, key_value); // span.attributes (9)
    open(&mut out, 0x0a, key.len()); // key_value.key (1)
    out.extend_from_slice(key);
    open(&mut out, 0x12, any_value); // key_value.value (2)
    open(&mut out, 0x2a, array); // any_value.array_value (5)
    for _ in 0..n {
        out.extend_from_slice(&[0x0a, 0x02, 0x0a, 0x00]);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_stay_under_the_memory_limit() {
    let mut config = test_config();
    config.limits.memory_limit_bytes = LIMIT;
    config.receivers.body_read_timeout = Duration::from_secs(2);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();
    let baseline = peak_rss();

    // 1. One 16 MiB OTLP/JSON body of ~5.5M empty spans: decoding it could take gigabytes, more
    //    than the limit could ever hold, so it is refused (413) before it is parsed.
    let mut json = String::with_capacity(16 * MIB);
    json.push_str(r#"{"resourceSpans":[{"scopeSpans":[{"spans":["#);
    for k in 0..5_500_000 {
        json.push_str(if k == 0 { "{}" } else { ",{}" });
    }
    json.push_str("]}]}]}");
    assert!(json.len() < 16 * MIB);
    let (status, body) = post(http, "application/json", json.into_bytes()).await;
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    assert_eq!(c.events().dropped("too_large_for_memory"), 1);
    let after_json = peak_rss();

    // 2. 40 connections each declaring 15 MiB, sending 15 MiB - 1 byte and stopping: the
    //    bodies are reserved as they arrive, those that do not fit are refused at once (429),
    //    and those that do are cut at the body read timeout (408), their memory freed.
    static CHUNK: [u8; 1 << 20] = [0x0a; 1 << 20];
    let started = Instant::now();
    let clients: Vec<_> = (0..40)
        .map(|_| std::thread::spawn(move || slow_post(http, 15 * MIB, 15 * MIB - 1, &CHUNK)))
        .collect();
    let statuses: Vec<u16> = clients.into_iter().map(|t| t.join().unwrap_or(0)).collect();
    let count = |code| statuses.iter().filter(|&&s| s == code).count();
    eprintln!(
        "slow bodies: {} fit and timed out (408), {} refused (429), {} cut",
        count(408),
        count(429),
        count(0)
    );
    assert_eq!(count(200), 0, "nothing accepted: {statuses:?}");
    assert!(
        count(408) >= 1,
        "some bodies fit and timed out: {statuses:?}"
    );
    assert!(
        count(408) <= LIMIT / (15 * MIB),
        "no more fit than the limit: {statuses:?}"
    );
    assert!(
        count(429) + count(0) >= 40 - LIMIT / (15 * MIB),
        "{statuses:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(
        c.pipeline().data_memory_bytes(),
        0,
        "every reservation given back"
    );
    let after_slow = peak_rss();

    // 3. Eight concurrent protobuf bodies of 12 MiB, each one span whose finish reasons hold
    //    3M empty strings (4 bytes each on the wire): decoding keeps the first 64, so what a
    //    body costs stays within what was reserved for it (3 bytes per wire byte), where a
    //    16-byte slice per element had cost more than the reservation.
    let small = ExportTraceServiceRequest::decode(&span_with_string_array(3)[..]).unwrap();
    let span = &small.resource_spans[0].scope_spans[0].spans[0];
    assert!(
        matches!(&span.attributes[0].value.as_ref().unwrap().value,
            Some(any_value::Value::ArrayValue(a)) if a.values.len() == 3),
        "the hand-made encoding is what it says: {span:?}"
    );
    let body = Bytes::from(span_with_string_array(3_000_000));
    let posts: Vec<_> = (0..8)
        .map(|_| tokio::spawn(post_bytes(http, body.clone())))
        .collect();
    let mut arrays = Vec::new();
    for p in posts {
        arrays.push(p.await.unwrap());
    }
    drop(body);
    eprintln!("string-array bodies: {arrays:?}");
    assert!(
        arrays.iter().all(|&s| s == 200 || s == 429),
        "accepted or refused for now: {arrays:?}"
    );
    assert!(arrays.contains(&200), "some fit: {arrays:?}");
    let after_arrays = peak_rss();

    let grew = after_arrays.saturating_sub(baseline);
    eprintln!(
        "peak RSS: baseline {} MiB, after the JSON body {} MiB, after the slow bodies {} MiB, \
         after the string arrays {} MiB (grew {} MiB; limit {} MiB + {} MiB overhead)",
        baseline / MIB,
        after_json / MIB,
        after_slow / MIB,
        after_arrays / MIB,
        grew / MIB,
        LIMIT / MIB,
        FIXED_OVERHEAD / MIB
    );
    assert!(
        grew <= LIMIT + FIXED_OVERHEAD,
        "peak RSS grew {} MiB, over the limit and its overhead",
        grew / MIB
    );
    c.stop().await.unwrap();
}
