//! Alert rules (parse errors, pending → firing → resolved with explicit times, the Alertmanager
//! payload) and anomaly detection (a step change is found, noise is not, trends project).

use infertrace_analysis::alert::{
    AlertEngine, AlertRuleConfig, AlertState, AnomalyConfig, AnomalyDetector, Direction, Expr,
    FORGET_QUIET_AFTER, KpiBaseline, KpiPath, Latency, Op, RESOLVED_RETENTION, SloBound, Stat,
    to_alertmanager_json,
};
use infertrace_analysis::diagnosis::Severity;
use infertrace_analysis::kpi::{
    Goodput, KpiSnapshot, LatencyStats, PhaseShares, SeriesKpis, SloConfig, Throughput, TokenTotals,
};

const S: u64 = 1_000_000_000;
/// 2026-11-30T00:00:00Z.
const T0: u64 = 1_795_996_800 * S;

fn series(model: &str, e2e_p95: f64) -> SeriesKpis {
    SeriesKpis {
        service: "llm".into(),
        model: model.into(),
        operation: "chat".into(),
        requests: 100,
        errors: 0,
        cancelled: 0,
        rejected: 0,
        e2e: Some(LatencyStats {
            p50: e2e_p95 / 2.0,
            p90: e2e_p95 * 0.9,
            p95: e2e_p95,
            p99: e2e_p95 * 1.5,
            max: e2e_p95 * 2.0,
            mean: e2e_p95 / 2.0,
        }),
        queue: None,
        ttft: None,
        prefill: None,
        decode: None,
        tpot: None,
        itl: None,
        itl_p99: None,
        tokens: TokenTotals::default(),
        throughput: Throughput {
            requests_per_second: 10.0,
            ..Throughput::default()
        },
        goodput: Goodput {
            ratio: Some(0.95),
            requests_per_second: 9.5,
        },
        phase_share: PhaseShares::default(),
        gpu: None,
        disagg: None,
    }
}

fn snap(series: Vec<SeriesKpis>) -> KpiSnapshot {
    KpiSnapshot {
        window_seconds: 60.0,
        series,
    }
}

fn rule(name: &str, expr: &str, hold: Option<&str>) -> AlertRuleConfig {
    AlertRuleConfig {
        name: name.into(),
        expr: expr.into(),
        for_duration: hold.map(String::from),
        severity: Severity::Critical,
        summary: None,
    }
}

