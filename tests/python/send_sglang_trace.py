#!/usr/bin/env python3
"""Emits SGLang request traces with the official OpenTelemetry Python SDK, the way SGLang's
tracing module (sglang/srt/tracing, REFERENCE.md §2) does: one TracerProvider per process
(service), 64-bit random trace ids (SGLang's own id generator), all spans INTERNAL with
explicit wall-clock timestamps —

  Bootstrap Room 0x…            (bootstrap_room; created by the router in PD mode)
  └─ "{role} Req {rid[:8]}"     (rid; one per role: the router's, prefill, decode)
     └─ "{label} [TP n] (host:… | pid:…)"   (thread_label, host_id, pid, tp_rank)
        └─ stage slices, nested when started inside another; a slice started with no open
           slice links to the previous slice of its thread, or to the slice the context was
           handed over from (router → servers, tokenizer → scheduler), which travels as a
           W3C carrier plus a span context, as SGLang propagates it.

Prints one JSON object: the trace id and ground truth (seconds, from the integer nanosecond
timestamps) of every request.

    send_sglang_trace.py --endpoint http://127.0.0.1:4317 --pd 4 --plain 3
"""

import argparse
import json
import random
import sys
import time

from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider, id_generator
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanContext, TraceFlags

MS = 1_000_000  # ns


class SglangIdGenerator(id_generator.IdGenerator):
    """SGLang's generator: 64-bit trace and span ids (avoids duplicates across TP processes)."""

    def __init__(self, seed):
        self.rng = random.Random(f"sglang-ids/{seed}")

    def generate_trace_id(self):
        return self.rng.getrandbits(64)

    def generate_span_id(self):
        return self.rng.getrandbits(64)


class Process:
    """One traced SGLang process (router, prefill server, decode server, unified server)."""

    def __init__(self, service, endpoint, seed):
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": service}),
            id_generator=SglangIdGenerator(seed),
        )
        self.provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True))
        )
        self.tracer = self.provider.get_tracer("sglang server")


class Thread:
    """A thread context of one request: its thread span and its slice stack."""

    def __init__(self, proc, req_ctx, label, pid, start, tp_rank=None, handed_over=None):
        self.tracer = proc.tracer
        name = f"{label}"
        if tp_rank is not None:
            name += f" [TP {tp_rank}] "
        name += f"(host:1a2b3c4d | pid:{pid})"
        self.span = self.tracer.start_span(name, start_time=start, context=req_ctx)
        if tp_rank is not None:
            self.span.set_attributes({"tp_rank": tp_rank})
        self.span.set_attributes({"host_id": "1a2b3c4d5e6f", "pid": pid, "thread_label": label})
        self.stack = []
        self.last = handed_over  # SpanContext the first slice links to

    def start(self, name, ts):
        parent = self.stack[-1] if self.stack else self.span
        span = self.tracer.start_span(name, start_time=ts, context=trace.set_span_in_context(parent))
        if not self.stack and self.last is not None:
            span.add_link(self.last)
        self.stack.append(span)

    def end(self, ts):
        span = self.stack.pop()
        span.end(end_time=ts)
        if not self.stack:
            self.last = span.get_span_context()

    def slice(self, name, start, end):
        self.start(name, start)
        self.end(end)

    def handover(self):
        """What SGLang propagates to the next process: the current or last slice."""
        return self.stack[0].get_span_context() if self.stack else self.last

    def finish(self, ts):
        self.span.end(end_time=ts)


def remote(ctx):
    """The span context as another process rebuilds it from SGLang's propagated dict."""
    return SpanContext(ctx.trace_id, ctx.span_id, is_remote=True, trace_flags=TraceFlags(1))


def carrier_of(span):
    carrier = {}
    propagate.inject(carrier, trace.set_span_in_context(span))
    return carrier


def req_span(proc, role, rid, start, room_ctx, extra=None):
    name = f"{role} Req {rid[:8]}"
    span = proc.tracer.start_span(name, start_time=start, context=room_ctx,
                                  attributes={"rid": rid, **(extra or {})})
    span.set_attributes({"rid": rid})
    return span


