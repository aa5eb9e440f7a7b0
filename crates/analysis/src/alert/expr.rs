//! Alert expressions: `<kpi> <op> <value>` over a series' KPIs, and `for:` durations.
//!
//! KPI paths name a number of [`SeriesKpis`]:
//!
//! | path | unit |
//! |---|---|
//! | `e2e`, `queue`, `ttft`, `prefill`, `decode`, `tpot`, `itl` `.p50` `.p90` `.p95` `.p99` `.max` `.mean` | seconds |
//! | `gpu.utilization.mean` (duration-weighted over the phases), `gpu.utilization.queue` / `.prefill` / `.decode` | ratio |
//! | `gpu.energy_per_output_token` | joules |
//! | `error_rate`, `rejection_rate`, `cancel_rate`, `goodput.ratio` | ratio |
//! | `phase_share.all` / `.p90` / `.p99` `.queue` / `.prefill` / `.decode` | ratio |
//! | `throughput.requests_per_second`, `.input_tokens_per_second`, `.output_tokens_per_second`, `goodput.requests_per_second` | per second |
//! | `requests` | count |
//!
//! Operators: `>` `>=` `<` `<=` `==` `!=`. Values: a number, with a unit where it fits the KPI:
//! durations (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`) for seconds KPIs, `%` for ratios
//! (`95%` = `0.95`). A bare number is in the KPI's unit (seconds, ratio, …).

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::diagnosis::gpu_utilization_mean;
use crate::kpi::{LatencyStats, PhaseShare, SeriesKpis};

/// What a KPI's value measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KpiUnit {
    /// Seconds (accepts duration units).
    Seconds,
    /// A fraction 0–1 (accepts `%`).
    Ratio,
    /// Per second.
    PerSecond,
    /// A count.
    Count,
    /// Joules.
    Joules,
}

/// A latency distribution of [`SeriesKpis`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Latency {
    /// `e2e`.
    E2e,
    /// `queue`.
    Queue,
    /// `ttft`.
    Ttft,
    /// `prefill`.
    Prefill,
    /// `decode`.
    Decode,
    /// `tpot`.
    Tpot,
    /// `itl`.
    Itl,
}

/// A statistic of a latency distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stat {
    /// `p50`.
    P50,
    /// `p90`.
    P90,
    /// `p95`.
    P95,
    /// `p99`.
    P99,
    /// `max`.
    Max,
    /// `mean`.
    Mean,
}

/// One of the three phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// `queue`.
    Queue,
    /// `prefill`.
    Prefill,
    /// `decode`.
    Decode,
}

/// Which requests a phase share covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tail {
    /// `all`.
    All,
    /// `p90`.
    P90,
    /// `p99`.
    P99,
}

/// A number of [`SeriesKpis`], named by a dotted path (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KpiPath {
    /// `<latency>.<stat>`.
    Latency(Latency, Stat),
    /// `gpu.utilization.mean`.
    GpuUtilizationMean,
    /// `gpu.utilization.<phase>`.
    GpuUtilization(Phase),
    /// `gpu.energy_per_output_token`.
    GpuEnergyPerOutputToken,
    /// `error_rate`.
    ErrorRate,
    /// `rejection_rate`.
    RejectionRate,
    /// `cancel_rate`.
    CancelRate,
    /// `requests`.
    Requests,
    /// `goodput.ratio`.
    GoodputRatio,
    /// `goodput.requests_per_second`.
    GoodputRequestsPerSecond,
    /// `phase_share.<tail>.<phase>`.
    PhaseShare(Tail, Phase),
    /// `throughput.requests_per_second`.
    RequestsPerSecond,
    /// `throughput.input_tokens_per_second`.
    InputTokensPerSecond,
    /// `throughput.output_tokens_per_second`.
    OutputTokensPerSecond,
}

