"""mixtrain.optim.AdamW / SGD / Muon against torch.optim.AdamW(foreach=False) / SGD(foreach=False)
/ Muon, and AdamW(fused=True) against torch's fused AdamW (at every CPU capability, in child
processes), in one process on the same tensors: BITWISE (params and every state tensor after every
step), with LR schedulers, two param groups, an option changed between steps, a closure, and
state_dict() moved both ways between ours and torch's mid-run. Muon's forms torch lacks
(momentum_style, every ns_variant, NorMuon, match_rms_adamw's factor, set_head_split) against
float64 references written here from docs/architecture.md section 5 and the papers (within a
stated float32 tolerance; the momentum buffers bitwise). Then the contract's edges: torch's
refusals, our refusals of torch options we lack (capturable, differentiable,
decoupled_weight_decay=False, ...), a load_state_dict that fails changing nothing,
add_param_group keeping state, the routing helper.

Why bitwise is the expectation: each of our leaves runs, per element, the operation sequence of
torch's single-tensor path (the C++ oracles tests/python/{adamw,sgd,muon}_oracle.py show it
through optim-replay; here it is shown through the Python package, the way users call it), at
the CPU capability ATen picked in this same process. Muon's parameters have distinct shapes:
our Muon batches same-shape matrices into one Newton-Schulz call, whose batched GEMMs may round
differently from torch's one-matrix GEMMs (checked separately with a tolerance below).
"""

import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import oracle_util as util  # noqa: E402

util.run_gemms_as_torch()

STEPS = 6


def make_params(shapes, dtype, seed):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(s, generator=gen) * 0.5).to(dtype)) for s in shapes]


def grads_for(shapes, steps, seed):
    """Per step, one float32 gradient per shape spanning 10^-6 .. 10^2 (as the oracles)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        out.append([torch.randn(s, generator=gen) * 10 ** (torch.rand(s, generator=gen) * 8 - 6)
                    for s in shapes])
    return out


def clone_params(params):
    import torch

    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def same(a, b):
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def compare_states(check, label, ours, theirs, params_ours, params_theirs):
    """Params and state bitwise. "step" only where torch counts it (AdamW): torch's SGD and
    Muon keep none, and one loaded from ours carries our count without advancing it."""
    import torch

    counted = isinstance(theirs, torch.optim.AdamW)
    for i, (po, pt) in enumerate(zip(params_ours, params_theirs)):
        check.expect(same(po.detach(), pt.detach()), f"{label}: param {i} differs")
        so, st = ours.state[po], theirs.state[pt]
        for key, value in st.items():
            if key == "step" and not counted:
                continue
            check.expect(key in so, f"{label}: param {i} lacks state {key!r}")
            if key in so:
                check.expect(same(so[key], value), f"{label}: param {i} state {key!r} differs")


def run_pair(check, label, params, grads, make_ours, make_theirs, schedule, change=None):
    """Steps ours and torch's side by side; at step 3 moves the state ours -> a fresh torch
    optimizer and torch -> a fresh ours (both continue from the other's state_dict)."""
    import torch

    po, pt = clone_params(params), clone_params(params)
    ours, theirs = make_ours(po), make_theirs(pt)
    so, st = schedule(ours), schedule(theirs)
    for k, step_grads in enumerate(grads):
        if change and k == 2:
            change(ours)
            change(theirs)
        for p, q, g in zip(po, pt, step_grads):
            p.grad, q.grad = g.to(p.dtype), g.to(q.dtype)
        if k == 1:  # a closure once: its loss comes back, the step is the same
            loss = ours.step(lambda: torch.tensor(2.5))
            check.expect(float(loss) == 2.5, f"{label}: closure loss {loss}")
        else:
            ours.step()
        theirs.step()
        so.step()
        st.step()
        compare_states(check, f"{label} step {k + 1}", ours, theirs, po, pt)
        if k == 2:
            # Swap: torch's state into a new ours, ours into a new torch; schedulers follow.
            saved_ours, saved_theirs = ours.state_dict(), theirs.state_dict()
            check.expect(set(saved_ours["state"]) == set(saved_theirs["state"]),
                         f"{label}: state_dict indices {set(saved_ours['state'])}")
            for index, entry in saved_theirs["state"].items():
                for key, value in entry.items():
                    mine = saved_ours["state"][index].get(key)
                    check.expect(mine is not None and mine.dtype == value.dtype and
                                 mine.shape == value.shape,
                                 f"{label}: state_dict {index}.{key} layout")
            for gt, go in zip(saved_theirs["param_groups"], saved_ours["param_groups"]):
                missing = set(gt) - set(go)
                check.expect(not missing, f"{label}: our param_groups lack {missing}")
            new_ours, new_theirs = make_ours(po), make_theirs(pt)
            new_ours.load_state_dict(saved_theirs)
            new_theirs.load_state_dict(saved_ours)
            ours, theirs = new_ours, new_theirs
            so_state, st_state = so.state_dict(), st.state_dict()
            so, st = schedule(ours), schedule(theirs)
            so.load_state_dict(so_state)
            st.load_state_dict(st_state)
            compare_states(check, f"{label} after the swap", ours, theirs, po, pt)
    return po


def lambda_schedule(opt):
    import torch

    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 + 0.5 * math.cos(step / 3))


