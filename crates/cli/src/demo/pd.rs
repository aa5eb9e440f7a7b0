//! `infertrace demo --scenario pd | pd-kv-bound | pd-ratio | pd-decode-bound | pd-kv-memory`:
//! disaggregated serving in one process.
//!
//! 1. the collector, as in the other scenarios (with a grace period longer than the span
//!    exporters' batch delay: the services export independently, so a trace's spans arrive
//!    from several exporters up to one batch delay apart);
//! 2. a [`DisaggSim`] (router, prefill and decode workers, each worker its own engine and
//!    simulated GPU) served by [`infertrace_demo::pd`]: every role its own HTTP service on
//!    loopback behind its own layer and `service.name`, trace context propagated router →
//!    prefill → decode;
//! 3. the load generator against the router;
//! 4. the report, the usual truth table, and the disaggregated breakdown: for every request
//!    the collector assembled across the services, each sub-phase it measured beside the
//!    simulator's truth for the same request (matched by trace id), and TTFT decomposed.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use infertrace_collector::server::RunningCollector;
use infertrace_demo::loadgen::{self, LengthDist, LoadConfig};
use infertrace_demo::pd::{self, PdIndex, RoleTelemetry};
use infertrace_demo::shutdown_signal;
use infertrace_semconv as sc;
use infertrace_sim::{DisaggConfig, DisaggSim, PdTruth, SimulatedGpu, TruthOutcome};
use infertrace_tower::otlp::{self, OtlpConfig, OtlpProviders};
use serde_json::{Value, json};

use super::args::{DemoArgs, Scenario};
use super::collector::{local_report, report_window, start_collector, wait_for_requests};
use super::truth::{client_summary, stat, truth_table};
use super::workload::{GPU_SAMPLE_INTERVAL, MODEL, workload};
use crate::render;
use crate::report::{Format, print_report};

/// The `pd-kv-memory` decode worker's KV memory, tokens: above the largest sequence the load
/// generator sends (2,048 prompt + 512 output tokens), so none is refused.
const PD_KV_MEMORY_TOKENS: u64 = 3072;

/// The deployment and load of a disaggregated scenario.
fn pd_workload(args: &DemoArgs) -> (DisaggConfig, LoadConfig, &'static str) {
    let base = workload(Scenario::Balanced, args.rate, args.duration, args.seed);
    let mut load = base.load;
    let mut cfg = DisaggConfig {
        prefill_workers: 2,
        decode_workers: 2,
        prefill: base.sim.clone(),
        decode: base.sim,
        seed: args.seed,
        ..DisaggConfig::default()
    };
    let description = match args.scenario {
        Scenario::PdKvBound => {
            // 400 prompt tokens are 52 MB of KV cache: 84 ms on 5 Gb/s against a 29 ms
            // prefill, and every transfer shares the one prefill worker's link (≈ 50 % busy at
            // 6 req/s, so transfers overlap and each takes longer than alone).
            cfg.prefill_workers = 1;
            cfg.link_bandwidth = 0.625e9;
            load.rate = args.rate.unwrap_or(6.0);
            "1 prefill : 2 decode workers, KV transfers share one 5 Gb/s link"
        }
        Scenario::PdRatio => {
            // Long prompts prefill for ≈ 87 ms each on the one prefill worker (≈ 87 % busy at
            // 10 req/s), while three decode workers share short outputs.
            cfg.prefill_workers = 1;
            cfg.decode_workers = 3;
            load.rate = args.rate.unwrap_or(10.0);
            load.prompt_tokens = LengthDist::LogNormal {
                median: 1200.0,
                sigma: 0.5,
                max: 4096,
            };
            load.output_tokens = LengthDist::LogNormal {
                median: 48.0,
                sigma: 0.4,
                max: 256,
            };
            "1 prefill : 3 decode workers for long prompts and short answers"
        }
        Scenario::PdDecodeBound => {
            // One decode worker runs at most 8 sequences (SGLang --max-running-requests): each
            // holds its slot for ≈ 110 steps of ≈ 8 ms, so 6 req/s keep ≈ 5.3 of the 8 busy on
            // average and arrivals queue for one whenever a burst comes; two prefill workers
            // idle.
            cfg.decode_workers = 1;
            cfg.decode.max_num_seqs = 8;
            load.rate = args.rate.unwrap_or(6.0);
            "2 prefill : 1 decode worker running at most 8 sequences"
        }
        Scenario::PdKvMemory => {
            // One decode worker with KV memory for 3,072 tokens (384 MB at 128 KiB per token):
            // a request reserves prompt + max_tokens (≈ 560 on average), so ≈ 5 fit while
            // 4.5 req/s keep ≈ 4 decoding; bursts wait at bootstrap. The batch limit (64) is
            // never reached, so nothing waits in decode_wait.
            cfg.decode_workers = 1;
            cfg.decode_kv_tokens = PD_KV_MEMORY_TOKENS;
            load.rate = args.rate.unwrap_or(4.5);
            "2 prefill : 1 decode worker with KV memory for 3,072 tokens"
        }
        _ => "2 prefill : 2 decode workers, 400 Gb/s KV links, within capacity",
    };
    (cfg, load, description)
}

