#!/usr/bin/env bash
# A/B of the collector at its default configuration, in a steady state: for each round, each
# variant in turn runs the collector pinned to core 1 while `otlp-blast` (16 connections, fresh
# trace ids; gRPC without a Content-Length unless a variant's blast flags add
# `--grpc-content-length`) loads it from core 0; after `warm` seconds, the spans analysed (recorded requests ×
# spans per request) and the collector's CPU are counted for `window` seconds. Prints CPU ns per
# analysed span per variant and round: variants alternate, so machine drift hits them alike.
#
#   scripts/bench-ingest-ab.sh PROTO ROUNDS WARM WINDOW 'label|collector binary|blast flags|spans per request[|config]' ...
#
# The optional fifth field is YAML appended to the collector's config for that variant (one
# line, e.g. `limits: { max_traces_in_flight: 5000000 }`); without it the defaults.
#
# e.g. this commit against another build, HTTP whole traces:
#   scripts/bench-ingest-ab.sh http 3 15 8 'old|/tmp/old/infertrace||4' 'new|target/release/infertrace||4'
# plain against disaggregated traces (docs/PERFORMANCE.md):
#   scripts/bench-ingest-ab.sh grpc 3 15 8 'plain|target/release/infertrace||4' 'pd|target/release/infertrace|--pd|17'
# the defaults against raised limits:
#   scripts/bench-ingest-ab.sh http 3 15 8 'default|target/release/infertrace||4' \
#     'raised|target/release/infertrace||4|limits: { memory_limit_bytes: 8589934592, max_traces_in_flight: 5000000 }'
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 5 ]; then sed -n '2,20p' "$0" >&2; exit 2; fi
proto=$1 rounds=$2 warm=$3 window=$4
shift 4
cargo build --release -q -p infertrace-collector --bin otlp-blast
blast=target/release/otlp-blast
taskset -cp 0 $$ >/dev/null
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
cat > "$tmp/c.yaml" <<YAML
receivers:
  otlp_grpc: { endpoint: 127.0.0.1:24317 }
  otlp_http: { endpoint: 127.0.0.1:24318 }
api: { listen: 127.0.0.1:29464 }
YAML
case $proto in grpc) port=24317 ;; http) port=24318 ;; *) echo "PROTO must be grpc or http" >&2; exit 2 ;; esac
hz=$(getconf CLK_TCK)
# "CPU ticks, spans analysed" of collector `pid`, `per` spans per recorded request.
sample() {
  echo "$(awk '{print $14+$15}' "/proc/$1/stat") $(curl -s 127.0.0.1:29464/metrics |
    awk -v p="$2" '/^infertrace_requests_total\{/{s+=$2} END{printf "%d", s*p}')"
}
for round in $(seq "$rounds"); do
  for spec in "$@"; do
    IFS='|' read -r label bin flags per extra <<< "$spec"
    rm -rf "$tmp/data"
    { cat "$tmp/c.yaml"; printf '%s\n' "${extra:-}"; } > "$tmp/v.yaml"
    taskset -c 1 "$bin" collect --data-dir "$tmp/data" --config "$tmp/v.yaml" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/29464) 2>/dev/null && break; sleep 0.1; done
    # shellcheck disable=SC2086 # the flags are words
    taskset -c 0 $blast --protocol "$proto" --addr 127.0.0.1:$port --connections 16 \
      --duration $((warm + window + 2)) $flags >/dev/null 2>&1 &
    blaster=$!
    sleep "$warm"; read -r t0 c0 <<< "$(sample $pid "$per")"
    sleep "$window"; read -r t1 c1 <<< "$(sample $pid "$per")"
    wait "$blaster" || true
    kill -INT "$pid"; while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    awk -v l="$label" -v p="$proto" -v r="$round" -v c=$((c1 - c0)) -v t=$((t1 - t0)) -v hz="$hz" \
      'BEGIN { if (c > 0) printf "%-8s %-5s round %d: %8.0f spans/CPU-s  %6.0f ns/span\n", l, p, r, c/(t/hz), (t/hz)*1e9/c; else printf "%-8s %-5s round %d: nothing analysed\n", l, p, r }'
  done
done