def check_adamw(check):
    import torch

    import mixtrain.optim as mo

    shapes = [(33, 17), (64,), (5, 7, 9)]
    for dtype in (torch.float32, torch.bfloat16):
        params = make_params(shapes, dtype, seed=1)
        grads = grads_for(shapes, STEPS, seed=2)

        def groups(ps):
            return [{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0,
                                         "betas": (0.8, 0.99)}]

        def change(opt):
            opt.param_groups[0]["weight_decay"] = 0.3
            opt.param_groups[1]["eps"] = 1e-6

        run_pair(check, f"AdamW {dtype}", params, grads,
                 lambda ps: mo.AdamW(groups(ps), lr=3e-3, weight_decay=0.05),
                 lambda ps: torch.optim.AdamW(groups(ps), lr=3e-3, weight_decay=0.05,
                                              foreach=False),
                 lambda_schedule, change)
    check_adamw_fused(check, torch.backends.cpu.get_cpu_capability())


def check_adamw_fused(check, capability):
    """fused=True against torch's fused AdamW (ATen's _fused_adamw_), float32, shapes whose
    sizes are no multiple of any vector width (the tails)."""
    import torch

    import mixtrain.optim as mo

    shapes = [(33, 17), (64,), (5, 7, 9), (1000003,)]
    params = make_params(shapes, torch.float32, seed=15)
    grads = grads_for(shapes, STEPS, seed=16)

    def groups(ps):
        return [{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0,
                                     "betas": (0.8, 0.99)}]

    run_pair(check, f"AdamW fused=True ({capability})", params, grads,
             lambda ps: mo.AdamW(groups(ps), lr=3e-3, weight_decay=0.05, fused=True),
             lambda ps: torch.optim.AdamW(groups(ps), lr=3e-3, weight_decay=0.05, fused=True),
             lambda_schedule)