const LATENCIES: [(&str, Latency); 7] = [
    ("e2e", Latency::E2e),
    ("queue", Latency::Queue),
    ("ttft", Latency::Ttft),
    ("prefill", Latency::Prefill),
    ("decode", Latency::Decode),
    ("tpot", Latency::Tpot),
    ("itl", Latency::Itl),
];
const STATS: [(&str, Stat); 6] = [
    ("p50", Stat::P50),
    ("p90", Stat::P90),
    ("p95", Stat::P95),
    ("p99", Stat::P99),
    ("max", Stat::Max),
    ("mean", Stat::Mean),
];
const PHASES: [(&str, Phase); 3] = [
    ("queue", Phase::Queue),
    ("prefill", Phase::Prefill),
    ("decode", Phase::Decode),
];
const TAILS: [(&str, Tail); 3] = [("all", Tail::All), ("p90", Tail::P90), ("p99", Tail::P99)];
const SCALARS: [(&str, KpiPath); 10] = [
    ("gpu.utilization.mean", KpiPath::GpuUtilizationMean),
    (
        "gpu.energy_per_output_token",
        KpiPath::GpuEnergyPerOutputToken,
    ),
    ("error_rate", KpiPath::ErrorRate),
    ("rejection_rate", KpiPath::RejectionRate),
    ("cancel_rate", KpiPath::CancelRate),
    ("requests", KpiPath::Requests),
    ("goodput.ratio", KpiPath::GoodputRatio),
    (
        "goodput.requests_per_second",
        KpiPath::GoodputRequestsPerSecond,
    ),
    ("throughput.requests_per_second", KpiPath::RequestsPerSecond),
    (
        "throughput.input_tokens_per_second",
        KpiPath::InputTokensPerSecond,
    ),
];

