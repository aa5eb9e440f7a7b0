//! The demo's in-process collector: started on free ports, waited on until it has assembled
//! the run's requests, and read back as a report.

use std::time::{Duration, Instant};

use anyhow::Context;
use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server::{self, RunningCollector};
use serde_json::{Value, json};

use super::args::DemoArgs;

/// The in-process collector of a demo: OTLP on free ports, the API on `--listen`, traces
/// closed `grace` after their request span arrives, nothing written to disk.
pub(super) async fn start_collector(
    args: &DemoArgs,
    grace: Duration,
) -> anyhow::Result<RunningCollector> {
    let mut config = CollectorConfig::default();
    // The demo's process holds the simulated engines and load too: its resident memory is not
    // the collector's.
    config.limits.watch_resident_memory = false;
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
pub(super) fn report_window(elapsed: Duration) -> Duration {
    if elapsed < Duration::from_secs(55) {
        Duration::from_secs(60)
    } else if elapsed < Duration::from_secs(295) {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(3600)
    }
}

/// Requests of every series in the collector's `window`.
fn requests_in(collector: &RunningCollector, window: Duration) -> u64 {
    collector
        .kpis(window)
        .series
        .iter()
        .map(|s| s.requests)
        .sum()
}

/// Waits until the collector's `window` holds `expected` requests, or `limit` passed; the
/// count it has.
pub(super) async fn wait_for_requests(
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
pub(super) fn local_report(collector: &RunningCollector, window: Duration) -> Value {
    let diagnosis = collector.diagnosis(window);
    json!({
        "window_seconds": window.as_secs_f64(),
        "kpis": collector.kpis(window),
        "critical_path": collector.critical_path(window),
        "findings": diagnosis.findings,
        "undiagnosed": diagnosis.undiagnosed,
        "diagnosis_min_requests": diagnosis.min_requests,
        "alerts": collector.alerts(),
    })
}
