//! One sender cannot take the whole memory limit from the others: a heavy sender holding most
//! of a small limit with bodies it never finishes is refused (429, `sender_share`) while a
//! light sender's request is still accepted (200). Senders are told apart by peer address
//! (127.0.0.2 against 127.0.0.1) without authentication, and by bearer token (both from
//! 127.0.0.1) with it.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use infertrace_collector::internal_events::RefusalLabels;
use infertrace_collector::server;
use prost::Message;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const MIB: usize = 1024 * 1024;
/// Small enough that ten heavy bodies overfill it: the share rule starts at 6 MiB in use (75 %
/// of what the aggregates leave, plus the aggregates: a little over 6 MiB).
const LIMIT: usize = 8 * MIB;
/// A heavy body: six fit under the soft limit with the aggregates' few dozen KiB, seven do not.
const BODY: usize = MIB - 64 * 1024;
const WAIT: Duration = Duration::from_secs(20);
const HEAVY_TOKEN: &str = "heavy-sender-0123456789abcdef";
const LIGHT_TOKEN: &str = "light-sender-fedcba9876543210";

/// A connection from `from` (any loopback address) to `to`.
async fn connect_from(from: IpAddr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(to).await.unwrap()
}

fn head(token: Option<&str>, length: usize) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!(
        "POST /v1/traces HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/x-protobuf\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n"
    )
}

/// Reads an answer's head (lower-cased), or `None` when the connection ends without one.
async fn answer(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(String::from_utf8_lossy(&buf).to_ascii_lowercase())
}

fn status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

async fn scenario(with_tokens: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.limits.memory_limit_bytes = LIMIT;
    // A trace index sized for 1,000 ids (32 KiB), not the default's 4 MiB, half this limit.
    config.limits.max_traces_in_flight = 1_000;
    // The heavy sender's bodies stay in progress for the whole test.
    config.receivers.body_read_timeout = Duration::from_secs(300);
    config.shutdown_timeout = Duration::from_millis(100);
    if with_tokens {
        let tokens = dir.path().join("tokens");
        std::fs::write(
            &tokens,
            format!("ingest,metrics {HEAVY_TOKEN}\ningest,metrics {LIGHT_TOKEN}\n"),
        )
        .unwrap();
        config.auth.tokens_file = Some(tokens);
    }
    let c = server::run(config, std::future::pending()).await.unwrap();
    let addr = c.http_addr.unwrap();
    let (heavy_ip, heavy_token, light_token): (IpAddr, _, _) = match with_tokens {
        true => ([127, 0, 0, 1].into(), Some(HEAVY_TOKEN), Some(LIGHT_TOKEN)),
        false => ([127, 0, 0, 2].into(), None, None),
    };

    // The heavy sender: ten bodies declaring 960 KiB each (reserved as soon as their head is
    // read), 1 KiB sent, never finished.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..10 {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut s = connect_from(heavy_ip, addr).await;
            s.write_all(head(heavy_token, BODY).as_bytes())
                .await
                .unwrap();
            s.write_all(&[0u8; 1024]).await.unwrap();
            // An admitted body waits here until the collector stops; a refused one is answered.
            let _ = tx.send(answer(&mut s).await);
            // Keep the connection (and so an admitted body's memory) until the test ends.
            tokio::time::sleep(Duration::from_secs(300)).await;
        });
    }
    let refused = |reason: &'static str| {
        c.events()
            .requests_refused
            .get_or_create(&RefusalLabels {
                receiver: "otlp_http",
                reason,
            })
            .get()
    };
    // Six bodies fit under the soft limit where the share rule starts; the others are refused.
    eventually(
        WAIT,
        "the heavy sender's bodies past its share refused",
        || refused("sender_share") >= 4,
    )
    .await;
    assert_eq!(
        c.pipeline().data_memory_bytes(),
        6 * BODY,
        "six heavy bodies held"
    );
    for _ in 0..4 {
        let head = rx
            .recv()
            .await
            .unwrap()
            .expect("an answer to a refused body");
        assert_eq!(status(&head), 429, "{head}");
        assert!(head.contains("retry-after: "), "{head}");
    }

    // A light sender beside it still gets in.
    let body = request(
        "light",
        infertrace_spans(&Req::new(1, "m", 10, 20, 300), t0()),
    )
    .encode_to_vec();
    let mut s = connect_from([127, 0, 0, 1].into(), addr).await;
    s.write_all(head(light_token, body.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(&body).await.unwrap();
    let head = answer(&mut s).await.expect("an answer");
    assert_eq!(status(&head), 200, "the light sender: {head}");
    assert_eq!(refused("memory_limit"), 0);
    assert_eq!(refused("sender_share"), 4);

    // The refusals are in /metrics too.
    let metrics = match with_tokens {
        false => get(c.api_addr, "/metrics").await.1,
        true => {
            let req = http::Request::get(format!("http://{}/metrics", c.api_addr))
                .header("authorization", format!("Bearer {LIGHT_TOKEN}"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            let resp = client().request(req).await.unwrap();
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            String::from_utf8_lossy(&body).into_owned()
        }
    };
    assert_eq!(
        metric(
            &metrics,
            "infertrace_requests_refused_total{receiver=\"otlp_http\",reason=\"sender_share\"}"
        ),
        Some(4.0),
        "{metrics}"
    );
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_sender_is_refused_its_share_and_a_light_one_still_gets_in_by_peer_address() {
    scenario(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_sender_is_refused_its_share_and_a_light_one_still_gets_in_by_token() {
    scenario(true).await;
}
