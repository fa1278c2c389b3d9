"""mixtrain.optim: mixtrain's C++ optimizers as torch.optim optimizers (docs/python.md).

AdamW, SGD and Muon are torch.optim.Optimizer subclasses whose step() runs the C++ leaf
optimizer of the same name on the parameters themselves (the same tensors: nothing is copied).
Each takes torch's arguments with torch's defaults and gives torch's results:
  AdamW == torch.optim.AdamW(foreach=False), SGD == torch.optim.SGD(foreach=False),
  Muon  == torch.optim.Muon (ema momentum, Keller Jordan's coefficients, bfloat16
           Newton-Schulz), bit for bit on the CPU (tests/python/package/).
Muon also takes the forms of mixtrain's config (keyword-only: momentum_style, ns_variant,
ns_dtype, NorMuon, cautious weight decay, per-head Newton-Schulz).

Param groups are read at every step: an lr or any other option set in `param_groups` (by an
LR scheduler or by hand) is what the next step uses. state_dict() / load_state_dict() use
torch's layout ("state" by parameter index, "step" a float32 tensor, "param_groups"), so the
state moves to and from torch's optimizer of the same name.

FP32MainParams wraps any of them (or a list, e.g. Muon + AdamW from muon_param_groups): fp32
main params behind bfloat16/float16 model params, main_grad accumulation, dynamic loss scaling
for float16, and the CLI trainer's checkpoint keys.
"""

import copy
import json
import math
from collections.abc import Mapping

import torch
from torch.optim import Optimizer

from . import _C

__all__ = ["AdamW", "SGD", "Muon", "FP32MainParams", "MuonParamGroups", "muon_param_groups"]

# torch.optim.Muon's defaults (torch/optim/_muon.py, from Keller Jordan's Muon).
MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


def _number(value):
    """lr and other options may be 1-element tensors in torch; the leaves take floats."""
    return float(value.item()) if isinstance(value, torch.Tensor) else value


def _refuse(cls_name, group, unsupported):
    """ValueError for a torch option this optimizer does not implement, set to anything but
    torch's default: {name: (default, why)}."""
    for name, (default, why) in unsupported.items():
        if group.get(name, default) != default:
            raise ValueError(f"mixtrain.optim.{cls_name}: {name}={group[name]!r} is not supported "
                             f"({why})")


class _StateView(Mapping):
    """optimizer.state: each parameter's live state, as torch keeps it ({param: {name: tensor}},
    "step" as a float32 0-dim tensor; the other tensors alias the leaf's state). Parameters
    without state are absent, and state[p] is {} for them, as with torch's defaultdict."""

    def __init__(self, optimizers):
        self._optimizers = optimizers
        self._owner = {}  # id(param) -> (optimizer, param), rebuilt when a lookup misses

    def _pairs(self):
        for opt in self._optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    yield opt, p

    def _find(self, param):
        entry = self._owner.get(id(param))
        if entry is None or entry[1] is not param:
            self._owner = {id(p): (opt, p) for opt, p in self._pairs()}
            entry = self._owner.get(id(param))
        return None if entry is None or entry[1] is not param else entry[0]

    def __getitem__(self, param):
        opt = self._find(param)
        return {} if opt is None else opt._torch_state(param)

    def __contains__(self, param):
        return bool(self[param])

    def __iter__(self):
        return (p for opt, p in self._pairs() if opt._state_list(p))

    def __len__(self):
        return sum(1 for _ in self)

    def items(self):
        """(param, state) of every parameter with state, in param group order."""
        for opt, p in self._pairs():
            state = opt._torch_state(p)
            if state:
                yield p, state