#[test]
fn pending_firing_resolved_with_explicit_times() {
    let mut engine = AlertEngine::from_config(&[rule("E2eP95High", "e2e.p95 > 500ms", Some("1m"))])
        .unwrap()
        .with_generator_url("http://collector:9464/");

    // t = 0: 0.4 s, quiet.
    assert!(
        engine
            .evaluate(&snap(vec![series("m", 0.4)]), T0)
            .is_empty()
    );
    assert!(engine.active().is_empty());

    // t = 10 s: 0.62 s > 0.5 s → pending.
    let ev = engine.evaluate(&snap(vec![series("m", 0.62)]), T0 + 10 * S);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].state, AlertState::Pending);
    assert_eq!(ev[0].starts_at_unix_nano, T0 + 10 * S);
    assert_eq!(to_alertmanager_json(&ev), serde_json::json!([]));
    let active = engine.active();
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].state, AlertState::Pending);
    assert_eq!(engine.firing_counts(), [("E2eP95High", 0)]);

    // t = 69.9 s: held 59.9 s < 1 m → still pending, no event.
    assert!(
        engine
            .evaluate(&snap(vec![series("m", 0.7)]), T0 + 69_900_000_000)
            .is_empty()
    );
    assert_eq!(engine.active()[0].state, AlertState::Pending);

    // t = 70 s: held 60 s → firing.
    let ev = engine.evaluate(&snap(vec![series("m", 0.8)]), T0 + 70 * S);
    assert_eq!(ev.len(), 1);
    let firing = &ev[0];
    assert_eq!(firing.state, AlertState::Firing);
    assert_eq!(firing.starts_at_unix_nano, T0 + 70 * S);
    assert_eq!(firing.value, 0.8);
    assert_eq!(firing.threshold, 0.5);
    assert_eq!(firing.ends_at_unix_nano, None);
    assert_eq!(
        firing.description,
        "e2e.p95 of service llm, model m, operation chat is 800 ms, > 500 ms for 1m"
    );
    assert_eq!(engine.firing_counts(), [("E2eP95High", 1)]);
    let a = &engine.active()[0];
    assert_eq!(
        (a.state, a.active_since_unix_nano, a.firing_since_unix_nano),
        (AlertState::Firing, T0 + 10 * S, Some(T0 + 70 * S))
    );
    assert_eq!(
        to_alertmanager_json(&ev),
        serde_json::json!([{
            "labels": {
                "alertname": "E2eP95High",
                "service": "llm",
                "model": "m",
                "operation": "chat",
                "severity": "critical",
            },
            "annotations": {
                "summary": "E2eP95High: e2e.p95 is 800 ms (> 500 ms)",
                "description": "e2e.p95 of service llm, model m, operation chat is 800 ms, > 500 ms for 1m",
            },
            "startsAt": "2026-11-30T00:01:10.000Z",
            "generatorURL": "http://collector:9464/api/alerts?alert=E2eP95High",
        }])
    );
    // Still firing: no new event, but it is re-sendable.
    assert!(
        engine
            .evaluate(&snap(vec![series("m", 0.9)]), T0 + 100 * S)
            .is_empty()
    );
    assert_eq!(engine.firing_events().len(), 1);
    assert_eq!(engine.firing_events()[0].value, 0.9);

    // t = 130 s: 0.3 s → resolved.
    let ev = engine.evaluate(&snap(vec![series("m", 0.3)]), T0 + 130 * S);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].state, AlertState::Resolved);
    assert_eq!(ev[0].ends_at_unix_nano, Some(T0 + 130 * S));
    assert_eq!(ev[0].starts_at_unix_nano, T0 + 70 * S);
    assert_eq!(ev[0].value, 0.3);
    assert_eq!(
        ev[0].summary, "E2eP95High: e2e.p95 is 300 ms, no longer > 500 ms",
        "a resolve does not read as still passing"
    );
    let am = to_alertmanager_json(&ev);
    assert_eq!(am[0]["endsAt"], "2026-11-30T00:02:10.000Z");
    assert_eq!(am[0]["startsAt"], "2026-11-30T00:01:10.000Z");
    assert!(engine.active().is_empty());
    assert_eq!(engine.resolved().len(), 1);
    assert_eq!(engine.firing_counts(), [("E2eP95High", 0)]);
    assert!(engine.firing_events().is_empty());

    // Resolved alerts are forgotten after the retention.
    engine.evaluate(
        &snap(vec![series("m", 0.3)]),
        T0 + 130 * S + RESOLVED_RETENTION.as_nanos() as u64,
    );
    assert!(engine.resolved().is_empty());
}

#[test]
fn pending_that_stops_holding_goes_back_to_inactive_and_restarts() {
    let mut engine =
        AlertEngine::from_config(&[rule("Slow", "e2e.p95 >= 1s", Some("30s"))]).unwrap();
    assert_eq!(engine.evaluate(&snap(vec![series("m", 1.0)]), T0).len(), 1);
    // Drops below before 30 s: silently inactive again.
    assert!(
        engine
            .evaluate(&snap(vec![series("m", 0.9)]), T0 + 20 * S)
            .is_empty()
    );
    assert!(engine.active().is_empty());
    // Holds again: the 30 s count restarts at 40 s.
    let ev = engine.evaluate(&snap(vec![series("m", 2.0)]), T0 + 40 * S);
    assert_eq!(ev[0].state, AlertState::Pending);
    assert!(
        engine
            .evaluate(&snap(vec![series("m", 2.0)]), T0 + 60 * S)
            .is_empty()
    );
    let ev = engine.evaluate(&snap(vec![series("m", 2.0)]), T0 + 70 * S);
    assert_eq!(ev[0].state, AlertState::Firing);
}

