//! What the server binaries share: [`ServerOptions`] (command-line flags), the simulator, GPU /
//! host telemetry and layer they build, [`Telemetry`] (logs + OTLP from the standard environment variables) and
//! [`shutdown_signal`] / [`ShutdownSignals`].

use std::time::Duration;

use clap::{Args, ValueEnum};
use infertrace_gpu::{GpuSamplerConfig, GpuTelemetry, HostSamplerConfig, TelemetryConfig};
use infertrace_sim::{SimConfig, SimHandle, SimulatedGpu};
use infertrace_tower::otlp::{self, OtlpConfig, OtlpProviders};
use infertrace_tower::{AdmissionConfig, InferenceTraceLayer, PhaseSource};

/// Where phase boundaries come from (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// The simulator marks scheduled / first token / tokens on the `RequestRecorder` (through
    /// [`EngineMarks`](crate::EngineMarks)).
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
    /// Sample NVIDIA GPUs through NVML (the default; where NVML does not load, one log line says
    /// why and GPU telemetry is off).
    #[arg(long, overrides_with = "no_gpu")]
    pub gpu: bool,
    /// Do not sample GPUs.
    #[arg(long, overrides_with = "gpu")]
    pub no_gpu: bool,
    /// Sample a *simulated* H100 driven by this server's simulated engine instead of NVML
    /// (utilisation = the engine's busy fraction; for machines without a GPU).
    #[arg(long, conflicts_with = "no_gpu")]
    pub simulated_gpu: bool,
    /// Time between GPU and host counter samples (e.g. 100ms, 1s).
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub sample_interval: Duration,
    /// Do not sample host and process counters (CPU, memory) onto the phase spans.
    #[arg(long)]
    pub no_host_counters: bool,
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

    /// What [`gpu_telemetry`](Self::gpu_telemetry) starts for real GPUs (`--gpu`,
    /// `--no-gpu`, `--sample-interval`, `--no-host-counters`).
    pub fn telemetry_config(&self) -> TelemetryConfig {
        TelemetryConfig {
            gpu: !self.no_gpu,
            gpu_sampler: GpuSamplerConfig {
                interval: self.sample_interval,
                ..GpuSamplerConfig::default()
            },
            host: !self.no_host_counters,
            host_sampler: HostSamplerConfig {
                interval: self.sample_interval,
                ..HostSamplerConfig::default()
            },
        }
    }

    /// Starts the GPU and host samplers these flags ask for: a [`SimulatedGpu`] following `sim`
    /// with `--simulated-gpu`, else NVML (falling back to no GPU where it does not load). Blocks
    /// while NVML loads: call it once, at startup.
    pub fn gpu_telemetry(&self, sim: &SimHandle) -> GpuTelemetry {
        if self.simulated_gpu {
            return SimulatedGpu::telemetry(
                sim.clone(),
                self.sample_interval,
                !self.no_host_counters,
            );
        }
        GpuTelemetry::start(&self.telemetry_config())
    }

    /// The layer these flags describe, on the global tracer and meter providers (see
    /// [`Telemetry::attach`] for OTLP export), with the GPU and host telemetry of
    /// [`gpu_telemetry`](Self::gpu_telemetry) (started here).
    pub fn layer(&self, sim: &SimHandle) -> InferenceTraceLayer {
        self.layer_without_telemetry()
            .gpu_telemetry(self.gpu_telemetry(sim))
    }

    /// The layer these flags describe, without GPU or host counters.
    pub fn layer_without_telemetry(&self) -> InferenceTraceLayer {
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
    /// variables (give the layer to [`attach`](Self::attach) to export its spans directly). `service_name` is used when neither `OTEL_SERVICE_NAME` nor
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

    /// `layer`, exporting through these providers: with OTLP on, its spans go straight to the
    /// OTLP batch processor (the direct path, [`InferenceTraceLayer::with_otlp`]) and its
    /// metrics to the OTLP meter provider; with `--no-otlp`, `layer` unchanged (global no-op
    /// providers).
    pub fn attach(&self, layer: InferenceTraceLayer) -> InferenceTraceLayer {
        match &self.providers {
            Some(providers) => layer.with_otlp(providers),
            None => layer,
        }
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

/// Ctrl-C (SIGINT) and SIGTERM, listened for from the moment [`ShutdownSignals::install`]
/// returns: a signal that arrives before anything awaits it is kept for [`recv`](Self::recv),
/// not left to its default action (the process killed with no stop at all). Install it before
/// the process says it is ready.
pub struct ShutdownSignals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    /// Starts listening for SIGINT and SIGTERM (must run within a Tokio runtime). A signal whose
    /// handler cannot be installed is never received.
    pub fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Self {
                interrupt: signal(SignalKind::interrupt()).ok(),
                terminate: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Completes at the next SIGINT or SIGTERM (on other systems, Ctrl-C), including one that
    /// arrived since [`install`](Self::install) or the previous call.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                let received = match s {
                    Some(s) => s.recv().await.is_some(),
                    None => false,
                };
                if !received {
                    std::future::pending::<()>().await;
                }
            }
            tokio::select! {
                () = next(&mut self.interrupt) => {}
                () = next(&mut self.terminate) => {}
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Completes on Ctrl-C or SIGTERM. The handlers are installed when this is called, not when
/// the future is first polled, so a signal sent as soon as a server is up still stops it.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut signals = ShutdownSignals::install();
    async move {
        signals.recv().await;
        tracing::info!(
            target: "infertrace",
            "shutting down: finishing open requests and flushing spans"
        );
    }
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

    #[test]
    fn gpu_and_host_counters_are_on_by_default() {
        let cli = Cli::parse_from(["x"]);
        let c = cli.opts.telemetry_config();
        assert!(c.gpu && c.host && !cli.opts.simulated_gpu);
        assert_eq!(c.gpu_sampler.interval, Duration::from_millis(100));
        assert_eq!(c.host_sampler.interval, Duration::from_millis(100));
        let cli = Cli::parse_from([
            "x",
            "--no-gpu",
            "--no-host-counters",
            "--sample-interval",
            "250ms",
        ]);
        let c = cli.opts.telemetry_config();
        assert!(!c.gpu && !c.host);
        assert_eq!(c.gpu_sampler.interval, Duration::from_millis(250));
        // The last of --gpu / --no-gpu wins.
        let cli = Cli::parse_from(["x", "--no-gpu", "--gpu"]);
        assert!(cli.opts.telemetry_config().gpu);
        assert!(Cli::try_parse_from(["x", "--no-gpu", "--simulated-gpu"]).is_err());
    }

    #[tokio::test]
    async fn simulated_gpu_flag_samples_the_simulated_engine() {
        let cli = Cli::parse_from(["x", "--simulated-gpu", "--no-host-counters"]);
        let sim = infertrace_sim::Simulator::start(cli.opts.sim_config()).unwrap();
        let t = cli.opts.gpu_telemetry(&sim);
        assert!(
            t.gpu_unavailable().is_none(),
            "a simulated GPU is always available"
        );
        assert!(t.host().is_none());
        let uuids: Vec<String> = t
            .gpu()
            .unwrap()
            .devices()
            .map(|d| d.uuid.to_string())
            .collect();
        assert_eq!(uuids, [infertrace_sim::SIMULATED_GPU_UUID]);
    }

    #[tokio::test]
    async fn attach_exports_directly_when_otlp_is_on() {
        let providers = otlp::init(
            OtlpConfig::http("http://127.0.0.1:1")
                .service_name("t")
                .metrics(false),
        )
        .unwrap();
        let on = Telemetry {
            providers: Some(providers),
        };
        let layer = on.attach(InferenceTraceLayer::new());
        assert!(format!("{layer:?}").contains("direct_export: true"));
        let off = Telemetry { providers: None };
        let layer = off.attach(InferenceTraceLayer::new());
        assert!(format!("{layer:?}").contains("direct_export: false"));
        // Nothing was recorded, so shutting down sends nothing to the closed port.
        on.shutdown();
    }
}