class _LeafOptimizer(Optimizer):
    """Base of AdamW, SGD and Muon: torch.optim.Optimizer over one C++ leaf (`_KIND`)."""

    _KIND = ""
    _COUNT_ONLY_STEP = True  # "step" is a count the update never reads (SGD, Muon)

    def __init__(self, params, defaults):
        self._leaf = None
        self._wrapped = None  # the FP32MainParams wrapping this optimizer
        super().__init__(params, defaults)
        self._leaf = self._new_leaf()
        self._synced = [None] * len(self.param_groups)
        self._sync()  # checks every group's options now, as torch's constructors do
        self.state = _StateView([self])

    # -- the leaf -----------------------------------------------------------------------------
    def _new_leaf(self):
        return _C.make_leaf(self._KIND, [list(g["params"]) for g in self.param_groups])

    def add_param_group(self, param_group):
        if self._wrapped is not None:
            raise RuntimeError(f"mixtrain.optim.{type(self).__name__}: add_param_group after "
                               "FP32MainParams wrapped this optimizer; add every group first")
        super().add_param_group(param_group)
        if self._leaf is None:  # called by Optimizer.__init__
            return
        # A new leaf over every group, holding the old one's state (copies).
        old, self._leaf = self._leaf, self._new_leaf()
        for group in self.param_groups[:-1]:
            for p in group["params"]:
                state = old.state(p)
                if state:
                    self._leaf.import_state(p, state)
        self._synced = [None] * len(self.param_groups)  # the new leaf has no options yet
        self._sync()

    def _hyperparameters(self, group):
        """The group's options under the leaf's names (its group_hyperparameters fields)."""
        raise NotImplementedError

    @staticmethod
    def _torch_options(values):
        """The reverse: a leaf's group_hyperparameters object as this class's group options
        (for groups read from a trainer checkpoint, mixtrain.checkpoint)."""
        raise NotImplementedError

    def _leaf_values(self, index, group):
        values = json.loads(self._leaf.hyperparameters(index))
        values.update(self._hyperparameters(group))
        return json.dumps(values)

    def _group_problem(self, index, group):
        """What the leaf would refuse in `group`'s options as group `index`, or None (changes
        nothing)."""
        try:
            self._leaf.check_hyperparameters(index, self._leaf_values(index, group))
        except ValueError as error:
            return str(error)
        return None

    def _sync(self):
        """Gives the leaf every group's lr and options as param_groups holds them now (the
        options only when they changed since the last step)."""
        for index, group in enumerate(self.param_groups):
            lr = _number(group["lr"])
            if not (isinstance(lr, (int, float)) and lr >= 0 and math.isfinite(lr)):
                raise ValueError(f"mixtrain.optim.{type(self).__name__}: param group {index}: "
                                 f"lr must be a finite number >= 0, got {group['lr']!r}")
            options = {k: v for k, v in group.items() if k not in ("params", "param_names", "lr")}
            synced = self._synced[index]
            if synced is None or options != synced[1]:
                try:
                    self._leaf.set_hyperparameters(index, self._leaf_values(index, group))
                except ValueError as error:
                    raise ValueError(f"mixtrain.optim.{type(self).__name__}: param group "
                                     f"{index}: {error}") from None
                synced = self._synced[index] = [None, copy.deepcopy(options)]
            if lr != synced[0]:
                self._leaf.set_lr(index, float(lr))
                synced[0] = lr

    def step(self, closure=None):
        """One step of every group (torch.optim's contract: the closure's loss, if given)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync()
        self._leaf.step()
        return loss

    # -- state in torch's layout ---------------------------------------------------------------
    def _state_list(self, param):
        """The leaf's (name, tensor) list for `param`; through the wrapper's swap when wrapped
        (state swapped out between steps is read back as copies)."""
        if self._wrapped is not None:
            return self._wrapped._mp.leaf_state(self._leaf, param)
        return self._leaf.state(param)

    def _torch_state(self, param):
        state = {}
        for name, value in self._state_list(param):
            state[name] = value.to(torch.float32) if name == "step" else value
        return state

    def _leaf_state(self, param, state):
        """A torch-layout state dict of one param as the leaf's (name, tensor) list."""
        if not state:
            return []
        entries = [(name, value if torch.is_tensor(value) else torch.tensor(value))
                   for name, value in state.items()]
        if self._COUNT_ONLY_STEP and "step" not in state:
            # torch.optim.SGD and Muon keep no step count; the leaf's is never used in the
            # update, so it restarts at 0.
            entries.append(("step", torch.tensor(0, dtype=torch.int64)))
        return entries

    def __setstate__(self, state):
        """Optimizer.load_state_dict's last act: checks the state of every parameter and the
        options of every group first, then replaces both; on any problem nothing changes."""
        if self.__dict__.get("_leaf") is None:
            raise TypeError(f"mixtrain.optim.{type(self).__name__} cannot be unpickled; use "
                            "state_dict() / load_state_dict()")
        groups = state["param_groups"]
        for group in groups:  # a torch optimizer's groups lack our options: the defaults
            for name, default in self.defaults.items():
                group.setdefault(name, default)
        problems, entries = [], []
        for key in state["state"]:
            if not torch.is_tensor(key):
                problems.append(f"state for parameter {key!r}, which no param group has")
        for index, group in enumerate(groups):
            problem = self._group_problem(index, group)
            if problem:
                problems.append(f"param group {index}: {problem}")
            for position, p in enumerate(group["params"]):
                values = self._leaf_state(p, state["state"].get(p, {}))
                for problem in self._leaf.state_problems(p, values):
                    problems.append(f"param group {index}, parameter {position}: {problem}")
                entries.append((p, values))
        if problems:
            raise ValueError(f"mixtrain.optim.{type(self).__name__}.load_state_dict: "
                             + "; ".join(problems))
        super().__setstate__({"state": {}, "param_groups": groups})
        for p, values in entries:
            self._leaf.import_state(p, values)
        self.state = _StateView([self])
        self._synced = [None] * len(groups)
        self._sync()

    def __getstate__(self):
        raise TypeError(f"mixtrain.optim.{type(self).__name__} cannot be pickled; use "
                        "state_dict()")


