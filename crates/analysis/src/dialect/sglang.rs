//! SGLang's request tree (docs/dialects-sglang.md#sglangs-span-model; `--enable-trace` / `--trace-level`).
//!
//! SGLang emits no request span with latencies: each request is a tree of INTERNAL spans with
//! explicit timestamps —
//! 1. a root `Bootstrap Room 0x…` (attribute `bootstrap_room`). In PD mode the router (or the
//!    side that created it) owns it and the prefill and decode servers continue it;
//! 2. under it one span per role and request, `"{role} Req {rid[..8]}"` (attribute `rid`;
//!    role `prefill`, `decode`, empty outside PD, and the router's);
//! 3. under that one span per thread that handled the request (tokenizer, each TP rank of
//!    the scheduler), attributes `thread_label`, `tp_rank`;
//! 4. under a thread span the stage slices, nested when started inside another slice, each
//!    linked to the previous slice of its thread (or, across processes, to the slice the
//!    context was handed over from).
//!
//! Newer versions (sglang/srt/observability) create no room span: each server's role span is
//! a root under the caller's W3C context and carries `bootstrap_room` itself in PD mode.
//!
//! **One request, one record.** The room span is the request (one record for the whole
//! cross-service tree). Spans of one trace with the same non-zero `bootstrap_room` and no
//! SGLang span above them are one request too — the rooms each server created when only W3C
//! context reached it (a gateway in front), and newer versions' role spans. Without any room
//! (it never arrived), the role spans sharing its missing parent are one request when one of
//! them is named `prefill` or `decode`. The span that stands for the request is a room, else
//! the router's role span, else the decode side's (it answers the client), earliest first;
//! arrival and end span the whole group.
//! Detection and the phases key on this structure and the stage names, not on exact
//! thread-span names (they changed across versions; FastDeploy reuses the design). Links only
//! order slices, which their timestamps already do, so they are not needed here.
//!
//! **Completion.** The room and the role spans tell the collector's assembler that the
//! request arrived — except a `prefill Req …` span: the prefill side finishes long before the
//! decode side, and the trace must not be completed (after its grace period) without the
//! decode side's spans and the room. Alone, it is still read with its trace.
//!
//! **Tensor-parallel ranks.** Every TP rank repeats the same stages; a stage is read from one
//! thread only — the lowest `tp_rank` that has it (a thread without a rank counts as 0) — so
//! it is counted once per request.
//!
//! **Roles.** The role is the name's prefix (`prefill`, `decode`, `router`); without one (empty
//! outside PD, and some routers) the stages decide: `mini_lb_launch` / `wait_pd_finish` →
//! router, `decode_prepare` / `decode_bootstrap` / `decode_transferred` / `fake_output` /
//! `quick_finish` → decode, `prefill_prepare` / `prefill_bootstrap` /
//! `prefill_transfer_kv_cache` → prefill, else unified.
//!
//! **Phases** (each the first occurrence of the stage on the chosen rank, measured):
//! - e2e: from the group's earliest start to its latest end (the room span's duration).
//! - unified: queue = `prefill_waiting`; prefill = `prefill_forward`; first token at the end
//!   of `prefill_forward`; TTFT = first token − arrival; decode = first token → end of the
//!   last `decode_loop` (or `decode_forward`).
//! - PD: queue = the prefill side's `prefill_waiting`, prefill = its `prefill_forward`;
//!   first token at the end of the decode side's `fake_output` (the prebuilt step that emits
//!   the token the prefill side computed), else at the start of its first `decode_loop` (else
//!   `decode_forward`); decode = first token → end of the decode side's last `decode_loop` /
//!   `decode_forward`, else the role spans' `gen_ai.latency.time_in_model_decode`. The decode
//!   side runs on another host: when its role span does not lie within the request, its clock
//!   is taken to run apart and its first token is moved by what puts that span's end at the
//!   request's end (its durations need no move).
//!   Sub-phases ([`DisaggPhases`]): routing = `mini_lb_launch`, bootstrap =
//!   `prefill_bootstrap`, prefill queue = `prefill_waiting`, prefill = `prefill_forward`,
//!   KV transfer = `prefill_transfer_kv_cache`, decode bootstrap = `decode_bootstrap`,
//!   decode wait = the decode side's `decode_waiting`, first token = `fake_output`.
//!   `tokenize`, `dispatch`, `request_process`, `prefill_prepare`, `decode_prepare`,
//!   `decode_transferred` (the decode side waiting for the KV, which overlaps the prefill
//!   side's stages) and `wait_pd_finish` are not phases of their own: their time is in e2e
//!   and, before the first token, in [`TtftBreakdown::unattributed`].
//! - TTFT without the slices that give the first token: the role spans'
//!   `gen_ai.latency.time_to_first_token` (the decode side's first). A tree with no slice at
//!   all (low trace level) is read from its role span's `gen_ai.latency.*` attributes like
//!   [`latency_attrs`].
//! - preemptions (unified): `prefill_forward` slices beyond the first on the chosen rank —
//!   SGLang prefills a retracted request again (a lower bound: a chunked re-prefill may only
//!   show `chunked_prefill`).
//! - model, operation, tokens, prefix-cache hits (`gen_ai.usage.cache_read.input_tokens`, or
//!   SGLang's `gen_ai.usage.cached_tokens`), LoRA adapter and outcome: the room span's, else
//!   the role spans' (SGLang puts the attributes passed at a request's finish there); a thread
//!   span with status ERROR (newer versions mark an aborted request so) makes it an error.
//! - TPOT = decode / (output tokens − 1) (derived).
//!
//! [`TtftBreakdown::unattributed`]: crate::record::TtftBreakdown::unattributed