def check_adamw_fused_every_capability(check):
    """check_adamw_fused in a child per CPU capability below this CPU's best (ATen's and ours
    lowered together, as both pick the best by default)."""
    import subprocess

    import torch

    order = ["DEFAULT", "AVX2", "AVX512"]
    best = torch.backends.cpu.get_cpu_capability()
    for capability in order[:order.index(best)] if best in order else []:
        env = dict(os.environ, ATEN_CPU_CAPABILITY=capability.lower(),
                   MIXTRAIN_CPU_CAPABILITY=capability.lower())
        result = subprocess.run([sys.executable, os.path.abspath(__file__), "--fused-only"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=300)
        check.expect(result.returncode == 0 and capability in result.stdout,
                     f"fused AdamW at {capability}:\n{result.stdout[-3000:]}")


def check_sgd(check):
    import torch

    import mixtrain.optim as mo

    shapes = [(31, 8), (40,)]
    params = make_params(shapes, torch.float32, seed=3)
    grads = grads_for(shapes, STEPS, seed=4)
    for kwargs in ({"momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
                   {"momentum": 0.8, "dampening": 0.1}, {}):
        def change(opt):
            opt.param_groups[0]["weight_decay"] = 0.02

        run_pair(check, f"SGD {kwargs}", params, grads,
                 lambda ps: mo.SGD(ps, lr=0.05, **kwargs),
                 lambda ps: torch.optim.SGD(ps, lr=0.05, foreach=False, **kwargs),
                 lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
                 change)


def check_muon(check):
    import torch

    import mixtrain.optim as mo

    shapes = [(48, 32), (32, 80), (40, 40)]  # rows > cols (transposed), rows < cols, square
    params = make_params(shapes, torch.float32, seed=5)
    grads = grads_for(shapes, STEPS, seed=6)
    for kwargs in ({}, {"adjust_lr_fn": "match_rms_adamw", "nesterov": False},
                   {"adjust_lr_fn": "original", "momentum": 0.9, "weight_decay": 0.0}):
        def change(opt):
            opt.param_groups[0]["momentum"] = 0.85

        run_pair(check, f"Muon {kwargs}", params, grads,
                 lambda ps: mo.Muon(ps, lr=0.02, **kwargs),
                 lambda ps: torch.optim.Muon(ps, lr=0.02, **kwargs),
                 lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS),
                 change)

    # Same-shape matrices go through one batched Newton-Schulz call: not the bits of torch's
    # one-matrix GEMMs, but within bfloat16 rounding. Bound: the updates are lr * r * O with
    # |O| <= ~1.2 (the legacy polynomial's maximum); bf16 keeps 8 significant bits and 5 steps
    # round X, A and the polynomial each (muon_oracle.py check 4): 15 * 2^-8 of lr * 1.2 per
    # step, summed over the steps.
    shapes = [(24, 16)] * 3
    params = make_params(shapes, torch.float32, seed=7)
    grads = grads_for(shapes, 3, seed=8)
    po, pt = clone_params(params), clone_params(params)
    ours, theirs = mo.Muon(po, lr=0.02), torch.optim.Muon(pt, lr=0.02)
    for step_grads in grads:
        for p, q, g in zip(po, pt, step_grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    bound = 3 * 0.02 * math.sqrt(24 / 16) * 1.2 * 15 * 2 ** -8
    worst = max(float((p - q).detach().abs().max()) for p, q in zip(po, pt))
    check.expect(worst <= bound, f"batched Muon: max |ours - torch| {worst} > {bound}")


def check_mixtrain_forms(check):
    """Options torch lacks reach the leaf: float32 Newton-Schulz differs from the default; per-
    step coefficients equal to the triple give the triple's bits. (momentum_style, ns_variant
    and NorMuon are checked against formulas below: check_muon_against_formulas.)"""
    import torch

    import mixtrain.optim as mo

    shapes = [(20, 12)]
    grads = grads_for(shapes, 2, seed=9)
    results = {}
    for name, kwargs in {"default": {}, "float32": {"ns_dtype": torch.float32},
                         "per step": {"ns_coefficients": [(3.4445, -4.7750, 2.0315)] * 5}}.items():
        ps = make_params(shapes, torch.float32, seed=10)
        opt = mo.Muon(ps, lr=0.02, **kwargs)
        for g in grads:
            ps[0].grad = g[0].clone()
            opt.step()
        results[name] = ps[0].detach()
    for name in ("float32",):
        check.expect(not torch.equal(results[name], results["default"]),
                     f"Muon {name}: same result as the defaults (option not applied)")
    check.expect(torch.equal(results["per step"], results["default"]),
                 "Muon with torch's triple written per step differs from the triple")
    opt = mo.Muon(make_params(shapes, torch.float32, seed=10), normuon=True)
    check.expect(opt.param_groups[0]["normuon"] is True, "normuon not in the param group")


# Newton-Schulz coefficient schedules as published (oracle_util.py says whose).
LEGACY, ASYM5, HYBRID_TAIL = util.NS_LEGACY, util.NS_ASYM5, util.NS_HYBRID_TAIL
POLAR_EXPRESS_5, POLAR_EXPRESS_8 = util.NS_POLAR_EXPRESS_5, util.NS_POLAR_EXPRESS_8

# Tolerance of ours (float32 Newton-Schulz, float32 params) against the float64 references below,
# on |p_ours - p_ref| in units of lr * steps: each Newton-Schulz step rounds its three float32
# GEMMs (inner dims <= 12 here: a few 2^-24 relative each) and the polynomial carries that error
# into the next step; measured <= 2e-6 on these shapes over 3 steps. 2e-5 leaves 10x for another
# GEMM blocking, and is ~3000x below what the mutations move (another schedule, scale, momentum
# form, a missing NorMuon or head split: >= 6e-2 measured).
MUON_TOL = 2e-5


def reference_newton_schulz(g, schedule, eps, norm_scale=1.0):
    """The documented iteration in float64: on the short side, X / (||X||_F * norm_scale + eps),
    then per triple A = X X^T, X = a X + (b A + c A A) X."""
    import torch

    x = g.double()
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) * norm_scale + eps)
    for a, b, c in schedule:
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def reference_muon(p0, grads, lr, wd, mu, schedule, nesterov=True, style="ema", norm_scale=1.0,
                   eps=1e-7, adjust="original", rms=0.2, normuon=None, split=None):
    """Muon in float64 from docs/architecture.md section 5 (momentum form, Newton-Schulz per
    matrix or per head block, NorMuon of arXiv 2510.05491 with the authors' norm-preserving
    rescale, the adjust_lr_fn scale of the (head) matrix, decoupled decay). Returns the param, the
    momentum buffer and NorMuon's v (None without NorMuon)."""
    import torch

    p, buf, v = p0.double().clone(), torch.zeros(p0.shape, dtype=torch.float64), None
    for g in grads:
        g = g.double()
        if style == "sum":                   # buf = mu buf + g; u = g + mu buf (Nesterov)
            buf = mu * buf + g
            u = g + mu * buf if nesterov else buf
        else:                                # buf = lerp(buf, g, 1 - mu)
            buf = buf + (1 - mu) * (g - buf)
            if not nesterov:
                u = buf
            elif style == "ema":             # u = lerp(g, buf, mu)
                u = (1 - mu) * g + mu * buf
            else:                            # ema_add: u = g + mu buf
                u = g + mu * buf
        if split is None:
            o = reference_newton_schulz(u, schedule, eps, norm_scale)
            rows, cols = u.shape
        else:                                # blocks of `block` rows (dim 0) or columns (dim 1)
            dim, block = split
            heads = u.split(block, dim=dim)
            o = torch.cat([reference_newton_schulz(h, schedule, eps, norm_scale) for h in heads],
                          dim=dim)
            rows, cols = heads[0].shape
        if normuon is not None:              # per row of p as stored
            beta2, epsilon = normuon
            v = torch.zeros(o.shape[0], dtype=torch.float64) if v is None else v
            v = beta2 * v + (1 - beta2) * o.square().mean(-1)
            hat = o / (v.sqrt() + epsilon)[:, None]
            o = hat * torch.linalg.matrix_norm(o) / (torch.linalg.matrix_norm(hat) + epsilon)
        scale = (math.sqrt(max(1.0, rows / cols)) if adjust == "original"
                 else rms * math.sqrt(max(rows, cols)))
        p = p * (1 - lr * wd) - lr * scale * o
    return p, buf, v