class AdamW(_LeafOptimizer):
    """torch.optim.AdamW with amsgrad off: the same arguments and defaults, and the same bits:
    those of torch's single-tensor AdamW (foreach=False, the CPU default) by default, those of
    torch's fused kernel with fused=True (a correctly rounded sqrt instead of ATen's MKL one;
    float32 parameters, e.g. FP32MainParams' main params). Either way one vectorized pass per
    parameter; `foreach` changes nothing. fused must be the same in every group. amsgrad,
    maximize, capturable, differentiable and decoupled_weight_decay=False are refused."""

    _KIND = "adamw"
    _COUNT_ONLY_STEP = False  # AdamW's bias correction reads "step": a state must carry it

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        differentiable=differentiable, fused=fused, decoupled_weight_decay=True)
        if fused and foreach:
            raise ValueError("mixtrain.optim.AdamW: `fused` and `foreach` cannot be True "
                             "together (as in torch)")
        super().__init__(params, defaults)

    def _new_leaf(self):
        self._fused = None  # the new leaf's form is set by the next _sync
        return super()._new_leaf()

    def _sync(self):
        super()._sync()
        forms = {bool(g.get("fused")) for g in self.param_groups}
        if len(forms) != 1:
            raise ValueError("mixtrain.optim.AdamW: `fused` must be the same in every param group")
        fused = forms.pop()
        if fused != self._fused:
            self._leaf.set_fused_form(fused)
            self._fused = fused

    def _hyperparameters(self, group):
        _refuse("AdamW", group, {
            "amsgrad": (False, "mixtrain's AdamW has no AMSGrad"),
            "maximize": (False, "minimizes only"),
            "capturable": (False, "steps are never CUDA-graph captured"),
            "differentiable": (False, "the step is not differentiable"),
            "decoupled_weight_decay": (True, "that is Adam, not AdamW"),
        })
        beta1, beta2 = (_number(b) for b in group["betas"])
        return {"betas": [beta1, beta2], "eps": _number(group["eps"]),
                "weight_decay": _number(group["weight_decay"]), "amsgrad": False}

    @staticmethod
    def _torch_options(values):
        return {"betas": tuple(values["betas"]), "eps": values["eps"],
                "weight_decay": values["weight_decay"]}