#[test]
fn zero_for_fires_at_once_and_series_are_independent() {
    let mut cfg = rule("Errors", "error_rate > 1%", None);
    cfg.severity = Severity::Warning;
    cfg.summary = Some("{model}: errors at {value} (limit {threshold})".into());
    let mut engine = AlertEngine::from_config(&[cfg]).unwrap();
    let mut bad = series("b", 0.1);
    bad.errors = 5;
    let good = series("a", 0.1);
    let ev = engine.evaluate(&snap(vec![good.clone(), bad.clone()]), T0);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].state, ev[0].model.as_str()),
        (AlertState::Firing, "b")
    );
    assert_eq!(ev[0].summary, "b: errors at 5% (limit 1%)");
    assert_eq!(
        to_alertmanager_json(&ev)[0]["labels"]["severity"],
        "warning"
    );
    // The bad series disappears from the window: its alert resolves.
    let ev = engine.evaluate(&snap(vec![good]), T0 + 60 * S);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].state, ev[0].model.as_str()),
        (AlertState::Resolved, "b")
    );
    // The last value that held is reported.
    assert_eq!(ev[0].value, 0.05);
}

#[test]
fn operations_are_separate_series_and_empty_labels_are_left_out() {
    let mut engine = AlertEngine::from_config(&[rule("Slow", "e2e.p95 > 1s", None)]).unwrap();
    let chat = series("m", 2.0);
    let mut embed = series("m", 0.1);
    embed.operation = "embeddings".into();
    let mut plain = series("", 2.0);
    plain.operation = String::new();
    let ev = engine.evaluate(&snap(vec![chat.clone(), embed.clone(), plain]), T0);
    assert_eq!(ev.len(), 2);
    let am = to_alertmanager_json(&ev);
    assert_eq!(am[0]["labels"]["operation"], "chat");
    assert_eq!(
        am[1]["labels"],
        serde_json::json!({"alertname": "Slow", "service": "llm", "severity": "critical"})
    );
    // Embeddings slow down too: a new alert, the chat one unchanged.
    embed.e2e.as_mut().unwrap().p95 = 3.0;
    let ev = engine.evaluate(&snap(vec![chat, embed]), T0 + S);
    let states: Vec<(&str, AlertState)> =
        ev.iter().map(|e| (e.operation.as_str(), e.state)).collect();
    assert_eq!(
        states,
        [
            ("embeddings", AlertState::Firing),
            ("", AlertState::Resolved)
        ]
    );
    // Resolved because its series is gone: said so, not "is 3 s: no longer > 1 s", and the
    // summary does not repeat the last firing value as if it were current.
    assert!(
        ev[1]
            .description
            .contains("has no data in the window any more (last"),
        "{}",
        ev[1].description
    );
    assert_eq!(ev[1].summary, "Slow: e2e.p95 has no data any more (> 1 s)");
    assert_eq!(engine.firing_counts(), [("Slow", 2)]);
}

