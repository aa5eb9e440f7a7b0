//! Bearer-token authentication with real clients: curl against `/api`, `/metrics`, `/health`,
//! the dashboard and both receivers (gRPC over h2c included); the official OpenTelemetry Python
//! SDK exporting with `OTEL_EXPORTER_OTLP_HEADERS` over HTTP and gRPC (accepted with the ingest
//! token, refused without); and a real Prometheus scraping `/metrics` with
//! `authorization: credentials_file:` (and failing to without).

mod support_prom;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server::{self, RunningCollector};
use serde_json::Value;
use support_prom::python::python_sdk;
use support_prom::{Prometheus, TempDir, require_binary};

const INGEST: &str = "ingest-0123456789abcdef0123";
const READ: &str = "read-0123456789abcdef01234567";
const METRICS: &str = "metrics-0123456789abcdef0123";
const WAIT: Duration = Duration::from_secs(30);

/// A collector on loopback with the three tokens (one scope each) in a tokens file.
async fn start(dir: &Path) -> RunningCollector {
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!("# one token per scope\ningest {INGEST}\nread {READ}\nmetrics {METRICS}\n"),
    )
    .expect("write tokens");
    let mut config = CollectorConfig::default();
    config.store.enabled = false;
    config.receivers.otlp_grpc.endpoint = "127.0.0.1:0".parse().unwrap();
    config.receivers.otlp_http.endpoint = "127.0.0.1:0".parse().unwrap();
    config.api.listen = "127.0.0.1:0".parse().unwrap();
    config.assembly.grace = Duration::from_millis(200);
    config.auth.tokens_file = Some(tokens);
    config.auth.tokens_env = None;
    server::run(config, std::future::pending())
        .await
        .expect("collector starts")
}

fn curl_binary() -> Option<PathBuf> {
    require_binary("CURL_BIN", "curl", "auth tests (curl part)")
}

/// Status line code, lower-cased headers and body of `curl -i`.
struct Answer {
    status: u16,
    headers: String,
    body: String,
}

