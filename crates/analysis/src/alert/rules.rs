//! Threshold alert rules and their state machine, and the Alertmanager payload.
//!
//! Each rule is evaluated per series (labels `service`, `model`, `operation`) against a KPI snapshot at an
//! explicit time. An alert instance goes
//!
//! ```text
//! inactive ──expr true──▶ pending ──true for `for`──▶ firing ──expr false──▶ resolved
//!     ▲                     │ expr false                                     │ expr true: pending
//!     └─────────────────────┘                            (forgotten after RESOLVED_RETENTION)
//! ```
//!
//! A rule with `for: 0` fires at the first evaluation that finds its expression true. A series
//! without a value for the KPI counts as "expression false", so an alert on a latency or a
//! ratio resolves when its series goes quiet. A series missing from a snapshot has no requests
//! in the window: a count or a rate of it (`requests`, `throughput.*`,
//! `goodput.requests_per_second`) reads 0 there, so a pending or firing alert on "too few"
//! holds on through the silence (a dead engine does not resolve its traffic alert) for up to
//! [`FORGET_QUIET_AFTER`] (an hour; a series silent longer is taken as gone — renamed or
//! removed — and its alert resolves); a new alert is not raised for a series no longer in the
//! snapshot. The state is the process's: after a restart a firing alert is not sent again,
//! and Alertmanager resolves it after its `resolve_timeout`. Like Prometheus, `startsAt` is
//! when the alert started *firing*.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::anomaly::FORGET_QUIET_AFTER;
use super::expr::{Expr, ParseError, parse_duration};
use crate::diagnosis::Severity;
use crate::kpi::KpiSnapshot;

/// How long a resolved alert is remembered (and listed by [`AlertEngine::resolved`]).
pub const RESOLVED_RETENTION: Duration = Duration::from_secs(15 * 60);

/// The default base of `generatorURL`.
pub const DEFAULT_GENERATOR_URL: &str = "http://127.0.0.1:9464";

fn default_severity() -> Severity {
    Severity::Warning
}

/// One alert rule as written in the collector's config.
///
/// ```yaml
/// - name: E2eP95High
///   expr: e2e.p95 > 500ms
///   for: 1m
///   severity: critical
///   summary: "p95 latency of {model} is {value}"
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertRuleConfig {
    /// Alert name (`alertname` label); letters, digits and `_`, not starting with a digit.
    pub name: String,
    /// `<kpi> <op> <value>`, see [`Expr::parse`].
    pub expr: String,
    /// How long the expression must hold before firing (`30s`, `5m`); default 0.
    #[serde(rename = "for", default, skip_serializing_if = "Option::is_none")]
    pub for_duration: Option<String>,
    /// `info`, `warning` (default) or `critical`.
    #[serde(default = "default_severity")]
    pub severity: Severity,
    /// Summary annotation; `{service}`, `{model}`, `{operation}`, `{value}`, `{threshold}` are
    /// replaced (`{value}` by `no data` when the alert resolves because its series went quiet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// A rule that failed to compile: which rule, which field, and the parse error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    /// The rule's name.
    pub rule: String,
    /// `name`, `expr` or `for`.
    pub field: &'static str,
    /// The error, with its position in the field.
    pub error: ParseError,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "alert rule '{}', {}: {}",
            self.rule, self.field, self.error
        )
    }
}

impl std::error::Error for RuleError {}

/// A compiled alert rule.
#[derive(Clone, Debug, PartialEq)]
pub struct AlertRule {
    /// Alert name.
    pub name: String,
    /// The expression.
    pub expr: Expr,
    /// The `for` duration.
    pub hold: Duration,
    /// Severity label.
    pub severity: Severity,
    /// Summary template.
    pub summary: Option<String>,
}

impl AlertRule {
    /// Compiles a configured rule.
    pub fn compile(config: &AlertRuleConfig) -> Result<Self, RuleError> {
        let err = |field, error| RuleError {
            rule: config.name.clone(),
            field,
            error,
        };
        if let Some(position) = invalid_name_position(&config.name) {
            return Err(err(
                "name",
                ParseError {
                    input: config.name.clone(),
                    position,
                    message: "alert names are letters, digits and '_', not starting with a digit"
                        .into(),
                },
            ));
        }
        let expr = Expr::parse(&config.expr).map_err(|e| err("expr", e))?;
        let hold = match &config.for_duration {
            Some(s) => parse_duration(s).map_err(|e| err("for", e))?,
            None => Duration::ZERO,
        };
        Ok(Self {
            name: config.name.clone(),
            expr,
            hold,
            severity: config.severity,
            summary: config.summary.clone(),
        })
    }
}