#[test]
fn a_traffic_alert_holds_on_when_its_series_goes_quiet() {
    // An engine that stops answering: its series drains from the window and then leaves the
    // snapshot. Its requests read 0 then, so "too few" holds on instead of resolving.
    let mut engine = AlertEngine::from_config(&[
        rule(
            "TrafficLow",
            "throughput.requests_per_second < 1",
            Some("10s"),
        ),
        rule("Busy", "requests > 50", None),
        rule("Slow", "e2e.p95 > 1s", None),
    ])
    .unwrap();
    let mut draining = series("m", 2.0);
    draining.throughput.requests_per_second = 0.4;
    let ev = engine.evaluate(&snap(vec![draining]), T0);
    let states: Vec<(&str, AlertState)> = ev.iter().map(|e| (e.alert.as_str(), e.state)).collect();
    assert_eq!(
        states,
        [
            ("TrafficLow", AlertState::Pending),
            ("Busy", AlertState::Firing),
            ("Slow", AlertState::Firing)
        ]
    );
    // Gone before `for` passed: still pending, then firing at 0/s.
    let ev = engine.evaluate(&snap(vec![]), T0 + 5 * S);
    let states: Vec<(&str, AlertState)> = ev.iter().map(|e| (e.alert.as_str(), e.state)).collect();
    assert_eq!(
        states,
        [
            ("Busy", AlertState::Resolved),
            ("Slow", AlertState::Resolved)
        ]
    );
    assert_eq!(
        ev[0].description,
        "requests of service llm, model m, operation chat is 0: no longer > 50"
    );
    assert_eq!(ev[1].summary, "Slow: e2e.p95 has no data any more (> 1 s)");
    let ev = engine.evaluate(&snap(vec![]), T0 + 10 * S);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].alert.as_str(), ev[0].state),
        ("TrafficLow", AlertState::Firing)
    );
    assert_eq!(ev[0].value, 0.0);
    assert!(
        ev[0].summary.contains("is 0/s (< 1/s)"),
        "{}",
        ev[0].summary
    );
    // Silence goes on: nothing changes, the alert stays listed as firing.
    assert!(engine.evaluate(&snap(vec![]), T0 + 600 * S).is_empty());
    assert_eq!(
        engine.firing_counts(),
        [("TrafficLow", 1), ("Busy", 0), ("Slow", 0)]
    );
    // Traffic comes back at 5/s: resolved.
    let mut back = series("m", 0.5);
    back.throughput.requests_per_second = 5.0;
    back.requests = 10;
    let ev = engine.evaluate(&snap(vec![back]), T0 + 601 * S);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].alert.as_str(), ev[0].state),
        ("TrafficLow", AlertState::Resolved)
    );
    // A series never seen raises nothing, and one that left while its alert was resolved is
    // not raised again by its silence.
    assert!(engine.evaluate(&snap(vec![]), T0 + 700 * S).is_empty());
    assert!(engine.active().is_empty());

    // A series silent for over an hour is taken as gone (renamed, removed): its alert resolves
    // instead of firing for ever (a review renamed a service and its old name's alerts fired on).
    let mut old = series("old-name", 2.0);
    old.throughput.requests_per_second = 0.4;
    let t = T0 + 800 * S;
    engine.evaluate(&snap(vec![old]), t);
    let ev = engine.evaluate(&snap(vec![]), t + 20 * S);
    assert_eq!(
        (ev[0].alert.as_str(), ev[0].state),
        ("TrafficLow", AlertState::Firing)
    );
    let hour = FORGET_QUIET_AFTER.as_secs() * S;
    assert!(engine.evaluate(&snap(vec![]), t + hour).is_empty());
    let ev = engine.evaluate(&snap(vec![]), t + hour + S);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].model.as_str(), ev[0].state),
        ("old-name", AlertState::Resolved)
    );
    assert!(engine.active().is_empty());
}

#[test]
fn a_missing_kpi_never_holds() {
    let mut engine = AlertEngine::from_config(&[
        rule("GpuHot", "gpu.utilization.mean > 0.95", None),
        rule("NoGoodput", "goodput.ratio < 0.9", None),
    ])
    .unwrap();
    let mut s = series("m", 0.1);
    s.goodput.ratio = None;
    assert!(engine.evaluate(&snap(vec![s]), T0).is_empty());
}

#[test]
fn every_operator_and_documented_kpi_parses() {
    for (text, kpi, op, value) in [
        ("e2e.p95 > 500ms", "e2e.p95", Op::Gt, 0.5),
        ("ttft.p99 >= 2s", "ttft.p99", Op::Ge, 2.0),
        ("tpot.p50 < 50ms", "tpot.p50", Op::Lt, 0.05),
        (
            "gpu.utilization.mean <= 95%",
            "gpu.utilization.mean",
            Op::Le,
            0.95,
        ),
        ("error_rate == 0", "error_rate", Op::Eq, 0.0),
        ("goodput.ratio != 0.95", "goodput.ratio", Op::Ne, 0.95),
        (
            "phase_share.p99.queue > 0.4",
            "phase_share.p99.queue",
            Op::Gt,
            0.4,
        ),
        (
            "throughput.requests_per_second < 5",
            "throughput.requests_per_second",
            Op::Lt,
            5.0,
        ),
    ] {
        let e = Expr::parse(text).unwrap_or_else(|err| panic!("{text}: {err}"));
        assert_eq!((e.kpi.name().as_str(), e.op), (kpi, op), "{text}");
        assert!((e.threshold - value).abs() < 1e-12, "{text}");
    }
}

