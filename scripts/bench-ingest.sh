#!/usr/bin/env bash
# Ingest benchmark, receiver pinned to one core, blaster on the other: the prost "null
# receiver" (decode and drop, the collector's HTTP/2 windows) against the full infertrace
# collector at its DEFAULT configuration (decode, assemble, dialects, KPIs, critical path,
# Prometheus), over OTLP/gRPC and OTLP/HTTP protobuf, with fresh trace ids in every send, whole
# traces per request and (cold runs) the spans of 64 traces interleaved. Cold runs also measure
# infertrace's receive path alone (`lean`: the collector's own receivers and decoder with an
# ingest that only counts): the ceiling of what the full pipeline can reach, since it does all
# of that and then the analysis. For the collector only
# spans that were fully analysed count (accepted minus anything dropped later), its time and CPU
# run until its assembler is empty (the 2 s grace included), so a pipeline that only buffers
# cannot look fast; each run also prints the spans dropped after an OK (must be 0), the traces
# closed early to make room and the requests refused (429 / UNAVAILABLE, which the blaster
# counts as errors and does not retry).
# Then the same in a steady state: the blaster runs on while the first `warm` seconds pass (the
# collector grows to its working size: a grace period of traces held, and the index of recently
# completed ids, which grows until it holds two generations of `max_traces_in_flight`
# completions — 10M ids here, reached after ~25 s at full rate; a window that starts earlier
# counts the index's last doublings), and spans done and CPU are counted over the next `window`
# seconds only. Also: memory per buffered span and KPI freshness. Prints the runs, the cold runs'
# means against the null receiver and the steady runs; see
# docs/PERFORMANCE.md.
#
#   scripts/bench-ingest.sh [seconds per run, default 8] [rounds, default 3]
#                           [steady warm-up seconds, default 40] [steady window seconds, default 10]
#
# gRPC requests carry no Content-Length, as tonic's and grpc-go's exporters send them;
# GRPC_CONTENT_LENGTH=1 makes the blaster declare it (the figures of docs/PERFORMANCE.md before
# 2026-12-06).
#
# WORKLOAD=pd sends disaggregated traces instead (`otlp-blast --pd`: 17 spans across a router,
# a prefill and a decode worker, as `infertrace demo --scenario pd` emits them); spans done
# then count 17 per recorded request.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
rounds=${2:-3}
warm=${3:-40}
window=${4:-10}
workload=${WORKLOAD:-plain}
case ${GRPC_CONTENT_LENGTH:-0} in
  0) blast_extra="" ;;
  1) blast_extra="--grpc-content-length" ;;
  *) echo "GRPC_CONTENT_LENGTH must be 0 or 1, not $GRPC_CONTENT_LENGTH" >&2; exit 2 ;;
esac
case $workload in
  plain) per_trace=4 blast_workload="" ;;
  pd) per_trace=17 blast_workload="--pd" ;;
  *) echo "WORKLOAD must be plain or pd, not $workload" >&2; exit 2 ;;
esac
cargo build --release -q -p infertrace-collector --bins
cargo build --release -q -p infertrace
B=target/release
# This script and what it starts (curl, the samplers) share core 0 with the blaster: only the
# receiver runs on core 1.
taskset -cp 0 $$ >/dev/null
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

start_receiver() { # kind -> pid
  case $1 in
    null) taskset -c 1 $B/otlp-null-receiver --decoder prost --grpc 127.0.0.1:24317 --http 127.0.0.1:24318 >/dev/null 2>&1 & ;;
    lean) taskset -c 1 $B/otlp-null-receiver --decoder lean --grpc 127.0.0.1:24317 --http 127.0.0.1:24318 >/dev/null 2>&1 & ;;
    full) cat > "$tmp/c.yaml" <<YAML
receivers:
  otlp_grpc: { endpoint: 127.0.0.1:24317 }
  otlp_http: { endpoint: 127.0.0.1:24318 }
api: { listen: 127.0.0.1:29464 }
YAML
      taskset -c 1 $B/infertrace collect --data-dir "$tmp/data" --config "$tmp/c.yaml" >/dev/null 2>&1 & ;;
  esac
  echo $!
}

# Stops a receiver and waits until it is gone (a collector flushes its traces in flight first).
stop() { kill -INT "$1" 2>/dev/null || true; while kill -0 "$1" 2>/dev/null; do sleep 0.1; done; }

