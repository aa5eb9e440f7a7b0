//! The embedded history store: restart, retention, crash (kill -9), refused files, and
//! percentiles merged over ranges checked against the exact percentiles of every value.

use infertrace_analysis::text::Text;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use infertrace_analysis::alert::{AlertEvent, AlertState};
use infertrace_analysis::diagnosis::{Finding, Severity};
use infertrace_analysis::kpi::{
    Accumulator, KpiConfig, KpiWindows, SeriesKey, SloConfig, sketch_config,
};
use infertrace_analysis::record::{Dialect, Outcome, RequestRecord};
use infertrace_analysis::trace::{SpanId, TraceId};
use infertrace_collector::InternalEvents;
use infertrace_collector::internal_events::DropLabels;
use infertrace_collector::store::{
    DB_FILE_NAME, HistoryFilter, MINUTE_NANOS, Store, StoreError, StoreOptions, minute_of,
    unix_nanos_now,
};

const SEC: u64 = 1_000_000_000;
/// Set in the child process of the kill -9 test: the store directory.
const CHILD_DIR_ENV: &str = "INFERTRACE_STORE_TEST_CHILD_DIR";

fn rec(n: u64, model: &str, e2e: f64, outcome: Outcome) -> RequestRecord {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&n.to_be_bytes());
    id[15] = 1;
    let mut r = RequestRecord::new(
        TraceId(id),
        SpanId([1; 8]),
        Text::from("svc"),
        Dialect::Infertrace,
        0,
        0,
    );
    r.model = model.into();
    r.operation = "chat".into();
    r.e2e = e2e;
    r.ttft = Some(e2e * 0.2);
    r.queue = Some(e2e * 0.1);
    r.prefill = Some(e2e * 0.1);
    r.decode = Some(e2e * 0.8);
    r.outcome = outcome;
    r.output_tokens = Some(10);
    r
}

/// Deterministic values, log-uniform over ~5 ms … 20 s.
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut x = seed.max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            0.005 * 4000f64.powf(u)
        })
        .collect()
}

/// The exact q-quantile by the sketch's rank rule (value at rank ⌊q·(n − 1)⌋).
fn exact_quantile(vals: &mut [f64], q: f64) -> f64 {
    vals.sort_by(f64::total_cmp);
    vals[(q * (vals.len() as f64 - 1.0)) as usize]
}

/// Options with `flush` and a queue large enough for tests that replay hours of simulated
/// time in a second (a live feed hands over at most once a second).
fn options(flush: Duration) -> StoreOptions {
    StoreOptions {
        flush_interval: flush,
        queue_capacity: 1 << 20,
        ..StoreOptions::default()
    }
}

/// Items the store dropped, for any reason.
fn dropped(events: &InternalEvents) -> u64 {
    ["queue_full", "writer_stopped", "write_failed"]
        .into_iter()
        .map(|reason| {
            events
                .store_dropped
                .get_or_create(&DropLabels { reason })
                .get()
        })
        .sum()
}

fn key(model: &str) -> SeriesKey {
    SeriesKey {
        service: Arc::from("svc"),
        model: Arc::from(model),
        operation: Arc::from("chat"),
    }
}

fn finding(model: &str) -> Finding {
    Finding {
        rule_id: "queue_dominates_tail",
        severity: Severity::Warning,
        service: "svc".into(),
        model: model.into(),
        operation: "chat".into(),
        title: "queue is 60% of the p99 requests' time".into(),
        evidence: Vec::new(),
        recommendation: "add replicas".into(),
    }
}

fn alert(state: AlertState, t: u64) -> AlertEvent {
    AlertEvent {
        alert: "HighTtft".into(),
        service: "svc".into(),
        model: "m".into(),
        operation: "chat".into(),
        severity: Severity::Critical,
        state,
        value: 1.5,
        threshold: 1.0,
        starts_at_unix_nano: t,
        ends_at_unix_nano: None,
        summary: "TTFT p99 above 1 s".into(),
        description: "ttft.p99 > 1s".into(),
        generator_url: "http://localhost/api/alerts".into(),
    }
}

