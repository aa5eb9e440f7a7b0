//! The rules for disaggregated prefill/decode serving, read from a series'
//! [`DisaggKpis`](crate::kpi::DisaggKpis) (docs/disaggregated.md#diagnosis).
//!
//! Each compares one sub-phase's share of time to first token (Σ sub-phase / Σ TTFT over the
//! series' disaggregated requests) with a threshold:
//!
//! | id | sub-phase | threshold (default) |
//! |---|---|---|
//! | `kv-transfer-dominates-ttft` | `kv_transfer` | `kv_transfer_ttft_share_max` (0.3) |
//! | `pd-ratio-prefill-bound` | `prefill_queue`, larger than `decode_wait` | `pool_wait_ttft_share_max` (0.15) |
//! | `pd-ratio-decode-bound` | `decode_wait` beyond one decode step (mean TPOT ÷ mean TTFT taken off its share), larger than `prefill_queue` | `pool_wait_ttft_share_max` (0.15) |
//! | `decode-kv-memory-wait` | `bootstrap` (the wait for the decode side's KV pre-allocation, then the handshake) | `kv_alloc_wait_ttft_share_max` (0.25) |
//!
//! A finding is a warning when the disaggregated requests' TTFT p90 is above
//! `ttft_p90_max_seconds` (the TTFT objective), else a note (info): the share says where TTFT
//! goes, the objective whether it hurts yet.

use infertrace_semconv::disagg as d;

use super::diagnoser::Diagnoser;
use super::finding::{Evidence, Severity, ev, pct, secs};
use super::pd_sizing::{self, PdSizing, PoolLoad};
use crate::kpi::{DisaggKpis, Pool};

/// How many times faster a link "what a faster link would save" assumes.
pub const KV_LINK_SPEEDUP: f64 = 2.0;