class SGD(_LeafOptimizer):
    """torch.optim.SGD (momentum, dampening, Nesterov, coupled weight decay): the same
    arguments and defaults, the same bits as foreach=False. maximize and differentiable are
    refused; `foreach` and `fused` change nothing."""

    _KIND = "sgd"

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 *, maximize=False, foreach=None, differentiable=False, fused=None):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach,
                        differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)

    def _hyperparameters(self, group):
        _refuse("SGD", group, {
            "maximize": (False, "minimizes only"),
            "differentiable": (False, "the step is not differentiable"),
        })
        return {"momentum": float(_number(group["momentum"])),
                "dampening": float(_number(group["dampening"])),
                "weight_decay": float(_number(group["weight_decay"])),
                "nesterov": bool(group["nesterov"])}

    @staticmethod
    def _torch_options(values):
        return {k: values[k] for k in ("momentum", "dampening", "weight_decay", "nesterov")}


class Muon(_LeafOptimizer):
    """torch.optim.Muon: the same arguments and defaults (lr 1e-3, weight decay 0.1, momentum
    0.95 in its ema form, Nesterov, Keller Jordan's coefficients for 5 steps, eps 1e-7,
    adjust_lr_fn None = "original") and, with them, the same bits. Parameters may have more
    than 2 dims: the last two are the matrix, the leading ones independent matrices (MoE
    experts). Same-shape matrices are orthogonalized in batched Newton-Schulz calls.

    Keyword-only, mixtrain's forms (docs/config.md, muon_*):
      momentum_style  "ema" (torch's), "sum" or "ema_add" (the seeds')
      ns_variant      None: ns_coefficients every step (a triple) or per step (ns_steps
                      triples); or a named schedule: "legacy", "asym5", "quintic", "hybrid",
                      "polar_express" (ns_coefficients then left at its default)
      ns_dtype        torch.bfloat16 (torch's) or torch.float32
      matched_adamw_rms  the 0.2 of adjust_lr_fn="match_rms_adamw"
      normuon, normuon_beta2, normuon_epsilon, cautious_weight_decay
    eps is the Newton-Schulz epsilon: X / (||X||_F + eps) where torch divides by
    max(||X||_F, eps); in bfloat16 both give the same bits for ||X||_F >= 2^-15.
    """

    _KIND = "muon"

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=MUON_COEFFICIENTS, eps=1e-7, ns_steps=5, adjust_lr_fn=None, *,
                 momentum_style="ema", ns_variant=None, ns_dtype=torch.bfloat16,
                 matched_adamw_rms=0.2, normuon=False, normuon_beta2=0.95,
                 normuon_epsilon=1e-10, cautious_weight_decay=False):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, momentum_style=momentum_style,
                        ns_variant=ns_variant, ns_dtype=ns_dtype,
                        matched_adamw_rms=matched_adamw_rms, normuon=normuon,
                        normuon_beta2=normuon_beta2, normuon_epsilon=normuon_epsilon,
                        cautious_weight_decay=cautious_weight_decay)
        super().__init__(params, defaults)

    def _hyperparameters(self, group):
        steps = group["ns_steps"]
        coefficients = group["ns_coefficients"]
        variant = group["ns_variant"]
        if variant in (None, "custom"):
            triples = [coefficients] if len(coefficients) == 3 and not isinstance(
                coefficients[0], (list, tuple)) else list(coefficients)
            if len(triples) == 1 and isinstance(steps, int):
                triples = triples * steps
            schedule = [[float(_number(x)) for x in triple] for triple in triples]
            variant = "custom"
        else:
            if tuple(coefficients) != MUON_COEFFICIENTS:
                raise ValueError(f"ns_variant={variant!r} names its own coefficients; leave "
                                 "ns_coefficients at its default or set ns_variant=None")
            schedule = []
        dtype = group["ns_dtype"]
        if isinstance(dtype, torch.dtype):
            if dtype not in _DTYPE_NAMES:
                raise ValueError(f"ns_dtype must be torch.bfloat16 or torch.float32, got {dtype}")
            dtype = _DTYPE_NAMES[dtype]
        fn = group["adjust_lr_fn"]
        if fn is None:
            fn = "original"
        return {"weight_decay": float(_number(group["weight_decay"])),
                "momentum": float(_number(group["momentum"])),
                "nesterov": bool(group["nesterov"]), "ns_steps": steps,
                "ns_variant": variant, "ns_coefficients": schedule,
                "ns_epsilon": float(group["eps"]), "ns_dtype": dtype,
                "matched_adamw_rms": float(group["matched_adamw_rms"]), "adjust_lr_fn": fn,
                "momentum_style": group["momentum_style"], "normuon": bool(group["normuon"]),
                "normuon_beta2": float(group["normuon_beta2"]),
                "normuon_epsilon": float(group["normuon_epsilon"]),
                "cautious_weight_decay": bool(group["cautious_weight_decay"])}

    @staticmethod
    def _torch_options(values):
        options = {k: values[k] for k in (
            "weight_decay", "momentum", "nesterov", "ns_steps", "matched_adamw_rms",
            "adjust_lr_fn", "momentum_style", "normuon", "normuon_beta2", "normuon_epsilon",
            "cautious_weight_decay")}
        options["eps"] = values["ns_epsilon"]
        options["ns_dtype"] = {v: k for k, v in _DTYPE_NAMES.items()}[values["ns_dtype"]]
        if values["ns_variant"] == "custom":
            triples = [tuple(t) for t in values["ns_coefficients"]]
            options["ns_variant"] = None
            options["ns_coefficients"] = triples[0] if len(set(triples)) == 1 else triples
        else:
            options["ns_variant"] = values["ns_variant"]
            options["ns_coefficients"] = MUON_COEFFICIENTS
        return options

    def set_head_split(self, param, head_dim, dim=0):
        """Newton-Schulz per attention head of `param` (a 2-D q/k/v/o weight): blocks of
        `head_dim` rows (dim=0: q, k, v) or columns (dim=1: o), as muon_per_head does."""
        self._leaf.set_head_split(param, dim, head_dim)