def float32_buffer(grads, mu, style):
    """The momentum buffer with torch's float32 ops, one per documented form: sum
    buf.mul_(mu).add_(g); ema and ema_add buf.lerp_(g, 1 - mu) (torch.optim.Muon's op)."""
    import torch

    buf = torch.zeros_like(grads[0])
    for g in grads:
        if style == "sum":
            buf.mul_(mu).add_(g)
        else:
            buf.lerp_(g, 1 - mu)
    return buf


def run_muon(p0, grads, head_split=None, **kwargs):
    """Ours on one float32 parameter; returns (param, momentum_buffer, normuon_v or None)."""
    import torch

    import mixtrain.optim as mo

    p = torch.nn.Parameter(p0.clone())
    opt = mo.Muon([p], **kwargs)
    if head_split is not None:
        opt.set_head_split(p, head_split[1], dim=head_split[0])
    for g in grads:
        p.grad = g.clone()
        opt.step()
    state = opt.state[p]
    return p.detach(), state["momentum_buffer"], state.get("normuon_v")


def expect_muon_matches(check, label, ours, reference, lr, steps, mu, style, grads):
    """Params within MUON_TOL of the float64 reference; the momentum buffer bitwise equal to
    torch's float32 ops of its form (a momentum form is scale-free through Newton-Schulz's
    normalization: sum's buffer is ema's / (1 - mu), the same update, so the buffer is what
    tells them apart); NorMuon's v within 1e-5 relative (float32 row means of a float32 O whose
    error is MUON_TOL-sized: measured <= 2e-6)."""
    import torch

    p, buf, v = ours
    p_ref, _, v_ref = reference
    worst = float((p.double() - p_ref).abs().max()) / (lr * steps)
    check.expect(worst <= MUON_TOL, f"{label}: max |ours - reference| = {worst:.3g} lr*steps "
                 f"> {MUON_TOL}")
    check.expect(torch.equal(buf, float32_buffer(grads, mu, style)),
                 f"{label}: momentum_buffer is not the {style} form's")
    check.expect((v is None) == (v_ref is None), f"{label}: normuon_v present: {v is not None}")
    if v is not None and v_ref is not None:
        rel = float(((v.double() - v_ref).abs() / v_ref).max())
        check.expect(rel <= 1e-5, f"{label}: normuon_v off by {rel:.3g} relative")