impl Diagnoser<'_> {
    /// Every disaggregated rule, when the series has at least `min_requests` disaggregated
    /// requests.
    pub(super) fn disaggregated(&mut self) {
        let Some(k) = self.s.disagg.as_ref() else {
            return;
        };
        if k.requests < self.c.min_requests {
            return;
        }
        let severity = match k.ttft {
            Some(t) if t.p90 > self.c.ttft_p90_max_seconds => Severity::Warning,
            _ => Severity::Info,
        };
        self.kv_transfer_dominates(k, severity);
        self.pd_ratio(k, severity);
        self.decode_kv_memory_wait(k, severity);
    }

    fn kv_transfer_dominates(&mut self, k: &DisaggKpis, severity: Severity) {
        let share = k.ttft_share(d::KV_TRANSFER);
        let (Some(kv), true) = (
            k.sub_phase(d::KV_TRANSFER),
            share > self.c.kv_transfer_ttft_share_max,
        ) else {
            return;
        };
        let lat = kv.latency;
        let saved = |v: f64| v - v / KV_LINK_SPEEDUP;
        let mut evidence = vec![
            ev(
                "disagg.ttft_share.kv_transfer",
                share,
                Some(self.c.kv_transfer_ttft_share_max),
                "ratio",
            ),
            ev("disagg.kv_transfer.p50", lat.p50, None, "s"),
            ev("disagg.kv_transfer.p90", lat.p90, None, "s"),
            ev(
                "disagg.ttft_saved_at_2x_link.mean",
                saved(lat.mean),
                None,
                "s",
            ),
            ev(
                "disagg.ttft_saved_at_2x_link.p90",
                saved(lat.p90),
                None,
                "s",
            ),
        ];
        if let Some(t) = k.ttft {
            evidence.push(ev("disagg.ttft.p90", t.p90, None, "s"));
        }
        let mut rate = String::new();
        if let Some(tps) = k.kv_transfer_tokens_per_second {
            evidence.push(ev(
                "disagg.kv_transfer.tokens_per_second",
                tps,
                None,
                "tokens/s",
            ));
            match self.c.kv_bytes_per_token {
                Some(b) => {
                    let bps = tps * b;
                    evidence.push(ev("disagg.kv_transfer.bytes_per_second", bps, None, "B/s"));
                    rate = format!(
                        "; each transfer achieved {:.1} Gb/s ({tps:.0} prompt tokens/s)",
                        bps * 8.0 / 1e9
                    );
                }
                None => rate = format!("; each transfer achieved {tps:.0} prompt tokens/s"),
            }
        }
        let mean_ttft = k.ttft.map(|t| t.mean).filter(|t| *t > 0.0);
        let saved_share = mean_ttft
            .map(|t| format!(" ({} of the mean TTFT)", pct(saved(lat.mean) / t)))
            .unwrap_or_default();
        self.push(
            "kv-transfer-dominates-ttft",
            severity,
            format!(
                "KV-cache transfer is {} of time to first token (threshold {}): {} at p50, {} \
                 at p90{rate}",
                pct(share),
                pct(self.c.kv_transfer_ttft_share_max),
                secs(lat.p50),
                secs(lat.p90)
            ),
            evidence,
            format!(
                "The prefill→decode link is the bottleneck: a link twice as fast would save {} \
                 per request on average{saved_share} and {} at p90. Use a faster interconnect \
                 or transport (RDMA / NVLink instead of TCP: Mooncake or NIXL backends), spread \
                 transfers over more links (more prefill workers, each with its own NIC), or move \
                 less KV (FP8 KV cache, prefix caching on the decode side).",
                secs(saved(lat.mean)),
                secs(saved(lat.p90))
            ),
        );
    }

    fn pd_ratio(&mut self, k: &DisaggKpis, severity: Severity) {
        let prefill_wait = k.ttft_share(d::PREFILL_QUEUE);
        let decode_wait_all = k.ttft_share(d::DECODE_WAIT);
        // A request whose KV arrives mid-step joins the batch at the next step: up to one
        // decode step (mean TPOT) of `decode_wait` is the step in progress, not a queue. Only
        // the rest says the decode pool is short (docs/disaggregated.md#diagnosis).
        let step_share = match (self.s.tpot, k.ttft) {
            (Some(tpot), Some(ttft)) if ttft.mean > 0.0 => tpot.mean / ttft.mean,
            _ => 0.0,
        };
        let decode_wait = (decode_wait_all - step_share).max(0.0);
        let max = self.c.pool_wait_ttft_share_max;
        let workers = |pool: Pool| {
            k.pools
                .iter()
                .find(|p| p.pool == pool)
                .map_or(0, |p| p.workers.len())
        };
        let (p, dw) = (workers(Pool::Prefill), workers(Pool::Decode));
        let sizing = self.pd_sizing(k, p, dw, prefill_wait > max, decode_wait > max);
        let (rule, waiting, share, other, other_share, advice) =
            if prefill_wait > max && prefill_wait > decode_wait {
                (
                    "pd-ratio-prefill-bound",
                    d::PREFILL_QUEUE,
                    prefill_wait,
                    d::DECODE_WAIT,
                    decode_wait_all,
                    shift(p, dw, true),
                )
            } else if decode_wait > max && decode_wait > prefill_wait {
                (
                    "pd-ratio-decode-bound",
                    d::DECODE_WAIT,
                    decode_wait_all,
                    d::PREFILL_QUEUE,
                    prefill_wait,
                    shift(p, dw, false),
                )
            } else {
                return;
            };
        let decode_waits = waiting == d::DECODE_WAIT;
        let (pool, other_pool) = if waiting == d::PREFILL_QUEUE {
            ("prefill", "decode")
        } else {
            ("decode", "prefill")
        };
        let mut evidence = vec![
            ev(
                format!("disagg.ttft_share.{waiting}"),
                share,
                (!decode_waits).then_some(max),
                "ratio",
            ),
            ev(
                format!("disagg.ttft_share.{other}"),
                other_share,
                None,
                "ratio",
            ),
            ev(
                "disagg.ttft_share.decode_wait_beyond_step",
                decode_wait,
                decode_waits.then_some(max),
                "ratio",
            ),
        ];
        if let Some(t) = self.s.tpot {
            evidence.push(ev("tpot.mean", t.mean, None, "s"));
        }
        for name in [waiting, other] {
            if let Some(s) = k.sub_phase(name) {
                evidence.push(ev(format!("disagg.{name}.p90"), s.latency.p90, None, "s"));
            }
        }
        evidence.push(ev(
            "disagg.pools.prefill.workers",
            p as f64,
            None,
            "workers",
        ));
        evidence.push(ev(
            "disagg.pools.decode.workers",
            dw as f64,
            None,
            "workers",
        ));
        let advice = match &sizing {
            Some((sz, inputs)) => {
                evidence.extend(sizing_evidence(sz, inputs));
                sizing_advice(sz, inputs, p, dw, &advice)
            }
            None => advice,
        };
        self.push(
            rule,
            severity,
            format!(
                "The {pool} pool is short: requests wait {} of time to first token in \
                 {waiting}{} (threshold {}) against {} in {other} (P:D = {p}:{dw})",
                pct(if decode_waits { decode_wait } else { share }),
                if decode_waits {
                    " beyond one decode step"
                } else {
                    ""
                },
                pct(max),
                pct(other_share)
            ),
            evidence,
            format!(
                "The prefill:decode ratio is wrong for this load: the {pool} pool queues while \
                 the {other_pool} pool admits at once. {advice}"
            ),
        );
    }

    /// DistServe-style sizing of the split ([`pd_sizing`]) from the window's figures: the
    /// load both pools served, each pool's busy fraction (1 for a pool whose arrivals wait
    /// past the threshold; else the prefill workers' share of time prefilling, load × mean
    /// prefill ÷ workers, and the decode workers' share of the TPOT objective used, mean
    /// TPOT ÷ TPOT objective), and each pool's SLO attainment (TTFT for prefill, TPOT for
    /// decode; 1 without an SLO). `None` without the numbers.
    fn pd_sizing(
        &self,
        k: &DisaggKpis,
        prefill_workers: usize,
        decode_workers: usize,
        prefill_waits: bool,
        decode_waits: bool,
    ) -> Option<(PdSizing, SizingInputs)> {
        let load = k.requests_per_second;
        let prefill_busy = if prefill_waits {
            1.0
        } else {
            let mean = k.sub_phase(d::PREFILL)?.latency.mean;
            (load * mean / prefill_workers.max(1) as f64).min(1.0)
        };
        let decode_busy = if decode_waits {
            1.0
        } else {
            let tpot = self.s.tpot?.mean;
            (tpot / self.c.tpot_p90_max_seconds).min(1.0)
        };
        let prefill = PoolLoad {
            workers: prefill_workers,
            busy: prefill_busy,
            slo_attainment: k.ttft_slo_attainment.unwrap_or(1.0),
        };
        let decode = PoolLoad {
            workers: decode_workers,
            busy: decode_busy,
            slo_attainment: k.tpot_slo_attainment.unwrap_or(1.0),
        };
        let sizing = pd_sizing::size(load, prefill, decode)?;
        let share = (k.requests as f64 / self.s.requests.max(1) as f64).min(1.0);
        Some((
            sizing,
            SizingInputs {
                prefill,
                decode,
                input_tokens_per_second: self.s.throughput.input_tokens_per_second * share,
                output_tokens_per_second: self.s.throughput.output_tokens_per_second * share,
            },
        ))
    }

    fn decode_kv_memory_wait(&mut self, k: &DisaggKpis, severity: Severity) {
        let share = k.ttft_share(d::BOOTSTRAP);
        let (Some(b), true) = (
            k.sub_phase(d::BOOTSTRAP),
            share > self.c.kv_alloc_wait_ttft_share_max,
        ) else {
            return;
        };
        let mut evidence = vec![
            ev(
                "disagg.ttft_share.bootstrap",
                share,
                Some(self.c.kv_alloc_wait_ttft_share_max),
                "ratio",
            ),
            ev("disagg.bootstrap.p50", b.latency.p50, None, "s"),
            ev("disagg.bootstrap.p90", b.latency.p90, None, "s"),
        ];
        if let Some(db) = k.sub_phase(d::DECODE_BOOTSTRAP) {
            evidence.push(ev("disagg.decode_bootstrap.p90", db.latency.p90, None, "s"));
        }
        self.push(
            "decode-kv-memory-wait",
            severity,
            format!(
                "Requests wait for the decode side's KV memory: bootstrap is {} of time to \
                 first token (threshold {}), {} at p90",
                pct(share),
                pct(self.c.kv_alloc_wait_ttft_share_max),
                secs(b.latency.p90)
            ),
            evidence,
            "The decode workers' KV cache is full when prefills finish, so new requests wait \
             for running ones to leave: give decode more KV memory (a higher \
             --mem-fraction-static / --gpu-memory-utilization, FP8 KV cache, larger or more \
             decode GPUs), add decode workers, or cap output length (max_tokens reserves KV \
             for every output token)."
                .to_string(),
        );
    }
}

