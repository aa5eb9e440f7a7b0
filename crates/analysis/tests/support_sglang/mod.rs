//! SGLang request trees in the structure docs/dialects-sglang.md#sglangs-span-model documents (and sglang/srt/tracing
//! emits), built from a table that tests can change before building:
//! a `Bootstrap Room 0x…` root → one `"{role} Req {rid[..8]}"` span per role (attribute `rid`)
//! → one span per thread (`"{label} [TP n] (host:… | pid:…)"`, attributes `thread_label`,
//! `tp_rank`) → stage slices, nested where started inside another, and each slice that starts
//! with no open slice on its thread linked to the previous one (the first to the slice the
//! context was handed over from, across processes).
//!
//! [`pd`]: router + prefill + decode, two TP ranks each on the schedulers (rank 1's slices
//! deliberately differ from rank 0's, so counting a stage twice or from the wrong rank shows).
//! [`plain`]: one server, two TP ranks.

#![allow(dead_code)]

use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{
    AttrValue, Span, SpanId, SpanKind, SpanLink, StatusCode, TraceId, known_key,
};
use infertrace_semconv as sc;

/// Start of every fixture, Unix nanoseconds.
pub const T0: u64 = 1_700_000_000_000_000_000;
/// Microseconds → nanoseconds.
pub const US: u64 = 1_000;
/// Milliseconds → microseconds (the tables are in µs).
pub const MS: u64 = 1_000;
/// The fixtures' trace.
pub const TRACE: TraceId = TraceId([7; 16]);

/// The room span (`None`: it never arrived, its id is still the role spans' parent).
#[derive(Clone, Debug)]
pub struct Room {
    pub service: &'static str,
    pub room: u64,
    pub start_us: u64,
    pub end_us: u64,
}

