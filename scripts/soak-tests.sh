#!/usr/bin/env bash
# Runs the workspace's tests N times in a row while another build keeps the machine busy, and
# fails if any run fails: the check that the tests hold on a loaded CI machine.
#
#   scripts/soak-tests.sh [RUNS] [LOAD]
#
# RUNS  how many times to run `cargo test --workspace` (default 10)
# LOAD  what keeps the CPUs busy meanwhile:
#       build (default)  a release build of the workspace into its own target directory,
#                        cleaned and restarted whenever it finishes
#       spin             one busy loop per core
#       none             nothing (a baseline)
# Prints one line per run (passed / failed, seconds) and the failing tests' names.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
load=${2:-build}
case "$load" in build | spin | none) ;; *)
  echo "LOAD must be build, spin or none (got $load)" >&2
  exit 2
  ;;
esac
export CI=${CI:-true}
log_dir=$(mktemp -d)
load_pid=""
stop_load() { [ -n "$load_pid" ] && kill -- -"$load_pid" 2>/dev/null || true; }
trap stop_load EXIT

echo "building the tests once (not timed)"
cargo test --workspace --no-run -q

case "$load" in
build)
  load_target=${SOAK_TARGET_DIR:-$log_dir/load-target}
  set -m
  (while true; do
    CARGO_TARGET_DIR=$load_target cargo build --workspace --release -q >/dev/null 2>&1 || true
    CARGO_TARGET_DIR=$load_target cargo clean -q >/dev/null 2>&1 || true
  done) &
  load_pid=$!
  set +m
  ;;
spin)
  set -m
  (for _ in $(seq "$(nproc)"); do while :; do :; done & done; wait) &
  load_pid=$!
  set +m
  ;;
esac

failed=0
for i in $(seq "$runs"); do
  start=$(date +%s)
  if cargo test --workspace -q >"$log_dir/run-$i.log" 2>&1; then
    echo "run $i/$runs: passed in $(($(date +%s) - start)) s (load: $load)"
  else
    failed=$((failed + 1))
    echo "run $i/$runs: FAILED in $(($(date +%s) - start)) s (load: $load); log $log_dir/run-$i.log"
    grep -E "^    [a-z_0-9:]+$|panicked at" "$log_dir/run-$i.log" | head -20 || true
  fi
done
echo "$((runs - failed)) of $runs runs passed"
[ "$failed" -eq 0 ]
