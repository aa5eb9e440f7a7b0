//! `infertrace demo`: the whole loop in one process, on embedded defaults.
//!
//! 1. starts the collector (OTLP/gRPC on a free port, the API on `--listen`);
//! 2. starts a simulated continuous-batching engine ([`infertrace_sim`]) behind an
//!    OpenAI-compatible axum server wrapped in [`InferenceTraceLayer`], exporting OTLP to (1).
//!    The layer samples a **simulated** GPU ([`SimulatedGpu`]: utilisation = the engine's busy
//!    fraction, power and energy from it, memory from the KV cache) plus the real host and process
//!    counters, so the report shows GPU utilisation per phase and energy per output token, and
//!    the diagnosis can tell a saturated GPU from an idle one;
//! 3. drives it with the Poisson load generator, with a progress bar;
//! 4. flushes the spans, waits for the collector to assemble every trace, and prints the report
//!    — plus what infertrace measured beside the simulator's ground truth (its own clock, from
//!    the moment the handler submitted the request) and what the client saw.
//!
//! `--scenario` picks a workload whose bottleneck is known, so the diagnosis can be seen to change.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server::{self, RunningCollector};
use infertrace_demo::loadgen::{self, LengthDist, LoadConfig, LoadReport, Outcome};
use infertrace_demo::{openai, shutdown_signal};
use infertrace_sim::{SimConfig, SimHandle, SimulatedGpu, Simulator, TruthOutcome, TruthRecord};
use infertrace_tower::InferenceTraceLayer;
use infertrace_tower::otlp::{self, OtlpConfig};
use serde_json::{Value, json};

use crate::render;
use crate::report::{Format, print_report};

mod pd;

/// A workload whose bottleneck is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Moderate load well within capacity: no latency rule should fire. The simulated GPU reads
    /// ~97% busy (a continuously batching engine runs a step whenever a request is in flight,
    /// which is what "GPU utilisation" counts), which is reported as an info-level note only.
    Balanced,
    /// Arrivals beyond the engine's capacity with a small batch limit: queueing dominates while
    /// the engine steps back to back, so the diagnosis is `queue-dominated-gpu-saturated`.
    Overload,
    /// A share of very long prompts without chunked prefill: prefill dominates time to first
    /// token (`prefill-dominated-ttft`), and each long prefill stalls the running decodes.
    LongPrompts,
    /// Disaggregated serving: a router, two prefill and two decode workers as separate traced
    /// services over loopback, with the breakdown of time to first token across them
    /// (routing, prefill queue, prefill, bootstrap, KV transfer, decode wait, first token)
    /// beside the simulator's truth.
    Pd,
    /// Disaggregated, with one prefill worker whose 5 Gb/s link carries every KV transfer:
    /// the KV transfer is the largest part of time to first token.
    PdKvBound,
    /// Disaggregated with the pools the wrong way round for the load: one prefill worker for
    /// long prompts and three mostly idle decode workers, so the prefill queue dominates.
    PdRatio,
    /// Disaggregated the other way round: two prefill workers and one decode worker that runs
    /// at most 8 sequences at once, so requests wait for a decode batch slot
    /// (`pd-ratio-decode-bound`).
    PdDecodeBound,
    /// Disaggregated with a decode worker whose KV memory holds few sequences: requests wait
    /// at bootstrap for running ones to give theirs back (`decode-kv-memory-wait`).
    PdKvMemory,
}

impl Scenario {
    /// Whether the scenario runs the disaggregated deployment.
    pub fn is_pd(self) -> bool {
        matches!(
            self,
            Self::Pd | Self::PdKvBound | Self::PdRatio | Self::PdDecodeBound | Self::PdKvMemory
        )
    }
}

/// Arguments of `infertrace demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// How long the load generator sends requests (e.g. 30s, 2m).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Mean arrivals per second [default: the scenario's].
    #[arg(long)]
    pub rate: Option<f64>,
    /// The workload.
    #[arg(long, value_enum, default_value_t = Scenario::Balanced)]
    pub scenario: Scenario,
    /// Keep the collector and server running after the report (Ctrl-C stops).
    #[arg(long)]
    pub keep: bool,
    /// API address (dashboard, /metrics, /api/*) [default: 127.0.0.1:9464 with --keep, else a
    /// free port].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Seed of arrivals, lengths and the engine.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Output format of the report.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// The engine and load of a scenario.
