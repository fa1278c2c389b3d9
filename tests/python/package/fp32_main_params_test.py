"""mixtrain.optim.FP32MainParams: a Python loop with Muon + AdamW behind fp32 main params against
(1) the CLI's `mixtrain optim-replay` on the same gradients and (2) the same loop written in
torch (float32 masters stepped by torch.optim.Muon / AdamW(foreach=False), cast to bfloat16):
BITWISE for the model params, the main params and the optimizer state. Then main_grad
accumulation in backward against accumulation at step() (bitwise), float16 dynamic loss
scaling (an overflowing step is skipped; every loss_scaler option against a scale sequence
worked out by hand and by torch's GradScaler rule), clip_grad_norm_ against
torch.nn.utils.clip_grad_norm_'s two halves (the norm within 2e-6 of torch's in float64, the
clipping bitwise), and state_dict() round trips: an interrupted run resumed from it continues
bitwise; a partial or broken state changes nothing.

Gradients: optim-replay hands each 16-bit parameter its float32 gradient as main_grad; the
Python loop's gradient arrives as .grad in the parameter's dtype. The gradients here are drawn
bfloat16-representable, so both routes carry the same float32 values.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import oracle_util as util  # noqa: E402

util.run_gemms_as_torch()

STEPS = 4
LR_MUON, LR_ADAMW, WD, MU = 0.02, 3e-3, 0.1, 0.95
BETAS, EPS = (0.9, 0.95), 1e-8
SHAPES = {  # routed by the yaml rule: matrices to Muon, the rest to AdamW (norm/bias no decay)
    "embed_tokens.weight": ((30, 16), "bfloat16"),
    "layers.0.attn.q_proj.weight": ((40, 16), "bfloat16"),
    "layers.0.attn.q_proj.bias": ((40,), "float32"),
    "layers.0.mlp.up_proj.weight": ((24, 40), "bfloat16"),
    "layers.0.mlp.down_proj.weight": ((16, 24), "float32"),
    "layers.0.input_layernorm.weight": ((16,), "bfloat16"),
}
NO_DECAY = ("bias", "layernorm")

REPLAY_CONFIG = f"""optimizer:
  _target_: Muon
  fp32_main_params: true
  muon_config:
    muon_lr: {LR_MUON}
    muon_weight_decay: {WD}
    muon_momentum: {MU}
    muon_nesterov: true
    muon_ns_variant: legacy
    muon_ns_steps: 5
    muon_ns_epsilon: 1e-7
    muon_ns_dtype: bfloat16
    muon_adjust_lr_fn: match_rms_adamw
    muon_matched_adamw_rms: 0.2
    muon_momentum_style: ema
  adamw_config:
    adamw_lr: {LR_ADAMW}
    adamw_betas: [{BETAS[0]}, {BETAS[1]}]
    adamw_eps: {EPS}
    adamw_weight_decay: {WD}
