//! `loadgen`: open-loop Poisson load against the example servers (or any OpenAI-compatible
//! server), with a client-side latency table.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use infertrace_demo::loadgen::{self, Api, LengthDist, LoadConfig, Protocol};

/// Open-loop load generator: Poisson arrivals at --rate per second for --duration, prompt
/// and output lengths drawn from seeded distributions, over HTTP/SSE (OpenAI-compatible) or gRPC.
/// Prints client-side TTFT, TPOT and end-to-end percentiles and outcome counts, to compare with
/// what the server-side spans say.
///
/// Length distributions: `fixed:N`, `lognormal:MEDIAN:SIGMA[:MAX]` or `mix:SHARE:LONG:BASE`.
#[derive(Parser, Debug)]
#[command(name = "loadgen", version)]
struct Cli {
    /// Base URL of the server. Default: http://127.0.0.1:8080 (http), http://127.0.0.1:50051 (grpc).
    #[arg(long)]
    target: Option<String>,
    /// Transport.
    #[arg(long, value_enum, default_value_t = Protocol::Http)]
    protocol: Protocol,
    /// OpenAI endpoint (http only).
    #[arg(long, value_enum, default_value_t = Api::Chat)]
    api: Api,
    /// Model to ask for.
    #[arg(long, default_value = "llama-3.1-8b")]
    model: String,
    /// Mean arrivals per second.
    #[arg(long, default_value = "10", value_parser = loadgen::parse_rate_arg)]
    rate: f64,
    /// How long requests arrive: `10s`, `500ms`, `2m`, or a bare number of seconds.
    #[arg(long, default_value = "10s", value_parser = loadgen::parse_duration_arg)]
    duration: Duration,
    /// Most requests in flight; arrivals beyond it are skipped (and counted).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Prompt length distribution (tokens).
    #[arg(long, default_value = "lognormal:512:0.6:4096")]
    prompt_tokens: LengthDist,
    /// Output length distribution (tokens; sent as max_tokens with ignore_eos).
    #[arg(long, default_value = "lognormal:128:0.6:1024")]
    output_tokens: LengthDist,
    /// Ask for whole answers instead of streams (no TTFT/TPOT then).
    #[arg(long)]
    no_stream: bool,
    /// Let the server stop early instead of generating exactly the drawn length.
    #[arg(long)]
    no_ignore_eos: bool,
    /// Seed of arrivals and lengths.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Per-request timeout: `60s`, `2m`, or a bare number of seconds.
    #[arg(long, default_value = "60s", value_parser = loadgen::parse_duration_arg)]
    timeout: Duration,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.duration.is_zero() {
        anyhow::bail!("--duration must be longer than 0: no request would be sent");
    }
    if cli.timeout.is_zero() {
        anyhow::bail!("--timeout must be longer than 0: every request would time out");
    }
    let target = cli.target.unwrap_or_else(|| match cli.protocol {
        Protocol::Http => "http://127.0.0.1:8080".to_owned(),
        Protocol::Grpc => "http://127.0.0.1:50051".to_owned(),
    });
    let cfg = LoadConfig {
        target,
        protocol: cli.protocol,
        api: cli.api,
        model: cli.model,
        rate: cli.rate,
        duration: cli.duration,
        concurrency: cli.concurrency as usize,
        prompt_tokens: cli.prompt_tokens,
        output_tokens: cli.output_tokens,
        stream: !cli.no_stream,
        ignore_eos: !cli.no_ignore_eos,
        seed: cli.seed,
        timeout: cli.timeout,
    };
    let report = loadgen::run(&cfg, !cli.quiet).await?;
    print!("{report}");
    if report.sent == 0 {
        anyhow::bail!(
            "no request arrived within --duration {} at --rate {}: make either larger",
            humantime_secs(cfg.duration),
            cfg.rate
        );
    }
    if report.sent > 0 && report.count(loadgen::Outcome::Ok) == 0 {
        let why = report
            .results
            .iter()
            .find_map(|r| r.error.clone())
            .unwrap_or_default();
        anyhow::bail!(
            "no request succeeded (first error: {why}); is the server at {} running?",
            cfg.target
        );
    }
    Ok(())
}

/// `d` as `1.5s`.
fn humantime_secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e:#}");
            ExitCode::FAILURE
        }
    }
}