use infertrace_semconv as sc;
use sc::sglang::stage as st;
use smallvec::SmallVec;

use super::base_record::{count_attr, input_tokens, outcome_signal, output_tokens, seconds_attr};
use super::latency_attrs::{self, LATENCY_KEYS};
use super::trace_view::TraceView;
use crate::record::{DisaggPhases, PhaseOrigin, RequestRecord, tpot_from};
use crate::trace::Span;

/// True for SGLang's per-request root, `Bootstrap Room 0x…` (or an unnamed span carrying
/// `bootstrap_room` that is not a role span: newer versions put the attribute on role spans).
pub fn is_room(span: &Span) -> bool {
    span.name.starts_with(sc::sglang::ROOM_SPAN_PREFIX)
        || (span.attr(sc::sglang::BOOTSTRAP_ROOM).is_some()
            && !is_role_request(span)
            && !is_kv_sender(span))
}

/// True for a per-role request span: `"{role} Req {rid}"` carrying `rid` — but the KV
/// sender's.
pub fn is_role_request(span: &Span) -> bool {
    // The name first: most spans fail it without an attribute scan.
    span.name.contains(sc::sglang::REQUEST_SPAN_MARKER)
        && !is_kv_sender(span)
        && span.attr(sc::sglang::RID).is_some()
}

/// The KV sender's span (`"Sender Req …"`, with `rid` and `bootstrap_room`): newer versions
/// open it for a transfer, as the root of a trace of its own; it is no request.
fn is_kv_sender(span: &Span) -> bool {
    span.name
        .split_once(sc::sglang::REQUEST_SPAN_MARKER)
        .is_some_and(|(role, _)| {
            role.trim()
                .eq_ignore_ascii_case(sc::sglang::role::KV_SENDER)
        })
}

/// True for the spans that stand for an SGLang request: the room and the role spans.
pub fn is_request_tree(span: &Span) -> bool {
    is_room(span) || is_role_request(span)
}

/// True for a role span its name calls the prefill side's (`"prefill Req …"`).
pub fn is_prefill_role(span: &Span) -> bool {
    is_role_request(span) && named_kind(span) == Some(Kind::Prefill)
}

/// The room of a PD request (`bootstrap_room`), `None` outside PD (room `0x0`, shared by every
/// unified request) or when absent.
fn pd_room(span: &Span) -> Option<&str> {
    let room = span.attr_str(sc::sglang::BOOTSTRAP_ROOM)?.trim();
    let digits = room.trim_start_matches("0x").trim_start_matches('0');
    (!digits.is_empty()).then_some(room)
}

