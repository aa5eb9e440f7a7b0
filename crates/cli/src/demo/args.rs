//! The command line of `infertrace demo`: [`DemoArgs`] and the [`Scenario`]s.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::report::Format;

/// A workload whose bottleneck is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Moderate load well within capacity: no latency rule should fire. The simulated GPU reads
    /// nearly always busy, 97–100% (a continuously batching engine runs a step whenever a
    /// request is in flight, which is what "GPU utilisation" counts), which is reported as an
    /// info-level note only.
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
    /// The name `--scenario` takes (`long-prompts`), for what the demo prints.
    pub fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(|| format!("{self:?}"), |v| v.get_name().to_owned())
    }

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
    /// How long the load generator sends requests (e.g. 30s, 2m, or a bare number of seconds).
    #[arg(long, default_value = "30s", value_parser = infertrace_demo::loadgen::parse_duration_arg)]
    pub duration: Duration,
    /// Mean arrivals per second [default: the scenario's].
    #[arg(long, value_parser = infertrace_demo::loadgen::parse_rate_arg)]
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
