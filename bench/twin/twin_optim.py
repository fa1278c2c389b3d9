"""The optimizer side of the eager twin, Megatron-LM / Moonlight style.

- Routing (ours: src/mixtrain/optim/routing.cpp, YAML rule): with a Muon target, Muon takes a
  parameter iff ndim >= 2 and its lower-cased name contains none of embed, lm_head, out_head,
  out_proj.bias or a muon_adamw_keywords entry; the rest goes to AdamW. AdamW weight decay is
  0 for names containing bias, norm or ln_.
- Mixed precision as Megatron's Float16OptimizerWithFloat16Params: an fp32 main copy of every
  low-precision param; a post-accumulate-grad hook adds each bf16 grad into a persistent fp32
  `main_grad` and drops it (Megatron's backward hook); before the update main.grad = main_grad;
  clip_grad_norm_ on the fp32 grads; the fp32 optimizers step; main params are copied back
  into the model (rounded to nearest even by copy_); main_grad is zeroed for the next step.
- AdamW: torch.optim.AdamW (amsgrad off) with PyTorch's default implementation for CPU tensors
  (the single-tensor loop), unless told `foreach` or `fused`.
- Muon: Moonlight's / Keller Jordan's, per parameter, 3-D expert stacks as batches of matrices:
  momentum (sum | ema | ema_add, Nesterov or not), Newton-Schulz in bfloat16 with the config's
  coefficient schedule (X / (||X||_F + eps); per step A = X X^T, B = b A + c A A, X = a X + B X,
  on the short side), then p *= 1 - lr wd, p -= lr scale O with scale = rms sqrt(max(A, B))
  (match_rms_adamw) or sqrt(max(1, A / B)) (original).
- LR: linear warmup then constant / linear / cosine decay to min_lr_ratio (ours:
  optim/lr_schedule.cpp), one factor on every group's base lr.
"""

import math

import torch

LEGACY = (3.4445, -4.7750, 2.0315)
ASYM5 = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
         (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012))
HYBRID_TAIL = (2.0, -1.5, 0.5)
HYBRID_LEGACY_STEPS = 8
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def ns_schedule(variant, steps, custom):
    if variant == "legacy":
        return [LEGACY] * steps
    if variant == "asym5":
        if steps > len(ASYM5):
            raise ValueError(f"asym5 has 5 coefficient sets; muon_ns_steps={steps}")
        return list(ASYM5[:steps])
    if variant == "hybrid":
        return [LEGACY if i < HYBRID_LEGACY_STEPS else HYBRID_TAIL for i in range(steps)]
    if variant == "custom":
        if len(custom) != steps:
            raise ValueError(f"custom schedule has {len(custom)} sets; muon_ns_steps={steps}")
        return [tuple(t) for t in custom]
    raise ValueError(f"unknown Newton-Schulz variant {variant!r}")