pub(crate) struct Workload {
    pub(crate) sim: SimConfig,
    pub(crate) load: LoadConfig,
    pub(crate) description: &'static str,
}

pub(crate) const MODEL: &str = "llama-3.1-8b";
/// How often the demo samples its simulated GPU and the host.
pub(crate) const GPU_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

pub(crate) fn workload(
    scenario: Scenario,
    rate: Option<f64>,
    duration: Duration,
    seed: u64,
) -> Workload {
    let mut sim = SimConfig {
        model: MODEL.to_owned(),
        seed,
        ..SimConfig::default()
    };
    let mut load = LoadConfig {
        model: MODEL.to_owned(),
        duration,
        seed,
        stream: true,
        ignore_eos: true,
        // Chat-sized requests unless the scenario says otherwise.
        prompt_tokens: LengthDist::LogNormal {
            median: 400.0,
            sigma: 0.5,
            max: 2048,
        },
        output_tokens: LengthDist::LogNormal {
            median: 96.0,
            sigma: 0.5,
            max: 512,
        },
        ..LoadConfig::default()
    };
    let description = match scenario {
        Scenario::Balanced => {
            load.rate = rate.unwrap_or(6.0);
            "moderate load within capacity (max_num_seqs 64)"
        }
        Scenario::Overload => {
            sim.max_num_seqs = 8;
            load.rate = rate.unwrap_or(12.0);
            "arrivals beyond capacity with max_num_seqs 8: requests wait for a batch slot"
        }
        Scenario::LongPrompts => {
            // One long prompt prefills for 20,000 × 60 µs ≈ 1.2 s, past the 1 s TTFT threshold on
            // its own; at 15 % of 1.5 req/s they keep the engine ~27 % busy, so most find it free
            // and their TTFT is their prefill, not a queue (prefill p90 / TTFT p90 ≈ 0.9 against
            // the rule's 0.6).
            sim.max_batched_tokens = 32_768;
            load.rate = rate.unwrap_or(1.5);
            load.prompt_tokens = LengthDist::Mix {
                share: 0.15,
                long: 20_000,
                base: Box::new(load.prompt_tokens.clone()),
            };
            load.output_tokens = LengthDist::LogNormal {
                median: 48.0,
                sigma: 0.4,
                max: 256,
            };
            "15% of prompts are 20,000 tokens, without chunked prefill"
        }
        // The disaggregated scenarios change the load in `pd`.
        Scenario::Pd
        | Scenario::PdKvBound
        | Scenario::PdRatio
        | Scenario::PdDecodeBound
        | Scenario::PdKvMemory => {
            load.rate = rate.unwrap_or(6.0);
            "disaggregated prefill and decode"
        }
    };
    Workload {
        sim,
        load,
        description,
    }
}