#[test]
fn restart_keeps_history_and_rebuilds_the_hour_window() {
    let dir = tempfile::tempdir().unwrap();
    // Three whole minutes ending ten minutes ago (well inside the 7-day retention).
    let start = minute_of(unix_nanos_now()) - 13 * MINUTE_NANOS;
    let end = start + 3 * MINUTE_NANOS;
    let kpi = KpiConfig::default();
    let mut live = KpiWindows::new(kpi.clone());
    live.set_start(start);
    let vals = values(7, 3000);
    {
        let store = Store::open(dir.path(), options(Duration::from_secs(5))).unwrap();
        let events = InternalEvents::default();
        let writer = store.start_writer(events.clone()).unwrap();
        let mut feed = store.feed(writer.clone(), &kpi);
        for (i, v) in vals.iter().enumerate() {
            let now = start + (i as u64) * (3 * MINUTE_NANOS / vals.len() as u64);
            let outcome = if i % 100 == 0 {
                Outcome::Error
            } else {
                Outcome::Ok
            };
            let model = if i % 3 == 0 { "a" } else { "b" };
            let r = rec(i as u64, model, *v, outcome);
            live.record(&r, now);
            feed.record(&r, None, now);
        }
        feed.hand_over(end);
        writer.write_findings(end - SEC, vec![finding("a")]);
        writer.write_alert_events(
            end - 2 * SEC,
            vec![alert(AlertState::Pending, end - 2 * SEC)],
        );
        writer.write_alert_events(end - SEC, vec![alert(AlertState::Firing, end - SEC)]);
        writer.flush().unwrap();
        assert_eq!(dropped(&events), 0);
    }
    // A new process: open again, read everything back.
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let rollups = store.rollups(start, end).unwrap();
    let total: u64 = rollups.iter().map(|r| r.accumulator.counts.requests).sum();
    assert_eq!(total, vals.len() as u64);
    assert_eq!(rollups.len(), 6, "3 minutes × 2 series");
    let series = store.series(start, end).unwrap();
    assert_eq!(series, [key("a"), key("b")]);
    assert!(store.series(end, end + MINUTE_NANOS).unwrap().is_empty());

    // The 1h window rebuilt from the stored minutes equals the one that saw every record.
    let mut rebuilt = KpiWindows::new(kpi);
    for r in &rollups {
        assert!(rebuilt.absorb_slot(&r.key, r.minute_unix_nano, MINUTE_NANOS, &r.accumulator));
    }
    let mut restored = KpiWindows::new(KpiConfig::default());
    let absorbed = store
        .restore_kpis(&mut restored, end, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(absorbed, 6);
    // A retention shorter than the window restores only what it keeps (not minutes the first
    // flush then deletes): 2 minutes before `end`, its last 2. (One collector per store: the
    // first handle goes first, and comes back after.)
    drop(store);
    let short = Store::open(
        dir.path(),
        StoreOptions {
            retention: Duration::from_secs(120),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let mut kept = KpiWindows::new(KpiConfig::default());
    let absorbed = short
        .restore_kpis(&mut kept, end, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(absorbed, 4, "the last two minutes × 2 series");
    drop(short);
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let (a, b) = (
        live.snapshot(Duration::from_secs(3600), end),
        rebuilt.snapshot(Duration::from_secs(3600), end),
    );
    assert_eq!(restored.snapshot(Duration::from_secs(3600), end), b);
    assert_eq!(a.series.len(), 2);
    for (x, y) in a.series.iter().zip(&b.series) {
        assert_eq!((x.requests, x.errors), (y.requests, y.errors));
        assert_eq!(x.e2e.unwrap().p99, y.e2e.unwrap().p99);
        assert_eq!(x.ttft.unwrap().p50, y.ttft.unwrap().p50);
        // Sums are merged in another order (equal up to rounding); the stored tail sums are
        // f32 (relative 6e-8).
        let (ax, ay) = (x.phase_share.all.unwrap(), y.phase_share.all.unwrap());
        assert!((ax.queue - ay.queue).abs() < 1e-12 && (ax.decode - ay.decode).abs() < 1e-12);
        let (sx, sy) = (x.phase_share.p90.unwrap(), y.phase_share.p90.unwrap());
        assert!((sx.queue - sy.queue).abs() < 1e-6 && (sx.decode - sy.decode).abs() < 1e-6);
        assert_eq!(x.goodput, y.goodput);
    }

    // Slow requests: 10 slowest a minute plus every failed one (30 errors).
    let slow = store.slow_requests(start, end, 1000).unwrap();
    let failed = slow.iter().filter(|r| r.reason == "failed").count();
    assert_eq!(failed, 30);
    for m in 0..3 {
        let minute = start + m * MINUTE_NANOS;
        let mut kept: Vec<f64> = slow
            .iter()
            .filter(|r| r.reason == "slow" && r.minute_unix_nano == minute)
            .map(|r| r.e2e)
            .collect();
        let mut truth: Vec<f64> = vals
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                let now = start + (*i as u64) * (3 * MINUTE_NANOS / vals.len() as u64);
                minute_of(now) == minute && i % 100 != 0
            })
            .map(|(_, v)| *v)
            .collect();
        truth.sort_by(|x, y| y.total_cmp(x));
        kept.sort_by(|x, y| y.total_cmp(x));
        assert_eq!(kept, truth[..10].to_vec(), "minute {m}");
    }
    assert!(slow.windows(2).all(|w| w[0].e2e >= w[1].e2e));
    assert_eq!(slow[0].record["model"], slow[0].model.as_str());
    let json_e2e = slow[0].record["e2e"].as_f64().unwrap();
    assert!((json_e2e - slow[0].e2e).abs() <= 1e-12 * slow[0].e2e);
    assert_eq!(store.slow_requests(start, end, 5).unwrap().len(), 5);

    let findings = store.findings(start, end).unwrap();
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].body["rule_id"], "queue_dominates_tail");
    let alerts = store.alert_history(start, end).unwrap();
    let states: Vec<&str> = alerts
        .iter()
        .map(|a| a.body["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["pending", "firing"]);
}

#[test]
fn retention_deletes_old_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            retention: Duration::from_secs(3600),
            ..options(Duration::from_secs(5))
        },
    )
    .unwrap();
    let writer = store.start_writer(InternalEvents::default()).unwrap();
    let now = unix_nanos_now();
    let old = minute_of(now) - 2 * 3600 * SEC;
    let recent = minute_of(now) - 10 * MINUTE_NANOS;
    let (config, slo) = (sketch_config(), SloConfig::default());
    let one = |e2e| {
        let mut a = Accumulator::default();
        a.add(&config, &slo, &rec(1, "m", e2e, Outcome::Ok));
        a
    };
    writer.write_rollups(old, vec![(key("m"), one(1.0))]);
    writer.write_rollups(recent, vec![(key("m"), one(2.0))]);
    writer.write_findings(old, vec![finding("m")]);
    writer.write_findings(recent, vec![finding("m")]);
    writer.write_alert_events(old, vec![alert(AlertState::Firing, old)]);
    writer.flush().unwrap();
    // The flush enforced retention at the wall clock: the 2-hour-old rows are gone.
    let all = |s: &Store| s.rollups(0, u64::MAX / 2).unwrap();
    let kept = all(&store);
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].minute_unix_nano, recent);
    assert_eq!(store.findings(0, u64::MAX / 2).unwrap().len(), 1);
    assert!(store.alert_history(0, u64::MAX / 2).unwrap().is_empty());
    // Explicit times: the minute `recent` goes once it ended an hour before; the finding
    // stored at its start goes a minute earlier.
    let stats = store
        .enforce_retention(recent + MINUTE_NANOS + 3600 * SEC - 1)
        .unwrap();
    assert_eq!((stats.rollups, stats.events), (0, 1));
    assert_eq!(all(&store).len(), 1);
    let stats = store
        .enforce_retention(recent + MINUTE_NANOS + 3600 * SEC)
        .unwrap();
    assert_eq!((stats.rollups, stats.events), (1, 0));
    assert!(all(&store).is_empty());
}