#[test]
fn parse_errors_say_what_and_where() {
    for (text, position, needle) in [
        ("", 0, "expected a KPI"),
        ("e2e.p96 > 1s", 0, "unknown statistic 'p96' of e2e"),
        ("latency.p95 > 1s", 0, "unknown KPI 'latency.p95'"),
        ("e2e > 1s", 0, "needs one statistic"),
        (
            "phase_share.p95.queue > 0.4",
            0,
            "unknown phase share tail 'p95'",
        ),
        ("e2e.p95 1s", 8, "expected a comparison operator"),
        ("e2e.p95 => 1s", 8, "expected a comparison operator"),
        ("e2e.p95 >", 9, "expected a number"),
        ("e2e.p95 > fast", 10, "expected a number"),
        ("e2e.p95 > 5 parsecs", 12, "unknown unit 'parsecs'"),
        ("e2e.p95 > 95%", 12, "'%' fits ratios only"),
        (
            "gpu.utilization.mean > 95 ms",
            26,
            "a duration fits latency KPIs only",
        ),
        ("e2e.p95 > 1s and more", 13, "unexpected text"),
    ] {
        let err = Expr::parse(text).expect_err(text);
        assert_eq!(err.position, position, "{text}: {err}");
        assert!(err.message.contains(needle), "{text}: {}", err.message);
        assert_eq!(err.input, text);
    }
    // Bad rules name the rule and the field.
    let err =
        AlertEngine::from_config(&[rule("Ok", "e2e.p95 > 1s", Some("5 parsecs"))]).unwrap_err();
    assert_eq!(
        (err.rule.as_str(), err.field, err.error.position),
        ("Ok", "for", 2)
    );
    assert!(
        err.to_string()
            .starts_with("alert rule 'Ok', for: '5 parsecs': column 3")
    );
    // `for:` takes the spellings of the config's other durations too.
    assert!(AlertEngine::from_config(&[rule("Ok", "e2e.p95 > 1s", Some("5 minutes"))]).is_ok());
    assert!(AlertEngine::from_config(&[rule("Ok", "e2e.p95 > 1s", Some("1min"))]).is_ok());
    let err = AlertEngine::from_config(&[rule("bad name", "e2e.p95 > 1s", None)]).unwrap_err();
    assert_eq!((err.field, err.error.position), ("name", 3));
    let err = AlertEngine::from_config(&[
        rule("Twice", "e2e.p95 > 1s", None),
        rule("Twice", "e2e.p99 > 1s", None),
    ])
    .unwrap_err();
    assert!(err.error.message.contains("same name"));
}

#[test]
fn rule_config_deserialises_with_for() {
    let cfg: Vec<AlertRuleConfig> = serde_json::from_str(
        r#"[{"name": "GpuSaturated", "expr": "gpu.utilization.mean > 0.95", "for": "5m"},
            {"name": "Errors", "expr": "error_rate > 1%", "severity": "critical", "summary": "x"}]"#,
    )
    .unwrap();
    assert_eq!(cfg[0].for_duration.as_deref(), Some("5m"));
    assert_eq!(cfg[0].severity, Severity::Warning);
    assert_eq!(cfg[1].severity, Severity::Critical);
    let engine = AlertEngine::from_config(&cfg).unwrap();
    assert_eq!(engine.rules()[0].hold.as_secs(), 300);
    assert!(
        serde_json::from_str::<AlertRuleConfig>(r#"{"name":"a","expr":"x","fro":"1m"}"#).is_err()
    );
}

// ---------------------------------------------------------------------------------------------
// Anomalies.