/// Runs `infertrace demo`.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    if args.duration.is_zero() {
        anyhow::bail!("--duration must be longer than zero (e.g. --duration 30s)");
    }
    if args.scenario.is_pd() {
        return pd::run(args).await;
    }
    let wl = workload(args.scenario, args.rate, args.duration, args.seed);
    let interactive = std::io::stderr().is_terminal();

    // 1. The collector.
    let collector = start_collector(&args, Duration::from_millis(500)).await?;
    let grpc = collector
        .grpc_addr
        .context("the demo needs the OTLP/gRPC receiver")?;

    // 2. The instrumented server on the simulated engine.
    let providers = otlp::init(
        OtlpConfig::grpc(format!("http://{grpc}"))
            .service_name("infertrace-demo")
            .metrics(false),
    )
    .context("setting up OTLP export to the collector")?;
    let sim = Simulator::start(wl.sim.clone())
        .map_err(|e| anyhow::anyhow!("starting the simulator: {e}"))?;
    let layer = InferenceTraceLayer::new()
        .with_otlp(&providers)
        .default_model(MODEL)
        .gpu_telemetry(SimulatedGpu::telemetry(
            sim.clone(),
            GPU_SAMPLE_INTERVAL,
            true,
        ));
    let app = openai::router(sim.clone(), layer, MODEL);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the demo server")?;
    let server_addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(openai::serve(listener, app, async move {
        let _ = stop_rx.await;
    }));

    eprintln!(
        "infertrace demo: scenario {:?} — {}; {:.1} req/s for {}",
        args.scenario,
        wl.description,
        wl.load.rate,
        humantime::format_duration(args.duration)
    );
    eprintln!(
        "  collector API http://{}  ·  server http://{server_addr}",
        collector.api_addr
    );

    // 3. Load.
    let load_cfg = LoadConfig {
        target: format!("http://{server_addr}"),
        ..wl.load.clone()
    };
    let started = Instant::now();
    let load = loadgen::run(&load_cfg, interactive)
        .await
        .context("running the load generator")?;

    // 4. Flush spans and let the collector assemble every trace.
    let p = providers.clone();
    tokio::task::spawn_blocking(move || p.tracer_provider.force_flush())
        .await
        .context("flushing spans")?
        .map_err(|e| anyhow::anyhow!("flushing spans to the collector: {e}"))?;
    let expected = load.sent;
    let window = report_window(started.elapsed());
    let received = wait_for_requests(&collector, window, expected, Duration::from_secs(10)).await;
    if received < expected {
        eprintln!(
            "infertrace demo: note: the collector has {received} of {expected} requests after 10s"
        );
    }

    let mut report = local_report(&collector, window);
    report["source"] = json!(format!("demo ({:?})", args.scenario));
    report["client"] = client_summary(&load);
    report["ground_truth"] = ground_truth(&sim);
    print_report(&report, args.format)?;
    if args.format == Format::Table {
        print!("{}", truth_table(&report));
    }

    if args.keep {
        eprintln!(
            "\ninfertrace demo: still running — metrics http://{0}/metrics · KPIs http://{0}/api/kpis?window=5m · report: infertrace report --url http://{0}  (Ctrl-C stops)",
            collector.api_addr
        );
        shutdown_signal().await;
    }
    let _ = stop_tx.send(());
    let _ = server.await;
    let p = providers.clone();
    let _ = tokio::task::spawn_blocking(move || p.shutdown()).await;
    collector.stop().await.context("stopping the collector")?;
    Ok(ExitCode::SUCCESS)
}

/// The in-process collector of a demo: OTLP on free ports, the API on `--listen`, traces
/// closed `grace` after their request span arrives, nothing written to disk.
pub(crate) async fn start_collector(
    args: &DemoArgs,
    grace: Duration,
) -> anyhow::Result<RunningCollector> {
    let mut config = CollectorConfig::default();
    config.receivers.otlp_grpc.endpoint = "127.0.0.1:0".parse()?;
    config.receivers.otlp_http.endpoint = "127.0.0.1:0".parse()?;
    config.api.listen = match (args.listen, args.keep) {
        (Some(a), _) => a,
        (None, true) => "127.0.0.1:9464".parse()?,
        (None, false) => "127.0.0.1:0".parse()?,
    };
    config.assembly.grace = grace;
    // The demo keeps everything in memory: it never creates ./infertrace-data.
    config.store.enabled = false;
    server::run(config, std::future::pending())
        .await
        .context("starting the collector")
}

/// The smallest default KPI window covering the run.
pub(crate) fn report_window(elapsed: Duration) -> Duration {
    if elapsed < Duration::from_secs(55) {
        Duration::from_secs(60)
    } else if elapsed < Duration::from_secs(295) {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(3600)
    }
}

fn requests_in(collector: &RunningCollector, window: Duration) -> u64 {
    collector
        .kpis(window)
        .series
        .iter()
        .map(|s| s.requests)
        .sum()
}

pub(crate) async fn wait_for_requests(
    collector: &RunningCollector,
    window: Duration,
    expected: u64,
    limit: Duration,
) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        let n = requests_in(collector, window);
        if n >= expected || Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The report of an in-process collector, in the API's JSON shapes.
pub fn local_report(collector: &RunningCollector, window: Duration) -> Value {
    json!({
        "window_seconds": window.as_secs_f64(),
        "kpis": collector.kpis(window),
        "critical_path": collector.critical_path(window),
        "findings": collector.findings(window),
        "alerts": collector.alerts(),
    })
}

