//! Proof of the scale-out story of docs/deploy.md, against a real Prometheus, and checks of the
//! shipped deployment files.
//!
//! `sharded_collectors_add_up_in_prometheus`: two collectors each receive the traces whose
//! trace id hashes to them (as the OpenTelemetry Collector's `loadbalancing` exporter with
//! `routing_key: traceID` sends them); a third receives every trace. Prometheus scrapes all
//! three every second (job `split`: the two shards; job `single`: the one that saw everything):
//! - `sum by (le, model) (<histogram>_bucket{job="split"})` equals the single collector's
//!   buckets for every classic histogram, and both equal the buckets computed from the traces'
//!   known timings;
//! - requests, tokens and goodput counters add up the same way;
//! - the per-instance `infertrace_critical_path_seconds_total` add up to the single
//!   collector's, which equal the phase and own-time seconds computed from the traces;
//! - every rule of otel-config/alerts.yml (loaded into Prometheus, and run as instant queries)
//!   and every PromQL expression of the Grafana dashboard evaluates without error, and the
//!   dashboard's infertrace panels return data;
//! - the Docker image's healthcheck command passes on a live collector.
//!
//! The other tests run promtool / amtool on the Prometheus and Alertmanager files, parse the
//! collector configs the compose files mount, and check that the files agree with each other.
//!
//! Needs `prometheus`, `promtool` and `amtool` (Debian packages `prometheus`,
//! `prometheus-alertmanager`): skipped with a message when absent and `CI` is unset; in CI
//! (.ci/run installs them) a missing binary fails.

mod support_prom;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server::{self, RunningCollector};
use support_prom::traffic::{self, Buckets, RequestSpec};
use support_prom::{HttpClient, Prometheus, Sample, dashboard, require_binary};

/// Traces sent (each to one shard, and all to the single collector).
const TRACES: usize = 240;
/// The history store's directory in the image (docker/Dockerfile, docker/*.yaml).
const STORE_DIR: &str = "/var/lib/infertrace/infertrace-data";
/// How long to wait for Prometheus to see what was sent.
const WAIT: Duration = Duration::from_secs(30);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

// ---------------------------------------------------------------------------------------------
// Reading Prometheus answers.

fn by_model_le(samples: &[Sample]) -> Buckets {
    samples
        .iter()
        .map(|s| {
            let le = support_prom::parse_value(s.label("le")).expect("numeric le");
            ((s.label("model").to_owned(), traffic::le_key(le)), s.value)
        })
        .collect()
}