fn invalid_name_position(name: &str) -> Option<usize> {
    if name.is_empty() {
        return Some(0);
    }
    name.chars().enumerate().find_map(|(i, c)| {
        let ok = c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit());
        (!ok).then_some(i)
    })
}

/// The state of one alert instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertState {
    /// The expression does not hold.
    Inactive,
    /// The expression holds, not yet for the rule's `for`.
    Pending,
    /// The expression has held for `for`.
    Firing,
    /// It was firing and no longer holds.
    Resolved,
}

/// One alert instance (a rule on one series), as listed by [`AlertEngine::active`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ActiveAlert {
    /// Rule name.
    pub alert: String,
    /// Series service.
    pub service: String,
    /// Series model.
    pub model: String,
    /// Series operation (empty when series are not split by operation).
    pub operation: String,
    /// Severity.
    pub severity: Severity,
    /// Pending, firing or resolved.
    pub state: AlertState,
    /// The expression, as written canonically.
    pub expr: String,
    /// The KPI's last value.
    pub value: f64,
    /// When the expression started to hold, Unix nanoseconds.
    pub active_since_unix_nano: u64,
    /// When it started firing.
    pub firing_since_unix_nano: Option<u64>,
    /// When it resolved.
    pub resolved_at_unix_nano: Option<u64>,
}

/// A state change, for logs and for delivery to Alertmanager.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AlertEvent {
    /// Rule name.
    pub alert: String,
    /// Series service.
    pub service: String,
    /// Series model.
    pub model: String,
    /// Series operation (empty when series are not split by operation).
    pub operation: String,
    /// Severity.
    pub severity: Severity,
    /// The new state: pending, firing or resolved.
    pub state: AlertState,
    /// The KPI's value at the transition (for resolved: the last value that held, or the
    /// current one if the series still has it).
    pub value: f64,
    /// The rule's threshold.
    pub threshold: f64,
    /// When it started firing (pending: when it started to hold), Unix nanoseconds.
    pub starts_at_unix_nano: u64,
    /// When it resolved.
    pub ends_at_unix_nano: Option<u64>,
    /// Summary annotation.
    pub summary: String,
    /// Description annotation (the expression and the values).
    pub description: String,
    /// Link back to the collector's alert API.
    pub generator_url: String,
}

/// (rule index, service, model, operation).
type InstanceKey = (usize, String, String, String);

#[derive(Clone, Debug)]
struct Instance {
    state: AlertState,
    value: f64,
    active_since: u64,
    fired_at: Option<u64>,
    resolved_at: Option<u64>,
    /// When its series was last in a snapshot with the expression holding.
    series_seen_at: u64,
}

/// Evaluates alert rules against KPI snapshots and keeps each instance's state.
#[derive(Clone, Debug)]
pub struct AlertEngine {
    rules: Vec<AlertRule>,
    /// (rule index, service, model, operation) → instance.
    instances: HashMap<InstanceKey, Instance>,
    generator_url: String,
}

impl AlertEngine {
    /// An engine over compiled rules.
    pub fn new(rules: Vec<AlertRule>) -> Self {
        Self {
            rules,
            instances: HashMap::new(),
            generator_url: DEFAULT_GENERATOR_URL.to_string(),
        }
    }

    /// Compiles configured rules; the first bad rule is the error. Duplicate names are refused.
    pub fn from_config(configs: &[AlertRuleConfig]) -> Result<Self, RuleError> {
        let mut rules: Vec<AlertRule> = Vec::with_capacity(configs.len());
        for c in configs {
            let rule = AlertRule::compile(c)?;
            if rules.iter().any(|r| r.name == rule.name) {
                return Err(RuleError {
                    rule: c.name.clone(),
                    field: "name",
                    error: ParseError {
                        input: c.name.clone(),
                        position: 0,
                        message: "another rule has the same name".into(),
                    },
                });
            }
            rules.push(rule);
        }
        Ok(Self::new(rules))
    }