wait_port() { for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

# Starts receiver `kind` for protocol `proto` and waits until it listens; sets `pid` and `port`
# (the port the blaster sends to).
launch() { # kind proto [order]
  pid=$(start_receiver "$1")
  wait_port 24317; wait_port 24318
  port=24317; [ "$2" = http ] && port=24318
  blast="taskset -c 0 $B/otlp-blast --protocol $2 --addr 127.0.0.1:$port --connections 16 $blast_workload $blast_extra"
  [ "${3:-whole}" = interleaved ] && blast="$blast --interleave"
  return 0
}

# Sum of the samples of one counter family in an exposition.
total() { awk -v f="$1" 'index($0, f"{") == 1 || index($0, f" ") == 1 {s+=$NF} END{printf "%d", s}'; }

declare -A per_cpu # "kind proto order" -> spans per CPU-second of each round
printf '%-6s %-5s %-11s %-7s %12s %12s %10s %16s %12s %12s %10s\n' kind proto order round "spans done" "spans/s" "CPU s" "spans/CPU-s" "dropped" "closed early" "refused"
for round in $(seq "$rounds"); do
 for order in whole interleaved; do
  for kind in null lean full; do
    for proto in grpc http; do
      launch $kind $proto $order
      t0=$(cpu_ticks "$pid"); w0=$(date +%s.%N)
      out=$($blast --duration "$secs" 2>&1)
      accepted=$(echo "$out" | grep -oE 'accepted_spans=[0-9]+' | tail -1 | cut -d= -f2 || echo 0)
      processed=$accepted
      if [ $kind = full ]; then
        # Count only what was analysed: wait until every trace left the assembler, then take the
        # spans of the requests recorded in the KPIs ($per_trace per trace) and all the CPU it took.
        for _ in $(seq 600); do
          m=$(curl -s 127.0.0.1:29464/metrics)
          [ "$(echo "$m" | awk '/^infertrace_traces_in_flight /{print $2}')" = "0" ] && break
          sleep 0.1
        done
        processed=$(( $(echo "$m" | total infertrace_requests_total) * per_trace ))
        # Dropped after an OK: the reasons that can only strike an accepted span.
        after_ok=$(echo "$m" | awk '/^infertrace_dropped_spans_total\{reason="(max_spans_per_trace|max_traces_in_flight|late_span_buffer_full|forward_queue_full|forward_no_body)"/{s+=$NF} END{printf "%d", s}')
        refused_req=$(echo "$m" | total infertrace_requests_refused_total)
        early=$(echo "$m" | total infertrace_traces_closed_early_total)
      else
        after_ok=- refused_req=- early=-
      fi
      t1=$(cpu_ticks "$pid"); w1=$(date +%s.%N)
      rate=$(awk -v p="$processed" -v a="$w0" -v b="$w1" 'BEGIN{printf "%.0f", p/(b-a)}')
      cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz}')
      per=$(awk -v r="$processed" -v c="$cpu" 'BEGIN{ if (c>0) printf "%.0f", r/c; else print "-" }')
      printf '%-6s %-5s %-11s %-7s %12s %12s %10s %16s %12s %12s %10s\n' $kind $proto $order "$round" "$processed" "$rate" "$cpu" "$per" "$after_ok" "$early" "$refused_req"
      per_cpu["$kind $proto $order"]+="$per "
      stop "$pid"
    done
  done
 done
done

# Each cold figure against the null receiver's, from the means over the rounds.
mean() { echo "$1" | awk '{s=0; n=0; for (i=1; i<=NF; i++) if ($i != "-") {s+=$i; n++}} END{if (n) printf "%.0f", s/n; else print 0}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b>0) printf "%.2fx", a/b; else print "-" }'; }
echo
echo "cold runs, mean spans per CPU-second against the null receiver's (target: full ≥ 1.5×;"
echo "lean, the receive path alone, is the ceiling the full pipeline stays under)"
printf '%-5s %-11s %12s %12s %8s %12s %8s\n' proto order null lean "lean/null" full "full/null"
for order in whole interleaved; do
  for proto in grpc http; do
    n=$(mean "${per_cpu["null $proto $order"]-}")
    l=$(mean "${per_cpu["lean $proto $order"]-}")
    f=$(mean "${per_cpu["full $proto $order"]-}")
    printf '%-5s %-11s %12s %12s %8s %12s %8s\n' $proto $order "$n" "$l" "$(ratio "$l" "$n")" "$f" "$(ratio "$f" "$n")"
  done
done