def scheduler_ranks(proc, req_ctx, pid, start, handed_over, rng):
    """TP ranks 0 and 1: rank 1 runs each stage `lag` later and `longer` longer."""
    lag, longer = rng.randint(100_000, 900_000), rng.randint(1 * MS, 3 * MS)
    ranks = []
    for rank in (0, 1):
        t = Thread(proc, req_ctx, "Scheduler", pid + rank, start, tp_rank=rank,
                   handed_over=handed_over)
        ranks.append((t, lag * rank, longer * rank))
    return ranks


def pd_request(procs, rng, arrival, i, newer=False):
    """A PD request. Older SGLang: the router (mini_lb) creates the bootstrap room span and
    hands it over. Newer SGLang (observability/trace.py): no room span; each server's role
    span is a root under the caller's W3C context (here an untraced gateway's) and carries
    `bootstrap_room`, and cache hits are `gen_ai.usage.cached_tokens`."""
    router, prefill, decode = procs
    ms = lambda lo, hi: rng.randint(int(lo * MS), int(hi * MS))  # noqa: E731
    room = rng.getrandbits(40)
    if newer:
        ids = random.Random(f"gateway/{room}")
        gateway = SpanContext(ids.getrandbits(64), ids.getrandbits(64), is_remote=True,
                              trace_flags=TraceFlags(1))
        carrier, prev = carrier_of(trace.NonRecordingSpan(gateway)), None
        t_launched = arrival
    else:
        # Router: creates the bootstrap room (continuing the client's context: none here).
        room_span = router.tracer.start_span(
            f"Bootstrap Room {hex(room)}", start_time=arrival,
            attributes={"bootstrap_room": str(hex(room))})
        room_ctx = trace.set_span_in_context(room_span)
        r_req = req_span(router, "", str(room), arrival, room_ctx)
        r_thread = Thread(router, trace.set_span_in_context(r_req), "router", 100 + i, arrival)
        t_launched = arrival + ms(1, 5)
        r_thread.start("mini_lb_launch", arrival)
        # The router hands the room context and its current slice to both servers.
        carrier, prev = carrier_of(room_span), remote(r_thread.handover())
        r_thread.end(t_launched)
        r_thread.start("wait_pd_finish", t_launched)
    room_attr = {"bootstrap_room": str(hex(room)), "module": "sglang::request"} if newer else {}

    rid = "%032x" % rng.getrandbits(128)
    out_tokens = rng.randint(8, 60)
    in_tokens = rng.randint(100, 4000)
    cached = rng.randint(0, in_tokens // 2)

    # Prefill server.
    remote_room = propagate.extract(carrier)
    p_start = t_launched + ms(0.2, 1.5)
    p_req = req_span(prefill, "prefill", rid, p_start, remote_room, room_attr)
    p_ctx = trace.set_span_in_context(p_req)
    tok = Thread(prefill, p_ctx, "Tokenizer", 200 + i, p_start, handed_over=prev)
    tokenized = p_start + ms(1, 3)
    tok.slice("tokenize", p_start, tokenized)
    tok_end = tokenized + ms(0.3, 1)
    tok.slice("dispatch", tokenized, tok_end)
    dispatched = remote(tok.handover())
    prepare, bootstrap, waiting = ms(0.2, 1), ms(5, 40), ms(1, 50)
    forward, transfer = ms(20, 150), ms(10, 60)
    s0 = tok_end
    marks = {}
    for th, lag, longer in scheduler_ranks(prefill, p_ctx, 201 + 10 * i, p_start, dispatched, rng):
        t = s0 + lag
        th.slice("prefill_prepare", t, t + prepare + longer); t += prepare
        th.slice("prefill_bootstrap", t, t + bootstrap + longer); t += bootstrap
        th.slice("prefill_waiting", t, t + waiting + longer); t += waiting
        th.start("prefill_forward", t)
        chunk = forward * 2 // 5
        th.slice("chunked_prefill", t, t + chunk)
        th.slice("chunked_prefill", t + chunk, t + forward + longer)
        th.end(t + forward + longer); t += forward
        th.slice("prefill_transfer_kv_cache", t, t + transfer + longer); t += transfer
        th.finish(t + longer + MS)
        if lag == 0:
            marks["transfer_end"] = t
    p_end = marks["transfer_end"] + 2 * MS
    tok.finish(p_end)
    p_req.end(end_time=p_end)

    # Decode server.
    d_start = t_launched + ms(0.2, 1.5)
    d_req = req_span(decode, "decode", rid, d_start, propagate.extract(carrier), room_attr)
    d_ctx = trace.set_span_in_context(d_req)
    dtok = Thread(decode, d_ctx, "Tokenizer", 300 + i, d_start, handed_over=prev)
    d_tokenized = d_start + ms(1, 3)
    dtok.slice("tokenize", d_start, d_tokenized)
    dtok_end = d_tokenized + ms(0.3, 1)
    dtok.slice("dispatch", d_tokenized, dtok_end)
    d_dispatched = remote(dtok.handover())
    d_prepare = ms(0.2, 1)
    d_bootstrap = ms(3, 30)
    poll = ms(0.5, 3)
    d_waiting, fake, step = ms(1, 20), ms(2, 10), ms(10, 30)
    truth_marks = {}
    for th, lag, longer in scheduler_ranks(decode, d_ctx, 301 + 10 * i, d_start, d_dispatched, rng):
        t = dtok_end + lag
        th.slice("decode_prepare", t, t + d_prepare + longer); t += d_prepare
        th.slice("decode_bootstrap", t, t + d_bootstrap + longer); t += d_bootstrap
        kv_arrived = max(t, marks["transfer_end"] + poll) + lag
        th.slice("decode_transferred", t, kv_arrived + longer); t = kv_arrived
        th.slice("decode_waiting", t, t + d_waiting + longer); t += d_waiting
        th.slice("fake_output", t, t + fake + longer); t += fake
        first = t
        for n in range(out_tokens - 1):
            end = t + step + (longer if n == out_tokens - 2 else 0)
            th.slice("decode_loop", t, end)
            t += step
        th.finish(t + longer + MS)
        if lag == 0:
            truth_marks.update(first=first, last=t, kv_arrived=kv_arrived)
    d_end = truth_marks["last"] + 2 * MS
    dtok.finish(d_end)
    # SGLang's API server passes these at the finish; its TTFT is the tokenizer's (later).
    d_req.set_attributes({
        "gen_ai.response.model": "llama-3.1-8b",
        "gen_ai.usage.prompt_tokens": in_tokens,
        "gen_ai.usage.completion_tokens": out_tokens,
        ("gen_ai.usage.cached_tokens" if newer else "gen_ai.usage.cache_read.input_tokens"): cached,
        "gen_ai.latency.time_to_first_token": (truth_marks["first"] - arrival + 3 * MS) / 1e9,
        "gen_ai.latency.e2e": (d_end - arrival) / 1e9,
    })
    d_req.end(end_time=d_end)

    if newer:
        # The request spans both servers' role spans; the decode side's stands for it.
        start, r_end, top, service = min(p_start, d_start), max(p_end, d_end), d_req, "sglang-decode"
    else:
        r_end = d_end + ms(0.5, 2)
        r_thread.end(r_end)
        r_thread.finish(r_end)
        r_req.end(end_time=r_end)
        room_span.end(end_time=r_end)
        start, top, service = arrival, room_span, "sglang-router"

    s = lambda ns: ns / 1e9  # noqa: E731
    decode_secs = s(truth_marks["last"] - truth_marks["first"])
    return {
        "mode": "pd-newer" if newer else "pd", "trace_id": "%032x" % top.get_span_context().trace_id,
        "room_span_id": "%016x" % top.get_span_context().span_id,
        "service": service, "e2e": s(r_end - start),
        "ttft": s(truth_marks["first"] - start), "queue": s(waiting), "prefill": s(forward),
        "decode": decode_secs, "tpot": decode_secs / (out_tokens - 1),
        "input_tokens": in_tokens, "output_tokens": out_tokens, "cache_read_input_tokens": cached,
        "disagg": {
            "routing": None if newer else s(t_launched - arrival), "bootstrap": s(bootstrap),
            "prefill_queue": s(waiting),
            "prefill": s(forward), "kv_transfer": s(transfer), "decode_bootstrap": s(d_bootstrap),
            "decode_wait": s(d_waiting), "first_token": s(fake), "decode": decode_secs,
            "prefill_worker": "sglang-prefill", "decode_worker": "sglang-decode",
        },
    }


def plain_request(proc, rng, arrival, i):
    ms = lambda lo, hi: rng.randint(int(lo * MS), int(hi * MS))  # noqa: E731
    room_span = proc.tracer.start_span(
        f"Bootstrap Room {hex(0)}", start_time=arrival, attributes={"bootstrap_room": str(hex(0))})
    room_ctx = trace.set_span_in_context(room_span)
    rid = "%032x" % rng.getrandbits(128)
    req = req_span(proc, "", rid, arrival, room_ctx)
    ctx = trace.set_span_in_context(req)
    tok = Thread(proc, ctx, "Tokenizer", 500 + i, arrival)
    tokenized = arrival + ms(1, 2)
    tok.slice("tokenize", arrival, tokenized)
    t0 = tokenized + ms(0.2, 1)
    tok.slice("dispatch", tokenized, t0)
    handed = remote(tok.handover())
    process, waiting, forward, step = ms(0.2, 1), ms(1, 80), ms(20, 120), ms(10, 30)
    out_tokens = rng.randint(4, 40)
    marks = {}
    for th, lag, longer in scheduler_ranks(proc, ctx, 501 + 10 * i, arrival, handed, rng):
        t = t0 + lag
        th.slice("request_process", t, t + process + longer); t += process
        th.slice("prefill_waiting", t, t + waiting + longer); t += waiting
        th.start("prefill_forward", t)
        th.slice("chunked_prefill", t, t + forward // 2)
        th.slice("chunked_prefill", t + forward // 2, t + forward + longer)
        th.end(t + forward + longer); t += forward
        first = t
        for n in range(out_tokens - 1):
            th.slice("decode_loop", t, t + step + (longer if n == out_tokens - 2 else 0))
            t += step
        th.finish(t + longer + MS)
        if lag == 0:
            marks.update(first=first, last=t)
    end = marks["last"] + 2 * MS
    tok.finish(end)
    req.set_attributes({"gen_ai.response.model": "qwen-2.5-7b",
                        "gen_ai.usage.prompt_tokens": 300, "gen_ai.usage.completion_tokens": out_tokens})
    req.end(end_time=end)
    room_span.end(end_time=end)
    s = lambda ns: ns / 1e9  # noqa: E731
    decode_secs = s(marks["last"] - marks["first"])
    return {
        "mode": "plain", "trace_id": "%032x" % room_span.get_span_context().trace_id,
        "room_span_id": "%016x" % room_span.get_span_context().span_id,
        "service": "sglang", "e2e": s(end - arrival), "ttft": s(marks["first"] - arrival),
        "queue": s(waiting), "prefill": s(forward), "decode": decode_secs,
        "tpot": decode_secs / (out_tokens - 1), "input_tokens": 300, "output_tokens": out_tokens,
        "preemptions": 0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoint", required=True, help="OTLP/gRPC endpoint")
    ap.add_argument("--pd", type=int, default=4, help="PD requests (router + prefill + decode)")
    ap.add_argument("--plain", type=int, default=3, help="unified requests")
    ap.add_argument("--pd-newer", type=int, default=0,
                    help="PD requests as newer SGLang traces them (no room span, no router)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--prefill-lead-ms", type=int, default=0,
                    help="wait between sending the prefill server's spans and the others'")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    pd_procs = [Process(name, args.endpoint, args.seed + k)
                for k, name in enumerate(["sglang-router", "sglang-prefill", "sglang-decode"])]
    unified = Process("sglang", args.endpoint, args.seed + 7)
    base = time.time_ns() - 20_000 * MS
    truth = [pd_request(pd_procs, rng, base + i * 1500 * MS, i) for i in range(args.pd)]
    truth += [plain_request(unified, rng, base + i * 700 * MS, i) for i in range(args.plain)]
    truth += [pd_request(pd_procs, rng, base + 500 * MS + i * 1500 * MS, 50 + i, newer=True)
              for i in range(args.pd_newer)]
    # The prefill server's spans first — in a real deployment they leave long before the
    # decode side's, which a long generation keeps busy — then the decode server's and the
    # router's (which ends last).
    ok = pd_procs[1].provider.force_flush(timeout_millis=15000)
    time.sleep(args.prefill_lead_ms / 1000)
    for p in [pd_procs[2], pd_procs[0], unified]:
        ok = p.provider.force_flush(timeout_millis=15000) and ok
    for p in pd_procs + [unified]:
        p.provider.shutdown()
    json.dump({"flushed": ok, "requests": truth}, sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
