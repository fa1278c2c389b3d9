"""mixtrain.checkpoint: a run moves between `mixtrain train` and Python without losing a bit.

1. CLI -> Python -> CLI: the trainer (Qwen2-MoE tiny: bfloat16, FP32 main params, Muon + AdamW,
   LR warmup + cosine) saves step 2 and runs on to step 4. Python loads step 2 (model,
   optimizers rebuilt from the checkpoint's param groups, state, main params), checks that the
   groups and options it rebuilt write back as the same JSON, and saves it again as another
   run's step 2. The trainer resumed from the Python-written step 2 reaches a step 4 whose every
   tensor equals the uninterrupted run's, bitwise, with the same losses; `ckpt verify` passes
   on the Python-written checkpoint.
2. Python -> CLI: Python steps the loaded model's optimizer (synthetic gradients) and saves
   step 3; the trainer resumes from it (it must accept everything Python wrote) and its
   restored state is Python's: the trainer saves again at once (step 3 -> 4 with 1 more step is
   not comparable, so the check is the restore itself plus `ckpt verify`), and Python reads
   back the trainer's step-4 checkpoint.
3. Python only: save -> read gives the same tensors, and a wrong model or a damaged file is
   refused naming the problem, the model untouched; save(keep_last=N) leaves the newest N steps
   (the right ones, with their contents) and nothing else of its own removed.
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import oracle_util as util  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "configs",
                      "qwen2_moe_tiny.yaml")


def train(binary, run_dir, steps, restore_from=None, interval=2):
    args = ["train", "--config", CONFIG, "--run-dir", run_dir, "--set", f"train.steps={steps}",
            "--set", f"checkpoint.interval={interval}", "--set", "train.log_every=1"]
    if restore_from:
        args += ["--set", f"checkpoint.restore_from={restore_from}"]
    return util.run_mixtrain(binary, args)


def losses(run_dir):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "step" in r}


def same(a, b):
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def model_from(checkpoint):
    """(name, Parameter) pairs of the checkpoint's model, as a Python model would hold them."""
    import torch

    import mixtrain.checkpoint as mc

    return [(k[len(mc.MODEL_PREFIX):], torch.nn.Parameter(torch.zeros_like(v)))
            for k, v in checkpoint.tensors.items() if k.startswith(mc.MODEL_PREFIX)]


def check_cli_python_cli(check, binary, root):
    import mixtrain.checkpoint as mc

    run_a, run_b = os.path.join(root, "a"), os.path.join(root, "b")
    train(binary, run_a, 4)
    step2 = os.path.join(run_a, "checkpoints", "step-00000002")
    ckpt = mc.read(step2)
    model = model_from(ckpt)
    ckpt.load_model(model)
    opt = ckpt.optimizer(model)
    for name, p in model:
        check.expect(same(p.detach(), ckpt.tensors[mc.MODEL_PREFIX + name]), f"{name}: loaded")
    rebuilt = mc._param_groups(opt)
    check.expect(rebuilt == ckpt.state["optimizer"]["param_groups"],
                 "the rebuilt optimizers' groups write back differently:\n"
                 f"{json.dumps(rebuilt)}\n{json.dumps(ckpt.state['optimizer']['param_groups'])}")
    mc.save(os.path.join(run_b, "checkpoints"), 2, model, opt, state=ckpt.state)
    util.run_mixtrain(binary, ["ckpt", "verify", os.path.join(run_b, "checkpoints")])
    again = mc.read(os.path.join(run_b, "checkpoints"))
    check.expect(set(again.tensors) == set(ckpt.tensors),
                 f"keys differ: {sorted(set(again.tensors) ^ set(ckpt.tensors))}")
    check.expect(all(same(again.tensors[k], v) for k, v in ckpt.tensors.items() if k in
                     again.tensors), "a tensor changed on the way through Python")

    train(binary, run_b, 4, restore_from=os.path.join(run_b, "checkpoints"))
    reference = mc.read(os.path.join(run_a, "checkpoints", "step-00000004"))
    resumed = mc.read(os.path.join(run_b, "checkpoints", "step-00000004"))
    check.expect(set(reference.tensors) == set(resumed.tensors), "step-4 keys differ")
    different = [k for k, v in reference.tensors.items()
                 if k in resumed.tensors and not same(resumed.tensors[k], v)]
    check.expect(not different, f"step 4 after the Python round trip differs in {different[:5]}")
    la, lb = losses(run_a), losses(run_b)
    check.expect(all(la.get(s) == lb.get(s) for s in (3, 4)) and 3 in lb,
                 f"losses of steps 3-4: {la} vs {lb}")
    return step2


