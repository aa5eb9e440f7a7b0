#!/usr/bin/env python3
"""Sends inference traces with known timings to an OTLP endpoint using the official
OpenTelemetry Python SDK — an independent client for infertrace's end-to-end tests.

Prints one JSON object on stdout: the ground truth of every request sent (seconds), so the Rust
test can compute the expected KPIs itself.

    send_traces.py --endpoint http://127.0.0.1:4317 --protocol grpc --dialect infertrace --count 40
"""

import argparse
import json
import random
import sys
import time

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode


def exporter_for(protocol, endpoint):
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # https:// endpoints use TLS, trusting OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE (and
        # presenting OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE / _CLIENT_KEY when set).
        return OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    ap.add_argument("--dialect", choices=["infertrace", "vllm", "tgi", "generic"], default="infertrace")
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--service", default="py-llm")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--error-every", type=int, default=0, help="every Nth request fails")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    provider = TracerProvider(resource=Resource.create({"service.name": args.service}))
    provider.add_span_processor(BatchSpanProcessor(exporter_for(args.protocol, args.endpoint)))
    tracer = provider.get_tracer("infertrace-e2e")

    # Requests in the recent past, so they fall inside the collector's windows.
    now = time.time_ns()
    base = now - 20 * 1_000_000_000
    truth = []
    for i in range(args.count):
        arrival = base + i * 250_000_000
        queue = rng.uniform(0.001, 0.200)
        prefill = rng.uniform(0.020, 0.300)
        out_tokens = rng.randint(8, 200)
        tpot = rng.uniform(0.010, 0.040)
        decode = tpot * (out_tokens - 1)
        in_tokens = rng.randint(50, 2000)
        failed = args.error_every > 0 and (i + 1) % args.error_every == 0
        t_sched = arrival + int(queue * 1e9)
        t_first = t_sched + int(prefill * 1e9)
        t_end = t_first + int(decode * 1e9)
        # Times are integer nanoseconds: the truth is computed from them exactly.
        q = (t_sched - arrival) / 1e9
        p = (t_first - t_sched) / 1e9
        d = (t_end - t_first) / 1e9
        truth.append({
            "queue": q, "prefill": p, "decode": d, "ttft": q + p, "e2e": (t_end - arrival) / 1e9,
            "tpot": d / (out_tokens - 1), "input_tokens": in_tokens, "output_tokens": out_tokens,
            "error": failed,
        })
        if args.dialect == "infertrace":
            name = f"chat {args.model}"
            attrs = {
                "gen_ai.operation.name": "chat", "gen_ai.request.model": args.model,
                "gen_ai.response.model": args.model, "gen_ai.usage.input_tokens": in_tokens,
                "gen_ai.usage.output_tokens": out_tokens, "infer.outcome": "error" if failed else "ok",
                "infer.phase.source": "engine", "http.request.method": "POST",
                "http.route": "/v1/chat/completions",
                "http.response.status_code": 500 if failed else 200,
            }
            root = tracer.start_span(name, kind=SpanKind.SERVER, start_time=arrival, attributes=attrs)
            ctx = trace.set_span_in_context(root)
            for pname, s, e in (("queue", arrival, t_sched), ("prefill", t_sched, t_first), ("decode", t_first, t_end)):
                child = tracer.start_span(pname, context=ctx, kind=SpanKind.INTERNAL, start_time=s,
                                          attributes={"infer.phase": pname})
                child.end(end_time=e)
            if failed:
                root.set_status(Status(StatusCode.ERROR))
                root.set_attribute("error.type", "engine_error")
            root.end(end_time=t_end)
        elif args.dialect == "vllm":
            attrs = {
                "gen_ai.response.model": args.model, "gen_ai.request.id": f"req-{i}",
                "gen_ai.usage.prompt_tokens": in_tokens, "gen_ai.usage.completion_tokens": out_tokens,
                "gen_ai.latency.time_in_queue": q, "gen_ai.latency.time_to_first_token": q + p,
                "gen_ai.latency.e2e": (t_end - arrival) / 1e9,
                "gen_ai.latency.time_in_model_prefill": p, "gen_ai.latency.time_in_model_decode": d,
                "gen_ai.latency.time_in_model_inference": p + d,
            }
            span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=arrival, attributes=attrs)
            if failed:
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=t_end)
        elif args.dialect == "tgi":
            def dur(sec):
                return f"{sec * 1e3:.3f}ms"
            attrs = {
                "total_time": dur((t_end - arrival) / 1e9), "validation_time": "0.000ms",
                "queue_time": dur(q), "inference_time": dur(p + d),
                "time_per_token": dur((p + d) / out_tokens),
            }
            span = tracer.start_span("generate", kind=SpanKind.SERVER, start_time=arrival, attributes=attrs)
            if failed:
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=t_end)
        else:
            span = tracer.start_span("POST /predict", kind=SpanKind.SERVER, start_time=arrival)
            if failed:
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=t_end)

    ok = provider.force_flush(timeout_millis=15000)
    provider.shutdown()
    json.dump({"flushed": ok, "requests": truth}, sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
