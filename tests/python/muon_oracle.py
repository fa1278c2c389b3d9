"""Our Muon with `muon_momentum_style: ema` (through `mixtrain optim-replay`) against Python's
torch.optim.Muon (torch/optim/_muon.py), for 2-D parameters, both `adjust_lr_fn` modes, with and
without Nesterov; float32 params and bfloat16 params with fp32 main params (torch: fp32 masters
updated by Muon, then cast to bfloat16).

torch.optim.Muon, read from its source (checked below where it is a constant):
  buf.lerp_(g, 1 - momentum); u = g.lerp(buf, momentum) if nesterov else buf   (= our `ema`)
  O = NS(u): X = u.bfloat16(), transposed if rows > cols, X /= max(||X||_F, eps), then ns_steps
      times X = a X + (b A + c A A) X with A = X X^T, (a, b, c) = (3.4445, -4.7750, 2.0315)
      every step (= our `muon_ns_variant: legacy`), eps = 1e-7, ns_steps = 5; O is bfloat16
  p.mul_(1 - lr * weight_decay)          (the unadjusted lr, as ours)
  p.add_(O, alpha=-lr * r): r = sqrt(max(1, A/B)) ("original", torch's default) or
      0.2 * sqrt(max(A, B)) ("match_rms_adamw"; ours: muon_matched_adamw_rms * sqrt(max(A, B)))
Differences of definition: torch divides by max(||X||_F, eps), we (and Keller Jordan's
original Muon) by ||X||_F + eps; torch always runs Newton-Schulz in bfloat16, we in
muon_ns_dtype. Checks:
  1. muon_ns_dtype: bfloat16 vs stock torch.optim.Muon: BITWISE (params, bf16 model params,
     momentum buffers). In bfloat16, ||X|| + 1e-7 rounds back to ||X|| for ||X|| >= 2^-15
     (half an ulp of bf16 is 2^-9 of the value), so both normalisations agree here.
  2. muon_ns_dtype: float32 vs torch's Muon with its Newton-Schulz run in float32, normalised
     as ours (||X|| + eps) and on a contiguous copy of the transposed X (as ours; float32 GEMMs
     on the transposed view round differently): BITWISE. So our float32 path is torch's formula.
  3. muon_ns_dtype: float32 vs torch's Muon with its exact Newton-Schulz in float32 (its
     normalisation, the transposed view): the inputs to Newton-Schulz differ by the factor
     1 - d, d = eps / ||u||_F.
     Scaling X scales every singular value s; the 5 steps map s to f(s) and a relative change d
     of s to at most K d of f(s), K = max over s in (0, 1] of |s f'(s) / f(s)| (computed here in
     float64, ~10.04), with f <= F = max f (~1.2024). So per step |dO_ij| <= ||dO||_2 <= K F d,
     and the params differ by at most sum over steps of lr * r * K * F * d_k (weight decay only
     shrinks earlier differences), plus float32 rounding noise of the two runs (different GEMM
     layout for rows > cols): allowed 2x. Measured: about 2% of the bound.
  4. muon_ns_dtype: float32 vs stock torch.optim.Muon (bfloat16 Newton-Schulz): what torch's
     bfloat16 costs. bf16 keeps 8 significant bits (1 ulp = 2^-8 relative at most); 5 steps
     round X, A and the polynomial each: allowed 15 * 2^-8 = 5.9% of max |update| (measured
     ~1.5%).
  5. Every coefficient schedule (muon_ns_variant asym5, quintic, hybrid with 10 steps,
     polar_express with 5 and 8 steps, custom) in float32 against torch.optim.Muon whose
     Newton-Schulz is check 2's with the schedule written out below from its publication
     (asym5: docs/architecture.md's table, the hyper-parallel seed's; Polar Express: the
     paper's Algorithm 1 triples before safety, with the safety applied here as the paper's code
     does, and the 5-step set as modded-nanogpt ships it) and the input norm times (1 + safety):
     BITWISE, so the replay runs exactly the published schedule step by step.
  6. muon_per_head: optim-replay against a per-head Muon written in torch (check_per_head).
  7. muon_normuon and muon_cautious_weight_decay: optim-replay against NorMuon and cautious
     decay written out in torch (check_normuon_and_cautious).
"""