def zeropower_via_newtonschulz(g, schedule, eps, dtype):
    x = g.to(dtype)
    transposed = g.size(-2) > g.size(-1)
    if transposed:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    for a, b, c in schedule:
        gram = x @ x.mT
        poly = b * gram + c * gram @ gram
        x = a * x + poly @ x
    return x.mT if transposed else x


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr, weight_decay, momentum, nesterov, schedule, eps, ns_dtype,
                 matched_adamw_rms, adjust_lr_fn, momentum_style):
        defaults = dict(lr=lr, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.momentum, self.nesterov, self.schedule, self.eps = momentum, nesterov, schedule, eps
        self.ns_dtype, self.rms, self.adjust = ns_dtype, matched_adamw_rms, adjust_lr_fn
        self.style = momentum_style

    def scale(self, rows, cols):
        if self.adjust == "original":
            return math.sqrt(max(1.0, rows / cols))
        return self.rms * math.sqrt(max(rows, cols))

    @torch.no_grad()
    def step(self):
        mu = self.momentum
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                g = g.to(buf.dtype)
                if self.style == "sum":
                    buf.mul_(mu).add_(g)
                    u = g.add(buf, alpha=mu) if self.nesterov else buf
                else:
                    buf.lerp_(g, 1 - mu)
                    if not self.nesterov:
                        u = buf
                    elif self.style == "ema":
                        u = g.lerp(buf, mu)
                    else:
                        u = g.add(buf, alpha=mu)
                o = zeropower_via_newtonschulz(u, self.schedule, self.eps, self.ns_dtype)
                if wd != 0:
                    p.mul_(1 - lr * wd)
                p.add_(o, alpha=-lr * self.scale(p.size(-2), p.size(-1)))


def routes_to_muon(name, ndim, keywords):
    lowered = name.lower()
    fixed = ("embed", "lm_head", "out_head", "out_proj.bias")
    return ndim >= 2 and not any(k in lowered for k in fixed) and not any(
        k and k.lower() in lowered for k in keywords)


def no_decay(name):
    return any(k in name for k in ("bias", "norm", "ln_"))


def lr_factor(c, step, total_steps):
    warmup = c["train.lr_scheduler.warmup_steps"]
    if warmup > 0 and step <= warmup:
        return step / warmup
    decay = c["train.lr_scheduler.decay"]
    if decay == "constant":
        return 1.0
    span = total_steps - warmup
    p = 1.0 if span <= 0 else min(max((step - warmup) / span, 0.0), 1.0)
    m = c["train.lr_scheduler.min_lr_ratio"]
    if decay == "linear":
        return 1.0 - (1.0 - m) * p
    return m + (1.0 - m) * (1.0 + math.cos(math.pi * p)) / 2.0


class MixedPrecisionOptimizer:
    """Main params, main_grad hooks, clip, AdamW + Muon, copy-back (module docstring)."""

    def __init__(self, model, c, adamw_impl="default"):
        self.config = c
        self.fp32_main = bool(c["optimizer.fp32_main_params"])
        self.max_grad_norm = c["train.max_grad_norm"]
        muon_target = c["optimizer._target_"] == "Muon"
        keywords = c["optimizer.muon_config.muon_adamw_keywords"]
        self.pairs = []  # (model param, main param)
        adamw_groups, muon_params = {}, []
        for name, p in model.named_parameters():
            low = p.dtype in (torch.bfloat16, torch.float16)
            main = p.detach().float().requires_grad_(False) if (self.fp32_main and low) else p
            if main is not p:
                p.main_grad = torch.zeros_like(main)
                p.register_post_accumulate_grad_hook(self._accumulate_main_grad)
            self.pairs.append((name, p, main))
            if muon_target and routes_to_muon(name, p.dim(), keywords):
                muon_params.append(main)
            else:
                wd = 0.0 if no_decay(name) else c["optimizer.adamw_config.adamw_weight_decay"]
                adamw_groups.setdefault(wd, []).append(main)
        adamw_lr = c["optimizer.adamw_config.adamw_lr"]
        kwargs = {"foreach": True} if adamw_impl == "foreach" else (
            {"fused": True} if adamw_impl == "fused" else {})
        self.optimizers = []
        if adamw_groups:
            groups = [{"params": ps, "weight_decay": wd} for wd, ps in adamw_groups.items()]
            self.optimizers.append(torch.optim.AdamW(
                groups, lr=adamw_lr, betas=tuple(c["optimizer.adamw_config.adamw_betas"]),
                eps=c["optimizer.adamw_config.adamw_eps"], amsgrad=False, **kwargs))
        if muon_params:
            m = lambda key: c["optimizer.muon_config." + key]  # noqa: E731
            self.optimizers.append(Muon(
                muon_params, lr=m("muon_lr"), weight_decay=m("muon_weight_decay"),
                momentum=m("muon_momentum"), nesterov=m("muon_nesterov"),
                schedule=ns_schedule(m("muon_ns_variant"), m("muon_ns_steps"),
                                     m("muon_ns_coefficients")),
                eps=m("muon_ns_epsilon"), ns_dtype=DTYPES[m("muon_ns_dtype")],
                matched_adamw_rms=m("muon_matched_adamw_rms"),
                adjust_lr_fn=m("muon_adjust_lr_fn"), momentum_style=m("muon_momentum_style")))
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["base_lr"] = group["lr"]

    @staticmethod
    def _accumulate_main_grad(param):
        param.main_grad.add_(param.grad)
        param.grad = None

    def main_params(self):
        return [main for _, _, main in self.pairs]

    @torch.no_grad()
    def step(self, step, total_steps):
        """Clips and updates; returns the pre-clip global grad norm (float)."""
        for _, p, main in self.pairs:
            if main is not p:
                main.grad = p.main_grad
        with_grad = [main for main in self.main_params() if main.grad is not None]
        if self.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(with_grad, self.max_grad_norm)
        else:
            norm = torch.nn.utils.get_total_norm([m.grad for m in with_grad])
        factor = lr_factor(self.config, step, total_steps)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["base_lr"] * factor
            opt.step()
        for _, p, main in self.pairs:
            if main is not p:
                p.copy_(main)
                p.main_grad.zero_()
                main.grad = None
            else:
                p.grad = None
        return float(norm)
