"""Our SGD (through `mixtrain optim-replay`) against Python's torch.optim.SGD.

Both sides run the same single-tensor ATen op sequence (torch/optim/sgd.py, foreach=False: the
CPU default; optim/sgd.h), so everything is expected BITWISE equal: float32 params, the
bfloat16 model params (the fp32 main param rounded after each step), the fp32 main params and
momentum_buffer. torch keeps no step count for SGD; ours ("step", for checkpoints) must equal the
number of steps taken. Three option sets, 8 steps each, grads spanning 1e-6..1e2: Nesterov with
coupled weight decay; dampened heavy ball; plain SGD (momentum 0: no buffer on either side).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_util as util  # noqa: E402

STEPS = 8
LR = 3e-2
# name: (shape, dtype); "bias" and "norm" names get weight decay 0 (our YAML no-decay rule).
SHAPES = {
    "layer.w": ((37, 29), "float32"),
    "layer.bias": ((29,), "float32"),
    "mlp.w": ((64, 33), "bfloat16"),
    "norm.weight": ((45,), "bfloat16"),
}
NO_DECAY = ("bias", "norm", "ln_")
OPTION_SETS = {
    "nesterov": dict(momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True),
    "dampened": dict(momentum=0.8, dampening=0.25, weight_decay=0.1, nesterov=False),
    "plain": dict(momentum=0.0, dampening=0.0, weight_decay=0.05, nesterov=False),
}


def config(options):
    return f"""optimizer:
  _target_: SGD
  fp32_main_params: true
  sgd_config:
    sgd_lr: {LR}
    sgd_momentum: {options["momentum"]}
    sgd_dampening: {options["dampening"]}
    sgd_weight_decay: {options["weight_decay"]}
    sgd_nesterov: {str(options["nesterov"]).lower()}
""" + util.REPLAY_MIXED_PRECISION


def torch_reference(params, grads, options):
    """torch.optim.SGD on fp32 masters, under our output's key names."""
    import torch

    masters, opt, out = util.torch_replay(
        params, grads, STEPS, NO_DECAY,
        lambda groups: torch.optim.SGD(groups, lr=LR, foreach=False, **options))
    for n, m in masters.items():
        buffer = opt.state[m].get("momentum_buffer")
        if buffer is not None:
            out[f"optimizer.state.{n}.momentum_buffer"] = buffer
    return out


def compare(check, label, ours, ref):
    import torch

    steps = {k: v for k, v in ours.items() if k.endswith(".step")}
    for key, value in steps.items():
        check.expect(value.dtype == torch.int64 and int(value) == STEPS,
                     f"{label} {key}: {value}, expected {STEPS} (int64)")
    ours = {k: v for k, v in ours.items() if k not in steps}
    check.expect(len(steps) == len(SHAPES), f"{label}: {len(steps)} step entries")
    check.expect(sorted(ref) == sorted(ours),
                 f"{label}: keys differ: {sorted(set(ref) ^ set(ours))}")
    differing_keys = 0
    for key in sorted(set(ref) & set(ours)):
        a, b = ours[key], ref[key]
        if not check.expect(a.dtype == b.dtype and a.shape == b.shape,
                            f"{label} {key}: ours {a.dtype} {list(a.shape)}, torch {b.dtype} "
                            f"{list(b.shape)}"):
            continue
        dist = util.ulp_distance(a, b)
        differing = int((dist > 0).sum())
        differing_keys += differing > 0
        check.expect(differing == 0, f"{label} {key}: {differing} of {dist.numel()} elements "
                     f"differ (max {int(dist.max())} ulp); expected bitwise equality")
    print(f"{label}: {len(ref)} tensors compared, "
          + ("bitwise equal" if differing_keys == 0 else f"{differing_keys} differ"))


def main():
    args, check = util.start(__doc__.splitlines()[0])
    params, grads = util.replay_inputs(SHAPES, STEPS, seed=20261202)
    for label, options in OPTION_SETS.items():
        with util.temp_dir() as directory:
            ours = util.optim_replay(args.mixtrain, directory, config(options), params, grads)
        compare(check, label, ours, torch_reference(params, grads, options))
    check.finish()


if __name__ == "__main__":
    main()