/// Deterministic standard normal noise (LCG + Box–Muller).
struct Noise(u64);

impl Noise {
    fn uniform(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

const E2E_P95: KpiPath = KpiPath::Latency(Latency::E2e, Stat::P95);

#[test]
fn a_step_change_is_an_anomaly_after_n_windows() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default()).unwrap();
    let mut noise = Noise(42);
    let mut found = vec![];
    for i in 0..120u64 {
        let level = if i < 60 { 1.0 } else { 1.6 };
        let v = level + 0.02 * noise.normal();
        if let Some(a) = d.observe("llm", "m", "chat", E2E_P95, v, T0 + i * 60 * S) {
            found.push((i, a));
        }
    }
    assert!(!found.is_empty());
    let (first, a) = &found[0];
    // Windows 60, 61, 62 are out of band: the third makes the anomaly.
    assert_eq!(*first, 62);
    assert_eq!(a.consecutive, 3);
    assert_eq!(a.since_unix_nano, T0 + 60 * 60 * S);
    assert_eq!(a.direction, Direction::Up);
    assert!((a.baseline - 1.0).abs() < 0.02, "{a:?}");
    assert!(a.deviation_sigmas > 10.0, "{a:?}");
    assert_eq!(a.kpi, "e2e.p95");
    // It stays an anomaly every window until the new level is accepted (360 windows, more
    // than this run has).
    let windows: Vec<u64> = found.iter().map(|(i, _)| *i).collect();
    assert_eq!(windows, (62..120).collect::<Vec<_>>());
}

#[test]
fn noise_alone_is_not_an_anomaly() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default()).unwrap();
    for seed in 1..=5u64 {
        let mut noise = Noise(seed);
        for i in 0..1000u64 {
            let v = 2.0 + 0.2 * noise.normal();
            let model = format!("m{seed}");
            assert!(
                d.observe("llm", &model, "chat", E2E_P95, v, T0 + i * S)
                    .is_none(),
                "seed {seed}, window {i}"
            );
        }
    }
}

#[test]
fn a_single_spike_is_not_an_anomaly_and_does_not_move_the_baseline() {
    let c = AnomalyConfig::default();
    let mut b = KpiBaseline::new();
    let mut noise = Noise(7);
    for i in 0..50u64 {
        b.observe(10.0 + 0.1 * noise.normal(), i, &c);
    }
    let before = b.mean();
    let o = b.observe(50.0, 50, &c).unwrap();
    assert!(o.out_of_band && !o.anomaly && o.consecutive == 1);
    assert_eq!(b.mean(), before);
    let o = b.observe(10.0, 51, &c).unwrap();
    assert!(!o.out_of_band && o.consecutive == 0);
}

#[test]
fn a_drop_is_reported_down() {
    let mut d = AnomalyDetector::new(AnomalyConfig::default()).unwrap();
    let tput = KpiPath::RequestsPerSecond;
    let mut last = None;
    for i in 0..40u64 {
        let v = if i < 30 { 100.0 + (i % 3) as f64 } else { 40.0 };
        last = d.observe("llm", "m", "chat", tput, v, T0 + i * S).or(last);
    }
    let a = last.unwrap();
    assert_eq!(a.direction, Direction::Down);
    assert!(a.deviation_sigmas < -3.0);
}

#[test]
fn a_long_incident_stays_an_anomaly_and_its_end_is_none() {
    // 5 s evaluations: 10 minutes at 8 s against a 2 s baseline, then back to 2 s.
    let mut d = AnomalyDetector::new(AnomalyConfig::default()).unwrap();
    let e2e = KpiPath::Latency(Latency::E2e, Stat::P95);
    let value = |i: u64| {
        let noise = 0.02 * (i % 3) as f64;
        if (60..180).contains(&i) {
            8.0 + noise
        } else {
            2.0 + noise
        }
    };
    let mut flagged = Vec::new();
    for i in 0..300u64 {
        if let Some(a) = d.observe("llm", "m", "chat", e2e, value(i), T0 + i * 5 * S) {
            flagged.push((i, a.direction));
        }
    }
    // Every evaluation of the incident from the third on, and nothing after it.
    let expected: Vec<(u64, Direction)> = (62..180).map(|i| (i, Direction::Up)).collect();
    assert_eq!(flagged, expected);
}

