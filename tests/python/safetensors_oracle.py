"""safetensors written by our C++ side, read by Python's `safetensors` package.

1. A checkpoint (tiny Qwen2-MoE config: bfloat16 model, fp32 main params, Muon + AdamW, 2 steps
   on 2 ranks with dp_shard 2, so most tensors are split over both rank files). For every rank
   file: safetensors.torch.load_file and safe_open(...).get_tensor / get_slice give the same
   keys, dtypes, shapes and bytes as an independent parse of the file (8-byte header length,
   JSON header, data_offsets: the format's definition); every piece .metadata.json lists is in
   its file under its key with its dtype and sizes, and no other. Values that the C++ side
   guarantees: every bfloat16 model parameter equals its fp32 main param rounded to nearest even
   (the copy-back after each step), assembled from both ranks' pieces; every step counter is 2.
2. `mixtrain optim-replay` output with lr 0 (AdamW and Muon): the parameters come back bitwise
   in their own dtypes (float32, bfloat16, float16), the fp32 main params are the parameters
   widened, the step counters are int64 scalars equal to the number of steps, and AdamW's
   exp_avg and Muon's momentum buffer equal the same ATen ops run here on the same grads
   (exp_avg.lerp_(g, 1 - beta1); buf.mul_(momentum).add_(g), `sum` style), bitwise.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_util as util  # noqa: E402

MAIN = util.MAIN


def raw_read(path):
    """{key: tensor} parsed from the bytes, by the safetensors format's definition alone."""
    import torch

    dtypes = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16,
              "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
              "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
    with open(path, "rb") as f:
        data = f.read()
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    header.pop("__metadata__", None)
    out = {}
    for key, entry in header.items():
        begin, end = entry["data_offsets"]
        payload = bytearray(data[8 + header_len + begin:8 + header_len + end])
        dtype = dtypes[entry["dtype"]]
        flat = (torch.frombuffer(payload, dtype=dtype) if payload
                else torch.empty(0, dtype=dtype))
        out[key] = flat.reshape(entry["shape"])
    return out