/// Runs as the child of [`kill_minus_9_loses_at_most_the_flush_interval`] when
/// [`CHILD_DIR_ENV`] is set (a no-op otherwise): records one request every 10 ms and prints
/// when each was handed to the feed, until it is killed.
#[test]
fn store_child_process() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let store = Store::open(Path::new(&dir), options(Duration::from_millis(300))).unwrap();
    let writer = store.start_writer(InternalEvents::default()).unwrap();
    let mut feed = store.feed(writer, &KpiConfig::default());
    let mut out = std::io::stdout().lock();
    for i in 0u64.. {
        let now = unix_nanos_now();
        feed.record(&rec(i, "m", 0.5, Outcome::Ok), None, now);
        feed.tick(now);
        writeln!(out, "recorded {i} {now}").unwrap();
        out.flush().unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn kill_minus_9_loses_at_most_the_flush_interval() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "store_child_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut parts = line.split_whitespace();
            if parts.next() == Some("recorded") {
                let i: u64 = parts.next().unwrap().parse().unwrap();
                let t: u64 = parts.next().unwrap().parse().unwrap();
                if tx.send((i, t)).is_err() {
                    return;
                }
            }
        }
    });
    // Flush interval 300 ms + hand-over step 75 ms + 250 ms for the commit itself, plus what
    // this machine's scheduler is measured to add in the same run: the child's 10 ms loop
    // running late by up to `lateness` means its flusher thread may be as late, a few times.
    let bound = |recorded: &[(u64, u64)]| {
        let lateness = recorded
            .windows(2)
            .map(|w| w[1].1.saturating_sub(w[0].1).saturating_sub(10_000_000))
            .max()
            .unwrap_or(0);
        ((300 + 75 + 250) * 1_000_000 + 3 * lateness, lateness)
    };
    let older_than_bound = |recorded: &[(u64, u64)], at: u64| {
        let (bound, _) = bound(recorded);
        recorded.iter().filter(|(_, t)| *t + bound <= at).count()
    };
    // Let it run ≥ 2 s (several flushes), and until enough of what it recorded lies further back
    // than the bound (a busy machine slows the child and widens the bound), then SIGKILL it.
    let started = Instant::now();
    let mut recorded = Vec::new();
    while started.elapsed() < Duration::from_secs(2)
        || older_than_bound(&recorded, unix_nanos_now()) < 30
    {
        if let Ok(x) = rx.recv_timeout(Duration::from_millis(50)) {
            recorded.push(x);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "child too slow"
        );
    }
    child.kill().unwrap(); // SIGKILL: no destructor, no final flush
    let killed_at = unix_nanos_now();
    child.wait().unwrap();
    while let Ok(x) = rx.try_recv() {
        recorded.push(x);
    }

    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let stored: u64 = store
        .rollups(0, u64::MAX / 2)
        .unwrap()
        .iter()
        .map(|r| r.accumulator.counts.requests)
        .sum();
    let (bound, lateness) = bound(&recorded);
    let must_have = recorded
        .iter()
        .filter(|(_, t)| *t + bound <= killed_at)
        .count() as u64;
    assert!(
        must_have >= 20,
        "the child recorded too little: {must_have}"
    );
    assert!(
        stored >= must_have,
        "stored {stored} of the {must_have} recorded more than {bound} ns before the kill \
         (scheduler lateness {lateness} ns)"
    );
    assert!(stored <= recorded.len() as u64 + 1);
}