class MuonParamGroups:
    """muon_param_groups' answer: `muon` (the parameters Muon updates), `adamw` (AdamW's param
    groups: under the yaml rule biases and norms in a second group with weight_decay 0.0) and
    `routes` ((name, "muon" | "adamw" | "adamw_no_decay") per trainable parameter)."""

    def __init__(self, muon, adamw, routes):
        self.muon, self.adamw, self.routes = muon, adamw, routes


def _named_parameters(model):
    if isinstance(model, torch.nn.Module):
        return list(model.named_parameters())
    return list(model)


def muon_param_groups(model, rule="yaml", adamw_keywords=()):
    """Splits a model's trainable parameters between Muon and AdamW by the trainer's rule
    (docs/config.md, optimizer.routing): "yaml" (hyper-parallel: ndim >= 2 and the name has
    none of embed, lm_head, out_head, out_proj.bias) or "toml" (torchtitan-npu: 2-D not named
    embed/lm_head/output, and 3-D). Names containing an `adamw_keywords` entry go to AdamW.
    `model`: an nn.Module or (name, parameter) pairs."""
    named = [(n, p) for n, p in _named_parameters(model) if p.requires_grad]
    try:
        routes = _C.route_muon(named, rule, list(adamw_keywords))
    except RuntimeError as error:
        raise ValueError(f"muon_param_groups: {error}") from None
    by_name = dict(named)
    muon = [by_name[n] for n, r in routes if r == "muon"]
    decay = [by_name[n] for n, r in routes if r == "adamw"]
    no_decay = [by_name[n] for n, r in routes if r == "adamw_no_decay"]
    adamw = [{"params": decay}]
    if no_decay:
        adamw.append({"params": no_decay, "weight_decay": 0.0})
    return MuonParamGroups(muon, [g for g in adamw if g["params"]], routes)