/// One role's request span.
#[derive(Clone, Debug)]
pub struct Role {
    pub service: &'static str,
    /// Name prefix: `prefill`, `decode`, or empty.
    pub role: &'static str,
    pub rid: &'static str,
    pub start_us: u64,
    pub end_us: u64,
    pub attributes: Vec<(&'static str, AttrValue)>,
}

/// One thread span.
#[derive(Clone, Debug)]
pub struct Thread {
    pub role: usize,
    pub label: &'static str,
    pub tp: Option<i64>,
    pub pid: u32,
    /// The slice (index) whose context this thread was handed, linked from its first slice.
    pub handed_over_from: Option<usize>,
}

/// One stage slice.
#[derive(Clone, Debug)]
pub struct Slice {
    pub thread: usize,
    pub name: &'static str,
    pub start_us: u64,
    pub end_us: u64,
    /// The slice (index) it was started inside, if any.
    pub inside: Option<usize>,
}

/// A request tree as a table.
#[derive(Clone, Debug)]
pub struct Tree {
    pub room: Option<Room>,
    pub roles: Vec<Role>,
    pub threads: Vec<Thread>,
    pub slices: Vec<Slice>,
}

fn kept(key: &str, v: AttrValue) -> (&'static str, AttrValue) {
    (known_key(key.as_bytes()).expect("a kept key"), v)
}

/// Span id of the room, role `i`, thread `i`, slice `i`.
pub fn room_id() -> SpanId {
    SpanId([0x10, 0, 0, 0, 0, 0, 0, 1])
}
pub fn role_id(i: usize) -> SpanId {
    SpanId([0x20, 0, 0, 0, 0, 0, 0, i as u8 + 1])
}
pub fn thread_id(i: usize) -> SpanId {
    SpanId([0x30, 0, 0, 0, 0, 0, 0, i as u8 + 1])
}
pub fn slice_id(i: usize) -> SpanId {
    let [hi, lo] = (i as u16 + 1).to_be_bytes();
    SpanId([0x40, 0, 0, 0, 0, 0, hi, lo])
}

fn span(id: SpanId, parent: Option<SpanId>, name: String, service: &str, s: u64, e: u64) -> Span {
    Span {
        trace_id: TRACE,
        span_id: id,
        parent_span_id: parent,
        name: name.as_str().into(),
        service: Text::from(service),
        kind: SpanKind::Internal,
        start_unix_nano: T0 + s * US,
        end_unix_nano: T0 + e * US,
        status: StatusCode::Unset,
        attributes: Vec::new(),
        links: Vec::new(),
    }
}

impl Tree {
    /// The spans, in the order SGLang ends (and so exports) them: slices, threads, roles, room.
    pub fn build(&self) -> Vec<Span> {
        let mut out = Vec::new();
        let mut last_top: Vec<Option<usize>> = vec![None; self.threads.len()];
        for (i, s) in self.slices.iter().enumerate() {
            let t = &self.threads[s.thread];
            let parent = s.inside.map(slice_id).unwrap_or(thread_id(s.thread));
            let mut sp = span(
                slice_id(i),
                Some(parent),
                s.name.to_string(),
                self.roles[t.role].service,
                s.start_us,
                s.end_us,
            );
            if s.inside.is_none() {
                let previous = last_top[s.thread].or(t.handed_over_from);
                if let Some(p) = previous {
                    sp.links.push(SpanLink {
                        trace_id: TRACE,
                        span_id: slice_id(p),
                    });
                }
                last_top[s.thread] = Some(i);
            }
            out.push(sp);
        }
        for (i, t) in self.threads.iter().enumerate() {
            let role = &self.roles[t.role];
            let tp = t.tp.map(|r| format!(" [TP {r}] ")).unwrap_or(" ".into());
            let mut sp = span(
                thread_id(i),
                Some(role_id(t.role)),
                format!("{}{tp}(host:1a2b3c4d | pid:{})", t.label, t.pid),
                role.service,
                role.start_us,
                role.end_us,
            );
            sp.attributes.push(kept(
                sc::sglang::THREAD_LABEL,
                AttrValue::Str(t.label.into()),
            ));
            if let Some(r) = t.tp {
                sp.attributes
                    .push(kept(sc::sglang::TP_RANK, AttrValue::Int(r)));
            }
            out.push(sp);
        }
        for (i, r) in self.roles.iter().enumerate() {
            let mut sp = span(
                role_id(i),
                Some(room_id()),
                format!("{} Req {}", r.role, &r.rid[..8]),
                r.service,
                r.start_us,
                r.end_us,
            );
            sp.attributes
                .push(kept(sc::sglang::RID, AttrValue::Str(r.rid.into())));
            sp.attributes.extend(r.attributes.iter().cloned());
            out.push(sp);
        }
        if let Some(room) = &self.room {
            let hex = format!("{:#x}", room.room);
            let mut sp = span(
                room_id(),
                None,
                format!("Bootstrap Room {hex}"),
                room.service,
                room.start_us,
                room.end_us,
            );
            sp.attributes.push(kept(
                sc::sglang::BOOTSTRAP_ROOM,
                AttrValue::Str(hex.as_str().into()),
            ));
            out.push(sp);
        }
        out
    }

    /// Index of the slice `name` on the thread with `label` and `tp` of role `role`.
    pub fn find(&self, role: usize, tp: Option<i64>, name: &str) -> usize {
        self.slices
            .iter()
            .position(|s| {
                let t = &self.threads[s.thread];
                t.role == role && t.tp == tp && s.name == name
            })
            .unwrap_or_else(|| panic!("no slice {name} on role {role} tp {tp:?}"))
    }

    /// Adds a thread and returns its index.
    fn thread(&mut self, role: usize, label: &'static str, tp: Option<i64>, pid: u32) -> usize {
        self.threads.push(Thread {
            role,
            label,
            tp,
            pid,
            handed_over_from: None,
        });
        self.threads.len() - 1
    }

    /// Adds a slice and returns its index.
    fn slice(&mut self, thread: usize, name: &'static str, s: u64, e: u64) -> usize {
        self.slices.push(Slice {
            thread,
            name,
            start_us: s,
            end_us: e,
            inside: None,
        });
        self.slices.len() - 1
    }

