#!/usr/bin/env bash
# Proof on real hardware for crates/gpu: builds `gpu-probe` (release) and runs it.
#
# It prints, as JSON lines: whether NVML loaded, every visible device (UUID, name, memory, MIG,
# GPM support, driver), N samples with the time each NVML call took, the window attributes over
# the run, and a summary (per device: ticks with a real reading, lost ticks, GPM readings, GPM
# errors; the verdict). A tick counts only when a device gave a real reading, not merely a
# sample that was not lost.
#
# Exit status: 0 = every device gave readings, or NVML is not available here and no GPU was
# expected (it says "not-applicable": nothing was proven); 1 = NVML loaded but a device gave no
# reading, or no GPU was found although one was expected; 2 = bad arguments.
# A GPU is expected with --expect-gpu, and whenever `nvidia-smi -L` lists one.
#
# Usage: scripts/gpu-check.sh [--samples N] [--interval-ms MS] [--library PATH] [--expect-gpu]
# Respects CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES like the sampler does.
set -euo pipefail
cd "$(dirname "$0")/.."

args=("$@")
if command -v nvidia-smi >/dev/null 2>&1; then
    echo "# nvidia-smi:" >&2
    nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total,power.draw \
        --format=csv,noheader >&2 || true
    if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        echo "# nvidia-smi lists a GPU: expecting one" >&2
        args+=(--expect-gpu)
    fi
else
    echo "# nvidia-smi not found" >&2
fi

cargo build --release -p infertrace-gpu --bin gpu-probe >&2
target_dir="${CARGO_TARGET_DIR:-target}"
exec "$target_dir/release/gpu-probe" "${args[@]}"