def same(a, b):
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def check_rank_file(check, path):
    """Python's readers against the raw parse; returns the file's tensors."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    raw = raw_read(path)
    loaded = load_file(path)
    check.expect(sorted(loaded) == sorted(raw), f"{path}: load_file keys differ from the header")
    with safe_open(path, framework="pt") as f:
        check.expect(sorted(f.keys()) == sorted(raw), f"{path}: safe_open keys differ")
        for key, expected in raw.items():
            check.expect(same(loaded[key], expected), f"{path}: {key}: load_file differs")
            check.expect(same(f.get_tensor(key), expected), f"{path}: {key}: get_tensor differs")
            if expected.dim() > 0:
                check.expect(same(f.get_slice(key)[:], expected),
                             f"{path}: {key}: get_slice differs")
    return loaded


def checkpoint_part(check, binary, directory):
    import torch

    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ckpt = os.path.join(directory, "ckpt")
    util.run_mixtrain(binary, [
        "train", "--config", os.path.join(source, "configs/qwen2_moe_tiny.yaml"),
        "--set", "train.steps=2", "--set", "checkpoint.interval=2",
        "--set", f"checkpoint.dir={ckpt}", "--set", "parallel.dp_shard=2",
        "--run-dir", os.path.join(directory, "run"), "--nproc", "2"])
    step_dir = os.path.join(ckpt, open(os.path.join(ckpt, "latest")).read().strip())
    with open(os.path.join(step_dir, ".metadata.json")) as f:
        metadata = json.load(f)
    files = {name: check_rank_file(check, os.path.join(step_dir, name))
             for name in sorted(os.listdir(step_dir)) if name.endswith(".safetensors")}
    check.expect(len(files) == 2, f"{step_dir}: {len(files)} rank files, expected 2")

    listed = {name: set() for name in files}
    tensors = {}
    split = 0
    for key, entry in metadata["tensors"].items():
        dtype = getattr(torch, entry["dtype"])
        full = torch.empty(entry["shape"], dtype=dtype)
        split += len(entry["chunks"]) > 1
        for chunk in entry["chunks"]:
            piece = files.get(chunk["file"], {}).get(key)
            listed.setdefault(chunk["file"], set()).add(key)
            if not check.expect(piece is not None and piece.dtype == dtype and
                                list(piece.shape) == chunk["sizes"],
                                f"{chunk['file']}: {key}: missing, or not {entry['dtype']} "
                                f"{chunk['sizes']}"):
                continue
            box = tuple(slice(o, o + s) for o, s in zip(chunk["offsets"], chunk["sizes"]))
            full[box] = piece
        tensors[key] = full
    for name, keys in files.items():
        extra = sorted(set(keys) - listed[name])
        check.expect(not extra, f"{name}: keys not in .metadata.json: {extra[:5]}")
    check.expect(split > 0, "no tensor is split over the two rank files")

    mains = [key for key in tensors if key.startswith(MAIN)]
    check.expect(len(mains) > 0, "checkpoint has no fp32 main params")
    for key in mains:
        model = tensors.get("model." + key[len(MAIN):])
        check.expect(model is not None and model.dtype == torch.bfloat16 and
                     same(model, tensors[key].to(torch.bfloat16)),
                     f"{key}: the bfloat16 model param is not the main param rounded")
    steps = [key for key in tensors if key.endswith(".step")]
    check.expect(len(steps) > 0 and all(
        tensors[k].dtype == torch.int64 and tensors[k].dim() == 0 and int(tensors[k]) == 2
        for k in steps), "step counters are not int64 scalars equal to 2")
    print(f"checkpoint: {len(tensors)} tensors ({split} split over 2 files), {len(mains)} main "
          f"params equal to their bf16 model params rounded, {len(steps)} step counters = 2")


def replay_part(check, binary, directory):
    import torch

    steps = 3
    gen = torch.Generator().manual_seed(7)
    params = {"layer.w": torch.randn(6, 5, generator=gen),
              "layer.v": torch.randn(4, 7, generator=gen).bfloat16(),
              "layer.h": torch.randn(9, generator=gen).half(),
              "layer.norm": torch.randn(5, generator=gen).bfloat16()}
    grads = {f"step.{k}.{n}": torch.randn(p.shape, generator=gen) * 0.1
             for k in range(1, steps + 1) for n, p in params.items()}
    config = """optimizer:
  _target_: Muon
  fp32_main_params: true
  muon_config:
    muon_lr: 0.0
    muon_momentum: 0.9
    muon_momentum_style: sum
  adamw_config:
    adamw_lr: 0.0
    adamw_betas: [0.8, 0.99]
""" + util.REPLAY_MIXED_PRECISION
    out = util.optim_replay(binary, directory, config, params, grads)
    path = os.path.join(directory, "o.safetensors")
    check_rank_file(check, path)
    for name, p in params.items():
        check.expect(same(out["model." + name], p), f"replay: model.{name} is not the param")
        if p.dtype != torch.float32:
            check.expect(same(out[MAIN + name], p.float()), f"replay: main param of {name}")
        step = out[f"optimizer.state.{name}.step"]
        check.expect(step.dtype == torch.int64 and step.dim() == 0 and int(step) == steps,
                     f"replay: {name} step {step}")
        state = torch.zeros(p.shape)
        for k in range(1, steps + 1):
            g = grads[f"step.{k}.{name}"]
            if p.dim() == 2:
                state.mul_(0.9).add_(g)
            else:
                state.lerp_(g, 1 - 0.8)
        key = f"optimizer.state.{name}." + ("momentum_buffer" if p.dim() == 2 else "exp_avg")
        check.expect(key in out and same(out[key], state), f"replay: {key} differs")
    print(f"optim-replay: {len(out)} tensors read back as written")


def main():
    args, check = util.start(__doc__.splitlines()[0])
    with util.temp_dir() as directory:
        checkpoint_part(check, args.mixtrain, directory)
        replay_part(check, args.mixtrain, directory)
    check.finish()


if __name__ == "__main__":
    main()
