#!/usr/bin/env bash
# Proof on real hardware for crates/gpu: builds `gpu-probe` (release) and runs it.
#
# It prints, as JSON lines: whether NVML loaded, every visible device (UUID, name, memory, MIG,
# GPM support, driver), N samples with the time each NVML call took, and the window attributes
# over the run. Exit status: 0 = samples arrived (or NVML is not available on this machine,
# which it says); 1 = NVML loaded but no sample arrived; 2 = bad arguments.
#
# Usage: scripts/gpu-check.sh [--samples N] [--interval-ms MS] [--library PATH]
# Respects CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES like the sampler does.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v nvidia-smi >/dev/null 2>&1; then
    echo "# nvidia-smi:" >&2
    nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total,power.draw \
        --format=csv,noheader >&2 || true
else
    echo "# nvidia-smi not found" >&2
fi

cargo build --release -p infertrace-gpu --bin gpu-probe >&2
target_dir="${CARGO_TARGET_DIR:-target}"
exec "$target_dir/release/gpu-probe" "$@"