    fn nested(&mut self, inside: usize, name: &'static str, s: u64, e: u64) -> usize {
        let thread = self.slices[inside].thread;
        let i = self.slice(thread, name, s, e);
        self.slices[i].inside = Some(inside);
        i
    }
}

/// Role indexes of [`pd`].
pub const ROUTER: usize = 0;
pub const PREFILL: usize = 1;
pub const DECODE: usize = 2;

/// Decode steps of [`pd`]: 39 steps of 20 ms after the first token (40 output tokens).
pub const PD_DECODE_STEPS: u64 = 39;

/// A PD request: router (`mini_lb_launch` 0–4 ms, `wait_pd_finish` 4–1000), prefill
/// (tokenize 5–7, dispatch 7–9, then on each TP rank `prefill_prepare` 9–10,
/// `prefill_bootstrap` 10–40, `prefill_waiting` 40–60, `prefill_forward` 60–150 with two
/// `chunked_prefill`, `prefill_transfer_kv_cache` 150–190) and decode (tokenize 6–8, dispatch
/// 8–10, `decode_prepare` 10–11, `decode_bootstrap` 11–38, `decode_transferred` 38–195,
/// `decode_waiting` 195–205, `fake_output` 205–212, then 39 `decode_loop` steps of 20 ms to
/// 992). Rank 1 runs each scheduler stage 0.5 ms later and 3 ms longer. The room spans 0–1000.
pub fn pd() -> Tree {
    let ms = |v: u64| v * MS;
    let mut t = Tree {
        room: Some(Room {
            service: "sglang-router",
            room: 0x005a_3c9e_01f2,
            start_us: 0,
            end_us: ms(1000),
        }),
        roles: vec![
            Role {
                service: "sglang-router",
                role: "",
                rid: "5a3c9e01f2",
                start_us: 0,
                end_us: ms(1000),
                attributes: Vec::new(),
            },
            Role {
                service: "sglang-prefill",
                role: "prefill",
                rid: "7f3a9c21e4d84b0f",
                start_us: ms(5),
                end_us: ms(191),
                attributes: Vec::new(),
            },
            Role {
                service: "sglang-decode",
                role: "decode",
                rid: "7f3a9c21e4d84b0f",
                start_us: ms(6),
                end_us: ms(998),
                attributes: vec![
                    kept(
                        sc::gen_ai::RESPONSE_MODEL,
                        AttrValue::Str("llama-3.1-8b".into()),
                    ),
                    kept(sc::gen_ai::USAGE_PROMPT_TOKENS, AttrValue::Int(1200)),
                    kept(
                        sc::gen_ai::USAGE_COMPLETION_TOKENS,
                        AttrValue::Int(PD_DECODE_STEPS as i64 + 1),
                    ),
                    kept(
                        sc::gen_ai::USAGE_CACHE_READ_INPUT_TOKENS,
                        AttrValue::Int(512),
                    ),
                ],
            },
        ],
        threads: Vec::new(),
        slices: Vec::new(),
    };
    let router = t.thread(ROUTER, "router", None, 100);
    let launch = t.slice(router, sc::sglang::stage::MINI_LB_LAUNCH, 0, ms(4));
    t.slice(router, sc::sglang::stage::WAIT_PD_FINISH, ms(4), ms(1000));

    // Prefill: tokenizer, then two TP ranks (rank 1 listed first: order must not matter).
    let tok = t.thread(PREFILL, "Tokenizer", None, 200);
    t.threads[tok].handed_over_from = Some(launch);
    t.slice(tok, sc::sglang::stage::TOKENIZE, ms(5), ms(7));
    let dispatch = t.slice(tok, sc::sglang::stage::DISPATCH, ms(7), ms(9));
    for (rank, pid) in [(1, 202), (0, 201)] {
        let th = t.thread(PREFILL, "Scheduler", Some(rank), pid);
        t.threads[th].handed_over_from = Some(dispatch);
        let (lag, longer) = if rank == 0 { (0, 0) } else { (500, 3000) };
        let at = |v: u64| ms(v) + lag;
        use sc::sglang::stage::*;
        t.slice(th, PREFILL_PREPARE, at(9), at(10) + longer);
        t.slice(th, PREFILL_BOOTSTRAP, at(10), at(40) + longer);
        t.slice(th, PREFILL_WAITING, at(40), at(60) + longer);
        let fwd = t.slice(th, PREFILL_FORWARD, at(60), at(150) + longer);
        t.nested(fwd, CHUNKED_PREFILL, at(60), at(100));
        t.nested(fwd, CHUNKED_PREFILL, at(100), at(150) + longer);
        t.slice(th, PREFILL_TRANSFER_KV_CACHE, at(150), at(190) + longer);
    }

    // Decode: tokenizer, then two TP ranks.
    let tok = t.thread(DECODE, "Tokenizer", None, 300);
    t.threads[tok].handed_over_from = Some(launch);
    t.slice(tok, sc::sglang::stage::TOKENIZE, ms(6), ms(8));
    let dispatch = t.slice(tok, sc::sglang::stage::DISPATCH, ms(8), ms(10));
    for (rank, pid) in [(0, 301), (1, 302)] {
        let th = t.thread(DECODE, "Scheduler", Some(rank), pid);
        t.threads[th].handed_over_from = Some(dispatch);
        let (lag, longer) = if rank == 0 { (0, 0) } else { (500, 3000) };
        let at = |v: u64| ms(v) + lag;
        use sc::sglang::stage::*;
        t.slice(th, DECODE_PREPARE, at(10), at(11) + longer);
        t.slice(th, DECODE_BOOTSTRAP, at(11), at(38) + longer);
        t.slice(th, DECODE_TRANSFERRED, at(38), at(195) + longer);
        t.slice(th, DECODE_WAITING, at(195), at(205) + longer);
        t.slice(th, FAKE_OUTPUT, at(205), at(212) + longer);
        for step in 0..PD_DECODE_STEPS {
            let s = 212 + step * 20;
            let end = if step + 1 == PD_DECODE_STEPS {
                at(s + 20) + longer
            } else {
                at(s + 20)
            };
            t.slice(th, DECODE_LOOP, at(s), end);
        }
    }
    t
}

/// Decode steps of [`plain`]: 20 steps of 20 ms.
pub const PLAIN_DECODE_STEPS: u64 = 20;

/// A unified (non-PD) request on one server with two TP ranks: room and ` Req …` 0–500 ms;
/// tokenize 0–2, dispatch 2–3; per rank `request_process` 3–4, `prefill_waiting` 4–30,
/// `prefill_forward` 30–80 (two `chunked_prefill`), 20 `decode_loop` steps of 20 ms to 480.
/// Rank 1 runs 0.5 ms later and 3 ms longer per stage.
pub fn plain() -> Tree {
    let ms = |v: u64| v * MS;
    let mut t = Tree {
        room: Some(Room {
            service: "sglang",
            room: 0,
            start_us: 0,
            end_us: ms(500),
        }),
        roles: vec![Role {
            service: "sglang",
            role: "",
            rid: "9b1c2d3e4f5a6b7c",
            start_us: 0,
            end_us: ms(500),
            attributes: vec![
                kept(
                    sc::gen_ai::RESPONSE_MODEL,
                    AttrValue::Str("qwen-2.5-7b".into()),
                ),
                kept(sc::gen_ai::USAGE_PROMPT_TOKENS, AttrValue::Int(300)),
                kept(
                    sc::gen_ai::USAGE_COMPLETION_TOKENS,
                    AttrValue::Int(PLAIN_DECODE_STEPS as i64 + 1),
                ),
            ],
        }],
        threads: Vec::new(),
        slices: Vec::new(),
    };
    let tok = t.thread(0, "Tokenizer", None, 400);
    t.slice(tok, sc::sglang::stage::TOKENIZE, 0, ms(2));
    let dispatch = t.slice(tok, sc::sglang::stage::DISPATCH, ms(2), ms(3));
    for (rank, pid) in [(0, 401), (1, 402)] {
        let th = t.thread(0, "Scheduler", Some(rank), pid);
        t.threads[th].handed_over_from = Some(dispatch);
        let (lag, longer) = if rank == 0 { (0, 0) } else { (500, 3000) };
        let at = |v: u64| ms(v) + lag;
        use sc::sglang::stage::*;
        t.slice(th, REQUEST_PROCESS, at(3), at(4) + longer);
        t.slice(th, PREFILL_WAITING, at(4), at(30) + longer);
        let fwd = t.slice(th, PREFILL_FORWARD, at(30), at(80) + longer);
        t.nested(fwd, CHUNKED_PREFILL, at(30), at(55));
        t.nested(fwd, CHUNKED_PREFILL, at(55), at(80) + longer);
        for step in 0..PLAIN_DECODE_STEPS {
            let s = 80 + step * 20;
            let end = if step + 1 == PLAIN_DECODE_STEPS {
                at(s + 20) + longer
            } else {
                at(s + 20)
            };
            t.slice(th, DECODE_LOOP, at(s), end);
        }
    }
    t
}