#[test]
fn a_corrupt_file_is_refused_named_and_left_alone() {
    for header in [&b""[..], &b"SQLite format 3\0"[..]] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DB_FILE_NAME);
        let mut bytes = header.to_vec();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        while bytes.len() < 8192 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(
                err,
                StoreError::NotADatabase { .. } | StoreError::Sqlite { .. }
            ),
            "{message}"
        );
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "the file was modified"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [DB_FILE_NAME], "files appeared beside it");
    }
}

#[test]
fn a_foreign_sqlite_file_is_refused_named_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE_NAME);
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO users (name) VALUES ('ada'), ('grace');",
        )
        .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, StoreError::Foreign { .. }), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("users"), "{message}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the file was modified"
    );
    // Another application's id, even with no table, is refused too.
    let other = tempfile::tempdir().unwrap();
    let path = other.path().join(DB_FILE_NAME);
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "application_id", 42).unwrap();
    }
    let err = Store::open(other.path(), StoreOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Foreign {
                application_id: 42,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn history_merges_minutes_into_the_percentile_of_every_value() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options(Duration::from_secs(5))).unwrap();
    let events = InternalEvents::default();
    let writer = store.start_writer(events.clone()).unwrap();
    let kpi = KpiConfig::default();
    let mut feed = store.feed(writer.clone(), &kpi);
    // Three hours; model "a" fast and steady, model "b" slow and growing, so per-minute
    // percentiles averaged would be far from the truth.
    let hour = 3600 * SEC;
    let start = minute_of(unix_nanos_now()) - 4 * hour;
    let n = 18_000usize;
    let (va, vb) = (values(11, n), values(12, n));
    let mut per_hour: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut per_hour_a: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for i in 0..n {
        let now = start + (i as u64) * (3 * hour / n as u64);
        let h = ((now - start) / hour) as usize;
        let a = va[i] * 0.1;
        let b = vb[i] * (1.0 + 5.0 * (i % 600) as f64 / 600.0);
        feed.record(&rec(i as u64, "a", a, Outcome::Ok), None, now);
        if i % 4 == 0 {
            feed.record(&rec(i as u64, "b", b, Outcome::Ok), None, now);
            per_hour[h].push(b);
        }
        per_hour[h].push(a);
        per_hour_a[h].push(a);
    }
    feed.hand_over(start + 3 * hour);
    writer.flush().unwrap();
    assert_eq!(dropped(&events), 0);

    let all = HistoryFilter::default();
    for q in ["p50", "p90", "p99"] {
        let qv: f64 = format!("0.{}", &q[1..]).parse().unwrap();
        let points = store
            .history(
                &format!("e2e.{q}"),
                &all,
                start,
                start + 3 * hour,
                Duration::from_secs(3600),
            )
            .unwrap();
        assert_eq!(points.len(), 3);
        for (h, p) in points.iter().enumerate() {
            assert_eq!(p.t_unix_nano, start + h as u64 * hour);
            let truth = exact_quantile(&mut per_hour[h], qv);
            let got = p.value.unwrap();
            assert!(
                (got - truth).abs() <= 0.01 * truth,
                "{q} hour {h}: merged {got} vs exact {truth}"
            );
        }
        // Filtered to one model.
        let points = store
            .history(
                &format!("e2e.{q}"),
                &HistoryFilter {
                    model: Some("a".into()),
                    ..HistoryFilter::default()
                },
                start,
                start + 3 * hour,
                Duration::from_secs(3600),
            )
            .unwrap();
        for (h, p) in points.iter().enumerate() {
            let truth = exact_quantile(&mut per_hour_a[h], qv);
            let got = p.value.unwrap();
            assert!((got - truth).abs() <= 0.01 * truth, "{q} a hour {h}");
        }
    }
    // Counts are exact; rates divide by the step.
    let requests = store
        .history(
            "requests",
            &all,
            start,
            start + 3 * hour,
            Duration::from_secs(3600),
        )
        .unwrap();
    let counts: Vec<f64> = requests.iter().map(|p| p.value.unwrap()).collect();
    let truth: Vec<f64> = per_hour.iter().map(|v| v.len() as f64).collect();
    assert_eq!(counts, truth);
    let rps = store
        .history(
            "throughput.requests_per_second",
            &all,
            start,
            start + 3 * hour,
            Duration::from_secs(3600),
        )
        .unwrap();
    assert!((rps[0].value.unwrap() - truth[0] / 3600.0).abs() < 1e-9);
    // One-minute steps: 180 points plus an empty hour after; no data reads as None.
    let fine = store
        .history(
            "goodput.ratio",
            &all,
            start,
            start + 4 * hour,
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(fine.len(), 240);
    assert!(fine[..180].iter().all(|p| p.value.is_some()));
    assert!(fine[180..].iter().all(|p| p.value.is_none()));
    let share = store
        .history(
            "phase_share.all.decode",
            &all,
            start,
            start + hour,
            Duration::from_secs(3600),
        )
        .unwrap();
    assert!((share[0].value.unwrap() - 0.8).abs() < 1e-9);
    assert!(matches!(
        store.history(
            "nonsense",
            &all,
            start,
            start + hour,
            Duration::from_secs(60)
        ),
        Err(StoreError::UnknownKpi { .. })
    ));
}

#[test]
fn rates_reaching_past_what_the_writer_committed_divide_by_the_time_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options(Duration::from_secs(5))).unwrap();
    let writer = store.start_writer(InternalEvents::default()).unwrap();
    let mut feed = store.feed(writer.clone(), &KpiConfig::default());
    assert_eq!(store.data_bounds().unwrap().until, None);
    // 10 requests a second for the first 30 s of a minute, handed over and committed at 30 s;
    // the range asked for reaches the minute's end (a report's `--since` up to now, while
    // the store lags).
    let minute = minute_of(unix_nanos_now()) - 10 * MINUTE_NANOS;
    feed.tick(minute);
    for i in 0..300u64 {
        feed.record(&rec(i, "m", 0.5, Outcome::Ok), None, minute + i * SEC / 10);
    }
    feed.hand_over(minute + 30 * SEC);
    writer.flush().unwrap();
    assert_eq!(store.data_bounds().unwrap().until, Some(minute + 30 * SEC));
    let rate = |to| {
        store
            .history(
                "throughput.requests_per_second",
                &HistoryFilter::default(),
                minute,
                to,
                Duration::from_secs(60),
            )
            .unwrap()[0]
            .value
            .unwrap()
    };
    // 300 requests over the 30 s the store holds, not over the 60 s asked for.
    assert!((rate(minute + 60 * SEC) - 10.0).abs() < 1e-9);
    // A range ending before the data does divides by the range, as before.
    assert!((rate(minute + 20 * SEC) - 15.0).abs() < 1e-9);
    // An idle hand-over moves it on: the quiet time after the requests counts.
    feed.hand_over(minute + 50 * SEC);
    writer.flush().unwrap();
    assert_eq!(store.data_bounds().unwrap().until, Some(minute + 50 * SEC));
    assert!((rate(minute + 60 * SEC) - 6.0).abs() < 1e-9);
}