fn lookup<T: Copy>(table: &[(&str, T)], key: &str) -> Option<T> {
    table.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

fn names<T>(table: &[(&str, T)]) -> String {
    table.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
}

fn name_of<T: PartialEq>(table: &[(&'static str, T)], v: &T) -> &'static str {
    table.iter().find(|(_, t)| t == v).map_or("?", |(k, _)| k)
}

impl KpiPath {
    /// Parses a dotted path; `Err` says what is known at the point it went wrong.
    pub fn parse(path: &str) -> Result<Self, String> {
        if let Some(p) = lookup(&SCALARS, path) {
            return Ok(p);
        }
        if path == "throughput.output_tokens_per_second" {
            return Ok(Self::OutputTokensPerSecond);
        }
        let mut parts = path.split('.');
        let head = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        if let Some(l) = lookup(&LATENCIES, head) {
            return match rest.as_slice() {
                [s] => lookup(&STATS, s)
                    .map(|s| Self::Latency(l, s))
                    .ok_or_else(|| {
                        format!(
                            "unknown statistic '{s}' of {head}; known: {}",
                            names(&STATS)
                        )
                    }),
                _ => Err(format!(
                    "'{head}' needs one statistic: {head}.p95 ({})",
                    names(&STATS)
                )),
            };
        }
        match (head, rest.as_slice()) {
            ("gpu", ["utilization", p]) => {
                lookup(&PHASES, p).map(Self::GpuUtilization).ok_or_else(|| {
                    format!("unknown GPU utilisation '{p}'; known: mean, queue, prefill, decode")
                })
            }
            ("phase_share", [t, p]) => match (lookup(&TAILS, t), lookup(&PHASES, p)) {
                (Some(t), Some(p)) => Ok(Self::PhaseShare(t, p)),
                (None, _) => Err(format!(
                    "unknown phase share tail '{t}'; known: {}",
                    names(&TAILS)
                )),
                (_, None) => Err(format!("unknown phase '{p}'; known: {}", names(&PHASES))),
            },
            ("phase_share", _) => {
                Err("phase shares are phase_share.<all|p90|p99>.<queue|prefill|decode>".into())
            }
            _ => Err(format!(
                "unknown KPI '{path}'; known: <{}>.<{}>, {}, throughput.output_tokens_per_second, \
                 gpu.utilization.<queue|prefill|decode>, phase_share.<all|p90|p99>.<queue|prefill|decode>",
                names(&LATENCIES),
                names(&STATS),
                names(&SCALARS),
            )),
        }
    }

    /// The canonical dotted path.
    pub fn name(&self) -> String {
        match self {
            Self::Latency(l, s) => format!("{}.{}", name_of(&LATENCIES, l), name_of(&STATS, s)),
            Self::GpuUtilization(p) => format!("gpu.utilization.{}", name_of(&PHASES, p)),
            Self::PhaseShare(t, p) => {
                format!("phase_share.{}.{}", name_of(&TAILS, t), name_of(&PHASES, p))
            }
            Self::OutputTokensPerSecond => "throughput.output_tokens_per_second".into(),
            other => name_of(&SCALARS, other).into(),
        }
    }

    /// The unit of the value.
    pub fn unit(&self) -> KpiUnit {
        match self {
            Self::Latency(..) => KpiUnit::Seconds,
            Self::GpuUtilizationMean
            | Self::GpuUtilization(_)
            | Self::ErrorRate
            | Self::RejectionRate
            | Self::CancelRate
            | Self::GoodputRatio
            | Self::PhaseShare(..) => KpiUnit::Ratio,
            Self::GpuEnergyPerOutputToken => KpiUnit::Joules,
            Self::Requests => KpiUnit::Count,
            Self::GoodputRequestsPerSecond
            | Self::RequestsPerSecond
            | Self::InputTokensPerSecond
            | Self::OutputTokensPerSecond => KpiUnit::PerSecond,
        }
    }

    /// The value in a series, `None` when the window has none (no requests with that data).
    pub fn value(&self, s: &SeriesKpis) -> Option<f64> {
        let rate = |n: u64| (s.requests > 0).then(|| n as f64 / s.requests as f64);
        match *self {
            Self::Latency(l, stat) => {
                let d: Option<LatencyStats> = match l {
                    Latency::E2e => s.e2e,
                    Latency::Queue => s.queue,
                    Latency::Ttft => s.ttft,
                    Latency::Prefill => s.prefill,
                    Latency::Decode => s.decode,
                    Latency::Tpot => s.tpot,
                    Latency::Itl => s.itl,
                };
                d.map(|d| match stat {
                    Stat::P50 => d.p50,
                    Stat::P90 => d.p90,
                    Stat::P95 => d.p95,
                    Stat::P99 => d.p99,
                    Stat::Max => d.max,
                    Stat::Mean => d.mean,
                })
            }
            Self::GpuUtilizationMean => gpu_utilization_mean(s),
            Self::GpuUtilization(p) => s.gpu.and_then(|g| match p {
                Phase::Queue => g.utilization_mean.queue,
                Phase::Prefill => g.utilization_mean.prefill,
                Phase::Decode => g.utilization_mean.decode,
            }),
            Self::GpuEnergyPerOutputToken => s.gpu.and_then(|g| g.energy_per_output_token_joules),
            Self::ErrorRate => rate(s.errors),
            Self::RejectionRate => rate(s.rejected),
            Self::CancelRate => rate(s.cancelled),
            Self::Requests => Some(s.requests as f64),
            Self::GoodputRatio => s.goodput.ratio,
            Self::GoodputRequestsPerSecond => Some(s.goodput.requests_per_second),
            Self::PhaseShare(t, p) => {
                let share: Option<PhaseShare> = match t {
                    Tail::All => s.phase_share.all,
                    Tail::P90 => s.phase_share.p90,
                    Tail::P99 => s.phase_share.p99,
                };
                share.map(|sh| match p {
                    Phase::Queue => sh.queue,
                    Phase::Prefill => sh.prefill,
                    Phase::Decode => sh.decode,
                })
            }
            Self::RequestsPerSecond => Some(s.throughput.requests_per_second),
            Self::InputTokensPerSecond => Some(s.throughput.input_tokens_per_second),
            Self::OutputTokensPerSecond => Some(s.throughput.output_tokens_per_second),
        }
    }

    /// The value for a series with no request in the window: 0 for a count or a rate of
    /// requests or tokens, `None` (no value) for a latency, a ratio or a GPU figure.
    pub fn value_when_quiet(&self) -> Option<f64> {
        match self {
            Self::Requests
            | Self::GoodputRequestsPerSecond
            | Self::RequestsPerSecond
            | Self::InputTokensPerSecond
            | Self::OutputTokensPerSecond => Some(0.0),
            _ => None,
        }
    }

    /// Formats a value of this KPI for people (`620 ms`, `97%`, `12.5/s`).
    pub fn format_value(&self, v: f64) -> String {
        match self.unit() {
            KpiUnit::Seconds if v.abs() < 1.0 => format!("{} ms", trim(v * 1e3)),
            KpiUnit::Seconds => format!("{} s", trim(v)),
            KpiUnit::Ratio => format!("{}%", trim(v * 100.0)),
            KpiUnit::PerSecond => format!("{}/s", trim(v)),
            KpiUnit::Count => trim(v),
            KpiUnit::Joules => format!("{} J", trim(v)),
        }
    }
}

/// Up to three significant decimals, trailing zeros removed.
fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    s.to_string()
}

impl fmt::Display for KpiPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Op {
    /// `>`.
    #[serde(rename = ">")]
    Gt,
    /// `>=`.
    #[serde(rename = ">=")]
    Ge,
    /// `<`.
    #[serde(rename = "<")]
    Lt,
    /// `<=`.
    #[serde(rename = "<=")]
    Le,
    /// `==`.
    #[serde(rename = "==")]
    Eq,
    /// `!=`.
    #[serde(rename = "!=")]
    Ne,
}

impl Op {
    /// Applies the comparison `value <op> threshold`.
    pub fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Self::Gt => value > threshold,
            Self::Ge => value >= threshold,
            Self::Lt => value < threshold,
            Self::Le => value <= threshold,
            Self::Eq => value == threshold,
            Self::Ne => value != threshold,
        }
    }

    /// The operator as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Eq => "==",
            Self::Ne => "!=",
        }
    }
}