/// Runs a disaggregated demo scenario.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let (cfg, load_cfg, description) = pd_workload(&args);
    let interactive = std::io::stderr().is_terminal();
    // 6 s: longer than the batch span processors' 5 s schedule delay.
    let collector = start_collector(&args, Duration::from_secs(6)).await?;
    let grpc = collector
        .grpc_addr
        .context("the demo needs the OTLP/gRPC receiver")?;
    let sim = DisaggSim::start(cfg.clone())
        .map_err(|e| anyhow::anyhow!("starting the simulator: {e}"))?;

    // One exporter per service, each with its own service.name.
    let mut providers: HashMap<(&'static str, usize), OtlpProviders> = HashMap::new();
    let roles = std::iter::once((sc::disagg::role::ROUTER, 0))
        .chain((0..cfg.prefill_workers).map(|i| (sc::disagg::role::PREFILL, i)))
        .chain((0..cfg.decode_workers).map(|i| (sc::disagg::role::DECODE, i)));
    for (role, i) in roles {
        let p = otlp::init(
            OtlpConfig::grpc(format!("http://{grpc}"))
                .service_name(pd::service_name(role, i))
                .metrics(false),
        )
        .context("setting up OTLP export to the collector")?;
        providers.insert((role, i), p);
    }
    let telemetry = |role: &'static str, i: usize| {
        let p = &providers[&(role, i)];
        let mut t = RoleTelemetry::new(p, role);
        let engine = match role {
            sc::disagg::role::PREFILL => sim.prefill_workers().get(i),
            sc::disagg::role::DECODE => sim.decode_workers().get(i),
            _ => None,
        };
        if let Some(engine) = engine {
            t.layer = t.layer.gpu_telemetry(SimulatedGpu::telemetry(
                engine.clone(),
                GPU_SAMPLE_INTERVAL,
                false,
            ));
        }
        t
    };
    let deployment = pd::launch(sim.clone(), MODEL, telemetry)
        .await
        .context("starting the disaggregated services")?;

    eprintln!(
        "infertrace demo: scenario {} — {description}; {:.1} req/s for {}",
        args.scenario.name(),
        load_cfg.rate,
        humantime::format_duration(args.duration)
    );
    eprintln!(
        "  collector API http://{}  ·  router http://{}",
        collector.api_addr, deployment.router
    );

    let load_cfg = LoadConfig {
        target: format!("http://{}", deployment.router),
        ..load_cfg
    };
    let started = Instant::now();
    let load = loadgen::run(&load_cfg, interactive)
        .await
        .context("running the load generator")?;

    let all: Vec<OtlpProviders> = providers.values().cloned().collect();
    tokio::task::spawn_blocking(move || {
        for p in &all {
            p.tracer_provider
                .force_flush()
                .map_err(|e| anyhow::anyhow!("flushing spans to the collector: {e}"))?;
        }
        Ok::<_, anyhow::Error>(())
    })
    .await
    .context("flushing spans")??;
    let expected = load.sent;
    let window = report_window(started.elapsed());
    let received = wait_for_requests(&collector, window, expected, Duration::from_secs(15)).await;
    if received < expected {
        eprintln!(
            "infertrace demo: note: the collector has {received} of {expected} requests after 15s"
        );
    }

    let mut report = local_report(&collector, window);
    report["source"] = json!(format!("demo ({})", args.scenario.name()));
    report["client"] = client_summary(&load);
    let truths: HashMap<u64, PdTruth> = sim
        .truth_all()
        .into_iter()
        .filter(|t| matches!(t.outcome(), Some(TruthOutcome::Finished(_))))
        .map(|t| (t.id, t))
        .collect();
    let noise = sim.step_lateness();
    report["ground_truth"] = ground_truth(&truths, &noise);
    report["pd"] = breakdown(
        &collector,
        &deployment.index,
        &truths,
        &cfg,
        &deployment.services,
    );
    print_report(&report, args.format)?;
    if args.format == Format::Table {
        print!("{}", truth_table(&report));
        print!("{}", pd_table(&report));
    }

    if args.keep {
        // Listening before saying so: a Ctrl-C right after the line still stops it gracefully.
        let stop = shutdown_signal();
        eprintln!(
            "\ninfertrace demo: still running — dashboard http://{0}/ · metrics http://{0}/metrics · KPIs http://{0}/api/kpis?window=5m · report: infertrace report --url http://{0}  (Ctrl-C stops)",
            collector.api_addr
        );
        stop.await;
    }
    deployment.stop().await;
    let all: Vec<OtlpProviders> = providers.into_values().collect();
    let _ = tokio::task::spawn_blocking(move || {
        for p in all {
            let _ = p.shutdown();
        }
    })
    .await;
    collector.stop().await.context("stopping the collector")?;
    Ok(ExitCode::SUCCESS)
}