def check_muon_against_formulas(check):
    """momentum_style, every ns_variant, NorMuon, adjust_lr_fn against reference_muon: small
    matrices (tall and wide: Newton-Schulz transposes the tall one), 3 steps, float32
    Newton-Schulz so that the comparison is tight."""
    import torch

    lr, wd, mu, steps = 0.05, 0.1, 0.9, 3
    common = dict(lr=lr, weight_decay=wd, momentum=mu, ns_dtype=torch.float32)
    cases = [  # (label, our keywords, reference keywords)
        ("ns_variant=legacy", {"ns_variant": "legacy"}, {"schedule": [LEGACY] * 5}),
        ("ns_variant=asym5", {"ns_variant": "asym5"}, {"schedule": ASYM5}),
        ("ns_variant=asym5 ns_steps=3", {"ns_variant": "asym5", "ns_steps": 3},
         {"schedule": ASYM5[:3]}),
        ("ns_variant=quintic", {"ns_variant": "quintic"}, {"schedule": ASYM5}),
        ("ns_variant=hybrid ns_steps=10", {"ns_variant": "hybrid", "ns_steps": 10},
         {"schedule": [LEGACY] * 8 + [HYBRID_TAIL] * 2}),
        ("ns_variant=polar_express", {"ns_variant": "polar_express"},
         {"schedule": POLAR_EXPRESS_5, "norm_scale": 1.02}),
        ("ns_variant=polar_express ns_steps=8", {"ns_variant": "polar_express", "ns_steps": 8},
         {"schedule": POLAR_EXPRESS_8, "norm_scale": 1.01}),
        ("custom per-step triples", {"ns_coefficients": ASYM5[::-1]}, {"schedule": ASYM5[::-1]}),
        ("momentum_style=sum", {"momentum_style": "sum"},
         {"schedule": [LEGACY] * 5, "style": "sum"}),
        ("momentum_style=sum nesterov=False", {"momentum_style": "sum", "nesterov": False},
         {"schedule": [LEGACY] * 5, "style": "sum", "nesterov": False}),
        ("momentum_style=ema_add", {"momentum_style": "ema_add"},
         {"schedule": [LEGACY] * 5, "style": "ema_add"}),
        ("normuon", {"normuon": True, "normuon_beta2": 0.9, "normuon_epsilon": 1e-8},
         {"schedule": [LEGACY] * 5, "normuon": (0.9, 1e-8)}),
        ("normuon + sum + asym5", {"normuon": True, "momentum_style": "sum", "ns_variant": "asym5"},
         {"schedule": ASYM5, "normuon": (0.95, 1e-10), "style": "sum"}),
        ("adjust_lr_fn=match_rms_adamw", {"adjust_lr_fn": "match_rms_adamw",
                                          "matched_adamw_rms": 0.3},
         {"schedule": [LEGACY] * 5, "adjust": "match_rms_adamw", "rms": 0.3}),
    ]
    gen = torch.Generator().manual_seed(31)
    for shape in ((12, 8), (6, 10)):
        p0 = torch.randn(shape, generator=gen) * 0.5
        grads = [torch.randn(shape, generator=gen) for _ in range(steps)]
        for label, ours_kwargs, ref_kwargs in cases:
            ours = run_muon(p0, grads, **dict(common, **ours_kwargs))
            reference = reference_muon(p0, grads, lr, wd, mu, **ref_kwargs)
            expect_muon_matches(check, f"Muon {label} {shape}", ours, reference, lr, steps, mu,
                                ref_kwargs.get("style", "ema"), grads)


