//! What a diagnosis says: [`Finding`]s with their [`Severity`] and [`Evidence`], and how the rules
//! put numbers into words (`850 ms`, `42%`).

use serde::{Deserialize, Serialize};

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; nothing is broken.
    Info,
    /// Latency, cost or capacity is off; act soon.
    Warning,
    /// Users are affected now (SLO breached, errors).
    Critical,
}

impl Severity {
    /// Lower-case name (`info`, `warning`, `critical`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Warning => "warning",
            Self::Critical => "critical",
        }
    }
}

/// One number behind a finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evidence {
    /// What was measured, as a KPI path (`phase_share.p90.queue`, `ttft.p90`, …).
    pub metric: String,
    /// The measured value.
    pub value: f64,
    /// The threshold it was compared with, if any.
    pub threshold: Option<f64>,
    /// Unit of `value` and `threshold`: `s`, `ratio` (a share, shown in %), `x` (a multiple,
    /// shown as 4.8×), `1/s`, `requests`.
    pub unit: &'static str,
}

/// A diagnosis: what is wrong, the numbers, and what to change.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// Stable rule id (see the module table).
    pub rule_id: &'static str,
    /// Severity.
    pub severity: Severity,
    /// Series service.
    pub service: String,
    /// Series model.
    pub model: String,
    /// Series operation (empty when series are not split by operation).
    pub operation: String,
    /// One line citing the numbers.
    pub title: String,
    /// The numbers.
    pub evidence: Vec<Evidence>,
    /// What to change, concretely.
    pub recommendation: String,
}

/// A series the rules did not judge: fewer requests in the window than
/// [`DiagnosisConfig::min_requests`](super::DiagnosisConfig::min_requests) (only the
/// throughput floor speaks below it). Reports say so, rather than "no problems found".
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Undiagnosed {
    /// Series service.
    pub service: String,
    /// Series model.
    pub model: String,
    /// Series operation (empty when series are not split by operation).
    pub operation: String,
    /// Its requests in the window.
    pub requests: u64,
}

/// One piece of [`Evidence`].
pub(super) fn ev(
    metric: impl Into<String>,
    value: f64,
    threshold: Option<f64>,
    unit: &'static str,
) -> Evidence {
    Evidence {
        metric: metric.into(),
        value,
        threshold,
        unit,
    }
}

/// Seconds for people: `850 ms`, `1.24 s`.
pub(super) fn secs(v: f64) -> String {
    if v.abs() < 1.0 {
        format!("{:.0} ms", v * 1e3)
    } else {
        format!("{v:.2} s")
    }
}

/// A rate to three significant digits (`1234`, `56.7`, `1.23`, `0.0183`): a quiet model's
/// 0.2 requests a second reads as such, not as `0.00`. Reports format their rates with it too.
pub fn format_rate(v: f64) -> String {
    let magnitude = v.abs();
    if !v.is_finite() || magnitude == 0.0 || magnitude >= 100.0 {
        return format!("{v:.0}");
    }
    let decimals = (2 - magnitude.log10().floor() as i32).clamp(0, 12) as usize;
    format!("{v:.decimals$}")
}

/// A ratio as a percentage: `42%`, `0.5%`.
pub(super) fn pct(v: f64) -> String {
    let p = v * 100.0;
    if p.abs() >= 10.0 || p == 0.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

/// `v` and its `target` as percentages that read apart: with more decimals where [`pct`]
/// would print both alike (a goodput of 89.7 % under a 90 % target is not "90% (target 90%)").
pub(super) fn pcts_apart(v: f64, target: f64) -> (String, String) {
    let (a, b) = (pct(v), pct(target));
    if a != b || v == target {
        return (a, b);
    }
    for decimals in 1..=3 {
        let (a, b) = (
            format!("{:.decimals$}%", v * 100.0),
            format!("{:.decimals$}%", target * 100.0),
        );
        if a != b {
            return (a, b);
        }
    }
    (a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_numbers_for_people() {
        assert_eq!(secs(0.25), "250 ms");
        assert_eq!(secs(1.234), "1.23 s");
        assert_eq!(pct(0.423), "42%");
        assert_eq!(pct(0.005), "0.5%");
        assert_eq!(pct(0.0), "0%");
    }

    #[test]
    fn a_value_and_its_target_read_apart() {
        // Not "90% (target 90%)".
        assert_eq!(pcts_apart(0.897, 0.9), ("89.7%".into(), "90.0%".into()));
        assert_eq!(pcts_apart(0.42, 0.9), ("42%".into(), "90%".into()));
        assert_eq!(pcts_apart(0.9, 0.9), ("90%".into(), "90%".into()));
    }
}