/// The sub-phases in time order along TTFT, then decode, with the truth of each.
type TruthOf = fn(&PdTruth) -> Option<Duration>;
const PHASES: [(&str, TruthOf); 9] = [
    (sc::disagg::ROUTING, |t| Some(t.routing())),
    (sc::disagg::PREFILL_QUEUE, PdTruth::prefill_queue),
    (sc::disagg::PREFILL, PdTruth::prefill),
    (sc::disagg::BOOTSTRAP, PdTruth::bootstrap),
    (sc::disagg::KV_TRANSFER, PdTruth::kv_transfer),
    (sc::disagg::DECODE_WAIT, PdTruth::decode_wait),
    (sc::disagg::FIRST_TOKEN, PdTruth::first_token),
    (sc::disagg::DECODE, PdTruth::decode),
    ("ttft", PdTruth::ttft),
];

/// The simulator's truth in the shape of the other scenarios' (queue = the prefill worker's
/// queue, decode = the decode worker's), and the run's scheduler noise.
fn ground_truth(truths: &HashMap<u64, PdTruth>, noise: &[Duration]) -> Value {
    let of = |f: &dyn Fn(&PdTruth) -> Option<Duration>| {
        stat(
            truths
                .values()
                .filter_map(|t| f(t).map(|d| d.as_secs_f64()))
                .collect(),
        )
    };
    let tpot = |t: &PdTruth| t.decode.as_ref()?.tpot();
    json!({
        "requests": truths.len(),
        "queue": of(&PdTruth::prefill_queue),
        "prefill": of(&PdTruth::prefill),
        "ttft": of(&PdTruth::ttft),
        "decode": of(&PdTruth::decode),
        "tpot": of(&tpot),
        "e2e": of(&PdTruth::e2e),
        "kv_alloc_wait": of(&PdTruth::kv_alloc_wait),
        "scheduler_noise": stat(noise.iter().map(Duration::as_secs_f64).collect()),
    })
}

