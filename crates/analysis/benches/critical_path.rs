//! Critical path cost on traces of 10, 1,000 and 100,000 spans: a random bushy tree (children
//! nested in their parents, some overflowing, many parallel) and a 100,000-deep chain; and what
//! one slot of the critical-path windows costs to encode for the history store (its size is
//! printed).

use infertrace_analysis::text::Text;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use infertrace_analysis::critical_path::{
    CriticalPath, CriticalPathOptions, CriticalPathWindows, Segment, critical_path,
};
use infertrace_analysis::trace::{Span, SpanId, SpanKind, StatusCode, TraceId};

/// A small deterministic generator (64-bit LCG), so runs are comparable.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn id(i: usize) -> SpanId {
    SpanId(((i as u64) + 1).to_be_bytes())
}

fn span(i: usize, parent: Option<usize>, start: u64, end: u64, service: &Text) -> Span {
    Span {
        trace_id: TraceId([3; 16]),
        span_id: id(i),
        parent_span_id: parent.map(id),
        name: format!("op{}", i % 50).into(),
        service: service.clone(),
        kind: SpanKind::Internal,
        start_unix_nano: start,
        end_unix_nano: end,
        status: StatusCode::Unset,
        attributes: vec![],
        links: vec![],
    }
}

/// `n` spans; span `i` hangs under a random earlier span and lies mostly inside it.
fn random_tree(n: usize) -> Vec<Span> {
    let mut rng = Lcg(n as u64);
    let services: Vec<Text> = ["gw", "llm", "tok"]
        .iter()
        .map(|s| Text::from(*s))
        .collect();
    let mut spans = vec![span(0, None, 0, 1_000_000_000, &services[0])];
    for i in 1..n {
        // Prefer recent spans as parents, so the tree is both deep and wide.
        let p = i - 1 - rng.below(i.min(16) as u64) as usize;
        let (ps, pe) = (spans[p].start_unix_nano, spans[p].end_unix_nano);
        let len = (pe - ps).max(1);
        let start = ps + rng.below(len);
        // One child in eight overflows its parent.
        let end = if rng.below(8) == 0 {
            start + rng.below(len) + 1
        } else {
            start + rng.below(pe - start + 1)
        };
        spans.push(span(i, Some(p), start, end, &services[i % 3]));
    }
    spans
}

fn chain(n: usize) -> Vec<Span> {
    let svc = Text::from("llm");
    (0..n)
        .map(|i| span(i, i.checked_sub(1), i as u64, (2 * n - i) as u64, &svc))
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("critical_path");
    for n in [10usize, 1_000, 100_000] {
        let spans = random_tree(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("random_tree", n), &spans, |b, spans| {
            b.iter(|| critical_path(black_box(spans), id(0), &CriticalPathOptions::default()))
        });
        let both = CriticalPathOptions {
            skew_tolerance: true,
            shift_remote_children: true,
        };
        group.bench_with_input(
            BenchmarkId::new("random_tree_all_options", n),
            &spans,
            |b, spans| b.iter(|| critical_path(black_box(spans), id(0), &both)),
        );
    }
    let spans = chain(100_000);
    group.throughput(Throughput::Elements(100_000));
    group.bench_with_input(BenchmarkId::new("chain", 100_000), &spans, |b, spans| {
        b.iter(|| critical_path(black_box(spans), id(0), &CriticalPathOptions::default()))
    });
    group.finish();
}

/// Windows holding one slot of 100,000 requests whose paths cross `keys` (service, span) keys,
/// four keys a path, e2e log-uniform over 20 ms … 20 s (a wide spread: many e2e buckets).
fn one_busy_slot(keys: usize) -> CriticalPathWindows {
    let mut rng = Lcg(7);
    let mut windows = CriticalPathWindows::default();
    let names: Vec<Text> = (0..keys).map(|k| Text::from(format!("span-{k}"))).collect();
    let service = Text::from("llm");
    for _ in 0..100_000 {
        let e2e = 0.02 * 1000f64.powf(rng.below(1_000_000) as f64 / 1e6);
        let mut t = 0;
        let segments = (0..4)
            .map(|_| {
                let start = t;
                t += (e2e / 4.0 * 1e9) as u64;
                Segment {
                    span_id: id(0),
                    name: names[rng.below(keys as u64) as usize].clone(),
                    service: service.clone(),
                    start_unix_nano: start,
                    end_unix_nano: t,
                }
            })
            .collect();
        let path = CriticalPath {
            trace_id: TraceId([1; 16]),
            root: id(0),
            segments,
            adjustments: vec![],
        };
        windows.record(&path, e2e, 1_800_000_000_000_000_000);
    }
    windows
}

fn bench_stored_slot(c: &mut Criterion) {
    let mut group = c.benchmark_group("critical_path_windows");
    for keys in [4usize, 256] {
        let windows = one_busy_slot(keys);
        let at = 1_800_000_000_000_000_000;
        let size = windows.encode_slot(at).map_or(0, |(_, b)| b.len());
        eprintln!("encoded slot, 100,000 requests over {keys} keys: {size} bytes");
        group.bench_function(BenchmarkId::new("encode_slot", keys), |b| {
            b.iter(|| windows.encode_slot(black_box(at)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench, bench_stored_slot);
criterion_main!(benches);