/// What the sizing was computed from, for the evidence.
struct SizingInputs {
    prefill: PoolLoad,
    decode: PoolLoad,
    /// Prompt tokens per second the prefill pool served (the series' rate × its
    /// disaggregated share of requests).
    input_tokens_per_second: f64,
    /// Output tokens per second the decode pool served (likewise).
    output_tokens_per_second: f64,
}

fn sizing_evidence(s: &PdSizing, i: &SizingInputs) -> Vec<Evidence> {
    vec![
        ev("disagg.load.requests_per_second", s.load_rps, None, "1/s"),
        ev(
            "disagg.pools.prefill.input_tokens_per_second",
            i.input_tokens_per_second,
            None,
            "tokens/s",
        ),
        ev(
            "disagg.pools.decode.output_tokens_per_second",
            i.output_tokens_per_second,
            None,
            "tokens/s",
        ),
        ev("disagg.pools.prefill.busy", i.prefill.busy, None, "ratio"),
        ev("disagg.pools.decode.busy", i.decode.busy, None, "ratio"),
        ev(
            "disagg.pools.prefill.slo_attainment",
            i.prefill.slo_attainment,
            None,
            "ratio",
        ),
        ev(
            "disagg.pools.decode.slo_attainment",
            i.decode.slo_attainment,
            None,
            "ratio",
        ),
        ev(
            "disagg.pools.prefill.goodput_per_gpu",
            s.prefill_goodput_per_gpu,
            None,
            "1/s",
        ),
        ev(
            "disagg.pools.decode.goodput_per_gpu",
            s.decode_goodput_per_gpu,
            None,
            "1/s",
        ),
        ev(
            "disagg.sizing.prefill_gpus_needed",
            s.prefill_gpus_needed,
            None,
            "workers",
        ),
        ev(
            "disagg.sizing.decode_gpus_needed",
            s.decode_gpus_needed,
            None,
            "workers",
        ),
        ev(
            "disagg.sizing.prefill_workers",
            s.prefill_workers as f64,
            None,
            "workers",
        ),
        ev(
            "disagg.sizing.decode_workers",
            s.decode_workers as f64,
            None,
            "workers",
        ),
    ]
}

