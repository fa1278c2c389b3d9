"""mixtrain.checkpoint: the trainer's checkpoints (docs/checkpoint.md) from Python, so a run moves
between `mixtrain train` and a Python loop in either direction (docs/python.md).

    ckpt = mixtrain.checkpoint.load("runs/a/checkpoints", model)   # model weights in
    opt = ckpt.optimizer(model)     # the run's optimizers, groups and state, FP32MainParams
    ...                             # train in Python
    mixtrain.checkpoint.save("runs/a/checkpoints", step, model, opt, state=ckpt.state)

Names: the checkpoint's model keys are "model." + the parameter's name in `model` (a
transformers model's names are the trainer's: model.layers.0.self_attn.q_proj.weight, ...).
Reading checks the metadata's checksum and every chunk's; saving publishes the step directory
atomically and moves `latest`, as the trainer does.
"""

import json

import torch

from . import _C
from .optim import SGD, AdamW, FP32MainParams, Muon, _named_parameters

__all__ = ["Checkpoint", "read", "load", "save"]

MODEL_PREFIX = "model."
MAIN_PREFIX = _C.MAIN_PARAM_PREFIX  # the trainer's key of an fp32 main param
_OPTIMIZERS = {"adamw": AdamW, "muon": Muon, "sgd": SGD}


class Checkpoint:
    """One step directory, read whole: `step`, `directory` (the step directory), `tensors`
    ({key: tensor}, the global tensors), `state` (the non-tensor state, a dict)."""

    def __init__(self, directory, step, tensors, state):
        self.directory, self.step, self.tensors, self.state = directory, step, tensors, state

    def model_problems(self, model):
        """Every way `model` does not match the checkpoint's model tensors (missing or extra
        keys, other shapes), as strings; empty when load_model can apply."""
        problems = []
        named = _named_parameters(model)
        names = {MODEL_PREFIX + n for n, _ in named}
        for name, p in named:
            key = MODEL_PREFIX + name
            if key not in self.tensors:
                problems.append(f"{key}: not in the checkpoint")
            elif tuple(self.tensors[key].shape) != tuple(p.shape):
                problems.append(f"{key}: shape {tuple(self.tensors[key].shape)} in the "
                                f"checkpoint, {tuple(p.shape)} in the model")
        for key in self.tensors:
            if key.startswith(MODEL_PREFIX) and key not in names:
                problems.append(f"{key}: in the checkpoint, not a parameter of the model")
        return problems

    def load_model(self, model):
        """Copies every model tensor into `model`'s parameter of that name, converted to the
        parameter's dtype; a float32 parameter takes the checkpoint's fp32 main param where it
        has one (exact, as the trainer restores a float32 model). Checks everything first: a
        ValueError lists every problem and nothing is copied."""
        problems = self.model_problems(model)
        if problems:
            raise ValueError(f"{self.directory}: the model does not match the checkpoint:\n  - "
                             + "\n  - ".join(problems))
        with torch.no_grad():
            for name, p in _named_parameters(model):
                source = self.tensors[MODEL_PREFIX + name]
                main = self.tensors.get(MAIN_PREFIX + name)
                if p.dtype == torch.float32 and main is not None:
                    source = main
                p.copy_(source)

    def optimizer(self, model, **fp32_options):
        """The optimizers the saving run had (docs/checkpoint.md `optimizer.param_groups`: one
        mixtrain.optim optimizer per leaf, its groups' parameters by name, lr = base_lr and
        every hyper-parameter), wrapped in FP32MainParams (`fp32_options` are its keyword
        arguments), with the checkpoint's optimizer state, main params and loss scaler loaded.
        Load the model first (load() does). The saving run must have kept fp32 main params or
        had a float32 model: a 16-bit model's own optimizer state without main params has no
        Python form here (ValueError)."""
        saved = self.state.get("optimizer", {})
        if not saved.get("saved", False):
            raise ValueError(f"{self.directory}: holds no optimizer state "
                             "(checkpoint.save_optimizer was false)")
        named = dict(_named_parameters(model))
        if not saved.get("fp32_main_params", False) and any(
                p.dtype != torch.float32 for p in named.values()):
            raise ValueError(f"{self.directory}: saved without fp32 main params; only "
                             "FP32MainParams runs (or float32 models) continue in Python")
        leaves = []  # (kind, [group dicts], [the leaf's own hyper-parameter objects])
        for entry in saved["param_groups"]:
            kind = entry["optimizer"]
            if kind not in _OPTIMIZERS:
                raise ValueError(f"{self.directory}: unknown optimizer {kind!r}")
            if not leaves or leaves[-1][0] != kind:
                leaves.append((kind, [], []))
            missing = [n for n in entry["params"] if n not in named]
            if missing:
                raise ValueError(f"{self.directory}: {kind} group {entry['group']}: parameters "
                                 f"not in the model: {missing}")
            values = {k: v for k, v in entry.items()
                      if k not in ("optimizer", "group", "params", "base_lr")}
            group = {"params": [named[n] for n in entry["params"]], "lr": entry["base_lr"]}
            group.update(_OPTIMIZERS[kind]._torch_options(values))
            leaves[-1][1].append(group)
            leaves[-1][2].append(values)
        optimizers = [_OPTIMIZERS[kind](groups) for kind, groups, _ in leaves]
        # Every saved field into the leaves as saved, also those without a torch name (Muon's
        # communication_dtype): the group dicts above already say the same for the rest.
        for opt, (_, _, values) in zip(optimizers, leaves):
            for index, fields in enumerate(values):
                opt._leaf.set_hyperparameters(index, json.dumps(fields))
        wrapper = FP32MainParams(optimizers, model, **fp32_options)
        wrapper.load_state_dict({
            "tensors": {k: v for k, v in self.tensors.items() if k.startswith("optimizer.")},
            "loss_scaler": _scaler_tuple(self.state.get("loss_scaler"))})
        return wrapper