/// A parsed `<kpi> <op> <value>`.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    /// The KPI compared.
    pub kpi: KpiPath,
    /// The operator.
    pub op: Op,
    /// The value, in the KPI's unit (seconds, ratio, …).
    pub threshold: f64,
}

impl Expr {
    /// Parses `<kpi> <op> <value>` (whitespace optional around the operator).
    ///
    /// ```
    /// use infertrace_analysis::alert::{Expr, KpiPath, Op};
    /// let e = Expr::parse("e2e.p95 > 500ms").unwrap();
    /// assert_eq!((e.kpi.name(), e.op, e.threshold), ("e2e.p95".to_string(), Op::Gt, 0.5));
    /// let err = Expr::parse("gpu.utilization.mean > 95 ms").unwrap_err();
    /// assert_eq!(err.position, 26);
    /// ```
    pub fn parse(input: &str) -> Result<Self, ParseError> {
        let mut p = Cursor::new(input);
        p.skip_ws();
        let kpi_at = p.pos;
        let kpi_text = p.take_while(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        if kpi_text.is_empty() {
            return Err(p.error(kpi_at, "expected a KPI name such as e2e.p95"));
        }
        let kpi = KpiPath::parse(kpi_text).map_err(|m| p.error(kpi_at, m))?;
        p.skip_ws();
        let op_at = p.pos;
        let op = p.op().ok_or_else(|| {
            p.error(
                op_at,
                "expected a comparison operator (>, >=, <, <=, ==, !=)",
            )
        })?;
        p.skip_ws();
        let value_at = p.pos;
        let threshold = p.value(kpi)?;
        p.skip_ws();
        if !p.at_end() {
            return Err(p.error(p.pos, "unexpected text after the value"));
        }
        if !threshold.is_finite() {
            return Err(p.error(value_at, "the value must be finite"));
        }
        Ok(Self { kpi, op, threshold })
    }

    /// The KPI's value in a series and whether the expression holds for it; `None` when the
    /// window has no value for the KPI (which never holds).
    pub fn evaluate(&self, s: &SeriesKpis) -> Option<(f64, bool)> {
        self.kpi
            .value(s)
            .map(|v| (v, self.op.holds(v, self.threshold)))
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.kpi,
            self.op.as_str(),
            self.kpi.format_value(self.threshold)
        )
    }
}

/// A parse error: what was expected, and where (a character column, 0-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The text parsed.
    pub input: String,
    /// Character column (0-based) where it went wrong.
    pub position: usize,
    /// What was wrong.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "'{}': column {}: {}\n  {}\n  {}^",
            self.input,
            self.position + 1,
            self.message,
            self.input,
            " ".repeat(self.position)
        )
    }
}

impl std::error::Error for ParseError {}

/// Parses a `for:` duration: `0`, `30s`, `5m`, `1h30m`, `500ms`, `1.5m` (units ns, us, µs, ms,
/// s, m, h, d; a sequence of number-unit pairs is summed), and every spelling the rest of the
/// collector's config takes (humantime: `1min`, `2hours`); the error is this grammar's.
///
/// ```
/// use std::time::Duration;
/// use infertrace_analysis::alert::parse_duration;
/// assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
/// assert_eq!(parse_duration("1min").unwrap(), Duration::from_secs(60));
/// assert!(parse_duration("soon").is_err());
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, ParseError> {
    prometheus_style_duration(input)
        .or_else(|e| humantime::parse_duration(input.trim()).map_err(|_| e))
}

