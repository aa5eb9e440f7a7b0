//! The rules for every series (queue, prefill, decode, GPU, SLOs, outcomes, critical path) and
//! the entry points that run them all, the disaggregated ones ([`super::disagg`]) included.

use std::fmt::Write as _;

use serde::Serialize;

use infertrace_semconv as sc;

use super::config::DiagnosisConfig;
use super::diagnoser::Diagnoser;
use super::finding::{Finding, Severity, Undiagnosed, ev, format_rate, pct, pcts_apart, secs};
use crate::critical_path::CriticalPathSummary;
use crate::kpi::{KpiSnapshot, SeriesKpis};

/// The duration-weighted mean GPU utilisation (0–1) of a series across queue, prefill and
/// decode (each phase's utilisation weighted by its mean duration); `None` without GPU data.
pub fn gpu_utilization_mean(s: &SeriesKpis) -> Option<f64> {
    let gpu = s.gpu.as_ref()?;
    let u = &gpu.utilization_mean;
    let mut weighted = 0.0;
    let mut weight = 0.0;
    let mut unweighted = (0.0, 0u32);
    for (util, phase) in [
        (u.queue, &s.queue),
        (u.prefill, &s.prefill),
        (u.decode, &s.decode),
    ] {
        let Some(util) = util.filter(|v| v.is_finite()) else {
            continue;
        };
        unweighted.0 += util;
        unweighted.1 += 1;
        if let Some(p) = phase.filter(|p| p.mean.is_finite() && p.mean > 0.0) {
            weighted += util * p.mean;
            weight += p.mean;
        }
    }
    if weight > 0.0 {
        Some(weighted / weight)
    } else if unweighted.1 > 0 {
        Some(unweighted.0 / f64::from(unweighted.1))
    } else {
        None
    }
}

/// Mean number of requests decoding at once, by Little's law: arrival rate × mean decode time.
pub fn decode_concurrency(s: &SeriesKpis) -> Option<f64> {
    let d = s.decode?;
    (s.throughput.requests_per_second > 0.0).then_some(s.throughput.requests_per_second * d.mean)
}

/// Runs every rule on one series; findings ordered most severe first (stable within a severity).
pub fn diagnose(
    series: &SeriesKpis,
    critical: Option<&CriticalPathSummary>,
    config: &DiagnosisConfig,
) -> Vec<Finding> {
    let mut d = Diagnoser {
        s: series,
        c: config,
        out: Vec::new(),
    };
    // Below the minimum only the throughput floor speaks: a low rate is its very subject.
    d.throughput_floor();
    if series.requests >= config.min_requests {
        let gpu = gpu_utilization_mean(series);
        let gpu_explained = d.queue_dominated(gpu, critical);
        d.prefill_dominated_ttft();
        let stalls = d.inter_token_stalls();
        d.high_tpot(gpu, stalls);
        if let Some(crit) = critical {
            d.critical_path_hotspot(crit);
        }
        if !gpu_explained {
            d.gpu_level(gpu);
        }
        d.e2e_slo();
        d.goodput();
        d.outcome_rates();
        d.disaggregated();
    }
    let mut out = d.out;
    out.sort_by_key(|f| std::cmp::Reverse(f.severity));
    out
}

/// Runs [`diagnose`] on every series of a snapshot except the overflow series. The critical
/// path summary speaks of a series only when every series with requests in the window is one
/// service serving one model and one operation (an engine that names no operation, as vLLM's
/// `llm_request`, counts as serving any). Its tails are the slowest requests of every series
/// together: beside another model's requests they could be theirs (a fast model reading 0 %
/// queue in a tail of slow requests), and a gateway's request and an engine's with phase
/// spans may be two paths of one trace there (see [`crate::critical_path::windows_paths`]).
/// Otherwise the critical-path evidence and rule are left out.
pub fn diagnose_snapshot(
    snapshot: &KpiSnapshot,
    critical: Option<&CriticalPathSummary>,
    config: &DiagnosisConfig,
) -> Vec<Finding> {
    let busy = || snapshot.series.iter().filter(|s| s.requests > 0);
    let named = |op: &&String| !op.is_empty() && op.as_str() != crate::record::UNKNOWN;
    let alone = all_equal(busy().map(|s| &s.service))
        && all_equal(busy().map(|s| &s.model))
        && all_equal(busy().map(|s| &s.operation).filter(named));
    let critical = critical.filter(|_| alone);
    let mut out: Vec<Finding> = snapshot
        .series
        .iter()
        .filter(|s| s.service != crate::kpi::OVERFLOW_LABEL)
        .flat_map(|s| diagnose(s, critical, config))
        .collect();
    out.sort_by_key(|f| std::cmp::Reverse(f.severity));
    out
}