import inspect
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_util as util  # noqa: E402

util.run_gemms_as_torch()

STEPS = 5
LR, WD, MU, EPS = 0.02, 0.1, 0.95, 1e-7
LEGACY = util.NS_LEGACY
SHAPES = {  # rows > cols (transposed), rows < cols, square
    "layers.0.mlp.up": ((48, 32), "float32"),
    "layers.0.mlp.down": ((32, 80), "bfloat16"),
    "layers.0.attn.q": ((40, 40), "bfloat16"),
}
MAIN = util.MAIN


def config(ns_dtype, adjust_lr_fn, nesterov, momentum_style="ema", extra=""):
    """The replay's Muon config; `extra`: more muon_config lines (4-space indented)."""
    return f"""optimizer:
  _target_: Muon
  fp32_main_params: true
  muon_config:
    muon_lr: {LR}
    muon_weight_decay: {WD}
    muon_momentum: {MU}
    muon_nesterov: {str(nesterov).lower()}
    muon_ns_variant: legacy
    muon_ns_steps: 5
    muon_ns_epsilon: {EPS}
    muon_ns_dtype: {ns_dtype}
    muon_adjust_lr_fn: {adjust_lr_fn}
    muon_matched_adamw_rms: 0.2
    muon_momentum_style: {momentum_style}
{extra}""" + util.REPLAY_MIXED_PRECISION


def check_torch_constants(check):
    import torch
    import torch.optim._muon as muon

    defaults = {k: v.default for k, v in inspect.signature(torch.optim.Muon).parameters.items()}
    check.expect(tuple(defaults["ns_coefficients"]) == LEGACY,
                 f"torch.optim.Muon ns_coefficients {defaults['ns_coefficients']}, not legacy")
    check.expect(defaults["eps"] == EPS and defaults["ns_steps"] == 5,
                 f"torch.optim.Muon eps {defaults['eps']}, ns_steps {defaults['ns_steps']}")
    check.expect(defaults["adjust_lr_fn"] is None, "torch.optim.Muon default adjust_lr_fn")
    for shape in ((48, 32), (32, 80)):
        a, b = shape
        check.expect(muon._adjust_lr(1.0, None, torch.Size(shape)) == math.sqrt(max(1, a / b)),
                     f"torch's original lr adjustment for {shape}")
        check.expect(muon._adjust_lr(1.0, "match_rms_adamw", torch.Size(shape)) ==
                     0.2 * math.sqrt(max(a, b)), f"torch's match_rms_adamw for {shape}")


def amplification():
    """K = max |s f'(s) / f(s)| and F = max f(s) over s in (0, 1] for the 5 legacy steps."""
    import torch

    s = torch.logspace(-12, 0, 200001, dtype=torch.float64, requires_grad=True)
    a, b, c = LEGACY
    f = s
    for _ in range(5):
        f = a * f + b * f**3 + c * f**5
    (df,) = torch.autograd.grad(f.sum(), s)
    return float((s * df / f).detach().abs().max()), float(f.detach().max())


def float32_newton_schulz(ours, norms):
    """torch's _zeropower_via_newtonschulz line by line, in float32. ours: normalised by
    ||X|| + eps and X made contiguous after the transpose, as ours; else torch's max(||X||, eps)
    on the transposed view. Records ||u|| in `norms`."""
    import torch

    def ns(grad, ns_coefficients, ns_steps, eps):
        a, b, c = ns_coefficients
        norms.append(float(grad.float().norm()))
        ortho_grad = grad.float()
        if grad.size(0) > grad.size(1):
            ortho_grad = ortho_grad.T.contiguous() if ours else ortho_grad.T
        norm = ortho_grad.norm()
        ortho_grad = ortho_grad / (norm + eps) if ours else ortho_grad.div(norm.clamp(min=eps))
        for _ in range(ns_steps):
            gram_matrix = ortho_grad @ ortho_grad.T
            gram_update = torch.addmm(gram_matrix, gram_matrix, gram_matrix, beta=b, alpha=c)
            ortho_grad = torch.addmm(ortho_grad, gram_update, ortho_grad, beta=a)
        if grad.size(0) > grad.size(1):
            ortho_grad = ortho_grad.T
        return ortho_grad

    return ns