/// Percentiles at rank ⌊q·(n − 1)⌋ (the rank rule of the KPI sketches, so the three sides are
/// comparable even on few requests), mean and sum of `values` in seconds.
pub(crate) fn stat(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| -> Option<f64> {
        let last = v.len().checked_sub(1)?;
        Some(v[((p * last as f64) as usize).min(last)])
    };
    let sum: f64 = v.iter().sum();
    let mean = (!v.is_empty()).then(|| sum / v.len() as f64);
    json!({"count": v.len(), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "mean": mean, "sum": sum})
}

/// What the load generator saw, over its successful requests: TTFT (sent → first token received)
/// and e2e (sent → stream complete) include the network and the server's own work.
pub(crate) fn client_summary(load: &LoadReport) -> Value {
    let ok = || load.results.iter().filter(|r| r.outcome == Outcome::Ok);
    json!({
        "sent": load.sent,
        "ok": ok().count(),
        "output_tokens": load.output_tokens,
        "ttft": stat(ok().filter_map(|r| r.ttft).map(|d| d.as_secs_f64()).collect()),
        "tpot": stat(ok().filter_map(|r| r.tpot()).map(|d| d.as_secs_f64()).collect()),
        "e2e": stat(ok().map(|r| r.e2e.as_secs_f64()).collect()),
    })
}

/// Exact percentiles of the simulator's true phase times (from its own clock, from the moment the
/// handler submitted the request), and how late its step timers woke (the run's scheduler noise).
fn ground_truth(sim: &SimHandle) -> Value {
    let records: Vec<TruthRecord> = sim
        .truth_all()
        .into_iter()
        .filter(|r| matches!(r.outcome, Some(TruthOutcome::Finished(_))))
        .collect();
    let of = |f: &dyn Fn(&TruthRecord) -> Option<Duration>| {
        stat(
            records
                .iter()
                .filter_map(|r| f(r).map(|d| d.as_secs_f64()))
                .collect(),
        )
    };
    json!({
        "requests": records.len(),
        "queue": of(&|r| r.queue()),
        "prefill": of(&|r| r.prefill()),
        "ttft": of(&|r| r.ttft()),
        "decode": of(&|r| r.decode()),
        "tpot": of(&|r| r.tpot()),
        "e2e": of(&|r| r.e2e()),
        "scheduler_noise": stat(sim.step_lateness().iter().map(Duration::as_secs_f64).collect()),
    })
}

/// "What infertrace measured vs what really happened" for the completed requests: the
/// simulator's truth, the layer's spans (through the collector) and the client's view.
pub(crate) fn truth_table(report: &Value) -> String {
    let truth = &report["ground_truth"];
    let client = &report["client"];
    let Some(series) = report.pointer("/kpis/series").and_then(Value::as_array) else {
        return String::new();
    };
    let Some(s) = series.first() else {
        return String::new();
    };
    let mut out = format!(
        "\nMeasured by infertrace vs the simulator's ground truth vs the client ({} completed requests)\n",
        truth["requests"]
    );
    out.push_str(
        "  metric    truth p50  layer p50  client p50   truth p99  layer p99  client p99\n",
    );
    for k in ["queue", "prefill", "ttft", "decode", "tpot", "e2e"] {
        let c = |p: &str| match k {
            "ttft" | "e2e" => render::secs(client[k][p].as_f64()),
            _ => "·".to_owned(),
        };
        out.push_str(&format!(
            "  {:<8}  {:>9}  {:>9}  {:>10}   {:>9}  {:>9}  {:>10}\n",
            k,
            render::secs(truth[k]["p50"].as_f64()),
            render::secs(s[k]["p50"].as_f64()),
            c("p50"),
            render::secs(truth[k]["p99"].as_f64()),
            render::secs(s[k]["p99"].as_f64()),
            c("p99"),
        ));
    }
    let noise = &truth["scheduler_noise"];
    out.push_str(&format!(
        "  truth: the simulator's own clock, from submit · layer: infertrace's spans, from arrival\n  \
         client: sent → received (network and server work included) · engine timer lateness p50 {} p99 {}\n",
        render::secs(noise["p50"].as_f64()),
        render::secs(noise["p99"].as_f64()),
    ));
    out
}
