"""The CUDA device bench_train_cuda_bench measures on, and its bf16 GEMM rate (issue 15).

Prints one JSON line: {"cuda": false} when torch sees no CUDA device; otherwise {"cuda": true,
"device_name", "total_memory_bytes", "torch"} and, with --gemm N > 0, "gemm": {"n", "iters",
"tflops" (median of --repeats timings), "tflops_all"}: C = A @ B with A, B [N, N] bfloat16 (torch
.matmul -> at::matmul -> cuBLAS, the library mixtrain links), 2 N^3 FLOPs each, timed with CUDA
events over --iters back-to-back products after 3 untimed ones. The GEMM rate is the measured
ceiling a dense bf16 training step could reach on this device; the datasheet peak is the other.

Usage: cuda_probe.py [--gemm N] [--iters K] [--repeats R]
"""

import argparse
import json
import statistics
import warnings

# torch warns at import when numpy is absent (our environment has none); nothing here uses it.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402


def gemm_tflops(n, iters, repeats):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):  # cuBLAS handle, heuristics, clocks
        torch.matmul(a, b, out=c)
    rates = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        rates.append(2 * n**3 * iters / seconds / 1e12)
    return {"n": n, "iters": iters, "tflops": statistics.median(rates), "tflops_all": rates}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemm", type=int, default=0, help="GEMM size N (0: no GEMM)")
    parser.add_argument("--iters", type=int, default=20, help="products per timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings (median taken)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"cuda": False, "torch": torch.__version__}), flush=True)
        return
    props = torch.cuda.get_device_properties(0)
    out = {"cuda": True, "device_name": props.name, "total_memory_bytes": props.total_memory,
           "torch": torch.__version__}
    if args.gemm > 0:
        out["gemm"] = gemm_tflops(args.gemm, args.iters, args.repeats)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
