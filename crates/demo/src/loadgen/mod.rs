//! An open-loop load generator: Poisson arrivals at `rate` per second for `duration`, each
//! request's prompt and output lengths drawn from seeded distributions, sent over HTTP/SSE or
//! gRPC; a cap on requests in flight (an arrival finding the cap reached is counted as
//! `skipped`, so arrivals stay open-loop); client-side TTFT, TPOT and end-to-end percentiles.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use infertrace_demo::loadgen::{self, LoadConfig};
//! let report = loadgen::run(&LoadConfig { rate: 5.0, ..LoadConfig::default() }, false).await?;
//! print!("{report}");
//! # Ok(()) }
//! ```

mod client;
mod config;
mod dist;
mod report;
mod request;

use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

pub use client::{LoadClient, prompt_text};
pub use config::{Api, LoadConfig, Protocol, parse_duration_arg, parse_rate_arg};
pub use dist::LengthDist;
pub use report::{LoadReport, Summary};
pub use request::{Outcome, RequestResult, RequestSpec};

/// Runs the load and returns the report. With `progress`, draws a progress bar on stderr.
pub async fn run(cfg: &LoadConfig, progress: bool) -> anyhow::Result<LoadReport> {
    if !(cfg.rate.is_finite() && cfg.rate > 0.0) {
        anyhow::bail!("--rate must be a positive number of requests per second");
    }
    let client = LoadClient::connect(cfg).await?;
    let schedule = cfg.schedule();
    let bar = if progress {
        let bar = ProgressBar::new(schedule.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} done, {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let slots = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
    let mut tasks = JoinSet::new();
    let mut skipped = 0u64;
    let start = Instant::now();
    for (seq, (at, spec)) in schedule.into_iter().enumerate() {
        tokio::time::sleep_until((start + at).into()).await;
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            skipped += 1;
            bar.inc(1);
            continue;
        };
        let client = client.clone();
        let timeout = cfg.timeout;
        let task_bar = bar.clone();
        tasks.spawn(async move {
            let sent_at = Instant::now();
            let seq = seq as u64;
            let res = match tokio::time::timeout(timeout, client.send(&spec, seq)).await {
                Ok(r) => r,
                Err(_) => RequestResult {
                    seq,
                    outcome: Outcome::Timeout,
                    status: None,
                    sent_at,
                    ttft: None,
                    last_token: None,
                    e2e: sent_at.elapsed(),
                    output_tokens: 0,
                    response_id: None,
                    error: Some(format!("no complete answer within {timeout:?}")),
                },
            };
            drop(permit);
            task_bar.inc(1);
            res
        });
        bar.set_message(format!(
            "{} in flight",
            cfg.concurrency.max(1) - slots.available_permits()
        ));
    }
    let mut results = Vec::with_capacity(tasks.len());
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(res) => results.push(res),
            Err(e) => anyhow::bail!("a request task failed: {e}"),
        }
    }
    bar.finish_and_clear();
    Ok(LoadReport::from_results(results, skipped, start.elapsed()))
}
