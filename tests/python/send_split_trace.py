#!/usr/bin/env python3
"""Sends inference traces whose phase spans reach the collector seconds after their request
span, as when a request's spans are exported by separate services (each through its own batch
processor): the request span is exported at once, its queue, prefill and decode spans `late`
seconds later (their timestamps are the request's, inside it; only their export is late).

Prints one JSON object on stdout: the trace ids sent (hex), in order.

    send_split_trace.py --endpoint http://127.0.0.1:4318 --late 4.0 --late 2.5
"""

import argparse
import json
import sys
import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, format_trace_id


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--late", type=float, action="append", required=True,
                    help="seconds between a trace's request span and its phase spans (one per trace)")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between traces")
    ap.add_argument("--model", default="llama-3.1-8b")
    args = ap.parse_args()

    provider = TracerProvider(resource=Resource.create({"service.name": "py-split"}))
    # Each span is exported as it ends: the script decides when each part reaches the collector.
    exporter = OTLPSpanExporter(endpoint=args.endpoint.rstrip("/") + "/v1/traces")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("infertrace-e2e")

    ids = []
    for late in args.late:
        arrival = time.time_ns() - 1_500_000_000
        t_sched, t_first, t_end = arrival + 50_000_000, arrival + 150_000_000, arrival + 1_000_000_000
        attrs = {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": args.model,
            "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 40,
            "infer.outcome": "ok",
        }
        root = tracer.start_span(f"chat {args.model}", kind=SpanKind.SERVER, start_time=arrival,
                                 attributes=attrs)
        ctx = trace.set_span_in_context(root)
        phases = [
            (tracer.start_span(name, context=ctx, kind=SpanKind.INTERNAL, start_time=s,
                               attributes={"infer.phase": name}), e)
            for name, s, e in (("queue", arrival, t_sched), ("prefill", t_sched, t_first),
                               ("decode", t_first, t_end))
        ]
        root.end(end_time=t_end)
        time.sleep(late)
        for span, e in phases:
            span.end(end_time=e)
        ids.append(format_trace_id(root.get_span_context().trace_id))
        time.sleep(args.gap)

    provider.shutdown()
    json.dump({"trace_ids": ids}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