""" + util.REPLAY_MIXED_PRECISION


def inputs():
    import torch

    params, grads = util.replay_inputs(SHAPES, STEPS, seed=20261204)
    # bfloat16-representable gradients (see the top): the same float32 values on both routes.
    grads = {k: v.to(torch.bfloat16).float() for k, v in grads.items()}
    return params, grads


def named_parameters(params):
    import torch

    return [(n, torch.nn.Parameter(t.clone())) for n, t in params.items()]


def python_loop(params, grads, steps=STEPS, stop_after=None, **kwargs):
    """Our loop; returns (named params, wrapper)."""
    named = named_parameters(params)
    opt = build(named, **kwargs)
    for k in range(1, (stop_after or steps) + 1):
        run_step(opt, named, grads, k)
    return named, opt


def build(named, **kwargs):
    import mixtrain.optim as mo

    groups = mo.muon_param_groups(named)
    muon = mo.Muon(groups.muon, lr=LR_MUON, weight_decay=WD, momentum=MU,
                   adjust_lr_fn="match_rms_adamw")
    adamw = mo.AdamW(groups.adamw, lr=LR_ADAMW, betas=BETAS, eps=EPS, weight_decay=WD)
    return mo.FP32MainParams([muon, adamw], named, **kwargs)


def run_step(opt, named, grads, k):
    for name, p in named:
        p.grad = grads[f"step.{k}.{name}"].to(p.dtype)
    opt.step()
    opt.zero_grad()


def torch_loop(params, grads):
    import torch

    masters = {n: t.detach().float().clone().requires_grad_() for n, t in params.items()}
    muon = [m for n, m in masters.items() if m.dim() >= 2 and "embed" not in n]
    rest = [(n, m) for n, m in masters.items() if not (m.dim() >= 2 and "embed" not in n)]
    decay = [m for n, m in rest if not any(s in n for s in NO_DECAY)]
    no_decay = [m for n, m in rest if any(s in n for s in NO_DECAY)]
    opts = [torch.optim.Muon(muon, lr=LR_MUON, weight_decay=WD, momentum=MU,
                             adjust_lr_fn="match_rms_adamw"),
            torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
                              lr=LR_ADAMW, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)]
    for k in range(1, STEPS + 1):
        for n, m in masters.items():
            m.grad = grads[f"step.{k}.{n}"].clone()
        for opt in opts:
            opt.step()
    return {n: m.detach() for n, m in masters.items()}


def same(a, b):
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def check_against_replay_and_torch(check, binary):
    import torch

    params, grads = inputs()
    named, opt = python_loop(params, grads)
    ours = dict(opt.state_dict()["tensors"])
    with util.temp_dir() as directory:
        replay = util.optim_replay(binary, directory, REPLAY_CONFIG, params, grads)
    masters = torch_loop(params, grads)
    for name, p in named:
        check.expect(same(p.detach(), replay["model." + name]), f"{name}: model param vs replay")
        check.expect(same(p.detach(), masters[name].to(p.dtype)), f"{name}: model param vs torch")
        main = opt.main_param(name)
        check.expect(same(main.detach(), masters[name]), f"{name}: main param vs torch")
        key = util.MAIN + name
        if p.dtype != torch.float32:
            check.expect(key in ours and same(ours[key], replay[key]), f"{key} vs replay")
        else:
            check.expect(key not in ours, f"{key}: a float32 param has no separate main param")
    state_keys = {k for k in replay if k.startswith("optimizer.state.")}
    check.expect(state_keys == {k for k in ours if k.startswith("optimizer.state.")},
                 f"state keys differ: {sorted(state_keys ^ set(ours))}")
    for key in sorted(state_keys):
        if key in ours:
            check.expect(same(ours[key], replay[key]), f"{key} vs replay")


def check_backward_accumulation(check):
    """A bfloat16 model, 2 micro-batches a step, one weight used twice: main_grad added in
    backward (hooks) == accumulate_grads() after each micro-batch (bitwise); .grad is None
    after backward with the hooks."""
    import torch

    def model_and_data():
        gen = torch.Generator().manual_seed(7)
        lin = torch.nn.Linear(12, 12).to(torch.bfloat16)
        head = torch.nn.Linear(12, 3, bias=False).to(torch.bfloat16)
        with torch.no_grad():
            for p in list(lin.parameters()) + list(head.parameters()):
                p.copy_(torch.randn(p.shape, generator=gen).to(p.dtype) * 0.3)
        model = torch.nn.ModuleDict({"lin": lin, "head": head})
        data = [torch.randn(5, 12, generator=gen).to(torch.bfloat16) for _ in range(6)]
        return model, data

    results = []
    for hooked in (True, False):
        model, data = model_and_data()
        opt = build(list(model.named_parameters()), accumulate_in_backward=hooked)
        for step in range(3):
            for micro in range(2):
                x = data[2 * step + micro]
                y = model["head"](model["lin"](model["lin"](x)))  # lin used twice
                y.float().pow(2).mean().backward()
                if not hooked:
                    opt.accumulate_grads()
            if hooked:
                check.expect(model["lin"].weight.grad is None, "hooked: .grad after backward")
                check.expect(opt.main_grad("lin.weight") is not None, "hooked: no main_grad")
            opt.step()
            opt.zero_grad()
        results.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for name in results[0]:
        check.expect(same(results[0][name], results[1][name]), f"{name}: hooks vs accumulate_grads")


def check_float16_loss_scaling(check):
    import torch

    named = [("w.weight", torch.nn.Parameter(torch.randn(8, 6).half())),
             ("w.bias", torch.nn.Parameter(torch.randn(8).half()))]
    opt = build(named, loss_scaler={"initial_scale": 1024.0})
    check.expect(opt.loss_scale == 1024.0, f"initial loss scale {opt.loss_scale}")
    before = [p.detach().clone() for _, p in named]
    for _, p in named:
        p.grad = torch.full_like(p, float("inf"))
    opt.step()
    opt.zero_grad()
    check.expect(opt.skipped_steps == 1, f"skipped_steps {opt.skipped_steps}")
    check.expect(opt.loss_scale == 512.0, f"loss scale after overflow {opt.loss_scale}")
    check.expect(all(same(p.detach(), b) for (_, p), b in zip(named, before)),
                 "an overflowing step changed the params")
    for _, p in named:
        p.grad = torch.full_like(p, 512.0)  # scaled gradient 1.0 per element
    opt.step()
    check.expect(not all(same(p.detach(), b) for (_, p), b in zip(named, before)),
                 "a clean step after the overflow did not update")
    saved = opt.state_dict()
    check.expect(saved["loss_scaler"] is not None and saved["loss_scaler"][0] == 512.0,
                 f"loss_scaler state {saved['loss_scaler']}")


def check_loss_scaler_trajectory(check):
    """Every loss_scaler option against a scale sequence worked out by hand (and by torch's
    GradScaler rule, torch._amp_update_scale_, with our documented floor min_scale on top):
    initial 8, x4 after 3 consecutive clean steps, x0.25 on an overflow, never below 0.5. Exact
    values (powers of two) throughout, so every comparison is bitwise. A float16 parameter under
    SGD(lr=1) whose every clean step's gradient is 0.25 * the scale in effect: its main param
    must drop by exactly 0.25 per clean step (the unscale uses the scale from before that step's
    update) and not at all on an overflow step (skipped, counted)."""
    import torch

    import mixtrain.optim as mo

    options = {"initial_scale": 8.0, "growth_factor": 4.0, "backoff_factor": 0.25,
               "growth_interval": 3, "min_scale": 0.5}
    overflow = [0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0]  # 1: an inf or nan in the gradients
    # step:    1  2  3   4   5  6  7  8  9    10   11   12   13
    by_hand = [8, 8, 32, 32, 8, 8, 8, 2, 0.5, 0.5, 0.5, 0.5, 2]  # the scale after each step
    trackers = [1, 2, 0, 1, 0, 1, 2, 0, 0, 0, 1, 2, 0]            # clean steps since a change
    torch_scale = torch.tensor([options["initial_scale"]])
    torch_tracker = torch.zeros(1, dtype=torch.int32)
    for k, found in enumerate(overflow):
        torch._amp_update_scale_(torch_scale, torch_tracker, torch.tensor([float(found)]),
                                 options["growth_factor"], options["backoff_factor"],
                                 options["growth_interval"])
        torch_scale.clamp_(min=options["min_scale"])
        check.expect(float(torch_scale) == by_hand[k] and int(torch_tracker) == trackers[k],
                     f"the hand-worked sequence disagrees with torch's rule at step {k + 1}")

    named = [("w.weight", torch.nn.Parameter(torch.ones(4, 4, dtype=torch.float16)))]
    opt = mo.FP32MainParams(mo.SGD([p for _, p in named], lr=1.0), named, loss_scaler=options)
    check.expect(opt.loss_scale == 8.0, f"initial loss scale {opt.loss_scale}")
    expected_main, skipped = 1.0, 0
    for k, found in enumerate(overflow):
        grad = torch.full((4, 4), 0.25 * opt.loss_scale, dtype=torch.float16)
        if found:
            grad[1, 2] = float("inf") if k % 2 else float("nan")  # one bad element suffices
            skipped += 1
        else:
            expected_main -= 0.25
        named[0][1].grad = grad
        opt.step()
        opt.zero_grad()
        label = f"loss scaler step {k + 1} ({'overflow' if found else 'clean'})"
        check.expect(opt.loss_scale == by_hand[k], f"{label}: scale {opt.loss_scale}, "
                     f"expected {by_hand[k]}")
        check.expect(tuple(opt.state_dict()["loss_scaler"]) == (by_hand[k], trackers[k], skipped),
                     f"{label}: (scale, growth_tracker, skipped) "
                     f"{opt.state_dict()['loss_scaler']}")
        check.expect(opt.skipped_steps == skipped, f"{label}: skipped_steps {opt.skipped_steps}")
        main = opt.main_param("w.weight").detach()
        check.expect(torch.equal(main, torch.full((4, 4), expected_main)),
                     f"{label}: main param {main[0, 0].item()}, expected {expected_main}")
        check.expect(torch.equal(named[0][1].detach(), main.half()), f"{label}: model param")

    # Invalid options are refused naming the option (with a float16 parameter to scale).
    for bad, word in (({"growth_factor": 1.0}, "growth_factor"),
                      ({"backoff_factor": 1.0}, "backoff_factor"),
                      ({"growth_interval": 0}, "growth_interval"),
                      ({"initial_scale": 0.0}, "initial_scale"),
                      ({"min_scale": -1.0}, "min_scale"),
                      ({"max_scale": 2.0}, "max_scale")):
        p = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
        try:
            mo.FP32MainParams(mo.SGD([p]), [("p", p)], loss_scaler=bad)
            check.expect(False, f"loss_scaler={bad} was accepted")
        except ValueError as error:
            check.expect(word in str(error), f"loss_scaler={bad}: message {error}")


def check_clip_grad_norm(check):
    """opt.clip_grad_norm_(max_norm) against torch.nn.utils.clip_grad_norm_, which is
    get_total_norm followed by clip_grads_with_norm_ (torch's own docstring), each half against
    torch: the norm against torch's get_total_norm of the main grads in float64 (ours sums in
    double; torch's float32 get_total_norm is itself off by up to ~5e-6 relative on a 10^5-element
    gradient, so its float32 bits are no reference), the clipping bitwise against torch's
    clip_grads_with_norm_ given our norm. Parameter sets: float32 (their own main params),
    bfloat16, and bfloat16 + float32 + float16 together (the float16 one brings the loss
    scaler: every gradient carries the scale, 8 here, and is unscaled before the clip); each with
    clipping active and inactive. Then the step (SGD, lr 1) uses the clipped gradients."""
    import torch

    import mixtrain.optim as mo

    sets = {
        "float32": [("a.weight", (33, 17), torch.float32), ("a.bias", (64,), torch.float32)],
        "bfloat16": [("a.weight", (33, 17), torch.bfloat16), ("b.weight", (1000,), torch.bfloat16)],
        "mixed": [("a.weight", (33, 17), torch.bfloat16), ("a.bias", (64,), torch.float32),
                  ("c.weight", (5, 7, 9), torch.float16), ("d.weight", (20011,), torch.float32)],
    }
    # Norm tolerance, relative: the sum-of-squares kernel adds at most 64 float32 squares per lane
    # before flushing to double (optim/grad_clip.h; tests/unit/optim/grad_clip_test.cpp): at most
    # 64 * 2^-24 = 3.8e-6 on the sum, half that on the norm. Measured <= 5e-8 here.
    norm_tolerance = 2e-6
    gen = torch.Generator().manual_seed(41)
    for set_name, specs in sets.items():
        for max_norm, active in ((0.5, True), (1e6, False)):
            label = f"clip_grad_norm_ {set_name} ({'clipping' if active else 'not clipping'})"
            named = [(n, torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)))
                     for n, shape, dtype in specs]
            start = {n: p.detach().clone() for n, p in named}
            opt = mo.FP32MainParams(mo.SGD([p for _, p in named], lr=1.0), named,
                                    loss_scaler={"initial_scale": 8.0})
            scale = opt.loss_scale  # 8 with the float16 parameter, else 1 (no scaler)
            # Unscaled gradients spanning 10^-2 .. 10^2, representable in each dtype after the
            # (power-of-two) scale, so the float32 main grads are known exactly.
            grads = {n: (torch.randn(shape, generator=gen) *
                         10 ** (torch.rand(shape, generator=gen) * 4 - 2) * scale).to(dtype)
                     for n, shape, dtype in specs}
            main_grads = {n: g.float() / scale for n, g in grads.items()}
            for n, p in named:
                p.grad = grads[n]
            ours = opt.clip_grad_norm_(max_norm)

            exact = float(torch.nn.utils.get_total_norm([g.double() for g in main_grads.values()]))
            check.expect(abs(ours - exact) <= norm_tolerance * exact,
                         f"{label}: norm {ours!r}, torch in float64 {exact!r}")
            reference = [torch.nn.Parameter(torch.zeros_like(g)) for g in main_grads.values()]
            for r, g in zip(reference, main_grads.values()):
                r.grad = g.clone()
            torch.nn.utils.clip_grads_with_norm_(reference, max_norm,
                                                 torch.tensor(ours, dtype=torch.float64))
            for (n, _), r in zip(named, reference):
                check.expect(same(opt.main_grad(n), r.grad), f"{label}: {n} clipped grad differs "
                             "from torch's clip_grads_with_norm_")
            coefficient = max_norm / (exact + 1e-6)
            check.expect((coefficient < 1.0) == active, f"{label}: case set up wrong")
            if not active:  # then torch's whole clip_grad_norm_ leaves the same bits
                whole = [torch.nn.Parameter(torch.zeros_like(g)) for g in main_grads.values()]
                for w, g in zip(whole, main_grads.values()):
                    w.grad = g.clone()
                torch.nn.utils.clip_grad_norm_(whole, max_norm)
                check.expect(all(same(opt.main_grad(n), w.grad) for (n, _), w in zip(named, whole)),
                             f"{label}: grads differ from torch.nn.utils.clip_grad_norm_'s")

            # The step takes the clipped grads: torch's SGD(lr=1) on float32 copies of the start.
            masters = [torch.nn.Parameter(start[n].float()) for n, _ in named]
            for m, r in zip(masters, reference):
                m.grad = r.grad.clone()
            torch.optim.SGD(masters, lr=1.0, foreach=False).step()
            opt.step()
            for (n, p), m in zip(named, masters):
                check.expect(same(opt.main_param(n).detach(), m.detach()),
                             f"{label}: {n} main param after the step")
                check.expect(same(p.detach(), m.detach().to(p.dtype)),
                             f"{label}: {n} model param after the step")


def check_resume(check):
    """Stop after 2 steps, save, build everything anew from the saved model params and the
    optimizer state, continue: the same bits as 4 uninterrupted steps."""
    import torch

    params, grads = inputs()
    full, _ = python_loop(params, grads)
    named, opt = python_loop(params, grads, stop_after=2)
    saved = opt.state_dict()
    saved = {"tensors": {k: v.clone() for k, v in saved["tensors"].items()},
             "param_groups": saved["param_groups"], "loss_scaler": saved["loss_scaler"]}
    model = {n: p.detach().clone() for n, p in named}
    resumed = named_parameters(model)
    opt2 = build(resumed)
    opt2.load_state_dict(saved)
    for k in (3, 4):
        run_step(opt2, resumed, grads, k)
    for (name, a), (_, b) in zip(full, resumed):
        check.expect(same(a.detach(), b.detach()), f"{name}: resumed run differs")

    # Broken states: a wrong shape, and main params for only some parameters: refused, the
    # live state unchanged.
    before = {k: v.clone() for k, v in opt2.state_dict()["tensors"].items()}
    bad = dict(saved, tensors=dict(saved["tensors"]))
    bad["tensors"]["optimizer.state.layers.0.attn.q_proj.bias.exp_avg"] = torch.zeros(3)
    partial = dict(saved, tensors={k: v for k, v in saved["tensors"].items()
                                   if k != util.MAIN + "embed_tokens.weight"})
    wrong_groups = dict(saved, param_groups=saved["param_groups"][:1])
    for label, state, word in (("shape", bad, "exp_avg"), ("partial", partial, "embed_tokens"),
                               ("groups", wrong_groups, "param groups")):
        try:
            opt2.load_state_dict(state)
            check.expect(False, f"load of a {label} problem did not fail")
        except ValueError as error:
            check.expect(word in str(error), f"{label}: message {error}")
        after = opt2.state_dict()["tensors"]
        check.expect(all(same(after[k], v) for k, v in before.items()),
                     f"a failed {label} load changed the state")


def check_swap(check):
    """The swap optimizer (state in a file between steps): the same bits as without, and its
    state reads back through state_dict() and .state."""
    params, grads = inputs()
    plain, plain_opt = python_loop(params, grads)
    with util.temp_dir() as directory:
        path = os.path.join(directory, "state.swap")
        swapped, opt = python_loop(params, grads, swap={"file": path, "bucket_mb": 1})
        check.expect(os.path.getsize(path) > 0, "nothing was written to the swap file")
        for (name, a), (_, b) in zip(plain, swapped):
            check.expect(same(a.detach(), b.detach()), f"{name}: swap on vs off")
        ours, theirs = opt.state_dict()["tensors"], plain_opt.state_dict()["tensors"]
        check.expect(set(ours) == set(theirs), "swap: state_dict keys")
        check.expect(all(same(ours[k], theirs[k]) for k in theirs), "swap: state_dict values")
        inner = opt.optimizers[0]
        p = inner.param_groups[0]["params"][0]
        q = plain_opt.optimizers[0].param_groups[0]["params"][0]
        check.expect(same(inner.state[p]["momentum_buffer"],
                          plain_opt.optimizers[0].state[q]["momentum_buffer"]),
                     "swap: .state read through the swap")
        del opt, inner
    try:
        build(named_parameters(params), swap={})
        check.expect(False, "a CPU swap without a file was accepted")
    except ValueError as error:
        check.expect("file" in str(error), f"message {error}")


def check_fused_adamw(check):
    """FP32MainParams(AdamW(fused=True)) == torch's fused AdamW on float32 masters cast to
    bfloat16, bitwise, with sizes that leave a tail of every length class (the copy of the
    tail into the model params included)."""
    import torch

    import mixtrain.optim as mo

    gen = torch.Generator().manual_seed(21)
    shapes = {"a.weight": (37, 11), "b.weight": (64,), "c.weight": (9,), "d.weight": (1031,)}
    params = {n: (torch.randn(s, generator=gen) * 0.5).bfloat16() for n, s in shapes.items()}
    grads = [{n: torch.randn(s, generator=gen).bfloat16().float() for n, s in shapes.items()}
             for _ in range(3)]
    named = named_parameters(params)
    opt = mo.FP32MainParams(mo.AdamW([p for _, p in named], lr=1e-2, weight_decay=0.1,
                                     fused=True), named)
    masters = {n: t.float().clone().requires_grad_() for n, t in params.items()}
    ref = torch.optim.AdamW(list(masters.values()), lr=1e-2, weight_decay=0.1, fused=True)
    for step_grads in grads:
        for n, p in named:
            p.grad = step_grads[n].bfloat16()
            masters[n].grad = step_grads[n].clone()
        opt.step()
        opt.zero_grad()
        ref.step()
    for n, p in named:
        check.expect(same(opt.main_param(n).detach(), masters[n].detach()), f"{n}: fused main")
        check.expect(same(p.detach(), masters[n].detach().bfloat16()), f"{n}: fused model")


def check_wrapping_rules(check):
    import torch

    import mixtrain.optim as mo

    named = [("a.weight", torch.nn.Parameter(torch.randn(4, 4).bfloat16()))]
    adamw = mo.AdamW([p for _, p in named])
    try:
        mo.FP32MainParams(adamw, [("other", torch.nn.Parameter(torch.zeros(1)))])
        check.expect(False, "a param outside `model` was accepted")
    except ValueError as error:
        check.expect("not a parameter of `model`" in str(error), f"message {error}")
    opt = mo.FP32MainParams(adamw, named)
    check.expect(adamw.param_groups[0]["params"][0].dtype == torch.float32,
                 "the wrapped optimizer's group does not hold the float32 main param")
    check.expect(opt.param_groups[0] is adamw.param_groups[0], "param_groups are not shared")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    named[0][1].grad = torch.ones(4, 4).bfloat16()
    opt.step()
    sched.step()
    check.expect(adamw.param_groups[0]["lr"] == 5e-4, "a scheduler over the wrapper")
    try:
        adamw.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
        check.expect(False, "add_param_group after wrapping was accepted")
    except RuntimeError as error:
        check.expect("FP32MainParams" in str(error), f"message {error}")
    try:
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
        check.expect(False, "add_param_group on the wrapper was accepted")
    except RuntimeError as error:
        check.expect("before wrapping" in str(error), f"message {error}")
    try:
        mo.FP32MainParams(torch.optim.SGD([named[0][1]]), named)
        check.expect(False, "a torch optimizer was wrapped")
    except TypeError as error:
        check.expect("mixtrain.optim" in str(error), f"message {error}")


def main():
    args, check = util.start(__doc__.splitlines()[0])
    check_against_replay_and_torch(check, args.mixtrain)
    check_backward_accumulation(check)
    check_float16_loss_scaling(check)
    check_loss_scaler_trajectory(check)
    check_clip_grad_norm(check)
    check_resume(check)
    check_swap(check)
    check_fused_adamw(check)
    check_wrapping_rules(check)
    check.finish()


if __name__ == "__main__":
    main()
