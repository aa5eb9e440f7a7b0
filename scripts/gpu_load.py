"""Keeps the GPU busy for N seconds with bf16 matrix products (2 s on, 1 s idle, so about two
thirds busy) for scripts/gpu-loop.sh: the NVML readings then move between idle and busy."""
import sys, time
import torch
secs = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + secs
n = 0
while time.time() < end:
    burst = time.time() + 2.0
    while time.time() < burst:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
        n += 20
    time.sleep(1.0)
print(f"gpu_load: {n} products of 8192^3 bf16 in {secs:.0f} s", flush=True)
