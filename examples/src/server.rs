//! What the server binaries share: [`ServerOptions`] (command-line flags), the simulator and
//! layer they build, [`Telemetry`] (logs + OTLP from the standard environment variables) and
//! [`shutdown_signal`].

use clap::{Args, ValueEnum};
use infertrace_sim::SimConfig;
use infertrace_tower::otlp::{self, OtlpConfig, OtlpProviders};
use infertrace_tower::{AdmissionConfig, InferenceTraceLayer, PhaseSource};

/// Where phase boundaries come from (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// The simulator marks scheduled / first token / tokens through the `RequestRecorder`.
    Engine,
    /// No engine marks: the layer's admission queue gives the queue phase and the response body
    /// gives prefill (until the first chunk) and decode (until the end of the stream).
    Derived,
}

/// Flags shared by `axum-server`, `tonic-server` and `hyper-server`.
#[derive(Args, Clone, Debug)]
pub struct ServerOptions {
    /// Model name served (requests naming another model get 404 / NOT_FOUND).
    #[arg(long, default_value = "llama-3.1-8b")]
    pub model: String,
    /// Maximum sequences in the engine's running batch (vLLM `max_num_seqs`).
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    /// Maximum tokens per engine step (vLLM `max_num_batched_tokens`).
    #[arg(long, default_value_t = 8192)]
    pub max_batched_tokens: u32,
    /// Chunked prefill: prompt chunks share steps with decodes (no inter-token stalls).
    #[arg(long)]
    pub chunked_prefill: bool,
    /// Where the spans' phase boundaries come from.
    #[arg(long, value_enum, default_value_t = Mode::Engine)]
    pub mode: Mode,
    /// Layer admission queue: requests served at once. Default: none in engine mode, the
    /// engine's --max-batch in derived mode (so the queue phase is the layer's).
    #[arg(long)]
    pub max_concurrent: Option<usize>,
    /// Layer admission queue: requests allowed to wait; beyond it requests are rejected with 429
    /// / RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 1024)]
    pub max_queue: usize,
    /// Seed of the simulator's random choices (output lengths, errors, text).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Multiplies every simulated step duration (0.1 = ten times faster than the cost model).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Probability that a request fails with an injected engine error.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Do not export OTLP (spans and metrics are still computed, then dropped).
    #[arg(long)]
    pub no_otlp: bool,
}

impl ServerOptions {
    /// The simulator configuration these flags describe.
    pub fn sim_config(&self) -> SimConfig {
        SimConfig {
            model: self.model.clone(),
            max_num_seqs: self.max_batch,
            max_batched_tokens: self.max_batched_tokens,
            chunked_prefill: self.chunked_prefill,
            seed: self.seed,
            time_scale: self.time_scale,
            error_rate: self.error_rate,
            ..SimConfig::default()
        }
    }

    /// The admission queue these flags ask for, if any.
    pub fn admission(&self) -> Option<AdmissionConfig> {
        let concurrent = match (self.max_concurrent, self.mode) {
            (Some(n), _) => n,
            (None, Mode::Derived) => self.max_batch,
            (None, Mode::Engine) => return None,
        };
        Some(AdmissionConfig::new(concurrent.max(1), self.max_queue))
    }

    /// The layer these flags describe, on the global tracer and meter providers.
    pub fn layer(&self) -> InferenceTraceLayer {
        let source = match self.mode {
            Mode::Engine => PhaseSource::Engine,
            Mode::Derived => PhaseSource::Derived,
        };
        let mut layer = InferenceTraceLayer::new()
            .phase_source(source)
            .default_model(self.model.clone());
        if let Some(a) = self.admission() {
            layer = layer.admission(a);
        }
        layer
    }
}

/// Logging and OTLP export of a server binary. Call [`shutdown`](Self::shutdown) at exit to
/// flush pending spans and metrics.
#[derive(Debug)]
pub struct Telemetry {
    providers: Option<OtlpProviders>,
}

impl Telemetry {
    /// Installs a `tracing` log subscriber (`RUST_LOG`, default `info`) and, unless `otlp` is
    /// false, global OTLP tracer and meter providers configured by the standard `OTEL_*`
    /// variables. `service_name` is used when neither `OTEL_SERVICE_NAME` nor
    /// `OTEL_RESOURCE_ATTRIBUTES` names the service. Must run inside a tokio runtime.
    pub fn init(service_name: &str, otlp: bool) -> anyhow::Result<Self> {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        // A second init (tests) keeps the first subscriber.
        let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
        if !otlp {
            return Ok(Self { providers: None });
        }
        let env_names_service = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
        let mut config = OtlpConfig::from_env();
        if !env_names_service {
            config = config.service_name(service_name);
        }
        let providers = otlp::init(config).map_err(|e| {
            anyhow::anyhow!("{e} (set OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_PROTOCOL, or pass --no-otlp)")
        })?;
        providers.install_global();
        tracing::info!(
            endpoint = %std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_else(|_| "default (localhost)".into()),
            "exporting OTLP traces and metrics"
        );
        Ok(Self {
            providers: Some(providers),
        })
    }

    /// Flushes and shuts the providers down, logging (not failing on) export errors.
    pub fn shutdown(self) {
        if let Some(p) = self.providers
            && let Err(e) = p.shutdown()
        {
            tracing::warn!(error = %e, "flushing telemetry at shutdown failed");
        }
    }
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    tracing::info!("shutting down: finishing open requests and flushing spans");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        opts: ServerOptions,
    }

    #[test]
    fn derived_mode_gets_an_admission_queue_sized_like_the_batch() {
        let cli = Cli::parse_from(["x", "--mode", "derived", "--max-batch", "16"]);
        assert_eq!(cli.opts.admission(), Some(AdmissionConfig::new(16, 1024)));
        let cli = Cli::parse_from(["x"]);
        assert_eq!(cli.opts.admission(), None);
        assert_eq!(cli.opts.sim_config().max_num_seqs, 64);
        let cli = Cli::parse_from(["x", "--max-concurrent", "3", "--max-queue", "0"]);
        assert_eq!(cli.opts.admission(), Some(AdmissionConfig::new(3, 0)));
    }
}