ASYM5, POLAR8, POLAR5 = util.NS_ASYM5, util.NS_POLAR_EXPRESS_8, util.NS_POLAR_EXPRESS_5
CUSTOM = [(3.0, -3.2, 1.2), (1.875, -1.25, 0.375)]
# (muon_ns_variant, muon_ns_steps, extra YAML, schedule, norm scale)
SCHEDULES = [
    ("asym5", 5, "", ASYM5, 1.0),
    ("asym5", 3, "", ASYM5[:3], 1.0),
    ("quintic", 5, "", ASYM5, 1.0),
    ("hybrid", 10, "", [LEGACY] * 8 + [(2.0, -1.5, 0.5)] * 2, 1.0),
    ("polar_express", 8, "", POLAR8, 1.01),
    ("polar_express", 5, "", POLAR5, 1.02),
    ("custom", 2, f"    muon_ns_coefficients: {[list(t) for t in CUSTOM]}\n", CUSTOM, 1.0),
]


def schedule_newton_schulz(schedule, norm_scale):
    """Check 2's float32 Newton-Schulz with a per-step (a, b, c) and X / (||X|| s + eps)."""
    import torch

    def ns(grad, ns_coefficients, ns_steps, eps):
        x = grad.float()
        if grad.size(0) > grad.size(1):
            x = x.T.contiguous()
        norm = x.norm()
        x = x / ((norm * norm_scale if norm_scale != 1.0 else norm) + eps)
        for a, b, c in schedule:
            gram = x @ x.T
            update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.addmm(x, update, x, beta=a)
        return x.T if grad.size(0) > grad.size(1) else x

    return ns


def check_schedules(args, check, params, grads, main_param):
    base = config("float32", "match_rms_adamw", True)
    for variant, steps, extra, schedule, norm_scale in SCHEDULES:
        text = base.replace("muon_ns_variant: legacy\n    muon_ns_steps: 5\n",
                            f"muon_ns_variant: {variant}\n    muon_ns_steps: {steps}\n{extra}")
        check.expect(text != base, "the schedule replaced the config's legacy lines")
        with util.temp_dir() as directory:
            out = util.optim_replay(args.mixtrain, directory, text, params, grads)
        ref = torch_muon(params, grads, "match_rms_adamw", True,
                         schedule_newton_schulz(schedule, norm_scale))
        total = 0
        for name in SHAPES:
            master, buf = ref[name]
            for what, a, b in (("main param", main_param(out, name), master),
                               ("momentum", out[f"optimizer.state.{name}.momentum_buffer"], buf)):
                differing = int((util.ulp_distance(a, b) > 0).sum())
                total += differing
                check.expect(differing == 0, f"{variant} x{steps} {name}: {what}: {differing} of "
                             f"{b.numel()} elements differ from the written-out schedule")
        print(f"muon_ns_variant {variant}, {steps} steps: {total} elements differ from the "
              "published schedule")


