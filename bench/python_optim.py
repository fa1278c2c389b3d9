"""Per-step time of mixtrain.optim's optimizers against torch.optim's on the ~41M-parameter
Qwen2-MoE's parameters (bench/python_optim_bench.cpp runs this with kMedium41MConfig; figures:
bench/README.md), in one process, one run:

  AdamW over every parameter (float32): mixtrain.optim.AdamW (torch's single-tensor bits) and
    with fused=True (torch's fused bits) vs torch.optim.AdamW with fused=True, foreach=True and
    foreach=False (the target: ours fused=True >= 1.0x torch's fused);
  Muon over the matrices the yaml rule routes to it, each expert matrix a 2-D parameter (torch's
    Muon takes 2-D only): mixtrain.optim.Muon vs torch.optim.Muon, both at torch's defaults
    (bfloat16 Newton-Schulz, 5 steps); also ours on the model's own 3-D expert tensors (the
    target: >= 1.5x torch's Muon).

Each variant steps fresh copies of the same parameters with the same float32 gradients: 2
warm-up steps (state created), then --steps timed steps; the figure is the median. Per thread
count (--threads, torch.set_num_threads). The hardware bound beside each: AdamW reads param,
grad and both moments and writes param and both moments, 28 bytes per parameter, against this
machine's in-place bandwidth measured here (a 256 MiB float32 mul_); Muon's Newton-Schulz costs
5 x (4 m^2 n + 2 m^3) flops per m x n matrix (m <= n), against a 1024^3 bfloat16 matmul's rate
measured here (small matrices reach less of it).

--device cuda runs the same on the current CUDA device (parameters, gradients and the bound
measurements there, each step timed between two synchronizations; --threads does not apply);
without a CUDA device it prints "skipped: no CUDA device" and exits 0.

Usage: python_optim.py --config 41M.yaml [--steps N] [--threads 1,2] [--device cpu|cuda]
(PYTHONPATH: the built package and bench/twin, which the driver sets.)
"""

import argparse
import statistics
import sys
import time

import torch

import mixtrain.optim
import twin_config
import twin_model


def timed(fn, repeats, device):
    """Seconds of each of `repeats` calls of fn, synchronizing a CUDA device around each."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def median_step_seconds(make, params, grads, steps):
    """`make(params)` on fresh float32 copies; 2 warm-up steps, then the median of `steps`."""
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for c, g in zip(copies, grads):
        c.grad = g
    opt = make(copies)
    timed(opt.step, 2, copies[0].device)
    return statistics.median(timed(opt.step, steps, copies[0].device))


def in_place_bandwidth(device):
    """Bytes read + written per second by an in-place multiply of 256 MiB of float32: AdamW's
    kind of traffic (every array it writes it also reads; no write-allocate reads). A copy_
    into another array reaches about half of it on the CPU."""
    data = torch.rand(64 << 20, device=device)
    data.mul_(1.0)
    return 2 * data.numel() * 4 / min(timed(lambda: data.mul_(1.0), 5, device))


def bf16_gemm_rate(device):
    a = torch.randn(1024, 1024, device=device).bfloat16()
    a @ a
    return 2 * 1024 ** 3 / min(timed(lambda: a @ a, 5, device))


def newton_schulz_flops(matrices):
    total = 0
    for p in matrices:
        m, n = sorted(p.shape[-2:])
        total += 5 * (4 * m * m * n + 2 * m ** 3)
    return total


def report(what, results, theirs, ours, bound, target):
    """One table block: each variant's ms/step, theirs / it, bound / it; then the target."""
    for name, seconds in results.items():
        print(f"{name:36s} {seconds * 1e3:9.1f} {results[theirs] / seconds:8.2f}x "
              f"{bound / seconds:8.0%}")
    ratio = results[theirs] / results[ours]
    print(f"{what}: ours / {theirs} = {ratio:.2f}x (target >= {target}: "
          f"{'met' if ratio >= target else 'NOT met'})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0

    config = twin_config.load_config(args.config)
    torch.manual_seed(0)
    model = twin_model.Qwen2MoeForCausalLM(config)
    model.to(device)
    named = list(model.named_parameters())
    params = [p for _, p in named]
    routed = mixtrain.optim.muon_param_groups(model)
    muon_3d = routed.muon
    muon_2d = [m for p in muon_3d for m in (p.unbind(0) if p.dim() == 3 else [p])]
    gen = torch.Generator().manual_seed(1)

    def grads_of(ps):
        return [(torch.randn(p.shape, generator=gen) * 1e-3).to(device) for p in ps]

    grads_all, grads_2d, grads_3d = grads_of(params), grads_of(muon_2d), grads_of(muon_3d)
    count = sum(p.numel() for p in params)
    print(f"model: {count / 1e6:.1f}M parameters ({len(params)} tensors); Muon: "
          f"{sum(p.numel() for p in muon_3d) / 1e6:.1f}M in {len(muon_2d)} matrices "
          f"({len(muon_3d)} tensors with the experts 3-D)")

    adamw = {
        "mixtrain.optim.AdamW": lambda ps: mixtrain.optim.AdamW(ps, lr=1e-3),
        "mixtrain.optim.AdamW fused=True": lambda ps: mixtrain.optim.AdamW(ps, lr=1e-3,
                                                                          fused=True),
        "torch AdamW fused=True": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
        "torch AdamW foreach=True": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True),
        "torch AdamW foreach=False": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False),
    }
    muon = {
        "mixtrain.optim.Muon (2-D)": (lambda ps: mixtrain.optim.Muon(ps, lr=0.02), muon_2d,
                                      grads_2d),
        "mixtrain.optim.Muon (3-D experts)": (lambda ps: mixtrain.optim.Muon(ps, lr=0.02),
                                              muon_3d, grads_3d),
        "torch.optim.Muon (2-D)": (lambda ps: torch.optim.Muon(ps, lr=0.02), muon_2d, grads_2d),
    }
    settings = [int(t) for t in args.threads.split(",")] if device.type == "cpu" else [None]
    for threads in settings:
        if threads is not None:
            torch.set_num_threads(threads)
        bandwidth, gemm = in_place_bandwidth(device), bf16_gemm_rate(device)
        where = f"{threads} thread(s)" if threads is not None else torch.cuda.get_device_name()
        print(f"\n== {where}: in-place {bandwidth / 1e9:.1f} GB/s, bfloat16 1024^3 GEMM "
              f"{gemm / 1e9:.1f} GFLOP/s")
        print(f"{'optimizer':36s} {'ms/step':>9s} {'vs torch':>9s} {'of bound':>9s}")
        results = {name: median_step_seconds(make, params, grads_all, args.steps)
                   for name, make in adamw.items()}
        report("AdamW", results, "torch AdamW fused=True", "mixtrain.optim.AdamW fused=True",
               28 * count / bandwidth, 1.0)
        print(f"AdamW, single-tensor bits: ours / torch foreach=False = "
              f"{results['torch AdamW foreach=False'] / results['mixtrain.optim.AdamW']:.2f}x")
        results = {name: median_step_seconds(make, ps, gs, args.steps)
                   for name, (make, ps, gs) in muon.items()}
        report("Muon", results, "torch.optim.Muon (2-D)", "mixtrain.optim.Muon (2-D)",
               newton_schulz_flops(muon_2d) / gemm, 1.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