#[test]
fn the_store_keeps_when_its_data_begins() {
    let dir = tempfile::tempdir().unwrap();
    let minute = minute_of(unix_nanos_now()) - 10 * MINUTE_NANOS;
    {
        let store = Store::open(dir.path(), options(Duration::from_secs(5))).unwrap();
        assert_eq!(store.data_bounds().unwrap().since, None, "a fresh store");
        let writer = store.start_writer(InternalEvents::default()).unwrap();
        assert!(writer.write_data_since(minute + 40 * SEC));
        writer.flush().unwrap();
        assert_eq!(store.data_bounds().unwrap().since, Some(minute + 40 * SEC));
        // A later collector's start does not replace the first one's.
        assert!(writer.write_data_since(minute + 200 * SEC));
        writer.flush().unwrap();
        assert_eq!(store.data_bounds().unwrap().since, Some(minute + 40 * SEC));
    }
    // Kept across a reopening.
    let store = Store::open(dir.path(), options(Duration::from_secs(5))).unwrap();
    assert_eq!(store.data_bounds().unwrap().since, Some(minute + 40 * SEC));
    // A range that starts before the data divides from where it begins: 20 requests in the
    // minute's last 20 s are 1 a second, not a third.
    let writer = store.start_writer(InternalEvents::default()).unwrap();
    let mut feed = store.feed(writer.clone(), &KpiConfig::default());
    feed.tick(minute + 40 * SEC);
    for i in 0..20u64 {
        feed.record(
            &rec(i, "m", 0.5, Outcome::Ok),
            None,
            minute + (40 + i) * SEC,
        );
    }
    feed.hand_over(minute + 60 * SEC);
    writer.flush().unwrap();
    let read = store
        .history_within(
            "throughput.requests_per_second",
            &HistoryFilter::default(),
            minute,
            minute + 60 * SEC,
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(read.bounds.since, Some(minute + 40 * SEC));
    assert_eq!(read.bounds.until, Some(minute + 60 * SEC));
    assert!(
        (read.points[0].value.unwrap() - 1.0).abs() < 1e-9,
        "{read:?}"
    );
    // Where the committed data ends is kept across a restart too: a collector that just
    // started has committed nothing yet, and the store's data still ends there.
    drop((feed, writer, store));
    let store = Store::open(dir.path(), options(Duration::from_secs(5))).unwrap();
    assert_eq!(store.data_bounds().unwrap().until, Some(minute + 60 * SEC));

    // A store written before it was kept: its oldest minute.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options(Duration::from_secs(5))).unwrap();
    let writer = store.start_writer(InternalEvents::default()).unwrap();
    let mut feed = store.feed(writer.clone(), &KpiConfig::default());
    feed.tick(minute + 30 * SEC);
    feed.record(&rec(1, "m", 0.5, Outcome::Ok), None, minute + 30 * SEC);
    feed.hand_over(minute + 31 * SEC);
    writer.flush().unwrap();
    assert_eq!(store.data_bounds().unwrap().since, Some(minute));
}

/// One collector's run on a store, as the pipeline writes it: a request a second from `start`
/// (or `data_since`, for a build that kept no runs), committed through `through`.
struct Run {
    start: Option<u64>,
    data_since: Option<u64>,
    first_id: u64,
    requests: u64,
    through: u64,
}

impl Run {
    /// Writes the run to the store in `dir`; returns the store, its writer gone.
    fn write(&self, dir: &Path) -> Store {
        let store = Store::open(dir, options(Duration::from_secs(5))).unwrap();
        let writer = store.start_writer(InternalEvents::default()).unwrap();
        if let Some(since) = self.data_since {
            assert!(writer.write_data_since(since));
        }
        if let Some(start) = self.start {
            assert!(writer.write_run_start(start));
        }
        let from = self.start.or(self.data_since).unwrap();
        let mut feed = store.feed(writer.clone(), &KpiConfig::default());
        feed.tick(from);
        for i in 0..self.requests {
            let r = rec(self.first_id + i, "m", 0.5, Outcome::Ok);
            feed.record(&r, None, from + i * SEC);
            // Minutes are handed over as they end.
            if (from + (i + 1) * SEC).is_multiple_of(MINUTE_NANOS) {
                feed.hand_over(from + (i + 1) * SEC);
            }
        }
        feed.tick(self.through);
        feed.hand_over(self.through);
        writer.flush().unwrap();
        drop((feed, writer));
        store
    }
}

/// A stopped collector's downtime is neither quiet time nor time the rates divide by: the
/// store keeps when each collector ran, and a minute inside a run without requests reads 0
/// where one outside every run reads `null`.
#[test]
fn quiet_minutes_read_zero_and_downtime_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let m = minute_of(unix_nanos_now()) - 10 * MINUTE_NANOS;
    // Run 1 from m: one request a second through minute m, then a quiet minute.
    let run = Run {
        start: Some(m),
        data_since: Some(m),
        first_id: 0,
        requests: 60,
        through: m + 120 * SEC,
    };
    drop(run.write(dir.path()));
    // Down for 150 s; run 2 from m + 270 s: 30 requests in its first 30 s.
    let store = Run {
        start: Some(m + 270 * SEC),
        data_since: None,
        first_id: 100,
        requests: 30,
        through: m + 300 * SEC,
    }
    .write(dir.path());

    let all = HistoryFilter::default();
    let history = |kpi: &str, step: u64| {
        store
            .history_within(kpi, &all, m, m + 300 * SEC, Duration::from_secs(step))
            .unwrap()
    };
    let values = |kpi: &str| -> Vec<Option<f64>> {
        history(kpi, 60).points.iter().map(|p| p.value).collect()
    };
    assert_eq!(
        values("throughput.requests_per_second"),
        [Some(1.0), Some(0.0), None, None, Some(1.0)]
    );
    assert_eq!(
        values("requests"),
        [Some(60.0), Some(0.0), None, None, Some(30.0)]
    );
    assert_eq!(values("e2e.p99")[1], None, "no request, no percentile");
    // One step over all of it: 90 requests in the 150 s that were seen.
    let whole = history("throughput.requests_per_second", 300);
    assert!(
        (whole.points[0].value.unwrap() - 0.6).abs() < 1e-9,
        "{whole:?}"
    );
    assert_eq!(
        whole.runs.gaps(m, m + 300 * SEC),
        [(m + 120 * SEC, m + 270 * SEC)]
    );
    // KPI windows restored from it (by a collector starting at m + 300 s) leave the
    // downtime out as well: 90 requests in 150 s.
    let mut kpis = KpiWindows::new(KpiConfig::default());
    store
        .restore_kpis(&mut kpis, m + 300 * SEC, Duration::from_secs(3600))
        .unwrap();
    let snapshot = kpis.snapshot(Duration::from_secs(3600), m + 300 * SEC);
    let rate: f64 = snapshot
        .series
        .iter()
        .map(|s| s.throughput.requests_per_second)
        .sum();
    assert!((rate - 0.6).abs() < 1e-9, "{rate}");
}

