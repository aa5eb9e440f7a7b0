//! [`LoadReport`]: client-side latency percentiles and outcome counts of a load run.

use std::fmt;
use std::time::Duration;

use super::request::{Outcome, RequestResult};

/// Exact summary statistics of a set of durations (nearest-rank percentiles).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    /// Samples.
    pub count: usize,
    /// Mean.
    pub mean: Duration,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Largest.
    pub max: Duration,
}

impl Summary {
    /// Summarises `samples` (sorted in place).
    pub fn of(samples: &mut [Duration]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let n = samples.len();
        let rank = |p: f64| samples[((p / 100.0 * n as f64).ceil() as usize).clamp(1, n) - 1];
        let total: Duration = samples.iter().sum();
        Self {
            count: n,
            mean: total / u32::try_from(n).unwrap_or(u32::MAX),
            p50: rank(50.0),
            p90: rank(90.0),
            p99: rank(99.0),
            max: samples[n - 1],
        }
    }
}

/// The result of a load run.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    /// Wall time from the first arrival to the last answer.
    pub wall: Duration,
    /// Requests sent (arrivals not skipped).
    pub sent: u64,
    /// Count per outcome, in [`Outcome::ALL`] order.
    pub outcomes: [u64; 6],
    /// Time to first token of streamed successful requests.
    pub ttft: Summary,
    /// Time per output token (after the first) of streamed successful requests with ≥ 2 tokens.
    pub tpot: Summary,
    /// End-to-end latency of successful requests.
    pub e2e: Summary,
    /// Output tokens received.
    pub output_tokens: u64,
    /// Every request's result, in arrival order.
    pub results: Vec<RequestResult>,
}

impl LoadReport {
    /// Builds the report from per-request results.
    pub fn from_results(mut results: Vec<RequestResult>, skipped: u64, wall: Duration) -> Self {
        results.sort_by_key(|r| r.seq);
        let mut outcomes = [0u64; 6];
        outcomes[5] = skipped;
        let (mut ttft, mut tpot, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
        let mut output_tokens = 0;
        for r in &results {
            if let Some(i) = Outcome::ALL.iter().position(|o| *o == r.outcome) {
                outcomes[i] += 1;
            }
            output_tokens += u64::from(r.output_tokens);
            if r.outcome == Outcome::Ok {
                e2e.push(r.e2e);
                ttft.extend(r.ttft);
                tpot.extend(r.tpot());
            }
        }
        Self {
            wall,
            sent: results.len() as u64,
            outcomes,
            ttft: Summary::of(&mut ttft),
            tpot: Summary::of(&mut tpot),
            e2e: Summary::of(&mut e2e),
            output_tokens,
            results,
        }
    }

    /// Requests that ended with `outcome`.
    pub fn count(&self, outcome: Outcome) -> u64 {
        Outcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .map_or(0, |i| self.outcomes[i])
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

impl fmt::Display for LoadReport {
    /// The final table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.wall.as_secs_f64().max(1e-9);
        writeln!(
            f,
            "requests: {} sent in {:.1} s ({:.1}/s), {} output tokens ({:.0} tok/s)",
            self.sent,
            secs,
            self.sent as f64 / secs,
            self.output_tokens,
            self.output_tokens as f64 / secs
        )?;
        let counts: Vec<String> = Outcome::ALL
            .iter()
            .zip(self.outcomes)
            .map(|(o, n)| format!("{} {n}", o.as_str()))
            .collect();
        writeln!(f, "outcomes: {}", counts.join(", "))?;
        writeln!(
            f,
            "{:<12} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "client-side", "count", "mean ms", "p50 ms", "p90 ms", "p99 ms", "max ms"
        )?;
        for (name, s) in [
            ("TTFT", &self.ttft),
            ("TPOT", &self.tpot),
            ("e2e", &self.e2e),
        ] {
            writeln!(
                f,
                "{:<12} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
                name,
                s.count,
                ms(s.mean),
                ms(s.p50),
                ms(s.p90),
                ms(s.p99),
                ms(s.max)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut xs: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let s = Summary::of(&mut xs);
        assert_eq!(s.count, 100);
        assert_eq!(s.p50, Duration::from_millis(50));
        assert_eq!(s.p90, Duration::from_millis(90));
        assert_eq!(s.p99, Duration::from_millis(99));
        assert_eq!(s.max, Duration::from_millis(100));
        assert_eq!(s.mean, Duration::from_micros(50_500));
        assert_eq!(Summary::of(&mut []), Summary::default());
        let mut one = [Duration::from_millis(3)];
        assert_eq!(Summary::of(&mut one).p99, Duration::from_millis(3));
    }
}