#[test]
fn a_return_to_the_level_before_a_rebaseline_is_no_anomaly() {
    let c = AnomalyConfig {
        rebaseline_after: 30,
        ..AnomalyConfig::default()
    };
    let mut d = AnomalyDetector::new(c).unwrap();
    let e2e = KpiPath::Latency(Latency::E2e, Stat::P95);
    let value = |i: u64| {
        let noise = 0.02 * (i % 3) as f64;
        if (20..70).contains(&i) {
            8.0 + noise
        } else {
            2.0 + noise
        }
    };
    let mut flagged = Vec::new();
    for i in 0..140u64 {
        if d.observe("llm", "m", "chat", e2e, value(i), T0 + i * S)
            .is_some()
        {
            flagged.push(i);
        }
    }
    // Up from the third value of the change until 30 of them made it the baseline (20..49);
    // the way back to 2 s is not reported "down".
    assert_eq!(flagged, (22..49).collect::<Vec<_>>());
    // The earlier baseline is restored: a later step to 8 s is an anomaly again.
    let mut again = Vec::new();
    for i in 140..150u64 {
        if d.observe("llm", "m", "chat", e2e, 8.0, T0 + i * S)
            .is_some()
        {
            again.push(i);
        }
    }
    assert_eq!(again, (142..150).collect::<Vec<_>>());

    // The earlier level is remembered only as long as it took to accept the new one (30
    // values): a return 40 values later is a change of its own, reported (a review: a
    // regression back to the level before an upgrade was never reported).
    let c = AnomalyConfig {
        rebaseline_after: 30,
        ..AnomalyConfig::default()
    };
    let mut d = AnomalyDetector::new(c).unwrap();
    let mut flagged = Vec::new();
    for i in 0..200u64 {
        let noise = 0.02 * (i % 3) as f64;
        let v = if (20..120).contains(&i) { 4.0 } else { 8.0 } + noise;
        if d.observe("llm", "m", "chat", e2e, v, T0 + i * S).is_some() {
            flagged.push(i);
        }
    }
    // Down from 22 until accepted at 49; back up at 120, reported from 122 until accepted.
    assert_eq!(flagged[..27], (22..49).collect::<Vec<_>>()[..]);
    assert_eq!(flagged[27..], (122..149).collect::<Vec<_>>()[..]);
}

#[test]
fn a_silent_series_is_fed_nothing_and_forgotten_after_an_hour() {
    let mut d = AnomalyDetector::new(AnomalyConfig {
        kpis: vec!["throughput.requests_per_second".into(), "e2e.p95".into()],
        ..AnomalyConfig::default()
    })
    .unwrap();
    let every = 5 * S;
    let mut s = series("m", 1.0);
    let mut at = |d: &mut AnomalyDetector, i: u64, present: bool| {
        s.throughput.requests_per_second = 10.0 + (i % 3) as f64 * 0.1;
        let series = if present { vec![s.clone()] } else { vec![] };
        d.observe_snapshot(&snap(series), T0 + i * every)
    };
    for i in 0..20u64 {
        assert!(at(&mut d, i, true).is_empty());
    }
    // Five minutes of silence, then the series is back at its level: nothing to report (a
    // review found rates fed as 0 during the silence dragged the baseline to 0, and the
    // return read as an anomaly for up to 30 minutes).
    for i in 20..80u64 {
        assert!(at(&mut d, i, false).is_empty());
    }
    for i in 80..100u64 {
        assert!(at(&mut d, i, true).is_empty(), "{i}");
    }
    assert_eq!(d.baseline_count(), 2);
    // An hour after it was last seen its baselines are forgotten.
    let last_seen = T0 + 99 * every;
    let horizon = FORGET_QUIET_AFTER.as_secs() * S;
    d.observe_snapshot(&snap(vec![]), last_seen + horizon);
    assert_eq!(d.baseline_count(), 2);
    d.observe_snapshot(&snap(vec![]), last_seen + horizon + S);
    assert_eq!(d.baseline_count(), 0);
}