/// Whether every item is the same (true of none).
fn all_equal<T: PartialEq>(mut items: impl Iterator<Item = T>) -> bool {
    let first = items.next();
    items.all(|i| Some(i) == first)
}

/// What the rules said of one window: the findings, and the series too quiet to judge.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowDiagnosis {
    /// [`diagnose_snapshot`]'s findings.
    pub findings: Vec<Finding>,
    /// [`undiagnosed`]'s series.
    pub undiagnosed: Vec<Undiagnosed>,
    /// The requests a series needs in the window to be judged.
    pub min_requests: u64,
}

/// [`diagnose_snapshot`] and [`undiagnosed`] of one window.
pub fn diagnose_window(
    snapshot: &KpiSnapshot,
    critical: Option<&CriticalPathSummary>,
    config: &DiagnosisConfig,
) -> WindowDiagnosis {
    WindowDiagnosis {
        findings: diagnose_snapshot(snapshot, critical, config),
        undiagnosed: undiagnosed(snapshot, config),
        min_requests: config.min_requests,
    }
}

/// The series of `snapshot` [`diagnose`] judged against the throughput floor only, for too
/// few requests ([`Undiagnosed`]); the overflow series is left out, as in
/// [`diagnose_snapshot`]. A series without a request is not listed: there was nothing to judge.
pub fn undiagnosed(snapshot: &KpiSnapshot, config: &DiagnosisConfig) -> Vec<Undiagnosed> {
    snapshot
        .series
        .iter()
        .filter(|s| {
            s.service != crate::kpi::OVERFLOW_LABEL
                && s.requests > 0
                && s.requests < config.min_requests
        })
        .map(|s| Undiagnosed {
            service: s.service.clone(),
            model: s.model.clone(),
            operation: s.operation.clone(),
            requests: s.requests,
        })
        .collect()
}

/// The shortest pause within requests (their typical p99 gap) that counts as a stall: a pause
/// a reader of the stream notices. Fixed, not the TPOT threshold: a tight TPOT SLO would make
/// the ~100 ms pauses of admitted prefills stalls.
const STALL_PAUSE_MIN_SECONDS: f64 = 0.25;

/// Mean input tokens per request under which a slow prefill is not blamed on prompt length.
const LONG_PROMPT_TOKENS: f64 = 2000.0;

/// Queue share of the p90 requests' e2e from which a saturated GPU is a warning, not a note.
const SATURATED_QUEUE_SHARE: f64 = 0.1;

/// `num / den`, 0 when `den` is 0.
fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

