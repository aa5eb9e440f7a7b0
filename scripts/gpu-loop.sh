#!/usr/bin/env bash
# The NVML path on a GPU machine, end to end: gpu-probe idle and under a GPU load, then the whole
# loop (collector + axum-server with NVML counters + loadgen) while the GPU is busy; prints the
# report, the KPIs' GPU block, the gpu metrics, and whether a trace's spans carry gpu.* / host.*.
# The load (scripts/gpu_load.py: PyTorch bf16 matrix products, 2 s on, 1 s off) runs only where
# PyTorch sees a GPU; without it the readings are of an idle GPU.
#
#   scripts/gpu-loop.sh [output dir, default /tmp/infertrace-gpu-loop]
#
# BIN: where the release binaries are (default target/release, built here when cargo is found).
# Takes about 80 s. See docs/PERFORMANCE.md, "On hardware".
set -u
cd "$(dirname "$0")/.."
B=${BIN:-target/release}
if [ -z "${BIN:-}" ] && command -v cargo >/dev/null; then
  cargo build --release -q -p infertrace -p infertrace-examples -p infertrace-gpu || exit 1
fi
O=${1:-/tmp/infertrace-gpu-loop}; mkdir -p "$O"
exec > >(tee $O/log.txt) 2>&1
date -u; uname -a; ldd --version | head -1
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib:${LD_LIBRARY_PATH:-}
ldconfig -p | grep -i nvidia-ml; ls /usr/local/nvidia/lib64 2>/dev/null | grep -i nvidia-ml
nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total,power.draw,utilization.gpu --format=csv,noheader
HAVE_TORCH=0; python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null && HAVE_TORCH=1
echo "torch+cuda: $HAVE_TORCH"
load() { [ $HAVE_TORCH = 1 ] && python3 scripts/gpu_load.py "$1"; }

[ $HAVE_TORCH = 1 ] || echo "# no PyTorch with CUDA here: no GPU load, the readings are of an idle GPU"
echo "== 1. gpu-probe, idle: 20 samples at 100 ms"
$B/gpu-probe --samples 20 --interval-ms 100 --expect-gpu > $O/probe-idle.jsonl; echo "rc=$?"
head -3 $O/probe-idle.jsonl; tail -2 $O/probe-idle.jsonl

echo "== 2. gpu-probe under load: 60 samples at 100 ms"
load 14 & LP=$!
sleep 6
$B/gpu-probe --samples 60 --interval-ms 100 --expect-gpu > $O/probe-load.jsonl; echo "rc=$?"
tail -2 $O/probe-load.jsonl
wait $LP

echo "== 3. collector + axum-server (NVML) + loadgen, GPU busy"
$B/infertrace collect --no-store --listen 127.0.0.1:9464 > /tmp/collect.log 2>&1 & CP=$!
sleep 1
OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 OTEL_METRICS_EXPORTER=none \
  $B/axum-server --gpu --max-batch 16 > /tmp/server.log 2>&1 & SP=$!
load 40 & LP=$!
sleep 6
$B/loadgen --rate 8 --duration 25s 2>&1 | tail -15
kill -INT $SP; wait $SP
sleep 4
$B/infertrace report --url http://127.0.0.1:9464 > $O/report.txt 2>&1; echo "report rc=$?"
cat $O/report.txt
python3 - $O <<'PY'
import json, sys, urllib.request
o = sys.argv[1]
get = lambda p: urllib.request.urlopen("http://127.0.0.1:9464" + p, timeout=10).read()
k = json.loads(get("/api/kpis"))
open(o + "/kpis.json", "w").write(json.dumps(k, indent=1))
m = get("/metrics").decode()
g = [l for l in m.splitlines() if "gpu" in l and not l.startswith("#")]
open(o + "/metrics-gpu.txt", "w").write("\n".join(g))
print("\n".join(g[:40]))
print("kpis gpu block:", json.dumps(k["series"][0].get("gpu"), indent=1) if k["series"] else None)
lst = json.loads(get("/api/traces?limit=5"))
open(o + "/traces.json", "w").write(json.dumps(lst, indent=1))
items = lst.get("traces", lst) if isinstance(lst, dict) else lst
tid = items[0].get("trace_id") if items else None
if tid:
    t = json.loads(get("/api/traces/" + tid))
    open(o + "/trace.json", "w").write(json.dumps(t, indent=1))
    txt = json.dumps(t)
    print("trace", tid, "has gpu.* attributes:", '"gpu.' in txt, "host.*:", '"host.' in txt)
PY
ls $O
kill -INT $CP; wait $CP; echo "collector rc=$?"
wait $LP
tail -5 /tmp/server.log; tail -5 /tmp/collect.log