#[test]
fn the_trend_says_when_the_slo_will_be_crossed() {
    let slo = SloConfig {
        e2e_seconds: Some(2.0),
        ..SloConfig::default()
    };
    let mut d = AnomalyDetector::new(AnomalyConfig::default())
        .unwrap()
        .with_kpi_slos(&slo);
    // Rising by 0.01 s every minute from 1.0 s: at window 20 (now) the fit is 1.2 s, the SLO of
    // 2 s is 0.8 / (0.01/60) = 4800 s ahead.
    for i in 0..=20u64 {
        d.observe(
            "llm",
            "m",
            "chat",
            E2E_P95,
            1.0 + 0.01 * i as f64,
            T0 + i * 60 * S,
        );
    }
    let now = T0 + 20 * 60 * S;
    let t = d.trend("llm", "m", "chat", E2E_P95, now).unwrap();
    assert!((t.slope_per_second - 0.01 / 60.0).abs() < 1e-12);
    assert!((t.fitted - 1.2).abs() < 1e-9);
    assert_eq!(t.points, 10);
    let at = t.crosses_slo_at_unix_nano.unwrap();
    assert!(
        (at as i128 - (now + 4800 * S) as i128).abs() < 1_000_000,
        "{at}"
    );
    // A falling series never crosses an upper SLO.
    let mut b = KpiBaseline::new();
    let c = AnomalyConfig::default();
    for i in 0..10u64 {
        b.observe(1.0 - 0.01 * i as f64, T0 + i * S, &c);
    }
    let bound = SloBound {
        threshold: 2.0,
        bad_above: true,
    };
    assert_eq!(
        b.trend(T0 + 9 * S, Some(bound), &c)
            .unwrap()
            .crosses_slo_at_unix_nano,
        None
    );
    // …but does cross a lower bound (goodput-style), and one already crossed reports now.
    let lower = SloBound {
        threshold: 0.5,
        bad_above: false,
    };
    let tr = b.trend(T0 + 9 * S, Some(lower), &c).unwrap();
    // Fitted 0.91 at now, −0.01/s → 41 s.
    assert!(
        (tr.crosses_slo_at_unix_nano.unwrap() as i128 - (T0 + 50 * S) as i128).abs() < 1_000_000
    );
    let above = SloBound {
        threshold: 0.5,
        bad_above: true,
    };
    assert_eq!(
        b.trend(T0 + 9 * S, Some(above), &c)
            .unwrap()
            .crosses_slo_at_unix_nano,
        Some(T0 + 9 * S)
    );
}

#[test]
fn snapshots_feed_every_watched_kpi_and_bad_paths_are_refused() {
    let mut d = AnomalyDetector::new(AnomalyConfig {
        kpis: vec!["e2e.p95".into(), "error_rate".into()],
        ..AnomalyConfig::default()
    })
    .unwrap();
    let mut hits = vec![];
    for i in 0..20u64 {
        let mut s = series(
            "m",
            if i < 15 {
                1.0 + 0.01 * (i % 2) as f64
            } else {
                3.0
            },
        );
        s.errors = if i < 15 { i % 2 } else { 1 };
        hits.extend(d.observe_snapshot(&snap(vec![s]), T0 + i * 60 * S));
    }
    assert!(hits.iter().all(|a| a.kpi == "e2e.p95"));
    assert_eq!(hits.len(), 3);
    assert!(hits.iter().all(|a| a.operation == "chat"));
    assert_eq!(d.baseline_count(), 2);
    d.retain_series(|_, model, _| model != "m");
    assert_eq!(d.baseline_count(), 0);
    let err = AnomalyDetector::new(AnomalyConfig {
        kpis: vec!["e2e.p42".into()],
        ..AnomalyConfig::default()
    })
    .unwrap_err();
    assert!(err.message.contains("p42"));
}