def check_python_cli(check, binary, root, step2):
    import torch

    import mixtrain.checkpoint as mc

    ckpt = mc.load(step2)
    model = model_from(ckpt)
    ckpt.load_model(model)
    opt = ckpt.optimizer(model)
    gen = torch.Generator().manual_seed(3)
    for _, p in model:
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-2).to(p.dtype)
    opt.step()
    opt.zero_grad()
    run_c = os.path.join(root, "c")
    mc.save(os.path.join(run_c, "checkpoints"), 3, model, opt, state=ckpt.state)
    saved = mc.read(os.path.join(run_c, "checkpoints"))
    out = train(binary, run_c, 4, restore_from=os.path.join(run_c, "checkpoints"), interval=1)
    check.expect("step 3" in out or "restored" in out.lower(), "no restore in the log")
    after = mc.read(os.path.join(run_c, "checkpoints"))
    check.expect(after.step == 4, f"the trainer's checkpoint after the Python one: {after.step}")
    # The trainer's step 4 moved from Python's step 3 (one update of every parameter): every
    # model tensor changed, and Python reads the trainer's checkpoint back.
    moved = [k for k, v in saved.tensors.items() if k.startswith(mc.MODEL_PREFIX)
             and not same(after.tensors[k], v)]
    check.expect(len(moved) > 0, "the trainer did not continue from the Python checkpoint")
    model2 = model_from(after)
    after.load_model(model2)
    after.optimizer(model2)