fn curl(bin: &Path, args: &[&str]) -> Answer {
    let out = Command::new(bin)
        .args(["-sS", "-i", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Answer {
        status,
        headers: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_sees_scopes_challenges_and_the_host_allowlist() {
    let Some(bin) = curl_binary() else { return };
    let dir = TempDir::new("auth-curl");
    let collector = start(dir.path()).await;
    let api = format!("http://{}", collector.api_addr);
    // curl blocks: run it off the runtime's workers.
    let run = |args: Vec<String>| {
        let bin = bin.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                curl(&bin, &args.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .await
            .unwrap()
        }
    };
    let get = |path: &str, token: Option<&str>| {
        let mut args = vec![format!("{api}{path}")];
        if let Some(t) = token {
            args.extend(["-H".into(), bearer(t)]);
        }
        run(args)
    };

    // Probes and the page stay open.
    assert_eq!(get("/health", None).await.status, 200);
    let page = get("/", None).await;
    assert_eq!(page.status, 200);
    assert!(
        page.headers
            .contains("content-security-policy: default-src 'none'; script-src 'self'")
            && page.headers.contains("frame-ancestors 'none'")
            && page.headers.contains("x-frame-options: deny")
            && page.headers.contains("x-content-type-options: nosniff")
            && page.headers.contains("referrer-policy: no-referrer"),
        "{}",
        page.headers
    );

    // The JSON API: read scope.
    let a = get("/api/kpis", None).await;
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(
        a.headers
            .contains("www-authenticate: bearer realm=\"infertrace\""),
        "{}",
        a.headers
    );
    assert!(a.body.contains("scope `read`"), "{}", a.body);
    let a = get("/api/kpis", Some("not-a-configured-token-000")).await;
    assert_eq!(a.status, 401);
    assert!(
        a.headers.contains("error=\"invalid_token\""),
        "{}",
        a.headers
    );
    let a = get("/api/kpis", Some(INGEST)).await;
    assert_eq!(a.status, 403);
    assert!(
        a.headers
            .contains("error=\"insufficient_scope\", scope=\"read\""),
        "{}",
        a.headers
    );
    let a = get("/api/kpis", Some(READ)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("\"series\""), "{}", a.body);
    assert_eq!(get("/api/dashboard", Some(READ)).await.status, 200);
    assert_eq!(get("/api/traces", None).await.status, 401);

    // /metrics: metrics scope.
    assert_eq!(get("/metrics", None).await.status, 401);
    assert_eq!(get("/metrics", Some(READ)).await.status, 403);
    let m = get("/metrics", Some(METRICS)).await;
    assert_eq!(m.status, 200);
    assert!(
        m.body.contains(
            "infertrace_auth_failures_total{listener=\"api\",reason=\"insufficient_scope\"} 2"
        ),
        "{}",
        m.body
    );

    // Another Host: 421, whatever the token.
    let mut args = vec![
        format!("{api}/api/kpis"),
        "-H".into(),
        "Host: attacker.example".into(),
    ];
    args.extend(["-H".into(), bearer(READ)]);
    let misdirected = run(args).await;
    assert_eq!(misdirected.status, 421);
    assert!(
        misdirected
            .body
            .contains(r#"{"error":"the Host \"attacker.example\" is not served"#),
        "a JSON error naming the Host: {}",
        misdirected.body
    );
    // A Host that is not visible ASCII is not let through as if there were none.
    let args = vec![
        format!("{api}/api/kpis"),
        "-H".into(),
        "Host: ex\u{e9}mple.example".into(),
        "-H".into(),
        bearer(READ),
    ];
    assert_eq!(run(args).await.status, 421);
    let args = vec![
        format!("{api}/health"),
        "-H".into(),
        format!("Host: localhost:{}", collector.api_addr.port()),
    ];
    assert_eq!(run(args).await.status, 200);

    // OTLP/HTTP: ingest scope.
    let http = format!("http://{}/v1/traces", collector.http_addr.unwrap());
    let post = |token: Option<&str>| {
        let mut args = vec![
            http.clone(),
            "-X".into(),
            "POST".into(),
            "-H".into(),
            "Content-Type: application/json".into(),
            "--data-binary".into(),
            "{}".into(),
        ];
        if let Some(t) = token {
            args.extend(["-H".into(), bearer(t)]);
        }
        run(args)
    };
    // Refusals carry a google.rpc.Status in the request's format, as OTLP/HTTP asks.
    let p = post(None).await;
    assert_eq!(p.status, 401);
    assert!(
        p.headers.contains("content-type: application/json"),
        "{}",
        p.headers
    );
    assert!(p.body.starts_with(r#"{"code":16,"#), "{}", p.body);
    assert!(p.body.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{}", p.body);
    let p = post(Some(READ)).await;
    assert_eq!(p.status, 403);
    assert!(p.body.starts_with(r#"{"code":7,"#), "{}", p.body);
    assert_eq!(post(Some(INGEST)).await.status, 200);
    // Over HTTP/2 (h2c) too. (An answer racing the body's arrival, which curl 7.x reported as
    // a framing error, is `connections.rs::an_early_http2_answer_waits_for_a_small_body_on_its_way`.)
    for _ in 0..5 {
        let args = vec![
            "--http2-prior-knowledge".to_owned(),
            http.clone(),
            "-H".into(),
            "Content-Type: application/json".into(),
            "--data-binary".into(),
            "{}".into(),
            "-H".into(),
            bearer("unknown-token-0123456789abcdef"),
        ];
        assert_eq!(run(args).await.status, 401);
    }

    // OTLP/gRPC over h2c with a real gRPC client (tonic): trailers-only UNAUTHENTICATED /
    // PERMISSION_DENIED, then OK. (curl races the server's stream reset on a trailers-only
    // answer to a request whose body it is still sending, and then prints nothing.)
    let grpc_call = |token: Option<&'static str>| {
        let addr = collector.grpc_addr.unwrap();
        async move {
            use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
            use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
            let mut client = TraceServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect to the gRPC receiver");
            let mut request = tonic::Request::new(ExportTraceServiceRequest::default());
            if let Some(t) = token {
                request.metadata_mut().insert(
                    "authorization",
                    format!("Bearer {t}")
                        .parse()
                        .expect("a valid metadata value"),
                );
            }
            client.export(request).await
        }
    };
    let g = grpc_call(None).await.unwrap_err();
    assert_eq!(g.code(), tonic::Code::Unauthenticated, "{g:?}");
    let g = grpc_call(Some(METRICS)).await.unwrap_err();
    assert_eq!(g.code(), tonic::Code::PermissionDenied, "{g:?}");
    let ok = grpc_call(Some(INGEST))
        .await
        .expect("accepted with the ingest token");
    assert!(ok.into_inner().partial_success.is_none());

    // Every refusal counted, by listener and reason.
    let e = collector.events();
    assert_eq!(e.auth_refusals("api", "missing_token"), 3);
    assert_eq!(e.auth_refusals("api", "unknown_token"), 1);
    assert_eq!(e.auth_refusals("api", "insufficient_scope"), 2);
    assert_eq!(e.auth_refusals("api", "host_not_allowed"), 2);
    assert_eq!(e.auth_refusals("otlp_http", "missing_token"), 1);
    assert_eq!(e.auth_refusals("otlp_http", "insufficient_scope"), 1);
    assert_eq!(e.auth_refusals("otlp_grpc", "missing_token"), 1);
    assert_eq!(e.auth_refusals("otlp_grpc", "insufficient_scope"), 1);
    collector.stop().await.expect("clean shutdown");
}

/// Runs tests/python/send_traces.py with `headers` as `OTEL_EXPORTER_OTLP_HEADERS` (or none).
fn send(endpoint: &str, protocol: &str, service: &str, headers: Option<&str>) -> Output {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/send_traces.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script)
        .args(["--endpoint", endpoint, "--protocol", protocol])
        .args([
            "--dialect",
            "infertrace",
            "--count",
            "10",
            "--service",
            service,
        ])
        .env_remove("OTEL_EXPORTER_OTLP_HEADERS")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_HEADERS");
    if let Some(h) = headers {
        cmd.env("OTEL_EXPORTER_OTLP_HEADERS", h);
    }
    cmd.output().expect("run python3")
}

fn requests_of(collector: &RunningCollector, service: &str) -> u64 {
    let kpis = serde_json::to_value(collector.kpis(Duration::from_secs(3600))).unwrap();
    kpis["series"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["service"] == service)
        .filter_map(|s| s["requests"].as_u64())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_exports_with_the_ingest_token_only() {
    if !python_sdk() {
        return;
    }
    let dir = TempDir::new("auth-python");
    let collector = start(dir.path()).await;
    let header = format!("authorization=Bearer%20{INGEST}");
    for (protocol, addr, listener) in [
        ("grpc", collector.grpc_addr.unwrap(), "otlp_grpc"),
        ("http", collector.http_addr.unwrap(), "otlp_http"),
    ] {
        let endpoint = format!("http://{addr}");
        // Without the header: refused, and the SDK says so.
        let refused = format!("py-refused-{protocol}");
        let before = collector.events().auth_refusals(listener, "missing_token");
        let out = tokio::task::spawn_blocking({
            let (endpoint, refused) = (endpoint.clone(), refused.clone());
            move || send(&endpoint, protocol, &refused, None)
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            collector.events().auth_refusals(listener, "missing_token") > before,
            "{protocol}: no refusal counted; SDK stderr:\n{stderr}"
        );
        assert!(
            stderr.contains("401") || stderr.contains("UNAUTHENTICATED"),
            "{protocol}: the SDK did not report the refusal:\n{stderr}"
        );
        // With the ingest token: every request arrives.
        let accepted = format!("py-accepted-{protocol}");
        let out = tokio::task::spawn_blocking({
            let (endpoint, accepted, header) = (endpoint.clone(), accepted.clone(), header.clone());
            move || send(&endpoint, protocol, &accepted, Some(&header))
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "{protocol}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("script prints JSON");
        assert_eq!(v["flushed"], true);
        let deadline = Instant::now() + WAIT;
        while requests_of(&collector, &accepted) < 10 {
            assert!(
                Instant::now() < deadline,
                "{protocol}: the 10 requests never arrived"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(requests_of(&collector, &accepted), 10, "{protocol}");
        assert_eq!(
            requests_of(&collector, &refused),
            0,
            "{protocol}: refused spans were recorded"
        );
    }
    collector.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_with_a_bearer_token() {
    let Some(bin) = require_binary(
        "PROMETHEUS_BIN",
        "prometheus",
        "prometheus_scrapes_with_a_bearer_token",
    ) else {
        return;
    };
    let dir = TempDir::new("auth-prom");
    let collector = start(dir.path()).await;
    let target = collector.api_addr;
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  \
         - job_name: infertrace\n    authorization:\n      credentials_file: metrics.token\n    \
         static_configs:\n      - targets: ['{target}']\n  \
         - job_name: anonymous\n    static_configs:\n      - targets: ['{target}']\n"
    );
    let token_file = format!("{METRICS}\n");
    let prom = Prometheus::start(&bin, &config, &[("metrics.token", &token_file)]).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let with = prom.query_sum("up{job=\"infertrace\"}").await;
        let without = prom.query("up{job=\"anonymous\"}").await;
        let refused = prom
            .query_sum(
                "infertrace_auth_failures_total{job=\"infertrace\",listener=\"api\",reason=\"missing_token\"}",
            )
            .await;
        let series = prom
            .query("infertrace_receiver_spans_total{job=\"infertrace\"}")
            .await;
        if let (Ok(1.0), Ok(w), Ok(r), Ok(_)) = (&with, &without, &refused, &series)
            && w.len() == 1
            && w[0].value == 0.0
            && *r >= 1.0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus: up with token {with:?}, without {without:?}, refusals seen {refused:?}\n{}",
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(collector.events().auth_refusals("api", "missing_token") >= 1);
    assert_eq!(collector.events().auth_refusals("api", "unknown_token"), 0);
    collector.stop().await.expect("clean shutdown");
}

/// The demo stacks in docker/ hold together: each collector config reads the tokens file the
/// compose file mounts, and the tokens its clients send (the example server's and otelcol's
/// ingest token, Prometheus' metrics token) are accepted there with the right scope.
#[test]
fn compose_demo_tokens_are_consistent() {
    use infertrace_collector::auth::{Scope, TokenSet};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let read =
        |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let tokens = TokenSet::parse(
        &read("otel-config/infertrace-tokens"),
        "infertrace-tokens",
        false,
    )
    .expect("the demo tokens file parses");
    let accepts = |token: &str, scope: Scope| {
        let header = http::HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        tokens.verify(Some(&header), scope).is_ok()
    };
    for (config, compose, scraped_as) in [
        (
            "docker/infertrace.compose.yaml",
            "docker/compose.yaml",
            &["infertrace"][..],
        ),
        (
            "docker/infertrace.scale.yaml",
            "docker/compose.scale.yaml",
            &["infertrace-1", "infertrace-2", "infertrace-3"][..],
        ),
    ] {
        let cfg = CollectorConfig::from_file(&root.join(config)).expect("parses");
        let file = cfg.auth.tokens_file.expect("auth.tokens_file");
        let mount = format!("../otel-config/infertrace-tokens:{}:ro", file.display());
        assert!(
            read(compose).contains(&mount),
            "{compose} does not mount {mount}"
        );
        assert!(!cfg.auth.insecure, "{config}");
        // The API answers Prometheus, which scrapes it by its service name.
        for host in scraped_as {
            assert!(
                cfg.api.allowed_hosts.iter().any(|h| h == host),
                "{config}: api.allowed_hosts lacks {host}"
            );
        }
    }
    let metrics = read("otel-config/infertrace-metrics.token");
    assert!(accepts(metrics.trim(), Scope::Metrics));
    assert!(!accepts(metrics.trim(), Scope::Ingest));
    let compose: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read("docker/compose.yaml")).unwrap();
    let header =
        compose["services"]["axum-server"]["environment"]["OTEL_EXPORTER_OTLP_TRACES_HEADERS"]
            .as_str()
            .expect("the example server sends a token");
    let token = header
        .strip_prefix("authorization=Bearer%20")
        .expect("authorization=Bearer%20<token>");
    assert!(accepts(token, Scope::Ingest));
    // The load balancer sends the token its compose service puts in its environment.
    let otelcol: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read("otel-config/otelcol-contrib.yaml")).unwrap();
    let auth = otelcol["exporters"]["loadbalancing/infertrace"]["protocol"]["otlp"]["headers"]
        ["authorization"]
        .as_str()
        .expect("otelcol sends a token");
    assert_eq!(auth, "Bearer ${env:INFERTRACE_INGEST_TOKEN}");
    let scale: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read("docker/compose.scale.yaml")).unwrap();
    let token = scale["services"]["otelcol"]["environment"]["INFERTRACE_INGEST_TOKEN"]
        .as_str()
        .expect("the load balancer's service sets the token");
    assert!(accepts(token, Scope::Ingest));
    for prom in ["otel-config/prometheus.yml", "docker/prometheus.scale.yml"] {
        let p: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read(prom)).unwrap();
        let job = p["scrape_configs"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|j| j["job_name"] == "infertrace")
            .expect("infertrace job");
        assert_eq!(
            job["authorization"]["credentials_file"].as_str(),
            Some("infertrace-metrics.token"),
            "{prom}"
        );
    }
}