/// A store written by a build that kept no runs counts its data so far as one run, from when
/// it began to its last commit, once a later build starts on it; ranges starting within a
/// minute see the runs of the whole minute; a far-off `to` is answered.
#[test]
fn a_store_without_runs_counts_its_data_as_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let m = minute_of(unix_nanos_now()) - 10 * MINUTE_NANOS;
    // As an earlier build wrote it: no run start, 90 requests over 90 s.
    let earlier = Run {
        start: None,
        data_since: Some(m),
        first_id: 0,
        requests: 90,
        through: m + 90 * SEC,
    };
    drop(earlier.write(dir.path()));
    // This build from m + 180 s: 30 requests in 30 s.
    let store = Run {
        start: Some(m + 180 * SEC),
        data_since: None,
        first_id: 100,
        requests: 30,
        through: m + 210 * SEC,
    }
    .write(dir.path());

    let all = HistoryFilter::default();
    let read = store
        .history_within("requests", &all, m, m + 240 * SEC, Duration::from_secs(60))
        .unwrap();
    let values: Vec<_> = read.points.iter().map(|p| p.value).collect();
    assert_eq!(values, [Some(60.0), Some(30.0), None, Some(30.0)]);
    assert_eq!(
        read.runs.gaps(m, m + 210 * SEC),
        [(m + 90 * SEC, m + 180 * SEC)]
    );
    // From 40 s into minute m + 1 (after the earlier data's last commit): the minute's 30
    // requests over the 30 s of it that were seen.
    let rate = store
        .history(
            "throughput.requests_per_second",
            &all,
            m + 100 * SEC,
            m + 120 * SEC,
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(rate.len(), 1);
    assert!((rate[0].value.unwrap() - 1.0).abs() < 1e-9, "{rate:?}");
    // A `to` far past anything (the last step's end saturates).
    let far = store
        .history("requests", &all, m, u64::MAX, Duration::from_secs(60))
        .unwrap();
    assert_eq!(far.iter().filter_map(|p| p.value).sum::<f64>(), 120.0);
}