/// Each request the collector assembled across the services, its sub-phases beside the truth.
fn breakdown(
    collector: &RunningCollector,
    index: &PdIndex,
    truths: &HashMap<u64, PdTruth>,
    cfg: &DisaggConfig,
    services: &[(String, std::net::SocketAddr)],
) -> Value {
    // (measured, truth) per phase; the unattributed rest of each measured TTFT.
    let mut pairs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); PHASES.len()];
    let mut unattributed = Vec::new();
    let mut records = 0u64;
    let mut matched = 0u64;
    let mut incomplete = 0u64;
    collector.pipeline().visit_recent_traces(&mut |trace| {
        for req in &trace.requests {
            let r = &req.record;
            let Some(d) = r.disagg.as_deref() else {
                continue;
            };
            records += 1;
            let Some(truth) = index
                .get(&r.trace_id.to_hex())
                .and_then(|id| truths.get(&id))
            else {
                continue;
            };
            matched += 1;
            let measured = [
                d.routing,
                d.prefill_queue,
                d.prefill,
                d.bootstrap,
                d.kv_transfer,
                d.decode_wait,
                d.first_token,
                d.decode,
                r.ttft,
            ];
            if measured.iter().any(Option::is_none) {
                incomplete += 1;
            }
            for (i, (m, (_, f))) in measured.iter().zip(PHASES).enumerate() {
                if let (Some(m), Some(t)) = (m, f(truth)) {
                    pairs[i].push((*m, t.as_secs_f64()));
                }
            }
            if let Some(b) = r.ttft_breakdown() {
                unattributed.push(b.unattributed);
            }
        }
    });
    let phases: Vec<Value> = PHASES
        .iter()
        .zip(&pairs)
        .map(|((name, _), p)| {
            json!({
                "phase": name,
                "measured": stat(p.iter().map(|x| x.0).collect()),
                "truth": stat(p.iter().map(|x| x.1).collect()),
                "error": stat(p.iter().map(|x| (x.0 - x.1).abs()).collect()),
                "signed_error": stat(p.iter().map(|x| x.0 - x.1).collect()),
            })
        })
        .collect();
    json!({
        "topology": {
            "prefill_workers": cfg.prefill_workers,
            "decode_workers": cfg.decode_workers,
            "link_bandwidth_bytes_per_second": cfg.link_bandwidth,
            "kv_bytes_per_token": cfg.kv_bytes_per_token,
            "decode_kv_tokens": cfg.decode_kv_tokens,
            "services": services.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        },
        "records": records,
        "matched": matched,
        "incomplete": incomplete,
        "phases": phases,
        "unattributed": stat(unattributed),
    })
}

/// The disaggregated breakdown table: per sub-phase, truth and measured percentiles, the
/// per-request error, and the measured share of TTFT.
fn pd_table(report: &Value) -> String {
    let pd = &report["pd"];
    let Some(phases) = pd["phases"].as_array() else {
        return String::new();
    };
    let ttft_mean = phases
        .iter()
        .find(|p| p["phase"] == "ttft")
        .and_then(|p| p["measured"]["mean"].as_f64());
    let mut out = format!(
        "\nDisaggregated breakdown across {} services: infertrace's spans vs the simulator's truth, per request ({} of {} requests matched)\n",
        pd["topology"]["services"].as_array().map_or(0, Vec::len),
        pd["matched"],
        report["ground_truth"]["requests"],
    );
    out.push_str("  sub-phase        truth p50  layer p50   truth p99  layer p99   |err| p50  |err| p99  share of TTFT\n");
    for p in phases {
        let name = p["phase"].as_str().unwrap_or_default();
        let share = match (name, p["measured"]["mean"].as_f64(), ttft_mean) {
            ("decode" | "ttft", _, _) => "·".to_owned(),
            (_, Some(m), Some(t)) if t > 0.0 => format!("{:.0}%", 100.0 * m / t),
            _ => "-".to_owned(),
        };
        out.push_str(&format!(
            "  {:<15}  {:>9}  {:>9}   {:>9}  {:>9}   {:>9}  {:>9}  {:>13}\n",
            name,
            render::secs(p["truth"]["p50"].as_f64()),
            render::secs(p["measured"]["p50"].as_f64()),
            render::secs(p["truth"]["p99"].as_f64()),
            render::secs(p["measured"]["p99"].as_f64()),
            render::secs(p["error"]["p50"].as_f64()),
            render::secs(p["error"]["p99"].as_f64()),
            share,
        ));
    }
    out.push_str(&format!(
        "  unattributed TTFT (hand-overs between services) p50 {} · decode KV allocation wait (truth) p99 {}\n",
        render::secs(pd["unattributed"]["p50"].as_f64()),
        render::secs(report["ground_truth"]["kv_alloc_wait"]["p99"].as_f64()),
    ));
    out
}