class FP32MainParams(Optimizer):
    """FP32 main params (Megatron's Float16OptimizerWithFloat16Params; docs/fp32-main-params.md)
    over mixtrain optimizers: each bfloat16/float16 parameter gets a float32 main param in the
    optimizers' groups; every step updates the main params and writes them, rounded to nearest
    even, into the model's parameters in the same pass. float32 parameters are their own main
    param.

        groups = mixtrain.optim.muon_param_groups(model)
        muon = mixtrain.optim.Muon(groups.muon, lr=0.02)
        adamw = mixtrain.optim.AdamW(groups.adamw, lr=1e-3)
        opt = mixtrain.optim.FP32MainParams([muon, adamw], model)
        (loss * opt.loss_scale).backward(); opt.step(); opt.zero_grad()

    `model` (an nn.Module or (name, parameter) pairs) names the parameters: the names key
    state_dict(), as the CLI trainer's checkpoints do. accumulate_in_backward (default True):
    each 16-bit gradient is added into its float32 main_grad as soon as autograd has it, so
    .grad stays None after backward (Megatron's main_grad); False keeps .grad until step() or
    accumulate_grads().
    With any float16 parameter a dynamic loss scaler (`loss_scaler`: a dict of
    initial_scale, growth_factor, backoff_factor, growth_interval, min_scale) unscales the
    gradients and skips steps that overflow: multiply the loss by loss_scale.

    swap (the swap optimizer, docs/architecture.md §9): {"file": PATH, "bucket_mb": 64,
    "merge_buckets": 1} keeps the optimizer state of CPU parameters in PATH between steps and
    brings it in bucket by bucket during step() (state of GPU parameters: pinned host memory,
    no file); the results are the same bits.

    param_groups are the wrapped optimizers' own group dicts: an LR scheduler over this object
    sets their lrs."""

    def __init__(self, optimizers, model, *, accumulate_in_backward=True, loss_scaler=None,
                 swap=None):
        opts = [optimizers] if isinstance(optimizers, Optimizer) else list(optimizers)
        for opt in opts:
            if not isinstance(opt, _LeafOptimizer):
                raise TypeError(f"FP32MainParams wraps mixtrain.optim optimizers, got "
                                f"{type(opt).__module__}.{type(opt).__name__}")
            if opt._wrapped is not None:
                raise ValueError(f"FP32MainParams: this {type(opt).__name__} is already wrapped")
        names = {id(p): n for n, p in _named_parameters(model)}
        named = []
        for opt in opts:
            opt._sync()
            entries = []
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    if id(p) not in names:
                        raise ValueError(f"FP32MainParams: {type(opt).__name__} param group {g} "
                                         f"parameter {i} (shape {tuple(p.shape)}) is not a "
                                         "parameter of `model`")
                    entries.append((names[id(p)], p))
            named.append(entries)
        scaler = _C.LossScalerOptions()
        for key, value in (loss_scaler or {}).items():
            if not hasattr(scaler, key):
                raise ValueError(f"FP32MainParams: unknown loss_scaler option {key!r}")
            setattr(scaler, key, value)
        self._mp = _C.MixedPrecision([o._leaf for o in opts], named, scaler)
        for opt in opts:
            opt._wrapped = self
            for g, group in enumerate(opt.param_groups):
                group["params"] = opt._leaf.group_params(g)  # the main params now
        if accumulate_in_backward:
            self._mp.accumulate_in_backward()
        if swap is not None:
            self._enable_swap(swap, named)
        self._optimizers = opts
        self._prepared = False
        self._built = False
        super().__init__([group for opt in opts for group in opt.param_groups], {})
        self._built = True
        self.state = _StateView(opts)

    def add_param_group(self, param_group):
        if self._built:
            raise RuntimeError("FP32MainParams.add_param_group: add every group to the wrapped "
                               "optimizers before wrapping them")
        super().add_param_group(param_group)

    def _enable_swap(self, swap, named):
        options = {"file": None, "bucket_mb": 64, "merge_buckets": 1}
        unknown = set(swap) - set(options)
        if unknown:
            raise ValueError(f"FP32MainParams: unknown swap option(s) {sorted(unknown)}")
        options.update(swap)
        devices = {p.device for entries in named for _, p in entries}
        if len(devices) != 1:
            raise ValueError(f"FP32MainParams: the swap optimizer needs every parameter on one "
                             f"device, got {sorted(map(str, devices))}")
        device = devices.pop()
        if device.type == "cpu" and not options["file"]:
            raise ValueError("FP32MainParams: swap={'file': PATH} names the file the CPU "
                             "optimizer state lives in between steps")
        if int(options["bucket_mb"]) < 1 or int(options["merge_buckets"]) < 1:
            raise ValueError("FP32MainParams: swap bucket_mb and merge_buckets must be >= 1")
        self._mp.enable_swap(str(options["file"] or ""), int(options["bucket_mb"]),
                             int(options["merge_buckets"]), str(device))

    @property
    def optimizers(self):
        return list(self._optimizers)

    @property
    def loss_scale(self):
        """1.0, or the dynamic loss scale when some parameter is float16."""
        return self._mp.loss_scale

    @property
    def skipped_steps(self):
        return self._mp.skipped_steps

    def main_param(self, name):
        """The float32 param the optimizers update for model parameter `name`."""
        return self._mp.main_param(name)

    def main_grad(self, name):
        """The float32 gradient accumulated for `name` since zero_grad() (None if none)."""
        return self._mp.main_grad(name)

    def accumulate_grads(self):
        """main_grad += .grad (in float32) for every parameter with a .grad, which is then
        cleared. With accumulate_in_backward=False, call it after each micro-batch's backward to
        accumulate in float32 (else the micro-batches' gradients add up in the parameter's
        dtype until step()); the hooks do the same, bit for bit."""
        self._mp.accumulate_model_grads()

    def _prepare(self):
        if not self._prepared:
            self._mp.accumulate_model_grads()
            self._mp.prepare_grads()
            self._prepared = True

    def clip_grad_norm_(self, max_norm):
        """torch.nn.utils.clip_grad_norm_ (2-norm) over the float32 main grads, before step();
        returns the norm before clipping."""
        self._prepare()
        return self._mp.clip_grad_norm(float(max_norm))

    def step(self, closure=None):
        """main grads ready (unscaled, checked for inf/nan with float16), then every wrapped
        optimizer's step and the copy into the model's params. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self._optimizers:
            opt._sync()
        self._prepare()
        self._prepared = False
        self._mp.step_with_ready_grads()
        return loss

    def zero_grad(self, set_to_none=True):
        """Every gradient, main param gradient and main_grad to None (set_to_none=False is
        refused: main_grad is recreated at the first accumulation)."""
        if not set_to_none:
            raise ValueError("FP32MainParams.zero_grad: only set_to_none=True")
        self._mp.zero_grad()
        self._prepared = False

    def state_dict(self):
        """{"tensors": the CLI checkpoint's optimizer keys (optimizer.state.<name>.<field>,
        optimizer._mixed_precision_optimizer.fp32_from_fp16_params.<name>; tensors alias the
        live state), "param_groups": each wrapped optimizer's groups (options, no params),
        "loss_scaler": (scale, growth_tracker, skipped_steps) or None}."""
        groups = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
                  for opt in self._optimizers]
        return {"tensors": dict(self._mp.state_dict()), "param_groups": groups,
                "loss_scaler": self._mp.scaler_state()}

    def load_state_dict(self, state_dict):
        """Checks everything first (keys, shapes, dtypes, group counts and options, the loss
        scaler) and changes nothing on a problem (ValueError listing them). Main params absent
        from the tensors are rebuilt from the 16-bit model (a warning: their fp32 bits are
        lost); a partial set is refused. "param_groups" and "loss_scaler" may be left out
        (None): the current ones stay."""
        groups = state_dict.get("param_groups")
        scaler = state_dict.get("loss_scaler")
        problems = []
        if groups is not None:
            if len(groups) != len(self._optimizers) or any(
                    len(g) != len(o.param_groups) for g, o in zip(groups, self._optimizers)):
                problems.append("the param groups do not match the wrapped optimizers'")
            else:
                for opt, saved in zip(self._optimizers, groups):
                    for index, group in enumerate(saved):
                        problem = opt._group_problem(index, dict(opt.param_groups[index], **group))
                        if problem:
                            problems.append(f"{type(opt).__name__} param group {index}: {problem}")
        if scaler is not None and self._mp.scaler_state() is None:
            problems.append("a loss scaler state, but no float16 parameter has a loss scaler")
        if problems:
            raise ValueError("FP32MainParams.load_state_dict: " + "; ".join(problems))
        # The tensors: checked in full by the C++ wrapper, which changes nothing on a problem.
        self._mp.load_state_dict(list(state_dict["tensors"].items()))
        if groups is not None:
            for opt, saved in zip(self._optimizers, groups):
                for index, group in enumerate(saved):
                    opt.param_groups[index].update(group)
        if scaler is not None:
            self._mp.restore_scaler(*scaler)