/// [`parse_duration`]'s own grammar (Prometheus's units, with decimals).
fn prometheus_style_duration(input: &str) -> Result<Duration, ParseError> {
    let mut p = Cursor::new(input);
    p.skip_ws();
    if p.at_end() {
        return Err(p.error(p.pos, "expected a duration such as 30s, 5m or 1h"));
    }
    if p.rest().trim() == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0.0f64;
    while !p.at_end() {
        let at = p.pos;
        let n = p.number().ok_or_else(|| p.error(at, "expected a number"))?;
        p.skip_ws();
        let unit_at = p.pos;
        let unit = p.take_while(|c| c.is_alphabetic());
        let scale = duration_unit(unit).ok_or_else(|| {
            p.error(
                unit_at,
                if unit.is_empty() {
                    "expected a unit (ns, us, ms, s, m, h, d)".to_string()
                } else {
                    format!("unknown unit '{unit}'; known: ns, us, ms, s, m, h, d")
                },
            )
        })?;
        total += n * scale;
        p.skip_ws();
    }
    Duration::try_from_secs_f64(total).map_err(|_| p.error(0, "the duration is out of range"))
}

fn duration_unit(unit: &str) -> Option<f64> {
    Some(match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return None,
    })
}

/// A character cursor that reports positions in characters.
struct Cursor<'a> {
    input: &'a str,
    /// Byte offset.
    byte: usize,
    /// Character offset.
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(input: &'a str) -> Self {
        Self {
            input,
            byte: 0,
            pos: 0,
        }
    }

    fn rest(&self) -> &'a str {
        &self.input[self.byte..]
    }

    fn at_end(&self) -> bool {
        self.byte >= self.input.len()
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) {
        if let Some(c) = self.peek() {
            self.byte += c.len_utf8();
            self.pos += 1;
        }
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        let start = self.byte;
        while self.peek().is_some_and(&f) {
            self.bump();
        }
        &self.input[start..self.byte]
    }

    fn skip_ws(&mut self) {
        self.take_while(char::is_whitespace);
    }

    fn error(&self, position: usize, message: impl Into<String>) -> ParseError {
        ParseError {
            input: self.input.to_string(),
            position,
            message: message.into(),
        }
    }

    fn op(&mut self) -> Option<Op> {
        let rest = self.rest();
        let (op, len) = if rest.starts_with(">=") {
            (Op::Ge, 2)
        } else if rest.starts_with("<=") {
            (Op::Le, 2)
        } else if rest.starts_with("==") {
            (Op::Eq, 2)
        } else if rest.starts_with("!=") {
            (Op::Ne, 2)
        } else if rest.starts_with('>') {
            (Op::Gt, 1)
        } else if rest.starts_with('<') {
            (Op::Lt, 1)
        } else {
            return None;
        };
        for _ in 0..len {
            self.bump();
        }
        Some(op)
    }

    /// A decimal number: optional sign, digits, optional fraction and exponent.
    fn number(&mut self) -> Option<f64> {
        let start = self.byte;
        let (save_byte, save_pos) = (self.byte, self.pos);
        if matches!(self.peek(), Some('-' | '+')) {
            self.bump();
        }
        let int = self.take_while(|c| c.is_ascii_digit()).len();
        let mut frac = 0;
        if self.peek() == Some('.') {
            self.bump();
            frac = self.take_while(|c| c.is_ascii_digit()).len();
        }
        if int + frac == 0 {
            self.byte = save_byte;
            self.pos = save_pos;
            return None;
        }
        // An exponent only when digits follow (so `5m` stays five minutes, `1e3` is a number).
        let rest = self.rest();
        if let Some(after) = rest.strip_prefix(['e', 'E']) {
            let after = after.strip_prefix(['-', '+']).unwrap_or(after);
            if after.starts_with(|c: char| c.is_ascii_digit()) {
                self.bump();
                if matches!(self.peek(), Some('-' | '+')) {
                    self.bump();
                }
                self.take_while(|c| c.is_ascii_digit());
            }
        }
        self.input[start..self.byte].parse().ok()
    }

    /// A value with an optional unit that must suit the KPI.
    fn value(&mut self, kpi: KpiPath) -> Result<f64, ParseError> {
        let at = self.pos;
        let n = self
            .number()
            .ok_or_else(|| self.error(at, "expected a number such as 0.95, 95%, 500ms or 2s"))?;
        // A unit may follow directly or after spaces.
        let (byte, pos) = (self.byte, self.pos);
        self.skip_ws();
        let unit_at = self.pos;
        let unit = if self.peek() == Some('%') {
            self.bump();
            "%"
        } else {
            self.take_while(|c| c.is_alphabetic())
        };
        if unit.is_empty() {
            self.byte = byte;
            self.pos = pos;
            return Ok(n);
        }
        let unit_kind = kpi.unit();
        if unit == "%" {
            return if unit_kind == KpiUnit::Ratio {
                Ok(n / 100.0)
            } else {
                Err(self.error(
                    unit_at,
                    format!("'%' fits ratios only; {kpi} is in {}", unit_name(unit_kind)),
                ))
            };
        }
        match duration_unit(unit) {
            Some(scale) if unit_kind == KpiUnit::Seconds => Ok(n * scale),
            Some(_) => Err(self.error(
                unit_at,
                format!(
                    "a duration fits latency KPIs only; {kpi} is in {} (write e.g. {})",
                    unit_name(unit_kind),
                    if unit_kind == KpiUnit::Ratio {
                        "0.95 or 95%"
                    } else {
                        "a bare number"
                    }
                ),
            )),
            None => Err(self.error(
                unit_at,
                format!("unknown unit '{unit}'; known: %, ns, us, ms, s, m, h"),
            )),
        }
    }
}