/// A request-tree span with no request-tree ancestor: a candidate to stand for a request.
fn is_top(span: &Span, trace: &TraceView<'_>) -> bool {
    is_request_tree(span) && !trace.ancestors(span).any(is_request_tree)
}

/// The missing parent of a role span whose parent is not in the trace.
fn orphan_role(span: &Span, trace: &TraceView<'_>) -> Option<crate::trace::SpanId> {
    let parent = span.parent_span_id?;
    (is_role_request(span) && trace.get(parent).is_none()).then_some(parent)
}

/// The top spans of the request `top` belongs to: those with the same PD room (each server
/// may root its own part: older versions a room span each when only W3C context reached
/// them, newer versions no room span at all, the room being an attribute of the role spans),
/// else the role spans sharing `top`'s missing parent when one of them is named `prefill` or
/// `decode` (the room span never arrived), else `top` alone.
fn group<'a>(top: &'a Span, trace: &TraceView<'a>) -> SmallVec<[&'a Span; 4]> {
    if let Some(key) = pd_room(top) {
        return trace
            .spans
            .iter()
            .filter(|s| pd_room(s) == Some(key) && is_top(s, trace))
            .collect();
    }
    if let Some(parent) = orphan_role(top, trace) {
        let siblings: SmallVec<[&'a Span; 4]> = trace
            .spans
            .iter()
            .filter(|s| {
                pd_room(s).is_none()
                    && s.parent_span_id == Some(parent)
                    && orphan_role(s, trace).is_some()
            })
            .collect();
        // Only a PD request's sides: unified requests under one missing caller span are not.
        let pd = siblings
            .iter()
            .any(|s| matches!(named_kind(s), Some(Kind::Prefill | Kind::Decode)));
        if pd {
            return siblings;
        }
    }
    SmallVec::from_elem(top, 1)
}

/// Which span of a group stands for the request (lowest first): a room, then the router's,
/// the decode side's (it answers the client), other role spans; then the earliest start.
fn precedence(span: &Span) -> (u8, u64) {
    let class = if is_room(span) {
        0
    } else {
        match named_kind(span) {
            Some(Kind::Router) => 1,
            Some(Kind::Decode) => 2,
            _ => 3,
        }
    };
    (class, span.start_unix_nano)
}

/// Whether `span` (at `index` in the trace), a request-tree span, is part of another
/// request-tree span's request rather than a request of its own: it has a request-tree
/// ancestor, or another span of its [`group`] stands for the request.
pub(crate) fn is_part_of_other(span: &Span, index: usize, trace: &TraceView<'_>) -> bool {
    if !is_top(span, trace) {
        return true;
    }
    let mine = (precedence(span), index);
    group(span, trace).iter().any(|other| {
        let at = trace
            .spans
            .iter()
            .position(|s| std::ptr::eq(s, *other))
            .unwrap_or(usize::MAX);
        (precedence(other), at) < mine
    })
}

/// The stages the phases are read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    PrefillWaiting,
    PrefillForward,
    DecodeLoop,
    DecodeForward,
    PrefillPrepare,
    PrefillBootstrap,
    PrefillTransferKv,
    DecodePrepare,
    DecodeBootstrap,
    DecodeWaiting,
    DecodeTransferred,
    FakeOutput,
    QuickFinish,
    MiniLbLaunch,
    WaitPdFinish,
}

const STAGES: usize = 15;