/// The sizing's recommendation: the split for the current GPU count, with the numbers; when
/// that is the current split, the one-GPU advice (`fallback`) and the GPUs the load needs.
fn sizing_advice(
    s: &PdSizing,
    i: &SizingInputs,
    prefill: usize,
    decode: usize,
    fallback: &str,
) -> String {
    let numbers = format!(
        "DistServe-style sizing for the observed {:.1} req/s: a prefill GPU serves {:.1} req/s \
         within the TTFT objective when fully busy (now {} busy, {} within it), a decode GPU \
         {:.1} req/s within the TPOT objective (now {} busy, {} within it); the load needs \
         {:.2} prefill and {:.2} decode GPUs.",
        s.load_rps,
        s.prefill_goodput_per_gpu,
        pct(i.prefill.busy),
        pct(i.prefill.slo_attainment),
        s.decode_goodput_per_gpu,
        pct(i.decode.busy),
        pct(i.decode.slo_attainment),
        s.prefill_gpus_needed,
        s.decode_gpus_needed,
    );
    if (s.prefill_workers, s.decode_workers) != (prefill, decode) {
        format!(
            "{numbers} Of the current {} GPUs, split P:D {prefill}:{decode} → {}:{} and compare \
             goodput.",
            prefill + decode,
            s.prefill_workers,
            s.decode_workers
        )
    } else {
        format!(
            "{numbers} The current split of {} GPUs already matches that ratio; the load needs \
             at least {}:{}. {fallback}",
            prefill + decode,
            s.prefill_gpus_needed.ceil().max(1.0),
            s.decode_gpus_needed.ceil().max(1.0)
        )
    }
}

/// The advice to move one worker to the waiting pool, when the other can spare one.
fn shift(prefill: usize, decode: usize, to_prefill: bool) -> String {
    let (from, to) = if to_prefill {
        (decode, prefill)
    } else {
        (prefill, decode)
    };
    let (pool, other) = if to_prefill {
        ("prefill", "decode")
    } else {
        ("decode", "prefill")
    };
    if from > 1 {
        let (p, dw) = if to_prefill {
            (prefill + 1, decode - 1)
        } else {
            (prefill - 1, decode + 1)
        };
        format!(
            "Move one GPU from the {other} pool to the {pool} pool (P:D {prefill}:{decode} → \
             {p}:{dw}) and compare goodput; or add a {pool} worker ({to} → {}).",
            to + 1
        )
    } else if from == 1 {
        format!("Add {pool} workers (now {to}); the {other} pool has none to spare.")
    } else {
        format!(
            "Add {pool} workers, or move GPUs from the {other} pool to the {pool} pool (the \
             traces do not name the workers, so the current split is unknown)."
        )
    }
}