fn unit_name(u: KpiUnit) -> &'static str {
    match u {
        KpiUnit::Seconds => "seconds",
        KpiUnit::Ratio => "a ratio (0–1)",
        KpiUnit::PerSecond => "per second",
        KpiUnit::Count => "a count",
        KpiUnit::Joules => "joules",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_round_trips_through_its_name() {
        let mut all = vec![];
        for (_, l) in LATENCIES {
            for (_, s) in STATS {
                all.push(KpiPath::Latency(l, s));
            }
        }
        for (_, t) in TAILS {
            for (_, p) in PHASES {
                all.push(KpiPath::PhaseShare(t, p));
            }
        }
        for (_, p) in PHASES {
            all.push(KpiPath::GpuUtilization(p));
        }
        all.extend(SCALARS.iter().map(|(_, k)| *k));
        all.push(KpiPath::OutputTokensPerSecond);
        for k in all {
            assert_eq!(KpiPath::parse(&k.name()), Ok(k), "{}", k.name());
        }
    }

    #[test]
    fn numbers_and_units() {
        let t = |s: &str| Expr::parse(s).unwrap().threshold;
        assert_eq!(t("e2e.p95 > 2s"), 2.0);
        assert_eq!(t("e2e.p95 > 2 s"), 2.0);
        assert_eq!(t("ttft.p99>=1.5m"), 90.0);
        assert!((t("tpot.p50 < 250us") - 250e-6).abs() < 1e-15);
        assert!((t("tpot.p50 < 250µs") - 250e-6).abs() < 1e-15);
        assert_eq!(t("e2e.p95 > 1e-1"), 0.1);
        assert_eq!(t("goodput.ratio < 90%"), 0.9);
        assert_eq!(t("goodput.ratio < .9"), 0.9);
        assert_eq!(t("requests == 0"), 0.0);
        assert_eq!(t("throughput.requests_per_second < -1"), -1.0);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5m").unwrap(), Duration::from_secs(90));
        let e = parse_duration("5").unwrap_err();
        assert_eq!((e.position, e.message.contains("unit")), (1, true));
        let e = parse_duration("5 parsecs").unwrap_err();
        assert_eq!(e.position, 2);
        // The spellings of the config's other durations (humantime).
        assert_eq!(parse_duration("5 mins").unwrap(), Duration::from_secs(300));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-5s").is_err());
    }

    #[test]
    fn display_points_at_the_column() {
        let e = Expr::parse("e2e.p95 >> 1s").unwrap_err();
        assert_eq!(e.position, 9);
        let shown = e.to_string();
        assert!(shown.contains("column 10"), "{shown}");
        assert!(
            shown.ends_with("\n  e2e.p95 >> 1s\n           ^"),
            "{shown:?}"
        );
    }
}