#[test]
fn a_second_writer_and_no_store_are_handled() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let _writer = store.start_writer(InternalEvents::default()).unwrap();
    assert!(matches!(
        store.start_writer(InternalEvents::default()),
        Err(StoreError::WriterRunning { .. })
    ));
    let off = StoreOptions {
        enabled: false,
        data_dir: dir.path().join("never"),
        ..StoreOptions::default()
    };
    assert!(Store::open_configured(&off).unwrap().is_none());
    assert!(!dir.path().join("never").exists());
}

#[test]
fn a_full_queue_drops_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            queue_capacity: 1,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let events = InternalEvents::default();
    let writer = store.start_writer(events.clone()).unwrap();
    let now = minute_of(unix_nanos_now());
    let (config, slo) = (sketch_config(), SloConfig::default());
    let mut acc = Accumulator::default();
    acc.add(&config, &slo, &rec(1, "m", 1.0, Outcome::Ok));
    let mut refused = 0u64;
    for _ in 0..10_000 {
        if !writer.write_rollups(now, vec![(key("m"), acc.clone())]) {
            refused += 1;
        }
    }
    writer.flush().unwrap();
    assert!(refused > 0, "a one-slot queue never filled");
    let dropped = events
        .store_dropped
        .get_or_create(&DropLabels {
            reason: "queue_full",
        })
        .get();
    assert_eq!(dropped, refused);
    let stored: u64 = store
        .rollups(now, now + MINUTE_NANOS)
        .unwrap()
        .iter()
        .map(|r| r.accumulator.counts.requests)
        .sum();
    assert_eq!(stored, 10_000 - refused);
    assert!(events.store_writes.get() >= 1);
}