    /// Sets the base URL of `generatorURL` (the collector's HTTP address).
    pub fn with_generator_url(mut self, base: &str) -> Self {
        self.generator_url = base.trim_end_matches('/').to_string();
        self
    }

    /// The rules.
    pub fn rules(&self) -> &[AlertRule] {
        &self.rules
    }

    /// Evaluates every rule on every series of `snapshot` at `now_unix_nano`; returns the
    /// transitions (to pending, firing, resolved) in rule order.
    pub fn evaluate(&mut self, snapshot: &KpiSnapshot, now_unix_nano: u64) -> Vec<AlertEvent> {
        let mut events = Vec::new();
        let mut seen: Vec<InstanceKey> = Vec::new();
        for (ri, rule) in self.rules.iter().enumerate() {
            for s in &snapshot.series {
                let Some((value, true)) = rule.expr.evaluate(s) else {
                    continue;
                };
                let key = (ri, s.service.clone(), s.model.clone(), s.operation.clone());
                let inst = self.instances.entry(key.clone()).or_insert(Instance {
                    state: AlertState::Inactive,
                    value,
                    active_since: now_unix_nano,
                    fired_at: None,
                    resolved_at: None,
                    series_seen_at: now_unix_nano,
                });
                inst.value = value;
                inst.series_seen_at = now_unix_nano;
                match inst.state {
                    AlertState::Inactive | AlertState::Resolved => {
                        inst.active_since = now_unix_nano;
                        inst.resolved_at = None;
                        inst.fired_at = None;
                        inst.state = AlertState::Pending;
                        if rule.hold.is_zero() {
                            inst.state = AlertState::Firing;
                            inst.fired_at = Some(now_unix_nano);
                        }
                        events.push(event(rule, &key, inst, &self.generator_url));
                    }
                    AlertState::Pending => {
                        if fire_if_held(inst, rule, now_unix_nano) {
                            events.push(event(rule, &key, inst, &self.generator_url));
                        }
                    }
                    AlertState::Firing => {}
                }
                seen.push(key);
            }
        }
        seen.sort_unstable();
        // Instances whose expression no longer holds (or whose series is gone).
        let mut keys: Vec<InstanceKey> = self
            .instances
            .keys()
            .filter(|k| seen.binary_search(k).is_err())
            .cloned()
            .collect();
        keys.sort_unstable();
        let forget_after = u64::try_from(FORGET_QUIET_AFTER.as_nanos()).unwrap_or(u64::MAX);
        for key in keys {
            let Some(inst) = self.instances.get_mut(&key) else {
                continue;
            };
            let rule = &self.rules[key.0];
            let series = snapshot
                .series
                .iter()
                .find(|s| s.service == key.1 && s.model == key.2 && s.operation == key.3);
            // A series gone quiet has no requests: a count or a rate of it is 0, and a rule
            // on "too few" holds on (an engine that stopped answering is not "resolved") — for
            // FORGET_QUIET_AFTER; a series gone longer is gone for good (renamed, removed).
            let quiet_value = series.is_none().then(|| rule.expr.kpi.value_when_quiet());
            let gone = now_unix_nano.saturating_sub(inst.series_seen_at) > forget_after;
            if let Some(Some(zero)) = quiet_value {
                inst.value = zero;
                if rule.expr.op.holds(zero, rule.expr.threshold)
                    && !gone
                    && matches!(inst.state, AlertState::Pending | AlertState::Firing)
                {
                    if inst.state == AlertState::Pending && fire_if_held(inst, rule, now_unix_nano)
                    {
                        events.push(event(rule, &key, inst, &self.generator_url));
                    }
                    continue;
                }
            }
            match inst.state {
                AlertState::Pending | AlertState::Inactive => {
                    self.instances.remove(&key);
                }
                AlertState::Firing => {
                    // Report the current value when the series still has one.
                    if let Some(v) = series.and_then(|s| rule.expr.kpi.value(s)) {
                        inst.value = v;
                    }
                    inst.state = AlertState::Resolved;
                    inst.resolved_at = Some(now_unix_nano);
                    events.push(event(rule, &key, inst, &self.generator_url));
                }
                AlertState::Resolved => {
                    let since = now_unix_nano.saturating_sub(inst.resolved_at.unwrap_or(0));
                    if u128::from(since) >= RESOLVED_RETENTION.as_nanos() {
                        self.instances.remove(&key);
                    }
                }
            }
        }
        events.sort_by_key(|e| {
            self.rules
                .iter()
                .position(|r| r.name == e.alert)
                .unwrap_or(usize::MAX)
        });
        events
    }