impl Stage {
    fn of(name: &str) -> Option<Self> {
        Some(match name {
            st::PREFILL_WAITING => Self::PrefillWaiting,
            st::PREFILL_FORWARD => Self::PrefillForward,
            st::DECODE_LOOP => Self::DecodeLoop,
            st::DECODE_FORWARD => Self::DecodeForward,
            st::PREFILL_PREPARE => Self::PrefillPrepare,
            st::PREFILL_BOOTSTRAP => Self::PrefillBootstrap,
            st::PREFILL_TRANSFER_KV_CACHE => Self::PrefillTransferKv,
            st::DECODE_PREPARE => Self::DecodePrepare,
            st::DECODE_BOOTSTRAP => Self::DecodeBootstrap,
            st::DECODE_WAITING => Self::DecodeWaiting,
            st::DECODE_TRANSFERRED => Self::DecodeTransferred,
            st::FAKE_OUTPUT => Self::FakeOutput,
            st::QUICK_FINISH => Self::QuickFinish,
            st::MINI_LB_LAUNCH => Self::MiniLbLaunch,
            // Older routers spell it `wait_PD_finish`.
            n if n.eq_ignore_ascii_case(st::WAIT_PD_FINISH) => Self::WaitPdFinish,
            _ => return None,
        })
    }
}

/// The occurrences of one stage on one thread.
#[derive(Clone, Copy, Debug, Default)]
struct Occurrences {
    count: u32,
    /// The earliest-starting occurrence.
    first_start: u64,
    first_end: u64,
    /// The earliest start and the latest end over all occurrences.
    min_start: u64,
    last_end: u64,
}

impl Occurrences {
    fn add(&mut self, s: &Span) {
        if self.count == 0 || s.start_unix_nano < self.first_start {
            self.first_start = s.start_unix_nano;
            self.first_end = s.end_unix_nano;
        }
        if self.count == 0 {
            self.min_start = s.start_unix_nano;
            self.last_end = s.end_unix_nano;
        }
        self.min_start = self.min_start.min(s.start_unix_nano);
        self.last_end = self.last_end.max(s.end_unix_nano);
        self.count = self.count.saturating_add(1);
    }

    /// Duration of the first occurrence, seconds.
    fn first_secs(&self) -> f64 {
        self.first_end.saturating_sub(self.first_start) as f64 / 1e9
    }
}

/// Which side of a deployment a role span is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Unified,
    Router,
    Prefill,
    Decode,
}

/// A thread span of the request and its stages.
struct Thread<'a> {
    span: &'a Span,
    role: usize,
    rank: i64,
    stages: [Occurrences; STAGES],
}

/// The role spans of the request `unit` stands for: the role spans of its group, and the role
/// spans under its group's rooms.
fn role_spans<'a>(unit: &'a Span, trace: &TraceView<'a>) -> SmallVec<[&'a Span; 4]> {
    let mut roles = SmallVec::new();
    for top in group(unit, trace) {
        if is_role_request(top) {
            roles.push(top);
        } else {
            roles.extend(trace.children(top).filter(|s| is_role_request(s)));
        }
    }
    roles
}