# Steady state. A sample is "CPU ticks, spans done" at one moment: for the collector, the spans
# of the requests recorded in its KPIs ($per_trace per trace) from /metrics; for the null receiver, the
# spans it decoded, from its GET /spans. Either is one curl, on the blaster's core.
sample() { # kind pid
  local t; t=$(cpu_ticks "$2")
  if [ "$1" = full ]; then
    local m; m=$(curl -s 127.0.0.1:29464/metrics)
    echo "$t $(( $(echo "$m" | total infertrace_requests_total) * per_trace )) $(echo "$m" | total infertrace_requests_refused_total)"
  else
    echo "$t $(curl -s 127.0.0.1:24318/spans) -"
  fi
}
echo
echo "steady state: ${warm} s of load first, then ${window} s counted"
printf '%-6s %-5s %-7s %12s %10s %16s %10s\n' kind proto round "spans done" "CPU s" "spans/CPU-s" "refused"
for round in $(seq "$rounds"); do
  for kind in null full; do
    for proto in grpc http; do
      launch $kind $proto
      $blast --duration $((warm + window + 3)) >"$tmp/steady-blast.log" 2>&1 &
      blaster=$!
      sleep "$warm"
      read -r t0 c0 r0 <<< "$(sample $kind "$pid")"
      sleep "$window"
      read -r t1 c1 r1 <<< "$(sample $kind "$pid")"
      wait "$blaster" || echo "  (the blaster stopped early: $(tail -1 "$tmp/steady-blast.log"))" >&2
      cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz}')
      per=$(awk -v r="$((c1 - c0))" -v c="$cpu" 'BEGIN{ if (c>0) printf "%.0f", r/c; else print "-" }')
      refused=-; [ "$r0" != - ] && refused=$((r1 - r0))
      printf '%-6s %-5s %-7s %12s %10s %16s %10s\n' $kind $proto "$round" "$((c1 - c0))" "$cpu" "$per" "$refused"
      stop "$pid"
    done
  done
done
echo

# Memory per buffered span: a long grace keeps every trace in flight; RSS growth / spans held.
cat > "$tmp/m.yaml" <<YAML
receivers:
  otlp_grpc: { endpoint: 127.0.0.1:24317 }
  otlp_http: { endpoint: 127.0.0.1:24318 }
api: { listen: 127.0.0.1:29464 }
assembly: { grace: 10m, idle_timeout: 10m, max_age: 20m }
limits: { memory_limit_bytes: 8589934592, max_traces_in_flight: 10000000 }
YAML
taskset -c 1 $B/infertrace collect --config "$tmp/m.yaml" >/dev/null 2>&1 &
pid=$!
wait_port 24318
rss0=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")
taskset -c 0 $B/otlp-blast --protocol http --addr 127.0.0.1:24318 --connections 4 --duration 3 $blast_workload >/dev/null 2>&1
sleep 1
rss1=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")
inflight=$(curl -s 127.0.0.1:29464/metrics | awk '/^infertrace_traces_in_flight /{print $2}')
spans=$(awk -v t="$inflight" -v n="$per_trace" 'BEGIN{print t*n}')
echo "memory: RSS +$(( (rss1-rss0)/1024 )) MiB for ${inflight} traces in flight (${spans} spans): $(awk -v a="$rss0" -v b="$rss1" -v s="$spans" 'BEGIN{ if (s>0) printf "%.0f", (b-a)*1024/s; else print "-" }') bytes per buffered span"
stop "$pid"

# KPI freshness: one trace sent to an idle collector; time until /api/kpis counts it.
taskset -c 1 $B/infertrace collect --config "$tmp/c.yaml" >/dev/null 2>&1 &
pid=$!
wait_port 24318; wait_port 29464
now=$(date +%s%N)
body=$(cat <<JSON
{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"fresh"}}]},"scopeSpans":[{"spans":[{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203331","name":"chat m","kind":2,"startTimeUnixNano":"$((now-50000000))","endTimeUnixNano":"$now","attributes":[{"key":"infer.outcome","value":{"stringValue":"ok"}},{"key":"gen_ai.request.model","value":{"stringValue":"m"}}]}]}]}]}
JSON
)
t0=$(date +%s%N)
curl -s -o /dev/null -H 'content-type: application/json' --data "$body" 127.0.0.1:24318/v1/traces
until curl -s '127.0.0.1:29464/api/kpis?window=1m' | grep -q '"service":"fresh"'; do sleep 0.02; done
t1=$(date +%s%N)
echo "freshness: request visible in /api/kpis $(( (t1-t0)/1000000 )) ms after it was sent (grace 2 s + tick)"
stop "$pid"
