"""PyTorch's matmul on the same GPU, as the yardstick for gcompile's cuBLASLt GEMM.

Prints one line per (dtype, size): median milliseconds over event-timed
repetitions and TFLOP/s (2·M·N·K / time). Inputs are random (never zeros)
and rotated among several sets so repeated runs do not measure the cache.
"""
import argparse
import json
import statistics

import torch


def bench(m, n, k, dtype, reps, sets):
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = [torch.randn(m, k, device="cuda", dtype=dtype, generator=gen) for _ in range(sets)]
    b = [torch.randn(k, n, device="cuda", dtype=dtype, generator=gen) for _ in range(sets)]
    c = torch.empty(m, n, device="cuda", dtype=dtype)
    # correctness against an fp64 product of the same (rounded) inputs
    ref = a[0].double() @ b[0].double()
    torch.matmul(a[0], b[0], out=c)
    rel = ((c.double() - ref).norm() / ref.norm()).item()
    for i in range(5):
        torch.matmul(a[i % sets], b[i % sets], out=c)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(a[i % sets], b[i % sets], out=c)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    ms = statistics.median(times)
    return {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "median_ms": ms,
            "tflops": 2 * m * n * k / (ms * 1e-3) / 1e12, "rel_err_vs_fp64": rel,
            "spread_ms": [min(times), max(times)]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="8192")
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--sets", type=int, default=3)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "cuda", torch.version.cuda)
    for size in args.sizes.split(","):
        n = int(size)
        for dt in args.dtypes.split(","):
            print("torch_gemm", json.dumps(bench(n, n, n, getattr(torch, dt), args.reps, args.sets)))


if __name__ == "__main__":
    main()