/// The TP rank of a thread span: `tp_rank`, else `[TP n]` in its name, else 0.
fn rank_of(span: &Span) -> i64 {
    if let Some(r) = span.attr_i64(sc::sglang::TP_RANK) {
        return r;
    }
    span.name
        .split_once("[TP ")
        .and_then(|(_, rest)| rest.split_once(']'))
        .and_then(|(n, _)| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The role named by a role span's prefix (`"prefill Req …"`), if any.
fn named_kind(span: &Span) -> Option<Kind> {
    let (prefix, _) = span.name.split_once(sc::sglang::REQUEST_SPAN_MARKER)?;
    let prefix = prefix.trim();
    [
        (sc::sglang::role::PREFILL, Kind::Prefill),
        (sc::sglang::role::DECODE, Kind::Decode),
        (sc::sglang::role::ROUTER, Kind::Router),
    ]
    .into_iter()
    .find(|(name, _)| prefix.eq_ignore_ascii_case(name))
    .map(|(_, k)| k)
}

/// The role a set of stages shows.
fn kind_from_stages(has: impl Fn(Stage) -> bool) -> Kind {
    use Stage::*;
    if [MiniLbLaunch, WaitPdFinish].into_iter().any(&has) {
        Kind::Router
    } else if [
        DecodePrepare,
        DecodeBootstrap,
        DecodeTransferred,
        FakeOutput,
        QuickFinish,
    ]
    .into_iter()
    .any(&has)
    {
        Kind::Decode
    } else if [PrefillPrepare, PrefillBootstrap, PrefillTransferKv]
        .into_iter()
        .any(&has)
    {
        Kind::Prefill
    } else {
        Kind::Unified
    }
}

/// The request's threads, their stages, and each role span's kind.
struct Tree<'a> {
    roles: SmallVec<[(&'a Span, Kind); 4]>,
    threads: SmallVec<[Thread<'a>; 8]>,
}

impl<'a> Tree<'a> {
    fn read(unit: &'a Span, trace: &TraceView<'a>) -> Self {
        let role_spans = role_spans(unit, trace);
        let mut threads: SmallVec<[Thread<'a>; 8]> = SmallVec::new();
        for (role, r) in role_spans.iter().enumerate() {
            threads.extend(trace.children(r).map(|span| Thread {
                span,
                role,
                rank: rank_of(span),
                stages: [Occurrences::default(); STAGES],
            }));
        }
        if !threads.is_empty() {
            // One pass over the trace: each slice with a known stage name goes to the thread
            // span above it (slices nest, so the nearest thread ancestor).
            for s in trace.spans {
                let Some(stage) = Stage::of(&s.name) else {
                    continue;
                };
                let thread = trace
                    .ancestors(s)
                    .find_map(|a| threads.iter().position(|t| t.span.span_id == a.span_id));
                if let Some(t) = thread {
                    threads[t].stages[stage as usize].add(s);
                }
            }
        }
        let roles = role_spans
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let kind = named_kind(r).unwrap_or_else(|| {
                    kind_from_stages(|stage| {
                        threads
                            .iter()
                            .any(|t| t.role == i && t.stages[stage as usize].count > 0)
                    })
                });
                (*r, kind)
            })
            .collect();
        Self { roles, threads }
    }

    /// `stage` on the role of `kind`, read from its lowest-ranked thread that has it.
    fn stage(&self, kind: Kind, stage: Stage) -> Option<&Occurrences> {
        self.threads
            .iter()
            .filter(|t| self.roles[t.role].1 == kind && t.stages[stage as usize].count > 0)
            .min_by_key(|t| (t.rank, t.span.start_unix_nano))
            .map(|t| &t.stages[stage as usize])
    }

    fn role(&self, kind: Kind) -> Option<&'a Span> {
        self.roles.iter().find(|(_, k)| *k == kind).map(|(s, _)| *s)
    }

    fn has_kind(&self, kind: Kind) -> bool {
        self.roles.iter().any(|(_, k)| *k == kind)
    }

    /// The role spans, decode side first (it sees the response the client gets).
    fn roles_decode_first(&self) -> impl Iterator<Item = &'a Span> + '_ {
        let decode = self.roles.iter().filter(|(_, k)| *k == Kind::Decode);
        let rest = self.roles.iter().filter(|(_, k)| *k != Kind::Decode);
        decode.chain(rest).map(|(s, _)| *s)
    }
}

/// Completes `r`, the base record (common to every dialect) of `unit`, an SGLang room span (or a
/// role span standing for a request whose room never arrived).
pub fn refine(unit: &Span, trace: &TraceView<'_>, r: &mut RequestRecord) {
    let tree = Tree::read(unit, trace);
    fill_from_roles(unit, &tree, r);
    // A request rooted by several spans (one per server) spans all of them.
    for top in group(unit, trace) {
        r.arrival_unix_nano = r.arrival_unix_nano.min(top.start_unix_nano);
        r.end_unix_nano = r.end_unix_nano.max(top.end_unix_nano);
    }
    if let Some(e2e) = secs_between(r.arrival_unix_nano, r.end_unix_nano)
        && e2e > r.e2e
    {
        r.e2e = e2e;
    }

    let any_slice = tree
        .threads
        .iter()
        .any(|t| t.stages.iter().any(|o| o.count > 0));
    if !any_slice {
        // Low trace level: the role span's own latency attributes, if it has them.
        if let Some(role) = tree
            .roles_decode_first()
            .find(|s| LATENCY_KEYS.iter().any(|k| s.attr(k).is_some()))
        {
            latency_attrs::refine(role, r);
        }
        return;
    }

    let arrival = r.arrival_unix_nano;
    let secs = secs_between;
    let measured = |v: Option<f64>| v.map(|_| PhaseOrigin::Measured);
    let pd = tree.has_kind(Kind::Prefill) || tree.has_kind(Kind::Decode);

    let (first_token_at, last_token_at);
    let mut first_token_offset = 0;
    if pd {
        let (p, d) = (Kind::Prefill, Kind::Decode);
        let mut phases = DisaggPhases {
            routing: tree
                .stage(Kind::Router, Stage::MiniLbLaunch)
                .map(Occurrences::first_secs),
            bootstrap: tree
                .stage(p, Stage::PrefillBootstrap)
                .map(Occurrences::first_secs),
            prefill_queue: tree
                .stage(p, Stage::PrefillWaiting)
                .map(Occurrences::first_secs),
            prefill: tree
                .stage(p, Stage::PrefillForward)
                .map(Occurrences::first_secs),
            kv_transfer: tree
                .stage(p, Stage::PrefillTransferKv)
                .map(Occurrences::first_secs),
            decode_bootstrap: tree
                .stage(d, Stage::DecodeBootstrap)
                .map(Occurrences::first_secs),
            decode_wait: tree
                .stage(d, Stage::DecodeWaiting)
                .map(Occurrences::first_secs),
            first_token: tree
                .stage(d, Stage::FakeOutput)
                .map(Occurrences::first_secs),
            decode: None,
            prefill_worker: tree.role(p).map(|s| s.service.clone()),
            decode_worker: tree.role(d).map(|s| s.service.clone()),
        };
        r.queue = phases.prefill_queue;
        r.prefill = phases.prefill;
        first_token_at = tree
            .stage(d, Stage::FakeOutput)
            .map(|o| o.first_end)
            .or_else(|| tree.stage(d, Stage::DecodeLoop).map(|o| o.min_start))
            .or_else(|| tree.stage(d, Stage::DecodeForward).map(|o| o.min_start));
        // TTFT reads the first token on the request's clock: the decode side runs on another
        // host (its durations need no move).
        first_token_offset = decode_clock_offset(&tree, arrival, r.end_unix_nano);
        last_token_at = last_decode_end(&tree, d);
        phases.decode = first_token_at
            .zip(last_token_at)
            .and_then(|(f, l)| secs(f, l));
        r.decode = phases.decode;
        r.disagg = Some(Box::new(phases));
    } else {
        let u = Kind::Unified;
        r.queue = tree
            .stage(u, Stage::PrefillWaiting)
            .map(Occurrences::first_secs);
        let forward = tree.stage(u, Stage::PrefillForward);
        r.prefill = forward.map(Occurrences::first_secs);
        r.preemptions = r
            .preemptions
            .or(forward.map(|o| u64::from(o.count.saturating_sub(1))));
        first_token_at = forward.map(|o| o.first_end);
        last_token_at = last_decode_end(&tree, u);
        r.decode = first_token_at
            .zip(last_token_at)
            .and_then(|(f, l)| secs(f, l));
    }
    if r.decode.is_none() {
        // Without the slices that bound it: the role spans' own decode time.
        r.decode = tree
            .roles_decode_first()
            .find_map(|s| seconds_attr(s, sc::latency::TIME_IN_MODEL_DECODE));
        if let Some(phases) = r.disagg.as_deref_mut() {
            phases.decode = r.decode;
        }
    }
    if r.decode.is_none() && r.output_tokens == Some(1) && first_token_at.is_some() {
        // One token: its first is its last, no decode step (vLLM and TGI say 0 too).
        r.decode = Some(0.0);
        if let Some(phases) = r.disagg.as_deref_mut() {
            phases.decode = r.decode;
        }
    }
    r.origins.queue = measured(r.queue);
    r.origins.prefill = measured(r.prefill);
    r.origins.decode = measured(r.decode);

    r.ttft = first_token_at
        .map(|f| f.saturating_add_signed(first_token_offset))
        .and_then(|f| secs(arrival, f));
    r.origins.ttft = measured(r.ttft);
    if r.ttft.is_none()
        && let Some(t) = tree
            .roles_decode_first()
            .find_map(|s| seconds_attr(s, sc::latency::TIME_TO_FIRST_TOKEN))
    {
        r.ttft = Some(t);
        r.origins.ttft = Some(PhaseOrigin::Measured);
    }

    if let (Some(d), Some(n)) = (r.decode, r.output_tokens) {
        r.tpot = tpot_from(d, n);
        r.origins.tpot = r.tpot.map(|_| PhaseOrigin::Derived);
    }
}

/// Nanoseconds to add to the decode side's times to read them on the request's clock. 0 while
/// its role span lies within the request (the clocks agree, or disagree by less than the
/// margins); else the shift that puts its end at the request's end (the decode side emits the
/// last token, and the request ends when it is relayed) — its host's clock runs apart, and
/// its first token would otherwise be taken before the arrival or after the end.
fn decode_clock_offset(tree: &Tree<'_>, arrival: u64, end: u64) -> i64 {
    match tree.role(Kind::Decode) {
        Some(role) if role.start_unix_nano < arrival || role.end_unix_nano > end => {
            i64::try_from(i128::from(end) - i128::from(role.end_unix_nano)).unwrap_or(0)
        }
        _ => 0,
    }
}

/// Seconds from `from` to `to` (Unix nanoseconds); `None` if `to` is earlier.
fn secs_between(from: u64, to: u64) -> Option<f64> {
    (to >= from).then(|| (to - from) as f64 / 1e9)
}

/// The end of the last decode step of the role of `kind`.
fn last_decode_end(tree: &Tree<'_>, kind: Kind) -> Option<u64> {
    let step = tree.stage(kind, Stage::DecodeLoop).map(|o| o.last_end);
    let forward = tree.stage(kind, Stage::DecodeForward).map(|o| o.last_end);
    step.max(forward)
}

/// Identity, tokens and outcome from the role spans where the room span does not tell.
fn fill_from_roles(unit: &Span, tree: &Tree<'_>, r: &mut RequestRecord) {
    for role in tree.roles_decode_first() {
        if r.model == crate::record::UNKNOWN
            && let Some(m) = role
                .attr_text(sc::gen_ai::RESPONSE_MODEL)
                .or_else(|| role.attr_text(sc::gen_ai::REQUEST_MODEL))
                .filter(|m| !m.is_empty())
        {
            r.model = m.clone();
        }
        if r.operation == crate::record::UNKNOWN
            && let Some(op) = role
                .attr_text(sc::gen_ai::OPERATION_NAME)
                .filter(|m| !m.is_empty())
        {
            r.operation = op.clone();
        }
        r.input_tokens = r.input_tokens.or_else(|| input_tokens(role));
        r.output_tokens = r.output_tokens.or_else(|| output_tokens(role));
        r.cache_read_input_tokens = r.cache_read_input_tokens.or_else(|| {
            count_attr(role, sc::gen_ai::USAGE_CACHE_READ_INPUT_TOKENS)
                .or_else(|| count_attr(role, sc::sglang::USAGE_CACHED_TOKENS))
        });
        r.preemptions = r
            .preemptions
            .or_else(|| count_attr(role, sc::infer::PREEMPTIONS));
        if r.lora_adapter.is_none() {
            r.lora_adapter = role.attr_text(sc::infer::LORA_ADAPTER).cloned();
        }
    }
    if outcome_signal(unit).is_none() {
        if let Some(o) = tree.roles_decode_first().find_map(outcome_signal) {
            r.outcome = o;
        } else if tree
            .threads
            .iter()
            .any(|t| t.span.status == crate::trace::StatusCode::Error)
        {
            // Newer versions mark a thread span ERROR when the request was aborted.
            r.outcome = crate::record::Outcome::Error;
        }
    }
}