def check_muon_head_split(check):
    """set_head_split(param, head_dim, dim): Newton-Schulz on each head's block (dim 0: blocks of
    head_dim rows, q/k/v; dim 1: blocks of columns, o) and the scale of the head's shape, against
    reference_muon's per-block iteration; with NorMuon on the merged matrix. The whole-matrix
    update is >= 1e-1 lr*steps away from each of these (measured), so a split ignored, put on
    the other dim or scaled by the whole matrix's shape fails."""
    import torch

    import mixtrain.optim as mo

    lr, wd, mu, steps = 0.05, 0.1, 0.9, 3
    gen = torch.Generator().manual_seed(32)
    for dim, head_dim, shape, adjust in ((0, 4, (12, 8), "original"),
                                         (1, 4, (8, 12), "original"),
                                         (0, 4, (12, 8), "match_rms_adamw"),
                                         (1, 3, (6, 9), "match_rms_adamw")):
        p0 = torch.randn(shape, generator=gen) * 0.5
        grads = [torch.randn(shape, generator=gen) for _ in range(steps)]
        for normuon in (False, True):
            label = f"Muon head split dim={dim} head_dim={head_dim} {shape} {adjust} " \
                    f"normuon={normuon}"
            ours = run_muon(p0, grads, head_split=(dim, head_dim), lr=lr, weight_decay=wd,
                            momentum=mu, ns_dtype=torch.float32, adjust_lr_fn=adjust,
                            normuon=normuon)
            reference = reference_muon(p0, grads, lr, wd, mu, [LEGACY] * 5, adjust=adjust,
                                       split=(dim, head_dim),
                                       normuon=(0.95, 1e-10) if normuon else None)
            expect_muon_matches(check, label, ours, reference, lr, steps, mu, "ema", grads)
            whole = reference_muon(p0, grads, lr, wd, mu, [LEGACY] * 5, adjust=adjust,
                                   normuon=(0.95, 1e-10) if normuon else None)[0]
            apart = float((whole - reference[0]).abs().max()) / (lr * steps)
            check.expect(apart > 100 * MUON_TOL, f"{label}: the test cannot tell heads from the "
                         f"whole matrix ({apart:.3g})")
    # Refused: a split that does not divide the matrix (at the step), a 3-D parameter.
    p = torch.nn.Parameter(torch.randn(10, 8, generator=gen))
    opt = mo.Muon([p])
    opt.set_head_split(p, 4, dim=0)
    p.grad = torch.ones(10, 8)
    expect_error(check, "head split of 10 rows by 4", ValueError, opt.step,
                 "cannot be cut into heads of 4")
    q = torch.nn.Parameter(torch.randn(2, 8, 8, generator=gen))
    expect_error(check, "head split of a 3-D param", ValueError,
                 lambda: mo.Muon([q]).set_head_split(q, 4), "2-D")


def expect_error(check, label, kind, fn, *words):
    try:
        fn()
    except kind as error:
        text = str(error)
        check.expect(all(w in text for w in words), f"{label}: message {text!r} lacks {words}")
        return
    except Exception as error:  # noqa: BLE001
        check.expect(False, f"{label}: {type(error).__name__} instead of {kind.__name__}: {error}")
        return
    check.expect(False, f"{label}: no error")