/// Another SQLite client reading the store while the collector runs — the `sqlite3` shell, a
/// backup tool — leaves the live WAL alone: the collector keeps its SQLite locks on the file,
/// so the other client never takes itself for the last one and deletes the WAL.
#[test]
fn another_sqlite_client_leaves_the_live_wal_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options(Duration::from_millis(300))).unwrap();
    let _writer = store.start_writer(InternalEvents::default()).unwrap();
    let db = dir.path().join(DB_FILE_NAME);
    let wal = dir.path().join(format!("{DB_FILE_NAME}-wal"));
    assert!(wal.exists(), "the store runs in WAL mode");
    // A process of its own: POSIX locks are per process.
    let script = "import sqlite3, sys\n\
                  c = sqlite3.connect(sys.argv[1])\n\
                  print(c.execute('select count(*) from rollups').fetchone()[0])\n\
                  c.close()\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&db)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        wal.exists(),
        "the other client took itself for the last one and deleted the live WAL"
    );
}

/// A one-segment critical path of `secs`.
fn one_segment_path(secs: f64) -> infertrace_analysis::critical_path::CriticalPath {
    use infertrace_analysis::critical_path::{CriticalPath, Segment};
    CriticalPath {
        trace_id: TraceId([3; 16]),
        root: SpanId([3; 8]),
        segments: vec![Segment {
            span_id: SpanId([3; 8]),
            name: "decode".into(),
            service: Text::from("llm"),
            start_unix_nano: 0,
            end_unix_nano: (secs * 1e9) as u64,
        }],
        adjustments: vec![],
    }
}

#[test]
fn critical_path_slots_are_replaced_by_start_and_deleted_past_the_windows_reach() {
    use infertrace_analysis::critical_path::CriticalPathWindows;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let writer = store.start_writer(InternalEvents::default()).unwrap();
    let now = unix_nanos_now();
    let (old, recent) = (now - 1800 * SEC, now - 300 * SEC);
    let mut windows = CriticalPathWindows::default();
    let width = windows.slot_nanos();
    windows.record(&one_segment_path(1.0), 1.0, old);
    windows.record(&one_segment_path(1.0), 1.0, recent);
    let slots = |windows: &CriticalPathWindows, at: &[u64]| -> Vec<(u64, Vec<u8>)> {
        at.iter().filter_map(|t| windows.encode_slot(*t)).collect()
    };
    assert!(writer.write_critical_slots(width, 0, slots(&windows, &[old, recent])));
    writer.flush().unwrap();
    // The recent slot again, with a second request; the old one now out of reach.
    windows.record(&one_segment_path(2.0), 2.0, recent);
    assert!(writer.write_critical_slots(width, now - 1200 * SEC, slots(&windows, &[recent])));
    writer.flush().unwrap();

    let mut restored = CriticalPathWindows::default();
    assert_eq!(store.restore_critical_paths(&mut restored, now).unwrap(), 1);
    let summary = restored.snapshot(Duration::from_secs(3600), now);
    assert_eq!(summary.requests, 2, "the recent slot's latest version only");
    assert!((summary.e2e_seconds.all - 3.0).abs() < 1e-9, "{summary:?}");
    // The store's own retention deletes slots too.
    assert_eq!(
        store
            .enforce_retention(now + 8 * 24 * 3600 * SEC)
            .unwrap()
            .critical_slots,
        1
    );
}

/// After `critical_path.slot` grew (10 s → 1 min), a restored minute holds the 10-second slots
/// it started with; written back, it replaces them, so a second restart counts them once.
#[test]
fn a_wider_slot_replaces_the_narrower_ones_it_took_in() {
    use infertrace_analysis::critical_path::{CriticalPathWindows, CriticalPathWindowsConfig};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let writer = store.start_writer(InternalEvents::default()).unwrap();
    let now = unix_nanos_now();
    let minute = minute_of(now) - 10 * MINUTE_NANOS;
    let mut narrow = CriticalPathWindows::default();
    for at in [minute, minute + 10 * SEC, minute + 50 * SEC] {
        narrow.record(&one_segment_path(1.0), 1.0, at);
    }
    assert!(writer.write_critical_slots(narrow.slot_nanos(), 0, narrow.unsaved_slots(now)));
    writer.flush().unwrap();
    let wide = || {
        CriticalPathWindows::new(CriticalPathWindowsConfig {
            slot: Duration::from_secs(60),
            ..CriticalPathWindowsConfig::default()
        })
    };
    let mut first = wide();
    assert_eq!(store.restore_critical_paths(&mut first, now).unwrap(), 3);
    let (start, slot) = first.encode_slot(minute).unwrap();
    assert!(writer.write_critical_slots(first.slot_nanos(), 0, vec![(start, slot)]));
    writer.flush().unwrap();
    let mut second = wide();
    assert_eq!(store.restore_critical_paths(&mut second, now).unwrap(), 1);
    let hour = Duration::from_secs(3600);
    assert_eq!(second.snapshot(hour, now).requests, 3);
}
