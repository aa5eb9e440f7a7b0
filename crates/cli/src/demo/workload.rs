//! The engine and load of each scenario, whose bottleneck is known.

use std::time::Duration;

use infertrace_demo::loadgen::{LengthDist, LoadConfig};
use infertrace_sim::SimConfig;

use super::args::Scenario;

/// The engine and load of a scenario.
pub(super) struct Workload {
    pub(super) sim: SimConfig,
    pub(super) load: LoadConfig,
    pub(super) description: &'static str,
}

/// The model every scenario serves.
pub(super) const MODEL: &str = "llama-3.1-8b";
/// How often the demo samples its simulated GPU and the host.
pub(super) const GPU_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

pub(super) fn workload(
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