def check_refusals(check):
    import torch

    import mixtrain.optim as mo

    p = make_params([(4, 4)], torch.float32, seed=11)
    v = make_params([(4,)], torch.float32, seed=11)
    expect_error(check, "AdamW amsgrad", ValueError, lambda: mo.AdamW(p, amsgrad=True), "amsgrad")
    expect_error(check, "AdamW maximize", ValueError, lambda: mo.AdamW(p, maximize=True),
                 "maximize")
    # torch options we lack: refused naming the option, as an argument, as a group's entry, set
    # between steps, and in a torch state_dict being loaded. (torch.optim.AdamW itself takes no
    # decoupled_weight_decay argument: both raise TypeError; the option reaches us through a
    # param group or torch.optim.Adam's state.)
    expect_error(check, "AdamW capturable", ValueError, lambda: mo.AdamW(p, capturable=True),
                 "capturable=True")
    expect_error(check, "AdamW differentiable", ValueError,
                 lambda: mo.AdamW(p, differentiable=True), "differentiable=True")
    expect_error(check, "SGD differentiable", ValueError,
                 lambda: mo.SGD(p, differentiable=True), "differentiable=True")
    expect_error(check, "SGD maximize", ValueError, lambda: mo.SGD(p, maximize=True), "maximize")
    expect_error(check, "AdamW decoupled_weight_decay argument", TypeError,
                 lambda: mo.AdamW(p, decoupled_weight_decay=False), "decoupled_weight_decay")
    expect_error(check, "AdamW decoupled_weight_decay group", ValueError,
                 lambda: mo.AdamW([{"params": p, "decoupled_weight_decay": False}]),
                 "decoupled_weight_decay=False")
    adam_state = torch.optim.Adam(p, decoupled_weight_decay=False).state_dict()
    expect_error(check, "AdamW loading torch Adam's state", ValueError,
                 lambda: mo.AdamW(p).load_state_dict(adam_state), "decoupled_weight_decay=False")
    for option, value in (("capturable", True), ("differentiable", True),
                          ("decoupled_weight_decay", False)):
        opt = mo.AdamW(p, lr=0.1)
        opt.param_groups[0][option] = value
        p[0].grad = torch.ones(4, 4)
        before = p[0].detach().clone()
        expect_error(check, f"AdamW {option} set in the group", ValueError, opt.step,
                     f"{option}={value}")
        check.expect(torch.equal(p[0].detach(), before), f"a refused {option} step moved p")
    expect_error(check, "AdamW fused and foreach", ValueError,
                 lambda: mo.AdamW(p, fused=True, foreach=True), "fused")
    expect_error(check, "AdamW beta", ValueError, lambda: mo.AdamW(p, betas=(1.5, 0.9)), "beta")
    expect_error(check, "AdamW lr", ValueError, lambda: mo.AdamW(p, lr=-1.0), "lr")
    expect_error(check, "SGD nesterov", ValueError, lambda: mo.SGD(p, nesterov=True), "nesterov")
    expect_error(check, "Muon 1-D", ValueError, lambda: mo.Muon(v), "Muon", "ndim")
    expect_error(check, "Muon variant", ValueError,
                 lambda: mo.Muon(p, ns_variant="asym5", ns_coefficients=(1.0, 2.0, 3.0)),
                 "ns_variant")
    expect_error(check, "Muon dtype", ValueError, lambda: mo.Muon(p, ns_dtype=torch.float16),
                 "ns_dtype")
    opt = mo.AdamW(p, lr=0.1)
    opt.param_groups[0]["eps"] = -1.0
    p[0].grad = torch.ones(4, 4)
    expect_error(check, "AdamW eps set in the group", ValueError, opt.step, "eps")


def check_failed_load_changes_nothing(check):
    import torch

    import mixtrain.optim as mo

    p = make_params([(6, 5), (6,)], torch.float32, seed=12)
    opt = mo.AdamW(p, lr=0.01)
    for q in p:
        q.grad = torch.ones_like(q)
    opt.step()
    before = {i: {k: v.clone() for k, v in opt.state[q].items()} for i, q in enumerate(p)}
    bad = opt.state_dict()
    bad["state"][0]["exp_avg"] = torch.zeros(3, 3)  # wrong shape
    bad["state"][1]["step"] = torch.tensor(1.5)     # not a whole count
    bad["param_groups"][0]["lr"] = 0.5
    expect_error(check, "bad load", ValueError, lambda: opt.load_state_dict(bad), "exp_avg",
                 "step")
    for i, q in enumerate(p):
        for k, v in before[i].items():
            check.expect(same(opt.state[q][k], v), f"failed load changed param {i} {k}")
    check.expect(opt.param_groups[0]["lr"] == 0.01, "failed load changed the lr")