def _scaler_tuple(saved):
    if saved is None:
        return None
    return (saved["scale"], saved["growth_tracker"], saved["skipped_steps"])


def read(path):
    """The step directory `path` (or the one a checkpoint directory's `latest` names), whole."""
    directory, step, tensors, state = _C.read_checkpoint(str(path))
    return Checkpoint(directory, step, dict(tensors), json.loads(state))


def load(path, model=None):
    """read(path), then (with `model`) its weights into `model` (Checkpoint.load_model).
    The optimizer: Checkpoint.optimizer(model)."""
    checkpoint = read(path)
    if model is not None:
        checkpoint.load_model(model)
    return checkpoint


def _param_groups(optimizer):
    """The trainer's optimizer.param_groups for a FP32MainParams: per wrapped optimizer (leaf)
    and group, its kind, group index, parameter names, base lr (the scheduler's initial_lr
    when one set it, else the lr) and hyper-parameters under the leaf's names."""
    groups = []
    names = {id(optimizer.main_param(n)): n for n in optimizer._mp.names}
    for opt in optimizer.optimizers:
        for index, group in enumerate(opt.param_groups):
            entry = {"optimizer": opt._KIND, "group": index,
                     "params": [names[id(p)] for p in group["params"]],
                     "base_lr": float(group.get("initial_lr", group["lr"]))}
            entry.update(json.loads(opt._leaf.hyperparameters(index)))
            groups.append(entry)
    return groups


def save(checkpoint_dir, step, model, optimizer=None, *, state=None, keep_last=0):
    """Publishes <checkpoint_dir>/step-<step> (8 digits) in the trainer's format and points
    `latest` at it: `model.<name>` for every parameter, and with `optimizer` (a
    FP32MainParams) its state_dict tensors, param groups and loss scaler. `state`: the
    non-tensor state to carry (a Checkpoint's `state`, so that `mixtrain train` can resume:
    it needs the run's config, LR schedule and data position from there); train.step,
    optimizer and loss_scaler are written from the arguments, ranks[0] from torch's CPU
    generator. keep_last: keep the newest that many steps (0: all)."""
    if optimizer is not None and not isinstance(optimizer, FP32MainParams):
        raise TypeError("mixtrain.checkpoint.save: `optimizer` must be a FP32MainParams (it "
                        "names the parameters, as the checkpoint keys need)")
    tensors = [(MODEL_PREFIX + n, p.detach()) for n, p in _named_parameters(model)]
    out = {k: v for k, v in (state or {}).items() if k != "ranks"}
    out["train"] = {"step": int(step)}
    out.pop("loss_scaler", None)
    if optimizer is not None:
        saved = optimizer.state_dict()
        tensors += list(saved["tensors"].items())
        out["optimizer"] = {"saved": True, "fp32_main_params": True,
                            "param_groups": _param_groups(optimizer)}
        if saved["loss_scaler"] is not None:
            scale, tracker, skipped = saved["loss_scaler"]
            out["loss_scaler"] = {"scale": scale, "growth_tracker": tracker,
                                  "skipped_steps": skipped}
    else:
        out["optimizer"] = {"saved": False, "fp32_main_params": False, "param_groups": []}
    rank_state = {"rng_cpu": bytes(torch.get_rng_state().tolist()).hex()}
    _C.write_checkpoint(str(checkpoint_dir), int(step), tensors, json.dumps(out),
                        json.dumps(rank_state), int(keep_last))