def torch_muon(params, grads, adjust_lr_fn, nesterov, newton_schulz=None):
    """torch.optim.Muon on fp32 masters (one optimizer per parameter, in order, so that the
    recorded norms are per parameter); `newton_schulz` replaces torch's if given."""
    import torch
    import torch.optim._muon as muon

    stock = muon._zeropower_via_newtonschulz
    if newton_schulz is not None:
        muon._zeropower_via_newtonschulz = newton_schulz
    try:
        out = {}
        for name, p in params.items():
            master = p.float().clone()
            opt = torch.optim.Muon([master], lr=LR, weight_decay=WD, momentum=MU,
                                   nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
            for k in range(1, STEPS + 1):
                master.grad = grads[f"step.{k}.{name}"].clone()
                opt.step()
            out[name] = (master, opt.state[master]["momentum_buffer"])
        return out
    finally:
        muon._zeropower_via_newtonschulz = stock


def main():
    args, check = util.start(__doc__.splitlines()[0])
    import torch

    check_torch_constants(check)
    K, F = amplification()
    print(f"Newton-Schulz (legacy, 5 steps): K = {K:.4f}, F = {F:.4f}")

    gen = torch.Generator().manual_seed(20261201)
    params = {n: (torch.randn(s, generator=gen) * 0.1).to(getattr(torch, d))
              for n, (s, d) in SHAPES.items()}
    grads = {f"step.{k}.{n}": torch.randn(s, generator=gen) * 0.01
             for k in range(1, STEPS + 1) for n, (s, _) in SHAPES.items()}

    def main_param(out, name):
        return out["model." + name] if params[name].dtype == torch.float32 else out[MAIN + name]

    for adjust_lr_fn in ("original", "match_rms_adamw"):
        for nesterov in (True, False):
            case = f"{adjust_lr_fn}, nesterov={nesterov}"
            ours = {}
            for ns_dtype in ("bfloat16", "float32"):
                with util.temp_dir() as directory:
                    ours[ns_dtype] = util.optim_replay(
                        args.mixtrain, directory, config(ns_dtype, adjust_lr_fn, nesterov),
                        params, grads)
            stock = torch_muon(params, grads, adjust_lr_fn, nesterov)
            norms_plus, norms_clamp = [], []
            plus = torch_muon(params, grads, adjust_lr_fn, nesterov,
                              float32_newton_schulz(True, norms_plus))
            clamp = torch_muon(params, grads, adjust_lr_fn, nesterov,
                               float32_newton_schulz(False, norms_clamp))
            for i, name in enumerate(SHAPES):
                rows, cols = SHAPES[name][0]
                ratio = (math.sqrt(max(1, rows / cols)) if adjust_lr_fn == "original" else
                         0.2 * math.sqrt(max(rows, cols)))
                start = params[name].float()
                # 1 and 2: bitwise, momentum buffers and bf16 model params included.
                for ns_dtype, (master, buf) in (("bfloat16", stock[name]),
                                                ("float32", plus[name])):
                    out = ours[ns_dtype]
                    pairs = [("main param", main_param(out, name), master),
                             ("momentum", out[f"optimizer.state.{name}.momentum_buffer"], buf),
                             ("model param", out["model." + name], master.to(params[name].dtype))]
                    for what, a, b in pairs:
                        differing = int((util.ulp_distance(a, b) > 0).sum())
                        check.expect(a.dtype == b.dtype and differing == 0,
                                     f"{case} {name} ns {ns_dtype}: {what}: {differing} of "
                                     f"{b.numel()} elements differ from torch (dtypes {a.dtype}, "
                                     f"{b.dtype})")
                # 3: float32 vs torch's normalisation, within the derived bound.
                ours32 = main_param(ours["float32"], name)
                deltas = [EPS / n for n in norms_clamp[i * STEPS:(i + 1) * STEPS]]
                bound = 2 * sum(LR * ratio * K * F * d for d in deltas)
                diff = float((ours32 - clamp[name][0]).abs().max())
                print(f"{case} {name}: float32 vs torch's max(||X||, eps): max |dp| {diff:.3e}, "
                      f"bound {bound:.3e}")
                check.expect(diff <= bound, f"{case} {name}: float32 vs torch's normalisation: "
                             f"max |dp| {diff:.3e} > bound {bound:.3e}")
                # 4: float32 vs stock torch (bfloat16 Newton-Schulz): update within 15 * 2^-8.
                update = stock[name][0] - start
                rel = float((ours32 - start - update).abs().max() / update.abs().max())
                print(f"{case} {name}: float32 vs stock torch (bf16 Newton-Schulz): "
                      f"max |dupdate| / max |update| = {rel:.2e}")
                check.expect(rel <= 15 * 2**-8, f"{case} {name}: float32 vs bf16 torch: "
                             f"{rel:.2e} > {15 * 2**-8:.2e}")
            print(f"{case}: ns bfloat16 = stock torch.optim.Muon and ns float32 = torch's "
                  "formula in float32 with ||X|| + eps: compared bitwise")
    check_schedules(args, check, params, grads, main_param)
    check_per_head(args, check)
    check_normuon_and_cautious(args, check)
    check.finish()


def check_per_head(args, check):
    """muon_per_head through optim-replay against a per-head Muon written here in torch: the
    model section's head_dim 8 cuts q/k/v ([H*8, 24]) into H blocks of 8 rows and o ([24, 32])
    into 4 blocks of 8 columns; each block's u (our default `sum` momentum with Nesterov) is
    orthogonalized alone (asym5, float32, X / (||X|| + eps) on the short side, as our float32
    path) and scaled by 0.2 * sqrt(max of the block's dims); the whole 24 x 24 `mlp` matrix is
    not split. Float32 params, no main params. Tolerance per step and element: 1e-4 * lr*scale,
    from float32 rounding of the two runs' GEMMs (batched fused vs per-matrix, different
    summation orders: ~1e-6 relative in O, amplified at most ~10x by 5 Newton-Schulz steps, and
    the rest margin; measured <= 6e-8 against 5.9e-6 allowed); the split itself moves p by
    orders of magnitude more (~1e-2, checked to be > 100x the tolerance)."""
    import torch

    asym5 = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
             (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]
    head_dim, steps = 8, 3
    shapes = {"model.layers.0.self_attn.q_proj.weight": ((32, 24), 0),
              "model.layers.0.self_attn.k_proj.weight": ((16, 24), 0),
              "model.layers.0.self_attn.o_proj.weight": ((24, 32), 1),
              "model.layers.0.mlp.up_proj.weight": ((24, 24), None)}
    gen = torch.Generator().manual_seed(20261202)
    params = {n: torch.randn(s, generator=gen) * 0.1 for n, (s, _) in shapes.items()}
    grads = {f"step.{k}.{n}": torch.randn(s, generator=gen) * 0.01
             for k in range(1, steps + 1) for n, (s, _) in shapes.items()}

    def ns(g):
        x = g.T.contiguous() if g.size(0) > g.size(1) else g
        x = x / (x.norm() + EPS)
        for a, b, c in asym5:
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        return x.T if g.size(0) > g.size(1) else x

    def torch_per_head(split):
        out = {}
        for name, (shape, dim) in shapes.items():
            p, buf = params[name].clone(), torch.zeros(shape)
            for k in range(1, steps + 1):
                g = grads[f"step.{k}.{name}"]
                buf = MU * buf + g
                u = g + MU * buf
                blocks = u.split(head_dim, dim) if split and dim is not None else (u,)
                o = torch.cat([ns(b.contiguous()) for b in blocks], dim or 0)
                rows, cols = blocks[0].shape
                p = p * (1 - LR * WD) - LR * 0.2 * math.sqrt(max(rows, cols)) * o
            out[name] = (p, 0.2 * math.sqrt(max(rows, cols)))
        return out

    yaml = f"""optimizer:
  _target_: Muon
  muon_config:
    muon_lr: {LR}
    muon_weight_decay: {WD}
    muon_momentum: {MU}
    muon_ns_dtype: float32
    muon_per_head: true
model:
  head_dim: {head_dim}
train:
  max_grad_norm: 0.0
"""
    with util.temp_dir() as directory:
        ours = util.optim_replay(args.mixtrain, directory, yaml, params, grads)
    expected, whole = torch_per_head(True), torch_per_head(False)
    for name, (p, scale) in expected.items():
        tolerance = steps * 1e-4 * LR * scale
        diff = float((ours["model." + name] - p).abs().max())
        split_moves = float((whole[name][0] - p).abs().max())
        print(f"per head {name}: max |ours - torch| {diff:.2e} (allowed {tolerance:.2e}); "
              f"per head vs whole matrix {split_moves:.2e}")
        check.expect(diff <= tolerance, f"per head {name}: {diff:.2e} > {tolerance:.2e}")
        if shapes[name][1] is not None:
            check.expect(split_moves > 100 * tolerance,
                         f"per head {name}: the split moves p by only {split_moves:.2e}")


# ---- NorMuon and cautious weight decay (self-contained: its own shapes, Newton-Schulz and
# reference) ----
NORMUON_SHAPES = {  # rows > cols (transposed by Newton-Schulz), rows < cols, square
    "layers.0.mlp.up": ((48, 32), "float32"),
    "layers.0.mlp.down": ((32, 80), "bfloat16"),
    "layers.0.attn.q": ((40, 40), "bfloat16"),
}
NORMUON_BETA2, NORMUON_EPS = 0.95, 1e-10


def normuon_config(cautious):
    return config(
        "float32",
        "match_rms_adamw",
        True,
        momentum_style="sum",
        extra=f"""    muon_normuon: true
    muon_normuon_beta2: {NORMUON_BETA2}
    muon_normuon_epsilon: {NORMUON_EPS}
    muon_cautious_weight_decay: {str(cautious).lower()}
""",
    )


def normuon_reference(params, grads, cautious, dtype):
    """The papers' formulas in torch, `dtype` throughout (float64: independent of rounding;
    float32: our operation order), per 2-D parameter on its fp32 master:
      buf = mu buf + g; u = g + mu buf                          (sum momentum, Nesterov)
      O = NS(u): X = u (transposed if rows > cols) / (||u||_F + eps), 5 legacy steps
      v = lerp(v, mean_j O_ij^2, 1 - beta2)                     (NorMuon, arXiv 2510.05491)
      O = O / (sqrt(v) + eps2); O *= ||O_before||_F / (||O||_F + eps2)
      p *= 1 - lr wd where O p >= 0 (cautious, arXiv 2510.12402; everywhere otherwise)
      p -= lr 0.2 sqrt(max(rows, cols)) O
    Returns {name: (p, buf, v, max row gain over the steps)}."""
    import torch

    a, b, c = LEGACY
    out = {}
    for name, p0 in params.items():
        p = p0.float().to(dtype).clone()
        rows, cols = p.shape
        buf = torch.zeros_like(p)
        v = torch.zeros(rows, dtype=dtype)
        gain = 0.0
        for k in range(1, STEPS + 1):
            g = grads[f"step.{k}.{name}"].to(dtype)
            buf.mul_(MU).add_(g)
            u = g.add(buf, alpha=MU)
            x = u.T.contiguous() if rows > cols else u
            x = x / (x.norm() + EPS)
            for _ in range(5):
                gram = x @ x.T
                x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
            o = (x.T if rows > cols else x).contiguous()  # as ours returns O
            v.lerp_((o * o).mean(-1), 1 - NORMUON_BETA2)
            denominator = v.sqrt() + NORMUON_EPS
            hat = o / denominator.unsqueeze(-1)
            ratio = o.norm() / (hat.norm() + NORMUON_EPS)
            gain = max(gain, float(ratio / denominator.min()))
            update = hat * ratio
            decay = 1 - LR * WD
            if cautious:
                p.mul_(torch.where(update * p >= 0, torch.tensor(decay, dtype=dtype),
                                   torch.tensor(1.0, dtype=dtype)))
            else:
                p.mul_(decay)
            p.add_(update, alpha=-LR * 0.2 * math.sqrt(max(rows, cols)))
        out[name] = (p, buf, v, gain)
    return out


def check_normuon_and_cautious(args, check):
    """optim-replay with muon_normuon (and with muon_cautious_weight_decay on top) against
    normuon_reference. Tolerances:
      float64 reference: float32 Newton-Schulz against float64 keeps O within 1e-4 of its scale
        per step (tests/unit/optim/muon_test.cpp's bound); NorMuon multiplies row i of O by its
        gain and moves it by at most 3x O's relative error (O itself, sqrt(v), the norm ratio):
        per step lr * 0.2 sqrt(max(A, B)) * 3 * gain * 1e-4, summed over the steps, plus 1e-6
        for float32 storage. A cautious mask can only differ where float32 and float64 disagree
        on the sign of some O_ij (|O_ij| at the 1e-7 level), absent on this data.
      float32 reference (our operation order, one thread, O contiguous as Newton-Schulz
        returns it: a reduction over a transposed view sums in another order): BITWISE (our
        LibTorch is the torch wheel's, so the same kernels run the same operations; params,
        model params, momentum and normuon_v). Measured against float64: |dp| <= 7.6e-8, about
        0.2% of the bound; normuon_v within 1.8e-6 relative (allowed 1e-4: float32 sums of at
        most 80 squares and five lerps, far below a wrong beta2 or mean)."""
    import torch

    gen = torch.Generator().manual_seed(20261202)
    params = {n: (torch.randn(s, generator=gen) * 0.1).to(getattr(torch, d))
              for n, (s, d) in NORMUON_SHAPES.items()}
    grads = {f"step.{k}.{n}": torch.randn(s, generator=gen) * 0.01
             for k in range(1, STEPS + 1) for n, (s, _) in NORMUON_SHAPES.items()}
    for cautious in (False, True):
        case = "normuon" + (" + cautious weight decay" if cautious else "")
        with util.temp_dir() as directory:
            ours = util.optim_replay(args.mixtrain, directory, normuon_config(cautious), params,
                                     grads)
        exact = normuon_reference(params, grads, cautious, torch.float64)
        same_order = normuon_reference(params, grads, cautious, torch.float32)
        for name in NORMUON_SHAPES:
            rows, cols = NORMUON_SHAPES[name][0]
            main = ours["model." + name] if params[name].dtype == torch.float32 else \
                ours[util.MAIN + name]
            v = ours[f"optimizer.state.{name}.normuon_v"]
            check.expect(v.dtype == torch.float32 and tuple(v.shape) == (rows,),
                         f"{case} {name}: normuon_v {v.dtype} {tuple(v.shape)}, expected "
                         f"float32 ({rows},)")
            p64, _, v64, gain = exact[name]
            lr_scale = LR * 0.2 * math.sqrt(max(rows, cols))
            bound = STEPS * 3 * gain * 1e-4 * lr_scale + 1e-6
            diff = float((main.double() - p64).abs().max())
            v_rel = float((v.double() - v64).abs().max() / v64.abs().max())
            print(f"{case} {name}: vs float64 formula max |dp| {diff:.3e} (bound {bound:.3e}), "
                  f"normuon_v relative {v_rel:.2e}")
            check.expect(diff <= bound, f"{case} {name}: max |dp| {diff:.3e} > {bound:.3e}")
            check.expect(v_rel <= 1e-4, f"{case} {name}: normuon_v relative {v_rel:.2e} > 1e-4")
            p32, buf32, v32, _ = same_order[name]
            for what, got, want in (("main param", main, p32), ("normuon_v", v, v32),
                                    ("momentum", ours[f"optimizer.state.{name}.momentum_buffer"],
                                     buf32),
                                    ("model param", ours["model." + name],
                                     p32.to(params[name].dtype))):
                differing = int((util.ulp_distance(got, want) > 0).sum())
                check.expect(got.dtype == want.dtype and differing == 0,
                             f"{case} {name}: {what}: {differing} of {want.numel()} elements "
                             f"differ from the float32 formula")
            print(f"{case} {name}: params, momentum and normuon_v bitwise the float32 formula")


if __name__ == "__main__":
    main()