    /// Pending and firing alerts, sorted by rule then series.
    pub fn active(&self) -> Vec<ActiveAlert> {
        self.list(|s| matches!(s, AlertState::Pending | AlertState::Firing))
    }

    /// Resolved alerts still remembered (see [`RESOLVED_RETENTION`]).
    pub fn resolved(&self) -> Vec<ActiveAlert> {
        self.list(|s| s == AlertState::Resolved)
    }

    fn list(&self, keep: impl Fn(AlertState) -> bool) -> Vec<ActiveAlert> {
        let mut out: Vec<(&InstanceKey, &Instance)> = self
            .instances
            .iter()
            .filter(|(_, i)| keep(i.state))
            .collect();
        out.sort_by(|a, b| a.0.cmp(b.0));
        out.into_iter()
            .map(|((ri, service, model, operation), i)| {
                let rule = &self.rules[*ri];
                ActiveAlert {
                    alert: rule.name.clone(),
                    service: service.clone(),
                    model: model.clone(),
                    operation: operation.clone(),
                    severity: rule.severity,
                    state: i.state,
                    expr: rule.expr.to_string(),
                    value: i.value,
                    active_since_unix_nano: i.active_since,
                    firing_since_unix_nano: i.fired_at,
                    resolved_at_unix_nano: i.resolved_at,
                }
            })
            .collect()
    }

    /// Events for every firing alert, for periodic re-sending to Alertmanager (which resolves
    /// an alert it has not heard about for its `resolve_timeout`).
    pub fn firing_events(&self) -> Vec<AlertEvent> {
        let mut keys: Vec<&InstanceKey> = self
            .instances
            .iter()
            .filter(|(_, i)| i.state == AlertState::Firing)
            .map(|(k, _)| k)
            .collect();
        keys.sort();
        keys.into_iter()
            .filter_map(|k| {
                let inst = self.instances.get(k)?;
                Some(event(&self.rules[k.0], k, inst, &self.generator_url))
            })
            .collect()
    }

    /// Firing instances per rule name, every rule listed (for `infertrace_alerts_active{alert}`).
    pub fn firing_counts(&self) -> Vec<(&str, u64)> {
        self.rules
            .iter()
            .enumerate()
            .map(|(ri, r)| {
                let n = self
                    .instances
                    .iter()
                    .filter(|(k, i)| k.0 == ri && i.state == AlertState::Firing)
                    .count();
                (r.name.as_str(), n as u64)
            })
            .collect()
    }
}

/// A pending instance whose expression has held for the rule's `for` starts firing; whether it
/// did.
fn fire_if_held(inst: &mut Instance, rule: &AlertRule, now_unix_nano: u64) -> bool {
    let held = now_unix_nano.saturating_sub(inst.active_since);
    if u128::from(held) < rule.hold.as_nanos() {
        return false;
    }
    inst.state = AlertState::Firing;
    inst.fired_at = Some(now_unix_nano);
    true
}