def check_python_only(check, root):
    import torch

    import mixtrain.checkpoint as mc
    import mixtrain.optim as mo

    gen = torch.Generator().manual_seed(5)
    model = [("w.weight", torch.nn.Parameter(torch.randn(6, 4, generator=gen).bfloat16())),
             ("w.bias", torch.nn.Parameter(torch.randn(6, generator=gen)))]
    groups = mo.muon_param_groups(model)
    opt = mo.FP32MainParams([mo.Muon(groups.muon, lr=0.01, ns_coefficients=[(3.0, -3.2, 1.2)] * 5),
                             mo.AdamW(groups.adamw, lr=1e-3)], model)
    for _, p in model:
        p.grad = torch.ones_like(p)
    opt.step()
    directory = os.path.join(root, "py", "checkpoints")
    mc.save(directory, 1, model, opt)
    back = mc.read(directory)
    check.expect(back.step == 1, f"step {back.step}")
    for name, p in model:
        check.expect(same(back.tensors["model." + name], p.detach()), f"{name} saved")
    for key, value in opt.state_dict()["tensors"].items():
        check.expect(same(back.tensors[key], value), f"{key} saved")
    model2 = [(n, torch.nn.Parameter(torch.zeros_like(p))) for n, p in model]
    back.load_model(model2)
    opt2 = back.optimizer(model2)
    check.expect(opt2.optimizers[0].param_groups[0]["ns_coefficients"] == (3.0, -3.2, 1.2),
                 "Muon's custom coefficients did not come back")
    for key, value in opt.state_dict()["tensors"].items():
        check.expect(same(opt2.state_dict()["tensors"][key], value), f"{key} reloaded")

    wrong = [("w.weight", torch.nn.Parameter(torch.zeros(5, 4))),
             ("other", torch.nn.Parameter(torch.zeros(1)))]
    try:
        back.load_model(wrong)
        check.expect(False, "a model of another shape was loaded")
    except ValueError as error:
        text = str(error)
        check.expect("model.w.weight: shape" in text and "model.other: not in" in text and
                     "model.w.bias: in the checkpoint" in text, f"message {text}")
    check.expect(float(wrong[0][1].detach().abs().sum()) == 0.0, "a refused load changed the model")

    rank_file = os.path.join(back.directory, "__0_0.safetensors")
    with open(rank_file, "r+b") as f:
        f.seek(os.path.getsize(rank_file) - 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    try:
        mc.read(directory)
        check.expect(False, "a damaged rank file was read")
    except RuntimeError as error:
        check.expect("__0_0.safetensors" in str(error) and "checksum" in str(error),
                     f"message {error}")


def check_keep_last(check, root):
    """save(keep_last=N): after each save the newest N complete steps (by step number) remain,
    with their own contents, and `latest` names the one just saved; other files and incomplete
    step directories are left alone; keep_last=0 keeps every step; a save at an earlier step
    (a rerun) keeps the newest N and the step `latest` names (checkpoint/storage.h: never the
    latest)."""
    import torch

    import mixtrain.checkpoint as mc
    import mixtrain.optim as mo

    def steps_in(directory):
        return sorted(int(n[len("step-"):]) for n in os.listdir(directory)
                      if n.startswith("step-") and
                      os.path.exists(os.path.join(directory, n, ".metadata.json")))

    def latest(directory):
        return open(os.path.join(directory, "latest")).read().strip()

    gen = torch.Generator().manual_seed(7)
    model = [("w.weight", torch.nn.Parameter(torch.randn(6, 4, generator=gen).bfloat16())),
             ("w.bias", torch.nn.Parameter(torch.randn(6, generator=gen)))]
    opt = mo.FP32MainParams(mo.AdamW([p for _, p in model], lr=1e-2), model)
    directory = os.path.join(root, "keep", "checkpoints")
    os.makedirs(os.path.join(directory, "step-00000000"))  # no metadata: not a checkpoint
    with open(os.path.join(directory, "notes.txt"), "w") as f:
        f.write("not a checkpoint\n")
    saved = {}
    for step in range(1, 6):
        for _, p in model:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
        opt.step()
        opt.zero_grad()
        saved[step] = {n: p.detach().clone() for n, p in model}
        mc.save(directory, step, model, opt, keep_last=2)
        want = list(range(max(1, step - 1), step + 1))
        check.expect(steps_in(directory) == want,
                     f"keep_last=2 after saving step {step}: {steps_in(directory)}, want {want}")
        check.expect(latest(directory) == f"step-{step:08d}", f"latest {latest(directory)}")
    for step in (4, 5):
        back = mc.read(os.path.join(directory, f"step-{step:08d}"))
        check.expect(back.step == step and all(
            same(back.tensors["model." + n], t) for n, t in saved[step].items()),
            f"keep_last=2: step {step}'s directory does not hold step {step}'s model")
    check.expect(os.path.exists(os.path.join(directory, "notes.txt")) and
                 os.path.isdir(os.path.join(directory, "step-00000000")),
                 "keep_last removed something that is not a complete step directory")

    mc.save(directory, 2, model, opt, keep_last=2)  # a rerun from step 2
    check.expect(steps_in(directory) == [2, 4, 5] and latest(directory) == "step-00000002",
                 f"keep_last=2 after a rerun saved step 2: {steps_in(directory)}, latest "
                 f"{latest(directory)}")

    everything = os.path.join(root, "keep_all", "checkpoints")
    for step in range(1, 4):
        mc.save(everything, step, model, opt)
    check.expect(steps_in(everything) == [1, 2, 3], f"keep_last=0: {steps_in(everything)}")


def main():
    args, check = util.start(__doc__.splitlines()[0])
    with util.temp_dir() as root:
        step2 = check_cli_python_cli(check, args.mixtrain, root)
        check_python_cli(check, args.mixtrain, root, step2)
        check_python_only(check, root)
        check_keep_last(check, root)
    check.finish()


if __name__ == "__main__":
    main()
