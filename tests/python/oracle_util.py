"""Shared helpers of the PyTorch-oracle tests (tests/python/*_oracle.py, run by CTest).

Python torch and safetensors come from the project's environment (scripts/setup.sh, pinned in
scripts/python-requirements.txt); CMake passes that interpreter (MIXTRAIN_PYTHON). A missing
package is a failure with a message saying what to do, never a skip.
"""

import argparse
import os
import subprocess
import sys
import tempfile


def require_packages():
    """Imports torch and safetensors.torch or exits 1 naming what is missing."""
    try:
        import torch  # noqa: F401
        import safetensors.torch  # noqa: F401
    except ImportError as error:
        sys.exit(
            f"FAIL: {sys.executable} cannot import {error.name!r} ({error}). These tests need "
            "the project's Python environment: run `make setup` (scripts/setup.sh), or configure "
            "with -DMIXTRAIN_PYTHON=<python with torch and safetensors of "
            "scripts/python-requirements.txt>."
        )


def parse_args(description):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--mixtrain", required=True, help="the built mixtrain binary")
    args = parser.parse_args()
    if not os.access(args.mixtrain, os.X_OK):
        sys.exit(f"FAIL: {args.mixtrain} is not an executable mixtrain binary")
    return args


class Checker:
    """Collects failed expectations, prints every one, exits 1 at the end if any failed."""

    def __init__(self):
        self.failures = []

    def expect(self, condition, message):
        if not condition:
            self.failures.append(message)
            print("FAIL:", message)
        return condition

    def finish(self):
        if self.failures:
            print(f"{len(self.failures)} expectation(s) failed")
            sys.exit(1)
        print("all expectations passed")


def start(description, one_thread=True):
    """An oracle's start: parses --mixtrain, checks the packages, runs torch on one thread
    (one_thread) and returns (args, Checker())."""
    args = parse_args(description)
    require_packages()
    if one_thread:
        import torch

        torch.set_num_threads(1)
    return args, Checker()


def run_mixtrain(binary, arguments, env=None):
    """Runs mixtrain; returns its combined output, raising with that output if it fails."""
    child_env = dict(os.environ, OMP_NUM_THREADS="1")
    if env:
        child_env.update(env)
    result = subprocess.run(
        [binary] + arguments, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=child_env, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"mixtrain {' '.join(arguments)} exited {result.returncode}:\n"
                           f"{result.stdout}")
    return result.stdout


def save_safetensors(tensors, path):
    """safetensors.torch.save_file without numpy: safetensors 0.8's save_file takes the tensors'
    memory through numpy (its [numpy] extra, not in our environment); serialize_file is the same
    writer given that memory directly."""
    from safetensors import TensorSpec, serialize_file

    tensors = {name: t.contiguous() for name, t in tensors.items()}  # alive until written
    specs = {name: TensorSpec(dtype=str(t.dtype).split(".")[-1], shape=list(t.shape),
                              data_ptr=t.data_ptr(), data_len=t.numel() * t.element_size())
             for name, t in tensors.items()}
    serialize_file(specs, path, metadata=None)


def optim_replay(binary, directory, config_yaml, params, grads, env=None):
    """Writes params/grads/config into `directory`, runs `mixtrain optim-replay`, returns the
    output file's tensors as Python's safetensors reads them."""
    from safetensors.torch import load_file

    paths = {name: os.path.join(directory, name)
             for name in ("c.yaml", "p.safetensors", "g.safetensors", "o.safetensors")}
    with open(paths["c.yaml"], "w") as f:
        f.write(config_yaml)
    save_safetensors(params, paths["p.safetensors"])
    save_safetensors(grads, paths["g.safetensors"])
    run_mixtrain(binary, ["optim-replay", "--config", paths["c.yaml"], "--params",
                          paths["p.safetensors"], "--grads", paths["g.safetensors"], "--out",
                          paths["o.safetensors"]], env=env)
    return load_file(paths["o.safetensors"])


# The end of an optim-replay config: bfloat16 model params, float32 gradient reduction, no
# gradient clipping (the replay's grads reach the optimizer as given).
REPLAY_MIXED_PRECISION = """fsdp_config:
  mix_precision:
    param_dtype: bfloat16
    reduce_dtype: float32
train:
  max_grad_norm: 0.0
"""

# The optim-replay output's key prefix of the fp32 main param of a 16-bit model param.
MAIN = "optimizer._mixed_precision_optimizer.fp32_from_fp16_params."


