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
