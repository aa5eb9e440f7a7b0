#!/usr/bin/env bash
# Instructions per request of the layer and its best peer, counted by callgrind (deterministic:
# independent of the machine's load), per thread: the request thread (the main thread) and the
# whole process (every thread: export threads, the HTTP client's).
#
#   scripts/layer-callgrind.sh [VARIANT...]    (default: the five variants of the whole-cost table)
#
# Each variant runs twice, with N1 and N2 requests (LAYER_CALLGRIND_N1 / _N2, default 500 and
# 2500); the difference divided by N2 - N1 is the cost per request (set-up, warm-up and shutdown
# cancel out). Needs valgrind. Output files stay in $OUT (default a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
N1=${LAYER_CALLGRIND_N1:-500}
N2=${LAYER_CALLGRIND_N2:-2500}
OUT=${OUT:-$(mktemp -d)}
variants=("$@")
if [ ${#variants[@]} -eq 0 ]; then
    variants=(bare infertrace_handover otel_instrumentation_tower infertrace_otlp otel_instrumentation_tower_otlp)
fi
bin=$(cargo bench -p infertrace-tower --bench layer_callgrind --no-run 2>&1 \
    | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "layer_callgrind binary not found" >&2; exit 1; }

# Total instructions of the threads of one run: "main other" (main: thread 1).
totals() {
    python3 - "$1" <<'PY'
import glob, re, sys
main = other = 0
for f in glob.glob(sys.argv[1] + "-*"):
    thread = int(f.rsplit("-", 1)[1])
    ir = 0
    for line in open(f):
        m = re.match(r"(?:summary|totals): (\d+)", line)
        if m:
            ir = int(m.group(1))
    if thread == 1:
        main += ir
    else:
        other += ir
print(main, other)
PY
}

printf '| variant | request thread | other threads | process |\n|---|---:|---:|---:|\n'
for v in "${variants[@]}"; do
    for n in "$N1" "$N2"; do
        valgrind --tool=callgrind --separate-threads=yes \
            --callgrind-out-file="$OUT/callgrind.$v.$n" "$bin" "$v" "$n" 2>"$OUT/valgrind.$v.$n.log" \
            || { echo "$v: valgrind failed, see $OUT/valgrind.$v.$n.log" >&2; exit 1; }
    done
    read -r m1 o1 < <(totals "$OUT/callgrind.$v.$N1")
    read -r m2 o2 < <(totals "$OUT/callgrind.$v.$N2")
    python3 -c "
d = $N2 - $N1
m, o = ($m2 - $m1) / d, ($o2 - $o1) / d
print(f'| $v | {m:,.0f} | {o:,.0f} | {m + o:,.0f} |')"
done
echo "(instructions per request; callgrind output in $OUT)"