fn event(rule: &AlertRule, key: &InstanceKey, inst: &Instance, generator_url: &str) -> AlertEvent {
    let (_, service, model, operation) = key;
    let kpi = rule.expr.kpi;
    let value = kpi.format_value(inst.value);
    let threshold = kpi.format_value(rule.expr.threshold);
    // Resolved while the value still passes the threshold: the series has no data in the
    // window any more (its requests stopped), and `value` is the last one seen while firing.
    let quiet =
        inst.state == AlertState::Resolved && rule.expr.op.holds(inst.value, rule.expr.threshold);
    let now_value = if quiet { "no data" } else { value.as_str() };
    let summary = match &rule.summary {
        Some(t) => t
            .replace("{service}", service)
            .replace("{model}", model)
            .replace("{operation}", operation)
            .replace("{value}", now_value)
            .replace("{threshold}", &threshold),
        None if quiet => format!(
            "{}: {kpi} has no data any more ({} {threshold})",
            rule.name,
            rule.expr.op.as_str()
        ),
        // A resolve says the threshold is no longer passed, not "(> 20)" beside a value of 11.
        None if inst.state == AlertState::Resolved => format!(
            "{}: {kpi} is {value}, no longer {} {threshold}",
            rule.name,
            rule.expr.op.as_str()
        ),
        None => format!(
            "{}: {kpi} is {value} ({} {threshold})",
            rule.name,
            rule.expr.op.as_str()
        ),
    };
    let hold = if rule.hold.is_zero() {
        String::new()
    } else {
        format!(" for {}", format_duration(rule.hold))
    };
    let mut who = format!("service {service}, model {model}");
    if !operation.is_empty() {
        who.push_str(", operation ");
        who.push_str(operation);
    }
    let op = rule.expr.op.as_str();
    let description = match inst.state {
        AlertState::Resolved if quiet => format!(
            "{kpi} of {who} has no data in the window any more (last {value} while firing): \
             resolved"
        ),
        AlertState::Resolved => format!("{kpi} of {who} is {value}: no longer {op} {threshold}"),
        _ => format!("{kpi} of {who} is {value}, {op} {threshold}{hold}"),
    };
    AlertEvent {
        alert: rule.name.clone(),
        service: service.clone(),
        model: model.clone(),
        operation: operation.clone(),
        severity: rule.severity,
        state: inst.state,
        value: inst.value,
        threshold: rule.expr.threshold,
        starts_at_unix_nano: inst.fired_at.unwrap_or(inst.active_since),
        ends_at_unix_nano: inst.resolved_at,
        summary,
        description,
        generator_url: format!(
            "{generator_url}/api/alerts?alert={}",
            percent_encode(&rule.name)
        ),
    }
}

fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_nanos() != 0 || s == 0 {
        format!("{}ms", d.as_millis())
    } else if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// RFC 3339 UTC with milliseconds (`2026-11-30T00:15:00.123Z`) of a Unix-nanosecond time.
pub fn rfc3339(unix_nano: u64) -> String {
    let secs = unix_nano / 1_000_000_000;
    let millis = (unix_nano % 1_000_000_000) / 1_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The body of Alertmanager's `POST /api/v2/alerts` for firing and resolved events (pending
/// ones are not alerts yet and are left out): labels `alertname`, `service`, `model`,
/// `operation` (each only when not empty), `severity`; annotations `summary`, `description`; `startsAt`, `endsAt` (resolved only),
/// `generatorURL`.
pub fn to_alertmanager_json(events: &[AlertEvent]) -> Value {
    Value::Array(
        events
            .iter()
            .filter(|e| matches!(e.state, AlertState::Firing | AlertState::Resolved))
            .map(|e| {
                let mut labels = serde_json::Map::new();
                labels.insert("alertname".into(), Value::String(e.alert.clone()));
                // Empty label values mean "no label" to Alertmanager: leave them out.
                for (k, v) in [
                    ("service", &e.service),
                    ("model", &e.model),
                    ("operation", &e.operation),
                ] {
                    if !v.is_empty() {
                        labels.insert(k.into(), Value::String(v.clone()));
                    }
                }
                labels.insert("severity".into(), Value::String(e.severity.as_str().into()));
                let mut alert = json!({
                    "labels": labels,
                    "annotations": {
                        "summary": e.summary,
                        "description": e.description,
                    },
                    "startsAt": rfc3339(e.starts_at_unix_nano),
                    "generatorURL": e.generator_url,
                });
                if let (Some(end), Some(obj)) = (e.ends_at_unix_nano, alert.as_object_mut()) {
                    obj.insert("endsAt".into(), Value::String(rfc3339(end)));
                }
                alert
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 12:34:56.789 UTC = 951827696.789
        assert_eq!(rfc3339(951_827_696_789_000_000), "2000-02-29T12:34:56.789Z");
        // 2026-11-30 00:15:00 UTC = 1795997700
        assert_eq!(
            rfc3339(1_795_997_700_000_000_000),
            "2026-11-30T00:15:00.000Z"
        );
        assert_eq!(
            rfc3339(4_102_444_799_999_000_000),
            "2099-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn names_and_encoding() {
        assert_eq!(invalid_name_position("E2eP95_High"), None);
        assert_eq!(invalid_name_position("9lives"), Some(0));
        assert_eq!(invalid_name_position("bad name"), Some(3));
        assert_eq!(invalid_name_position(""), Some(0));
        assert_eq!(percent_encode("a b/c"), "a%20b%2Fc");
        assert_eq!(format_duration(Duration::from_secs(300)), "5m");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }
}