fn by_labels(samples: &[Sample], labels: &[&str]) -> BTreeMap<Vec<String>, f64> {
    samples
        .iter()
        .map(|s| {
            (
                labels.iter().map(|l| s.label(l).to_owned()).collect(),
                s.value,
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Collectors and Prometheus.

fn collector_config() -> CollectorConfig {
    let mut c = CollectorConfig::default();
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    c.receivers.otlp_grpc.enabled = false;
    c.receivers.otlp_grpc.endpoint = any;
    c.receivers.otlp_http.endpoint = any;
    c.api.listen = any;
    // Close traces soon after their request span arrives: the test does not wait 2 s per trace.
    c.assembly.grace = Duration::from_millis(100);
    c.assembly.tick = Duration::from_millis(20);
    // No history store: three collectors in one process would share ./infertrace-data.
    c.store.enabled = false;
    c
}

async fn start_collector() -> RunningCollector {
    server::run(collector_config(), std::future::pending())
        .await
        .expect("collector starts")
}

fn prometheus_config(split: &[SocketAddr], single: SocketAddr) -> String {
    let targets = |addrs: &[SocketAddr]| {
        addrs
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
         rule_files:\n  - alerts.yml\n\
         scrape_configs:\n\
         \x20 - job_name: split\n    static_configs:\n      - targets: [{}]\n\
         \x20 - job_name: single\n    static_configs:\n      - targets: [{}]\n",
        targets(split),
        targets(&[single])
    )
}

/// Polls `expr` until it equals `want` (or panics after [`WAIT`] with the last value).
async fn wait_for_value(prom: &Prometheus, expr: &str, want: f64) {
    let deadline = Instant::now() + WAIT;
    let mut last = Err(String::new());
    while Instant::now() < deadline {
        last = prom.query_sum(expr).await;
        if matches!(last, Ok(v) if v == want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!(
        "{expr} never reached {want}: last {last:?}\nprometheus log:\n{}",
        prom.log()
    );
}

/// Whether two labelled value maps have the same keys and values within `rel` (relative, and
/// absolute below 1).
fn close(a: &BTreeMap<Vec<String>, f64>, b: &BTreeMap<Vec<String>, f64>, rel: f64) -> bool {
    a.len() == b.len()
        && a.iter().all(|(k, v)| {
            b.get(k)
                .is_some_and(|w| (v - w).abs() <= rel * w.abs().max(1.0))
        })
}

/// The shell command of docker/Dockerfile's HEALTHCHECK (the JSON exec form's last element).
fn dockerfile_healthcheck() -> String {
    let dockerfile =
        std::fs::read_to_string(repo_root().join("docker/Dockerfile")).expect("docker/Dockerfile");
    let start = dockerfile
        .find("\nHEALTHCHECK ")
        .expect("a HEALTHCHECK instruction");
    let cmd = &dockerfile[start..];
    let json = &cmd[cmd.find("CMD [").expect("exec-form CMD") + 4..];
    let json = &json[..=json.find(']').expect("closing ]")];
    let argv: Vec<String> = serde_json::from_str(json).expect("HEALTHCHECK CMD is a JSON array");
    assert_eq!(argv[..2], ["bash", "-c"], "{argv:?}");
    argv[2].clone()
}

/// Runs the healthcheck against `port` instead of 9464: `true` when it reports healthy.
fn healthcheck_passes(script: &str, port: u16) -> bool {
    assert!(script.contains("/9464"), "{script}");
    let script = script.replace("/9464", &format!("/{port}"));
    Command::new("bash")
        .args(["-c", &script])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("bash runs")
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_collectors_add_up_in_prometheus() {
    let Some(prom_bin) = require_binary(
        "PROMETHEUS_BIN",
        "prometheus",
        "sharded_collectors_add_up_in_prometheus",
    ) else {
        return;
    };
    let started = Instant::now();
    let root = repo_root();
    let alerts = std::fs::read_to_string(root.join("otel-config/alerts.yml")).expect("alerts.yml");
    let dashboard =
        dashboard::load(&root.join("otel-config/grafana/dashboards/llm-latency-breakdown.json"));

    // Three collectors: two shards and one that sees everything.
    let shards = [start_collector().await, start_collector().await];
    let single = start_collector().await;
    let shard_apis: Vec<SocketAddr> = shards.iter().map(|c| c.api_addr).collect();
    let prom = Prometheus::start(
        &prom_bin,
        &prometheus_config(&shard_apis, single.api_addr),
        &[("alerts.yml", &alerts)],
    )
    .await;

    // The traffic, split by trace id as the loadbalancing exporter would.
    let specs = traffic::requests(TRACES);
    let http = HttpClient::default();
    let mut per_shard: [Vec<&RequestSpec>; 2] = [Vec::new(), Vec::new()];
    for r in &specs {
        per_shard[r.shard(2)].push(r);
    }
    assert!(
        per_shard.iter().all(|s| s.len() > TRACES / 4),
        "both shards get a fair share: {} / {}",
        per_shard[0].len(),
        per_shard[1].len()
    );
    for (collector, traces) in shards.iter().zip(&per_shard) {
        let receiver = collector.http_addr.expect("HTTP receiver on");
        traffic::send(&http, receiver, traces).await;
    }
    let all: Vec<&RequestSpec> = specs.iter().collect();
    traffic::send(&http, single.http_addr.expect("HTTP receiver on"), &all).await;

    // Wait until Prometheus has scraped every request from every collector.
    let n = TRACES as f64;
    wait_for_value(&prom, r#"sum(infertrace_requests_total{job="split"})"#, n).await;
    wait_for_value(&prom, r#"sum(infertrace_requests_total{job="single"})"#, n).await;
    let instances = r#"count(count by (instance) (infertrace_requests_total{job="split"}))"#;
    wait_for_value(&prom, instances, 2.0).await;

    histograms_add_up(&prom, &specs).await;
    counters_add_up(&prom, &specs).await;
    critical_path_adds_up(&prom, &specs).await;
    alert_rules_evaluate(&prom, &alerts).await;
    dashboard_queries_run(&prom, &dashboard).await;
    docker_healthcheck_works(&http, single.api_addr).await;

    drop(prom);
    for c in shards {
        c.stop().await.expect("shard stops");
    }
    single.stop().await.expect("single stops");
    eprintln!(
        "scale-out proof took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The shards' `sum by (le, model)` is the single collector's, exactly, for every histogram,
/// and matches the buckets computed from the traces; `_sum` and `_count` add up too.
async fn histograms_add_up(prom: &Prometheus, specs: &[RequestSpec]) {
    for (family, truth) in traffic::expected_histograms(specs) {
        let q = |job: &str| format!(r#"sum by (le, model) ({family}_bucket{{job="{job}"}})"#);
        let split = by_model_le(&prom.query(&q("split")).await.expect("split query"));
        let whole = by_model_le(&prom.query(&q("single")).await.expect("single query"));
        assert!(!split.is_empty(), "{family}: no buckets scraped");
        assert_eq!(
            split, whole,
            "{family}: sharded sum differs from the single collector"
        );
        assert_eq!(
            split, truth,
            "{family}: buckets differ from the traces' timings"
        );
        for part in ["sum", "count"] {
            let q = |job: &str| format!(r#"sum by (model) ({family}_{part}{{job="{job}"}})"#);
            let a = by_labels(&prom.query(&q("split")).await.expect("query"), &["model"]);
            let b = by_labels(&prom.query(&q("single")).await.expect("query"), &["model"]);
            // Sums of floats in another order: equal up to rounding.
            assert!(close(&a, &b, 1e-9), "{family}_{part}: {a:?} vs {b:?}");
        }
    }
    let e2e_sum = prom
        .query_sum(r#"sum(infertrace_request_duration_seconds_sum{job="split"})"#)
        .await
        .expect("query");
    let truth: f64 = specs.iter().map(|r| RequestSpec::secs(r.e2e())).sum();
    assert!(
        (e2e_sum - truth).abs() < 1e-6,
        "e2e sum {e2e_sum} vs {truth}"
    );
}

/// Requests by outcome, tokens by type and goodput add up across the shards.
async fn counters_add_up(prom: &Prometheus, specs: &[RequestSpec]) {
    for (expr, labels) in [
        (
            r#"sum by (model, outcome) (infertrace_requests_total{job="JOB"})"#,
            &["model", "outcome"][..],
        ),
        (
            r#"sum by (model, type) (infertrace_tokens_total{job="JOB"})"#,
            &["model", "type"][..],
        ),
        (
            r#"sum by (model) (infertrace_goodput_requests_total{job="JOB"})"#,
            &["model"][..],
        ),
    ] {
        let split = expr.replace("JOB", "split");
        let single = expr.replace("JOB", "single");
        let a = by_labels(&prom.query(&split).await.expect("query"), labels);
        let b = by_labels(&prom.query(&single).await.expect("query"), labels);
        assert!(!a.is_empty(), "{expr}: no data");
        assert_eq!(a, b, "{expr}");
    }
    let errors = specs.iter().filter(|r| r.error).count() as f64;
    let got_errors = prom
        .query_sum(r#"sum(infertrace_requests_total{job="split", outcome="error"})"#)
        .await
        .expect("query");
    assert_eq!(got_errors, errors, "error requests");
    let output_tokens: u64 = specs.iter().map(|r| r.output_tokens).sum();
    let got_output = prom
        .query_sum(r#"sum(infertrace_tokens_total{job="split", type="output"})"#)
        .await
        .expect("query");
    assert_eq!(got_output, output_tokens as f64, "output tokens");
}

/// Per-instance critical-path counters add up to the single collector's, and to the phases'
/// and the request spans' own time.
async fn critical_path_adds_up(prom: &Prometheus, specs: &[RequestSpec]) {
    let cp = |job: &str| {
        format!(r#"sum by (service, span) (infertrace_critical_path_seconds_total{{job="{job}"}})"#)
    };
    let labels = ["service", "span"];
    let split = by_labels(&prom.query(&cp("split")).await.expect("query"), &labels);
    let single = by_labels(&prom.query(&cp("single")).await.expect("query"), &labels);
    let truth = traffic::expected_critical_path(specs);
    assert!(
        close(&split, &single, 1e-6),
        "critical path: shards {split:?}\nsingle {single:?}"
    );
    assert!(
        close(&split, &truth, 1e-6),
        "critical path: shards {split:?}\ntruth {truth:?}"
    );
}

/// Every alert rule loads, evaluates in Prometheus without error, and runs as a query.
async fn alert_rules_evaluate(prom: &Prometheus, alerts: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let rules = loop {
        let data = prom.api("rules").await.expect("rules API");
        let rules: Vec<serde_json::Value> = data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = |r: &serde_json::Value| {
            r["lastEvaluation"]
                .as_str()
                .is_some_and(|t| !t.starts_with("0001-"))
        };
        if !rules.is_empty() && rules.iter().all(evaluated) {
            break rules;
        }
        assert!(Instant::now() < deadline, "rules never evaluated: {data}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        rules.len(),
        alerts.matches("- alert:").count(),
        "every rule loaded"
    );
    for r in &rules {
        assert_eq!(
            r["health"], "ok",
            "rule {} failed: {}",
            r["name"], r["lastError"]
        );
        let q = r["query"].as_str().expect("rule query");
        prom.query(q)
            .await
            .unwrap_or_else(|e| panic!("rule {} query fails: {e}\n{q}", r["name"]));
    }
}

/// Every dashboard expression runs; the infertrace panels show data (once every series has the
/// two samples `rate` needs).
async fn dashboard_queries_run(prom: &Prometheus, dashboard: &serde_json::Value) {
    let two_samples = "min(count_over_time(infertrace_requests_total[1m])) >= bool 2";
    wait_for_value(prom, two_samples, 1.0).await;
    let exprs = dashboard::exprs(dashboard);
    assert!(
        exprs.len() > 20,
        "dashboard has its queries: {}",
        exprs.len()
    );
    let mut empty = Vec::new();
    for dashboard::Query { title, expr, .. } in &exprs {
        let q = dashboard::to_promql(expr);
        assert!(!q.contains('$'), "{title}: unsubstituted variable in {q}");
        let result = prom
            .query(&q)
            .await
            .unwrap_or_else(|e| panic!("dashboard panel {title:?}: {e}\n{q}"));
        if dashboard::must_have_data(&q) && result.is_empty() {
            empty.push(format!("{title}: {q}"));
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}",
        empty.join("\n")
    );
}

/// The Docker image's healthcheck (bash /dev/tcp, no curl in the image) sees a healthy
/// collector, and fails on a port where nothing listens.
async fn docker_healthcheck_works(http: &HttpClient, api: SocketAddr) {
    let script = dockerfile_healthcheck();
    assert!(
        healthcheck_passes(&script, api.port()),
        "healthcheck on a live collector"
    );
    let (status, body) = http
        .get(&format!("http://{api}/health"))
        .await
        .expect("GET /health");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let closed = support_prom::free_port();
    assert!(
        !healthcheck_passes(&script, closed),
        "healthcheck on a closed port"
    );
}

// ---------------------------------------------------------------------------------------------
// Static checks of the shipped deployment files.

fn run_tool(bin: &Path, args: &[&str], cwd: &Path) {
    let out = Command::new(bin)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {} failed:\n{}{}",
        bin.display(),
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn deployment_files_pass_promtool_and_amtool() {
    let test = "deployment_files_pass_promtool_and_amtool";
    let Some(promtool) = require_binary("PROMTOOL_BIN", "promtool", test) else {
        return;
    };
    let Some(amtool) = require_binary("AMTOOL_BIN", "amtool", test) else {
        return;
    };
    let root = repo_root();
    let otel = root.join("otel-config");
    run_tool(&promtool, &["check", "config", "prometheus.yml"], &otel);
    run_tool(&promtool, &["check", "rules", "alerts.yml"], &otel);
    run_tool(&promtool, &["test", "rules", "alerts.test.yml"], &otel);
    run_tool(&amtool, &["check-config", "alertmanager.yml"], &otel);
    // docker/prometheus.scale.yml is mounted next to alerts.yml in its container.
    let dir = support_prom::TempDir::new("promtool");
    std::fs::copy(
        root.join("docker/prometheus.scale.yml"),
        dir.path().join("prometheus.yml"),
    )
    .expect("copy prometheus.scale.yml");
    std::fs::copy(otel.join("alerts.yml"), dir.path().join("alerts.yml")).expect("copy alerts.yml");
    // ...and so is the bearer token of its infertrace job.
    std::fs::copy(
        otel.join("infertrace-metrics.token"),
        dir.path().join("infertrace-metrics.token"),
    )
    .expect("copy infertrace-metrics.token");
    run_tool(
        &promtool,
        &["check", "config", "prometheus.yml"],
        dir.path(),
    );
}

#[test]
fn compose_collector_configs_are_valid() {
    let root = repo_root();
    for file in [
        "docker/infertrace.compose.yaml",
        "docker/infertrace.scale.yaml",
    ] {
        let cfg =
            CollectorConfig::from_file(&root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        // Inside a container every listener must be on all interfaces.
        assert!(cfg.api.listen.ip().is_unspecified(), "{file}: api.listen");
        assert!(
            cfg.receivers.otlp_grpc.endpoint.ip().is_unspecified(),
            "{file}: otlp_grpc"
        );
        assert!(
            cfg.receivers.otlp_http.endpoint.ip().is_unspecified(),
            "{file}: otlp_http"
        );
        // The history store lives where the Dockerfile creates a directory the non-root user
        // owns (and where docker/compose.yaml mounts its volume).
        assert_eq!(
            cfg.store.data_dir,
            Path::new(STORE_DIR),
            "{file}: store.data_dir"
        );
    }
    let dockerfile = std::fs::read_to_string(root.join("docker/Dockerfile")).expect("Dockerfile");
    assert!(
        dockerfile.contains(&format!("install -d -o 10001 -g 10001 {STORE_DIR}")),
        "the image creates {STORE_DIR} for uid 10001"
    );
    // The examples image copies its binaries by name (not whatever the target cache holds):
    // every example is named.
    for entry in std::fs::read_dir(root.join("examples/src/bin")).expect("examples/src/bin") {
        let path = entry.expect("an entry").path();
        let bin = path.file_stem().and_then(|s| s.to_str()).expect("a name");
        assert!(
            dockerfile.lines().any(|l| l.contains("for bin in")
                && l.split_whitespace().any(|w| w.trim_end_matches(';') == bin)),
            "docker/Dockerfile copies the example {bin}"
        );
    }
    let compose = std::fs::read_to_string(root.join("docker/compose.yaml")).expect("compose");
    assert!(
        compose.contains(&format!("infertrace-data:{STORE_DIR}")),
        "compose.yaml mounts a volume at {STORE_DIR}"
    );
    let scale =
        CollectorConfig::from_file(&root.join("docker/infertrace.scale.yaml")).expect("parses");
    assert_eq!(
        scale.forward.endpoint, None,
        "replicas behind otelcol do not forward (otelcol fans out)"
    );
}

#[test]
fn dashboard_and_shards_are_well_formed() {
    let dashboard = dashboard::load(
        &repo_root().join("otel-config/grafana/dashboards/llm-latency-breakdown.json"),
    );
    let vars: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(
        vars.contains(&"model") && vars.contains(&"instance"),
        "{vars:?}"
    );
    let queries = dashboard::exprs(&dashboard);
    // Percentiles aggregate classic histograms across collectors by (le, model).
    let fleet_p95 = "histogram_quantile(0.95, sum by (le, model)";
    assert!(queries.iter().any(|q| q.expr.contains(fleet_p95)));
    // Families without a model label (per collector, or per (service, span)).
    let modelless = [
        "critical_path",
        "receiver_spans",
        "dropped_spans",
        "traces_in_flight",
        "exported_spans",
        "alerts_active",
        "series_overflow",
        "late_spans",
        "reopened_requests_not_counted",
        "assembly_grace",
        "store_",
        "memory_reserved",
        "memory_limit",
        "requests_refused",
        "traces_closed_early",
    ];
    for q in queries
        .iter()
        .filter(|q| !q.is_variable && q.expr.contains("infertrace_"))
    {
        let (title, e) = (&q.title, &q.expr);
        if !modelless.iter().any(|m| e.contains(m)) {
            assert!(
                e.contains("$model"),
                "{title}: request panels filter by $model: {e}"
            );
        }
        assert!(
            e.contains("$instance"),
            "{title}: collector panels filter by $instance: {e}"
        );
    }
    // The shard function partitions: every trace goes to exactly one of n shards, all used.
    let specs = traffic::requests(TRACES);
    for n in [2usize, 3] {
        let mut counts = vec![0usize; n];
        for r in &specs {
            counts[r.shard(n)] += 1;
        }
        assert!(counts.iter().all(|c| *c > 0), "{n} shards: {counts:?}");
        assert_eq!(counts.iter().sum::<usize>(), specs.len());
    }
}

fn yaml(path: &str) -> serde_yaml_ng::Value {
    let text =
        std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

fn strings(v: &serde_yaml_ng::Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The files of otel-config/ and docker/ name each other (hosts, ports, paths, anchors): check
/// that they agree, since no Docker engine, Grafana, Jaeger, Tempo or otelcol runs here.
#[test]
fn deployment_files_agree_with_each_other() {
    let root = repo_root();

    // The load balancer shards by trace id over exactly the compose replicas, on their gRPC
    // port, and fans the traces out to Jaeger; every pipeline component is defined.
    let otelcol = yaml("otel-config/otelcol-contrib.yaml");
    let lb = &otelcol["exporters"]["loadbalancing/infertrace"];
    assert_eq!(lb["routing_key"].as_str(), Some("traceID"));
    let backends = strings(&lb["resolver"]["static"]["hostnames"]);
    assert_eq!(
        backends,
        [
            "infertrace-1:4317",
            "infertrace-2:4317",
            "infertrace-3:4317"
        ]
    );
    for (kind, pipeline) in otelcol["service"]["pipelines"]
        .as_mapping()
        .expect("pipelines")
    {
        for section in ["receivers", "processors", "exporters"] {
            for name in strings(&pipeline[section]) {
                assert!(
                    otelcol[section].get(name.as_str()).is_some(),
                    "pipeline {kind:?} uses undefined {section} {name}"
                );
            }
        }
    }
    let traces_out = strings(&otelcol["service"]["pipelines"]["traces"]["exporters"]);
    assert!(
        traces_out.contains(&"loadbalancing/infertrace".to_owned())
            && traces_out.contains(&"otlp/jaeger".to_owned())
    );
    assert_eq!(
        otelcol["exporters"]["otlp/jaeger"]["endpoint"].as_str(),
        Some("jaeger:4317")
    );

    // compose.scale.yaml runs those replicas and Prometheus scrapes each one's API.
    let scale = yaml("docker/compose.scale.yaml");
    let mut scrape: Vec<String> = Vec::new();
    let prom_scale = yaml("docker/prometheus.scale.yml");
    for job in prom_scale["scrape_configs"]
        .as_sequence()
        .expect("scrape_configs")
    {
        if job["job_name"].as_str() == Some("infertrace") {
            for sc in job["static_configs"].as_sequence().expect("static_configs") {
                scrape.extend(strings(&sc["targets"]));
            }
        }
    }
    for backend in &backends {
        let host = backend.split(':').next().expect("host");
        assert!(
            !scale["services"][host].is_null(),
            "compose.scale.yaml has no service {host}"
        );
        assert!(
            scrape.contains(&format!("{host}:9464")),
            "prometheus.scale.yml does not scrape {host}"
        );
    }
    assert!(!scale["services"]["otelcol"].is_null() && !scale["services"]["jaeger"].is_null());

    // Jaeger listens where infertrace forwards in compose.yaml.
    let jaeger = yaml("otel-config/jaeger.yaml");
    assert_eq!(
        jaeger["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].as_str(),
        Some("0.0.0.0:4317")
    );
    let single =
        CollectorConfig::from_file(&root.join("docker/infertrace.compose.yaml")).expect("parses");
    assert_eq!(
        single.forward.endpoint.as_deref(),
        Some("http://jaeger:4317")
    );
    let tempo = yaml("otel-config/tempo.yaml");
    assert!(
        !tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"].is_null(),
        "tempo OTLP gRPC"
    );

    // Every file a compose file mounts exists, and Grafana's provider reads the mounted folder.
    let compose = yaml("docker/compose.yaml");
    for file in [&compose, &scale] {
        for (name, service) in file["services"].as_mapping().expect("services") {
            for volume in strings(&service["volumes"]) {
                let source = volume.split(':').next().expect("source");
                if source.starts_with('.') {
                    let path = root.join("docker").join(source);
                    assert!(path.exists(), "{name:?} mounts missing {}", path.display());
                }
            }
        }
    }
    let provider = yaml("otel-config/grafana/provisioning/dashboards/infertrace.yaml");
    let dash_dir = provider["providers"][0]["options"]["path"]
        .as_str()
        .expect("provider path");
    let grafana_mounts = strings(&compose["services"]["grafana"]["volumes"]);
    assert!(
        grafana_mounts
            .iter()
            .any(|v| v.ends_with(&format!("{dash_dir}:ro"))),
        "grafana does not mount the dashboards at {dash_dir}: {grafana_mounts:?}"
    );
    let datasources = yaml("otel-config/grafana/provisioning/datasources/prometheus.yaml");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            root.join("otel-config/grafana/dashboards/llm-latency-breakdown.json"),
        )
        .expect("dashboard"),
    )
    .expect("JSON");
    let default_ds = dashboard["templating"]["list"][0]["current"]["value"]
        .as_str()
        .expect("datasource var");
    assert_eq!(
        datasources["datasources"][0]["uid"].as_str(),
        Some(default_ds)
    );

    // Every alert has for, severity, summary, description and a runbook that exists.
    let alerts = yaml("otel-config/alerts.yml");
    let deploy = std::fs::read_to_string(root.join("docs/deploy.md")).expect("docs/deploy.md");
    let mut n = 0;
    for group in alerts["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("alerting rules only");
            n += 1;
            assert!(rule["for"].as_str().is_some(), "{name}: for");
            assert!(
                matches!(
                    rule["labels"]["severity"].as_str(),
                    Some("warning" | "critical")
                ),
                "{name}: severity"
            );
            for a in ["summary", "description", "runbook_url"] {
                assert!(
                    rule["annotations"][a]
                        .as_str()
                        .is_some_and(|s| !s.is_empty()),
                    "{name}: {a}"
                );
            }
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .expect("runbook_url");
            assert!(
                url.ends_with(&format!("docs/deploy.md#{}", name.to_lowercase())),
                "{name}: {url}"
            );
            assert!(
                deploy.contains(&format!("\n### {name}\n")),
                "docs/deploy.md has no runbook for {name}"
            );
        }
    }
    assert!(n >= 6, "{n} alerts");
}

/// `docker-compose config` (Compose v1) or `docker compose config` (v2) parses both compose files
/// against the Compose schema without a Docker engine (`apt-get install docker-compose`; .ci/run
/// installs it). Without a client it is skipped with a message when `CI` is unset, and fails in
/// CI; [`compose_files_hold_together`] checks their structure either way.
#[test]
fn compose_files_pass_docker_compose_config() {
    let docker_compose_v2 = support_prom::find_binary("DOCKER_BIN", "docker").filter(|docker| {
        Command::new(docker)
            .args(["compose", "version"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let (bin, prefix): (PathBuf, &[&str]) = match docker_compose_v2 {
        Some(docker) => (docker, &["compose"]),
        None => match support_prom::find_binary("DOCKER_COMPOSE_BIN", "docker-compose") {
            Some(p) => (p, &[]),
            None if std::env::var_os("CI").is_some() => panic!(
                "no `docker compose` or `docker-compose` client but CI is set: .ci/run installs \
                 docker-compose (or set DOCKER_COMPOSE_BIN)"
            ),
            None => {
                eprintln!(
                    "SKIPPED compose_files_pass_docker_compose_config: no `docker compose` or \
                     `docker-compose` client (apt-get install docker-compose); in CI this fails"
                );
                return;
            }
        },
    };
    let docker_dir = repo_root().join("docker");
    for file in ["compose.yaml", "compose.scale.yaml"] {
        let mut args: Vec<&str> = prefix.to_vec();
        args.extend([
            "-f",
            file,
            "--profile",
            "tempo",
            "--profile",
            "gpu",
            "config",
            "-q",
        ]);
        run_tool(&bin, &args, &docker_dir);
    }
}

/// Both compose files parse as YAML (merge keys applied) and hold together, with no tool
/// needed: every service names an image or a build whose context and Dockerfile exist, and
/// every file a service mounts from the repository exists.
#[test]
fn compose_files_hold_together() {
    let docker_dir = repo_root().join("docker");
    for file in ["compose.yaml", "compose.scale.yaml"] {
        let text = std::fs::read_to_string(docker_dir.join(file)).expect("read compose file");
        let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect(file);
        doc.apply_merge().expect(file);
        let services = doc["services"].as_mapping().expect("services");
        assert!(!services.is_empty(), "{file}: no services");
        for (name, service) in services {
            let name = name.as_str().unwrap_or("?");
            let build = &service["build"];
            assert!(
                service["image"].is_string() || !build.is_null(),
                "{file}: {name} has neither image nor build"
            );
            if let Some(context) = build["context"].as_str() {
                let context = docker_dir.join(context);
                assert!(
                    context.is_dir(),
                    "{file}: {name}: build context {context:?}"
                );
                let dockerfile = build["dockerfile"].as_str().unwrap_or("Dockerfile");
                assert!(
                    context.join(dockerfile).is_file(),
                    "{file}: {name}: Dockerfile {dockerfile}"
                );
            }
            let volumes = service["volumes"].as_sequence().map_or(&[][..], |v| &v[..]);
            for volume in volumes.iter().filter_map(|v| v.as_str()) {
                let source = volume.split(':').next().unwrap_or_default();
                if source.starts_with("./") || source.starts_with("../") {
                    assert!(
                        docker_dir.join(source).exists(),
                        "{file}: {name} mounts {source}, which does not exist"
                    );
                }
            }
        }
    }
}