def replay_inputs(shapes, steps, seed):
    """Params {name: randn * 0.5 in its dtype} and grads {"step.k.name": randn * 10^u, u
    uniform in [-6, 2)} for shapes {name: (shape, dtype name)}, drawn from one seeded
    generator."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    params, grads = {}, {}
    for name, (shape, dtype) in shapes.items():
        params[name] = (torch.randn(shape, generator=gen) * 0.5).to(getattr(torch, dtype))
    for k in range(1, steps + 1):
        for name, (shape, _) in shapes.items():
            magnitude = 10 ** (torch.rand(shape, generator=gen) * 8 - 6)
            grads[f"step.{k}.{name}"] = torch.randn(shape, generator=gen) * magnitude
    return params, grads


def torch_replay(params, grads, steps, no_decay, make_optimizer):
    """What optim-replay does, in torch: fp32 masters of `params` in two groups, those whose
    name contains none of `no_decay` and the rest (weight_decay 0), stepped by
    make_optimizer(groups) on the grads of steps 1..steps. Returns (masters, optimizer, out),
    out holding the model params ("model.<name>": the master rounded to the param's dtype) and
    the fp32 main params of the 16-bit ones, under the replay output's key names."""
    import torch

    masters = {n: p.detach().float().clone() for n, p in params.items()}
    decay = [m for n, m in masters.items() if not any(s in n for s in no_decay)]
    rest = [m for n, m in masters.items() if any(s in n for s in no_decay)]
    opt = make_optimizer([{"params": decay}, {"params": rest, "weight_decay": 0.0}])
    for k in range(1, steps + 1):
        for n, m in masters.items():
            m.grad = grads[f"step.{k}.{n}"].clone()
        opt.step()
    out = {}
    for n, m in masters.items():
        out["model." + n] = m.to(params[n].dtype)
        if params[n].dtype != torch.float32:
            out[MAIN + n] = m
    return masters, opt, out


def temp_dir():
    return tempfile.TemporaryDirectory(prefix="mixtrain-pyoracle-")


def ordered_bits(t):
    """float32 / bfloat16 / float16 as integers ordered like the floats (int64), so that the
    difference of two is their distance in units in the last place (ulp)."""
    import torch

    int_dtype = {torch.float32: torch.int32, torch.bfloat16: torch.int16,
                 torch.float16: torch.int16}[t.dtype]
    bits = t.contiguous().view(int_dtype).to(torch.int64)
    sign_bit = 1 << (torch.iinfo(int_dtype).bits - 1)
    # Negative floats: the magnitude bits counted downwards from zero (-0.0 maps to 0 like +0.0).
    return torch.where(bits < 0, -(bits + sign_bit), bits)


def ulp_distance(a, b):
    """Elementwise |a - b| in ulps of their dtype (int64 tensor)."""
    return (ordered_bits(a) - ordered_bits(b)).abs()


# Newton-Schulz coefficient schedules as published (muon_oracle.py and package/optim_test.py check
# ours against them). legacy: Keller Jordan's triple (torch.optim.Muon's default); asym5 /
# quintic: the five triples docs/architecture.md lists; hybrid's tail: (2, -1.5, 0.5); Polar
# Express (Amsel et al., arXiv 2505.16932): the 8 triples of Algorithm 1 (l = 1e-3) before the
# safety factor, and with it (each but the last becomes p(x / 1.01); input norm times 1.01); the
# five-step set modded-nanogpt / nanochat / Dion ship (safety 1.02 folded into all but the last,
# input norm times 1.02).
NS_LEGACY = (3.4445, -4.7750, 2.0315)
NS_ASYM5 = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
            (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]
NS_HYBRID_TAIL = (2.0, -1.5, 0.5)
NS_POLAR_EXPRESS_8_PAPER = [(8.28721201814563, -23.595886519098837, 17.300387312530933),
                            (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
                            (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
                            (3.3184196573706015, -2.488488024314874, 0.51004894012372),
                            (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
                            (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
                            (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
                            (1.875, -1.25, 0.375)]
NS_POLAR_EXPRESS_8 = [(a / 1.01, b / 1.01 ** 3, c / 1.01 ** 5)
                      for a, b, c in NS_POLAR_EXPRESS_8_PAPER[:-1]] + NS_POLAR_EXPRESS_8_PAPER[-1:]
NS_POLAR_EXPRESS_5 = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
                      (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                      (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                      (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                      (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]


def run_gemms_as_torch():
    """Our bf16 GEMMs on the native path, torch's own, in this process and the binaries it runs.

    Bitwise parity with torch is a property of one GEMM path: torch's bf16 GEMMs run ATen's native
    kernel (oneDNN, or its generic loop on a CPU without bf16 arithmetic), so ours must too,
    whatever this machine's choice (core/cpu_gemm.h; docs/python.md). Call before the first step.
    The widened path's numerics are checked against a float64 bound in
    tests/unit/core/cpu_gemm_test.cpp.
    """
    os.environ["MIXTRAIN_CPU_GEMM"] = "native"