def check_add_param_group(check):
    import torch

    import mixtrain.optim as mo

    shapes = [(8, 4), (7, 3)]
    grads = grads_for(shapes, 3, seed=13)
    params = make_params(shapes, torch.float32, seed=14)
    po, pt = clone_params(params), clone_params(params)
    ours = mo.AdamW(po[:1], lr=0.01)
    theirs = torch.optim.AdamW(pt[:1], lr=0.01, foreach=False)
    for k, g in enumerate(grads):
        if k == 1:
            ours.add_param_group({"params": po[1:], "lr": 0.02})
            theirs.add_param_group({"params": pt[1:], "lr": 0.02})
        for p, q, gi in zip(po, pt, g):
            p.grad, q.grad = gi.clone(), gi.clone()
        ours.step()
        theirs.step()
    compare_states(check, "add_param_group", ours, theirs, po, pt)


def check_zero_copy(check):
    """The step updates the Python tensors themselves (same storage before and after), and
    .state's tensors are the leaf's live state (a write through them is what the next step
    reads), as with torch's own optimizers."""
    import torch

    import mixtrain.optim as mo

    p = make_params([(16, 8)], torch.float32, seed=17)
    q = clone_params(p)
    ours, theirs = mo.AdamW(p, lr=0.01), torch.optim.AdamW(q, lr=0.01, foreach=False)
    address = p[0].data_ptr()
    for a, b in ((ours, p), (theirs, q)):
        b[0].grad = torch.ones(16, 8)
        a.step()
    check.expect(p[0].data_ptr() == address, "the step moved the parameter's storage")
    state = ours.state[p[0]]["exp_avg"]
    check.expect(state.data_ptr() == ours.state[p[0]]["exp_avg"].data_ptr(),
                 ".state gave a copy, not the live state")
    state.mul_(0.5)
    theirs.state[q[0]]["exp_avg"].mul_(0.5)
    for a, b in ((ours, p), (theirs, q)):
        b[0].grad = torch.ones(16, 8)
        a.step()
    compare_states(check, "zero copy", ours, theirs, p, q)


def check_routing(check):
    import torch

    import mixtrain.optim as mo

    model = torch.nn.Module()
    model.embed_tokens = torch.nn.Embedding(10, 4)
    model.q_proj = torch.nn.Linear(4, 4)
    model.norm = torch.nn.LayerNorm(4)
    model.lm_head = torch.nn.Linear(4, 10, bias=False)
    model.experts = torch.nn.Parameter(torch.zeros(2, 4, 4))
    yaml = mo.muon_param_groups(model)
    routes = dict(yaml.routes)
    check.expect(routes == {"embed_tokens.weight": "adamw", "q_proj.weight": "muon",
                            "q_proj.bias": "adamw_no_decay", "norm.weight": "adamw_no_decay",
                            "norm.bias": "adamw_no_decay", "lm_head.weight": "adamw",
                            "experts": "muon"}, f"yaml routes {routes}")
    check.expect(len(yaml.muon) == 2 and {id(p) for p in yaml.muon} ==
                 {id(model.q_proj.weight), id(model.experts)}, "yaml muon list")
    check.expect(len(yaml.adamw) == 2 and yaml.adamw[1]["weight_decay"] == 0.0,
                 "yaml adamw groups")
    toml = dict(mo.muon_param_groups(model, rule="toml", adamw_keywords=["q_proj"]).routes)
    check.expect(toml["q_proj.weight"] == "adamw" and toml["experts"] == "muon",
                 f"toml routes {toml}")
    expect_error(check, "nothing to Muon", ValueError,
                 lambda: mo.muon_param_groups(torch.nn.Linear(2, 2, bias=False),
                                              adamw_keywords=["weight"]), "Muon")


def main():
    if "--fused-only" in sys.argv:
        import torch

        sys.argv.remove("--fused-only")
        check = util.Checker()
        torch.set_num_threads(1)
        capability = torch.backends.cpu.get_cpu_capability()
        print("capability", capability)
        check_adamw_fused(check, capability)
        check.finish()
        return
    args, check = util.start(__doc__.splitlines()[0])
    del args
    check_adamw_fused_every_capability(check)
    check_adamw(check)
    check_sgd(check)
    check_muon(check)
    check_mixtrain_forms(check)
    check_muon_against_formulas(check)
    check_muon_head_split(check)
    check_refusals(check)
    check_failed_load_changes_nothing(check)
    check_add_param_group(check)
    check_zero_copy(check)
    check_routing(check)
    check.finish()


if __name__ == "__main__":
    main()