impl Diagnoser<'_> {
    /// Queue-dominated latency; returns whether it already spoke about the GPU level.
    fn queue_dominated(
        &mut self,
        gpu: Option<f64>,
        critical: Option<&CriticalPathSummary>,
    ) -> bool {
        let Some(share) = self.s.phase_share.p90.or(self.s.phase_share.all) else {
            return false;
        };
        let tail = if self.s.phase_share.p90.is_some() {
            "p90"
        } else {
            "all"
        };
        if share.queue <= self.c.queue_share_max {
            return false;
        }
        let mut evidence = vec![ev(
            format!("phase_share.{tail}.queue"),
            share.queue,
            Some(self.c.queue_share_max),
            "ratio",
        )];
        if let Some(q) = self.s.queue {
            evidence.push(ev("queue.p90", q.p90, None, "s"));
        }
        if let Some(e) = self.s.e2e {
            evidence.push(ev("e2e.p90", e.p90, None, "s"));
        }
        if let Some(entry) = critical.and_then(|c| {
            c.entries
                .iter()
                .find(|e| *e.service == *self.s.service && &*e.span == sc::span::QUEUE)
        }) {
            evidence.push(ev(
                "critical_path.share.p90.queue",
                entry.share.p90,
                None,
                "ratio",
            ));
        }
        let who = if tail == "p90" {
            "The slowest 10% of requests spend"
        } else {
            "Requests spend"
        };
        let queued = format!(
            "{who} {} of their latency waiting in the queue (threshold {})",
            pct(share.queue),
            pct(self.c.queue_share_max)
        );
        match gpu {
            Some(u) if u > self.c.gpu_saturated_min => {
                evidence.push(ev(
                    "gpu.utilization.mean",
                    u,
                    Some(self.c.gpu_saturated_min),
                    "ratio",
                ));
                self.push(
                    "queue-dominated-gpu-saturated",
                    Severity::Warning,
                    format!("{queued} while the GPU is {} busy: capacity-bound", pct(u)),
                    evidence,
                    format!(
                        "The engine is busy {} of the time and work waits for it: add replicas \
                         (or GPUs) until utilisation is below {} at peak, or shed load at \
                         admission. One check first: utilisation counts time any kernel runs, \
                         not how full each step is — if the batch limit (max_num_seqs) is small \
                         and GPU memory has room for more KV cache (gpu.memory.used.max), \
                         raising the limit adds throughput on the same GPU.",
                        pct(u),
                        pct(self.c.gpu_saturated_min)
                    ),
                );
                true
            }
            Some(u) if u < self.c.gpu_idle_max => {
                evidence.push(ev(
                    "gpu.utilization.mean",
                    u,
                    Some(self.c.gpu_idle_max),
                    "ratio",
                ));
                self.push(
                    "queue-dominated-gpu-idle",
                    Severity::Warning,
                    format!(
                        "{queued} while the GPU is only {} busy: admission or batch limits are too low",
                        pct(u)
                    ),
                    evidence,
                    "Requests wait although the GPU has room: raise the engine's concurrency \
                     limits (vLLM --max-num-seqs, --max-num-batched-tokens; TGI \
                     --max-batch-total-tokens, --max-concurrent-requests) or the admission \
                     queue's concurrency, and check the KV-cache size (--gpu-memory-utilization) \
                     is not what caps the batch."
                        .to_string(),
                );
                true
            }
            Some(u) => {
                evidence.push(ev("gpu.utilization.mean", u, None, "ratio"));
                self.push(
                    "queue-dominated",
                    Severity::Warning,
                    format!("{queued}; the GPU is {} busy", pct(u)),
                    evidence,
                    "The GPU is neither idle nor saturated: first raise the batch limits \
                     (--max-num-seqs, --max-num-batched-tokens) and watch whether utilisation \
                     and throughput rise; if they stop rising, add replicas."
                        .to_string(),
                );
                false
            }
            None => {
                self.push(
                    "queue-dominated",
                    Severity::Warning,
                    format!("{queued}; no GPU data to tell why"),
                    evidence,
                    format!(
                        "Either the engine is capacity-bound (GPU > {}: add replicas) or its \
                         admission/batch limits are too low (GPU < {}: raise --max-num-seqs / \
                         --max-num-batched-tokens). Measure GPU utilisation to tell which: \
                         enable infertrace's GPU sampler (NVML) on the serving host or scrape \
                         DCGM's DCGM_FI_DEV_GPU_UTIL.",
                        pct(self.c.gpu_saturated_min),
                        pct(self.c.gpu_idle_max)
                    ),
                );
                false
            }
        }
    }

    fn prefill_dominated_ttft(&mut self) {
        let (Some(ttft), Some(prefill)) = (self.s.ttft, self.s.prefill) else {
            return;
        };
        if ttft.p90 <= self.c.ttft_p90_max_seconds || ttft.p90 <= 0.0 {
            return;
        }
        let share = prefill.p90 / ttft.p90;
        if share < self.c.prefill_ttft_share_min {
            return;
        }
        let mut evidence = vec![
            ev("ttft.p90", ttft.p90, Some(self.c.ttft_p90_max_seconds), "s"),
            ev("prefill.p90", prefill.p90, None, "s"),
            ev(
                "prefill.p90 / ttft.p90",
                share,
                Some(self.c.prefill_ttft_share_min),
                "ratio",
            ),
        ];
        let mut title = format!(
            "TTFT p90 is {} (threshold {}) and prefill takes {} of it ({})",
            secs(ttft.p90),
            secs(self.c.ttft_p90_max_seconds),
            pct(share),
            secs(prefill.p90)
        );
        let per_request = (self.s.requests > 0 && self.s.tokens.input > 0)
            .then(|| self.s.tokens.input as f64 / self.s.requests as f64);
        if let Some(per_request) = per_request {
            evidence.push(ev("tokens.input per request", per_request, None, "tokens"));
            let _ = write!(title, "; prompts average {per_request:.0} input tokens");
        }
        let recommendation = if per_request.is_some_and(|n| n < LONG_PROMPT_TOKENS) {
            format!(
                "Prompts are short (under {LONG_PROMPT_TOKENS:.0} input tokens on average) yet \
                 take long to prefill: the prefills wait for or share steps with other work. \
                 Check what runs beside them — a few very long prompts in the same batches \
                 (compare prefill.p50 with p90), a large decode batch (cap it with \
                 --max-num-seqs), or a GPU shared with another model — and enable chunked \
                 prefill (--enable-chunked-prefill with a --max-num-batched-tokens budget) so \
                 long prompts do not monopolise steps."
            )
        } else {
            "Prompts take long to prefill: enable prefix caching (vLLM \
             --enable-prefix-caching) so shared system prompts and chat history are computed \
             once, enable chunked prefill (--enable-chunked-prefill with a \
             --max-num-batched-tokens budget) so long prompts do not monopolise steps, and \
             trim or cap prompt length; for sustained long-prompt load consider disaggregated \
             prefill."
                .to_string()
        };
        self.push(
            "prefill-dominated-ttft",
            Severity::Warning,
            title,
            evidence,
            recommendation,
        );
    }

    /// Slow decoding. When stalls were found and the steady gap between tokens (inter-token
    /// p50) is within the threshold, the stalls explain the slow TPOT and this rule is quiet:
    /// blaming the batch size would send the user the wrong way.
    fn high_tpot(&mut self, gpu: Option<f64>, stalls: bool) {
        let Some(tpot) = self.s.tpot else {
            return;
        };
        if tpot.p90 <= self.c.tpot_p90_max_seconds {
            return;
        }
        if stalls
            && self
                .s
                .itl
                .is_some_and(|i| i.p50 <= self.c.tpot_p90_max_seconds)
        {
            return;
        }
        let mut evidence = vec![ev(
            "tpot.p90",
            tpot.p90,
            Some(self.c.tpot_p90_max_seconds),
            "s",
        )];
        let batch = decode_concurrency(self.s);
        if let Some(b) = batch {
            evidence.push(ev(
                "decode concurrency (Little's law)",
                b,
                Some(self.c.large_batch_min),
                "requests",
            ));
        }
        if let Some(u) = gpu {
            evidence.push(ev("gpu.utilization.mean", u, None, "ratio"));
        }
        let head = format!(
            "TPOT p90 is {} (threshold {}, {:.1} tokens/s per request)",
            secs(tpot.p90),
            secs(self.c.tpot_p90_max_seconds),
            1.0 / tpot.p90
        );
        match batch {
            Some(b) if b >= self.c.large_batch_min => self.push(
                "high-tpot-large-batch",
                Severity::Warning,
                format!("{head} with about {b:.0} requests decoding at once: decode is memory-bandwidth-bound"),
                evidence,
                "Each decode step reads the weights and every sequence's KV cache, so a large \
                 batch slows every token: cap the batch (lower --max-num-seqs) to trade \
                 throughput for TPOT, add replicas, quantise weights and KV cache (FP8/INT4), \
                 or use speculative decoding."
                    .to_string(),
            ),
            _ => self.push(
                "high-tpot",
                Severity::Warning,
                match batch {
                    Some(b) => format!("{head} at a small batch (about {b:.1} requests decoding at once)"),
                    None => head,
                },
                evidence,
                "Decoding is slow even without a large batch: the model is large for this GPU. \
                 Use tensor parallelism across more GPUs, a quantised model (FP8/INT4), \
                 speculative decoding, or check for CPU-side stalls (detokenisation, \
                 streaming back-pressure)."
                    .to_string(),
            ),
        }
    }

    /// Decodes that stall: a request's mean gap between tokens (TPOT) far above its median gap
    /// (inter-token p50) means a few long pauses; so does the typical request's own p99 gap far
    /// above the median gap and over [`STALL_PAUSE_MIN_SECONDS`] (pauses within requests), or the
    /// tail of the requests' median gaps far above the median (some requests slow throughout).
    /// Returns whether the rule fired.
    fn inter_token_stalls(&mut self) -> bool {
        let Some(itl) = self.s.itl else {
            return false;
        };
        if itl.p50 <= 0.0 {
            return false;
        }
        let tail = itl.p99 / itl.p50;
        let mean_over_median = self.s.tpot.map(|t| t.p50 / itl.p50);
        let own_p99 = self.s.itl_p99.map(|p| p.p50);
        let pause = own_p99.map(|p| p / itl.p50);
        let by_tail = tail > self.c.itl_p99_p50_ratio_max;
        let by_mean = mean_over_median.is_some_and(|r| r > self.c.tpot_itl_ratio_max);
        // Pauses must also be long for a reader of the stream (a continuously batching
        // engine's decodes pause for each admitted prefill, ~100 ms: normal).
        let by_pause = pause.is_some_and(|r| r > self.c.itl_p99_p50_ratio_max)
            && own_p99.is_some_and(|p| p > STALL_PAUSE_MIN_SECONDS);
        if !by_tail && !by_mean && !by_pause {
            return false;
        }
        let mut evidence = vec![
            ev("itl.p50", itl.p50, None, "s"),
            ev("itl.max", itl.max, None, "s"),
            ev(
                "itl.p99 / itl.p50",
                tail,
                Some(self.c.itl_p99_p50_ratio_max),
                "x",
            ),
        ];
        if let (Some(r), Some(t)) = (mean_over_median, self.s.tpot) {
            evidence.insert(0, ev("tpot.p50", t.p50, None, "s"));
            evidence.push(ev(
                "tpot.p50 / itl.p50",
                r,
                Some(self.c.tpot_itl_ratio_max),
                "x",
            ));
        }
        if let (Some(p), Some(r)) = (own_p99, pause) {
            evidence.push(ev("itl_p99.p50", p, None, "s"));
            evidence.push(ev(
                "itl_p99.p50 / itl.p50",
                r,
                Some(self.c.itl_p99_p50_ratio_max),
                "x",
            ));
        }
        let detail = match (by_mean, mean_over_median, self.s.tpot) {
            (true, Some(r), Some(t)) => format!(
                "the typical gap between tokens is {} but requests average {} per token ({r:.1}×, threshold {:.1}×)",
                secs(itl.p50),
                secs(t.p50),
                self.c.tpot_itl_ratio_max
            ),
            _ if by_pause => format!(
                "the typical gap between tokens is {} but half the requests pause {} or more \
                 at their 99th percentile ({:.1}×, threshold {:.1}×)",
                secs(itl.p50),
                secs(own_p99.unwrap_or_default()),
                pause.unwrap_or_default(),
                self.c.itl_p99_p50_ratio_max
            ),
            _ => format!(
                "inter-token latency p99 is {} against a p50 of {} ({tail:.1}×, threshold {:.1}×)",
                secs(itl.p99),
                secs(itl.p50),
                self.c.itl_p99_p50_ratio_max
            ),
        };
        self.push(
            "inter-token-stalls",
            Severity::Warning,
            format!("Decodes stall: {detail}; worst gap {}", secs(itl.max)),
            evidence,
            "Prefills of newly admitted requests interrupt running decodes: enable chunked \
             prefill (vLLM --enable-chunked-prefill, a smaller --max-num-batched-tokens) so \
             prefill is spread over steps, or separate prefill and decode onto different \
             instances (disaggregated prefill)."
                .to_string(),
        );
        true
    }

    fn gpu_level(&mut self, gpu: Option<f64>) {
        let Some(u) = gpu else {
            return;
        };
        if u > self.c.gpu_saturated_min {
            // A continuously batching engine keeps a kernel running whenever any request is in
            // flight, so "busy" alone is normal under steady load. It is a problem once requests
            // start to wait or miss their SLOs; until then it is a capacity note.
            let queueing = self
                .s
                .phase_share
                .p90
                .is_some_and(|p| p.queue >= SATURATED_QUEUE_SHARE);
            let missing_slos = self.s.goodput.ratio.is_some_and(|g| g < self.c.goodput_min);
            let (severity, consequence) = if queueing || missing_slos {
                (
                    Severity::Warning,
                    "requests already wait or miss their SLOs",
                )
            } else {
                (
                    Severity::Info,
                    "requests do not queue yet, but there is no headroom for bursts",
                )
            };
            self.push(
                "gpu-saturated",
                severity,
                format!(
                    "GPU is {} busy (threshold {}): {consequence}",
                    pct(u),
                    pct(self.c.gpu_saturated_min)
                ),
                vec![ev(
                    "gpu.utilization.mean",
                    u,
                    Some(self.c.gpu_saturated_min),
                    "ratio",
                )],
                "Any increase in load will queue: plan capacity now (add a replica, or enable \
                 autoscaling on queue length / GPU utilisation)."
                    .to_string(),
            );
        } else if u < self.c.gpu_idle_max {
            self.push(
                "gpu-underutilized",
                Severity::Warning,
                format!(
                    "GPU is only {} busy (threshold {}): paying for idle capacity",
                    pct(u),
                    pct(self.c.gpu_idle_max)
                ),
                vec![ev(
                    "gpu.utilization.mean",
                    u,
                    Some(self.c.gpu_idle_max),
                    "ratio",
                )],
                "Consolidate: fewer replicas or a smaller GPU for this load, or serve another \
                 model on the same GPU; if requests also queue, raise the batch limits."
                    .to_string(),
            );
        }
    }

    fn e2e_slo(&mut self) {
        let (Some(slo), Some(e2e)) = (self.c.e2e_p95_slo_seconds, self.s.e2e) else {
            return;
        };
        if e2e.p95 <= slo {
            return;
        }
        self.push(
            "e2e-slo-breach",
            Severity::Critical,
            format!(
                "e2e p95 is {}, over the {} SLO ({} over)",
                secs(e2e.p95),
                secs(slo),
                pct(e2e.p95 / slo - 1.0)
            ),
            vec![
                ev("e2e.p95", e2e.p95, Some(slo), "s"),
                ev("e2e.p50", e2e.p50, None, "s"),
            ],
            "See the other findings and the critical path of the p99 requests for where the \
             time goes; queue time points at capacity, prefill at prompt length, decode at \
             batch size and output length."
                .to_string(),
        );
    }

    fn goodput(&mut self) {
        let Some(g) = self.s.goodput.ratio else {
            return;
        };
        if g >= self.c.goodput_min {
            return;
        }
        let (good, target) = pcts_apart(g, self.c.goodput_min);
        // Goodput counts failed requests (errors, rejections) as missed: say which it was.
        let eligible = self.s.requests.saturating_sub(self.s.cancelled);
        let failed = ratio(self.s.errors + self.s.rejected, eligible);
        let slow = (1.0 - g - failed).max(0.0);
        let mut evidence = vec![
            ev("goodput.ratio", g, Some(self.c.goodput_min), "ratio"),
            ev(
                "goodput.requests_per_second",
                self.s.goodput.requests_per_second,
                None,
                "1/s",
            ),
        ];
        if failed > 0.0 {
            evidence.push(ev(
                "failed (errors + rejected) / requests",
                failed,
                None,
                "ratio",
            ));
        }
        let recommendation = if failed >= slow {
            format!(
                "Most of the shortfall is requests that failed ({} errors or rejections), not \
                 slow ones ({} served outside their SLOs): see the error and rejection findings \
                 and the failed requests' error.type first.",
                pct(failed),
                pct(slow)
            )
        } else {
            let mut text = "Requests are served but too slowly: check which SLO they miss (TTFT, \
                            TPOT, e2e) in the other findings; raising throughput at the cost of \
                            latency lowers goodput."
                .to_string();
            if failed > 0.0 {
                let _ = write!(
                    text,
                    " ({} were served outside their SLOs, {} failed.)",
                    pct(slow),
                    pct(failed)
                );
            }
            text
        };
        self.push(
            "goodput-below-target",
            Severity::Warning,
            format!(
                "Only {good} of requests met their SLOs (target {target}; {} good requests/s)",
                format_rate(self.s.goodput.requests_per_second)
            ),
            evidence,
            recommendation,
        );
    }

    fn throughput_floor(&mut self) {
        let Some(floor) = self.c.throughput_min_rps else {
            return;
        };
        let rps = self.s.throughput.requests_per_second;
        if rps >= floor {
            return;
        }
        self.push(
            "throughput-below-floor",
            Severity::Warning,
            format!(
                "Throughput is {} requests/s, below the floor of {} ({} output tokens/s)",
                format_rate(rps),
                format_rate(floor),
                format_rate(self.s.throughput.output_tokens_per_second)
            ),
            vec![
                ev("throughput.requests_per_second", rps, Some(floor), "1/s"),
                ev(
                    "throughput.output_tokens_per_second",
                    self.s.throughput.output_tokens_per_second,
                    None,
                    "1/s",
                ),
            ],
            "Less traffic is being served than expected: check upstream routing and client \
             errors; if requests queue, see the queue findings."
                .to_string(),
        );
    }

    fn outcome_rates(&mut self) {
        let n = self.s.requests;
        if n == 0 {
            return;
        }
        let errors = ratio(self.s.errors, n);
        if errors > self.c.error_rate_max {
            self.push(
                "error-rate",
                Severity::Critical,
                format!(
                    "{} of requests failed ({} of {n}; threshold {})",
                    pct(errors),
                    self.s.errors,
                    pct(self.c.error_rate_max)
                ),
                vec![ev(
                    "error_rate",
                    errors,
                    Some(self.c.error_rate_max),
                    "ratio",
                )],
                "Look at error.type on the failed request spans (infer.outcome = error) and the \
                 engine logs; out-of-memory and context-length errors point at request size \
                 limits."
                    .to_string(),
            );
        }
        let rejected = ratio(self.s.rejected, n);
        if rejected > self.c.rejection_rate_max {
            self.push(
                "rejection-rate",
                Severity::Critical,
                format!(
                    "{} of requests were rejected at admission ({} of {n}; threshold {})",
                    pct(rejected),
                    self.s.rejected,
                    pct(self.c.rejection_rate_max)
                ),
                vec![ev(
                    "rejection_rate",
                    rejected,
                    Some(self.c.rejection_rate_max),
                    "ratio",
                )],
                "The admission queue is full: add capacity, or lengthen the queue if the \
                 latency SLO allows the extra wait."
                    .to_string(),
            );
        }
        let cancelled = ratio(self.s.cancelled, n);
        if cancelled > self.c.cancel_rate_max {
            self.push(
                "cancel-rate",
                Severity::Warning,
                format!(
                    "{} of requests were cancelled by the client ({} of {n}; threshold {})",
                    pct(cancelled),
                    self.s.cancelled,
                    pct(self.c.cancel_rate_max)
                ),
                vec![ev(
                    "cancel_rate",
                    cancelled,
                    Some(self.c.cancel_rate_max),
                    "ratio",
                )],
                "Clients give up before the answer ends: compare TTFT and e2e with client \
                 timeouts; cancelled requests still cost GPU time (their tokens are counted)."
                    .to_string(),
            );
        }
    }

    fn critical_path_hotspot(&mut self, crit: &CriticalPathSummary) {
        let phases = [sc::span::QUEUE, sc::span::PREFILL, sc::span::DECODE];
        let Some(top) = crit
            .entries
            .iter()
            .filter(|e| *e.service == *self.s.service && !phases.contains(&&*e.span))
            .max_by(|a, b| a.share.p99.total_cmp(&b.share.p99))
        else {
            return;
        };
        if top.share.p99 <= self.c.critical_span_share_max {
            return;
        }
        self.push(
            "critical-path-hotspot",
            Severity::Warning,
            format!(
                "Span '{}' owns {} of the critical path of the slowest 1% of requests ({} over all requests; threshold {})",
                top.span,
                pct(top.share.p99),
                pct(top.share.all),
                pct(self.c.critical_span_share_max)
            ),
            vec![
                ev(
                    format!("critical_path.share.p99.{}", top.span),
                    top.share.p99,
                    Some(self.c.critical_span_share_max),
                    "ratio",
                ),
                ev(
                    format!("critical_path.share.all.{}", top.span),
                    top.share.all,
                    None,
                    "ratio",
                ),
            ],
            format!(
                "Time outside the engine's queue, prefill and decode dominates the slow \
                 requests: look at what '{}' does (tokenisation, retrieval, tool calls, \
                 network, the request span's own time) in the slowest traces.",
                top.span
            ),
        );
    }
}
