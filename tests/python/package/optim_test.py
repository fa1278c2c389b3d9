"""mixtrain.optim.AdamW / SGD / Muon against torch.optim.AdamW(foreach=False) / SGD(foreach=False)
/ Muon, and AdamW(fused=True) against torch's fused AdamW (at every CPU capability, in child
processes), in one process on the same tensors: BITWISE (params and every state tensor after every
step), with LR schedulers, two param groups, an option changed between steps, a closure, and
state_dict() moved both ways between ours and torch's mid-run. Then the contract's edges:
torch's refusals, our refusals of torch options we lack, a load_state_dict that fails changing
nothing, add_param_group keeping state, the routing helper.

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
    """Options torch lacks reach the leaf: float32 Newton-Schulz and the sum momentum differ
    from the defaults; a named schedule and per-step coefficients are accepted."""
    import torch

    import mixtrain.optim as mo

    shapes = [(20, 12)]
    grads = grads_for(shapes, 2, seed=9)
    results = {}
    for name, kwargs in {"default": {}, "float32": {"ns_dtype": torch.float32},
                         "sum": {"momentum_style": "sum"},
                         "asym5": {"ns_variant": "asym5"},
                         "per step": {"ns_coefficients": [(3.4445, -4.7750, 2.0315)] * 5},
                         "normuon": {"normuon": True}}.items():
        ps = make_params(shapes, torch.float32, seed=10)
        opt = mo.Muon(ps, lr=0.02, **kwargs)
        for g in grads:
            ps[0].grad = g[0].clone()
            opt.step()
        results[name] = ps[0].detach()
    for name in ("float32", "sum", "asym5", "normuon"):
        check.expect(not torch.equal(results[name], results["default"]),
                     f"Muon {name}: same result as the defaults (option not applied)")
    check.expect(torch.equal(results["per step"], results["default"]),
                 "Muon with torch's triple written per step differs from the triple")
    opt = mo.Muon(make_params(shapes, torch.float32, seed=10), normuon=True)
    check.expect(opt.param_groups[0]["normuon"] is True, "normuon not in the param group")


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
    check_refusals(check)
    check_failed_load_changes_nothing(check)
    check_add_param_group(check)
    check_zero_copy(check)
    check_routing(check)
    check.finish()


if __name__ == "__main__":
    main()
