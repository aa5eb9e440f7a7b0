//! [`LoadConfig`]: what a load run sends, where, how fast and for how long, and the arrival
//! schedule it gives.

use std::time::Duration;

use clap::ValueEnum;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};

use super::dist::LengthDist;
use super::request::RequestSpec;

/// Transport of the load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    /// OpenAI-compatible HTTP (SSE when streaming).
    Http,
    /// The example `Generator` gRPC service.
    Grpc,
}

/// Which OpenAI endpoint (HTTP only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// Reads a command-line duration: humantime (`30s`, `500ms`, `2m`) or a bare number of seconds
/// (`10`, `0.5`), so `loadgen` and `demo` take the same spellings.
pub fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{s:?} is not a non-negative number of seconds"));
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("invalid duration {s:?} ({e}); write e.g. \"10s\", \"500ms\", \"2m\" or seconds")
    })
}

/// Reads a command-line rate of arrivals per second: a finite number above 0.
pub fn parse_rate_arg(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("{s:?} is not a rate above 0 (requests per second)")),
    }
}

/// A load run.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadConfig {
    /// Base URL: `http://127.0.0.1:8080` (HTTP) or `http://127.0.0.1:50051` (gRPC).
    pub target: String,
    /// Transport.
    pub protocol: Protocol,
    /// Endpoint (HTTP).
    pub api: Api,
    /// Model to ask for.
    pub model: String,
    /// Mean arrivals per second (Poisson).
    pub rate: f64,
    /// How long arrivals continue.
    pub duration: Duration,
    /// Most requests in flight at once.
    pub concurrency: usize,
    /// Prompt lengths.
    pub prompt_tokens: LengthDist,
    /// Output lengths (sent as `max_tokens`, with `ignore_eos` when set).
    pub output_tokens: LengthDist,
    /// Ask for streamed answers.
    pub stream: bool,
    /// Ask for exactly the drawn output length.
    pub ignore_eos: bool,
    /// Seed of arrivals and lengths.
    pub seed: u64,
    /// Per-request timeout (the client hangs up after it).
    pub timeout: Duration,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            target: "http://127.0.0.1:8080".to_owned(),
            protocol: Protocol::Http,
            api: Api::Chat,
            model: "llama-3.1-8b".to_owned(),
            rate: 10.0,
            duration: Duration::from_secs(10),
            concurrency: 256,
            prompt_tokens: LengthDist::LogNormal {
                median: 512.0,
                sigma: 0.6,
                max: 4096,
            },
            output_tokens: LengthDist::LogNormal {
                median: 128.0,
                sigma: 0.6,
                max: 1024,
            },
            stream: true,
            ignore_eos: true,
            seed: 7,
            timeout: Duration::from_secs(60),
        }
    }
}

impl LoadConfig {
    /// The arrival offsets and request specs of this run (deterministic given the seed).
    pub fn schedule(&self) -> Vec<(Duration, RequestSpec)> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut out = Vec::new();
        let Ok(exp) = Exp::new(self.rate) else {
            return out;
        };
        let mut t = 0.0f64;
        loop {
            t += exp.sample(&mut rng);
            let at = Duration::from_secs_f64(t.min(1e9));
            if !t.is_finite() || at >= self.duration {
                return out;
            }
            let spec = RequestSpec {
                model: self.model.clone(),
                prompt_tokens: self.prompt_tokens.sample(&mut rng),
                max_tokens: self.output_tokens.sample(&mut rng),
                stream: self.stream,
                ignore_eos: self.ignore_eos,
                cancel_after_tokens: None,
            };
            out.push((at, spec));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_is_poisson_and_deterministic() {
        let cfg = LoadConfig {
            rate: 200.0,
            duration: Duration::from_secs(10),
            ..LoadConfig::default()
        };
        let a = cfg.schedule();
        assert_eq!(a, cfg.schedule());
        // 2000 expected arrivals; a Poisson count's σ is √2000 ≈ 45.
        assert!((1800..2200).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].0 <= w[1].0));
        assert!(a.iter().all(|(t, _)| *t < cfg.duration));
        // Exponential gaps: the share of gaps above the mean is e^-1 ≈ 0.37.
        let mean = 1.0 / cfg.rate;
        let above = a
            .windows(2)
            .filter(|w| (w[1].0 - w[0].0).as_secs_f64() > mean)
            .count() as f64
            / (a.len() - 1) as f64;
        assert!((0.32..0.42).contains(&above), "{above}");
        let other = LoadConfig {
            seed: 8,
            ..cfg.clone()
        }
        .schedule();
        assert_ne!(a, other);
    }

    #[test]
    fn durations_read_as_humantime_or_seconds() {
        assert_eq!(parse_duration_arg("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration_arg("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration_arg("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration_arg("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration_arg(" 0.5 "), Ok(Duration::from_millis(500)));
        assert!(parse_duration_arg("-1").is_err());
        assert!(parse_duration_arg("soon").unwrap_err().contains("10s"));
        assert_eq!(parse_rate_arg("2.5"), Ok(2.5));
        for bad in ["0", "-1", "inf", "NaN", "fast"] {
            assert!(parse_rate_arg(bad).is_err(), "{bad}");
        }
    }
}
