"""Eager PyTorch 2.x twin of mixtrain's training step (issue 13, "Performance").

The same Qwen2-MoE (twin_model.py: names, shapes, init, numerics of src/mixtrain/model/) and the
same optimizer step (twin_optim.py: routing, fp32 main params and main_grad, clipping, AdamW +
Muon with Newton-Schulz in bfloat16, LR schedule) written as the Python originals write them
(Hugging Face, torchtitan, Megatron-LM, Moonlight), read from OUR YAML config, so a config has
the same shapes and FLOPs in both. One step = global_batch_size / micro_batch_size
micro-batches of random tokens (uniform over the vocabulary, [micro_batch_size, seq_len + 1]
each, drawn inside the step as ours draws its batch), forward, cross-entropy on float32 logits
+ router_aux_loss_coef * aux loss, backward of loss / accumulation steps, then the optimizer.

With --device cuda (issue 15; default: the config's train.device, cpu unless set) the model is
built and initialised on the CPU as on cpu, then moved to the current CUDA device (cuda:0) with
its optimizer state; the tokens are drawn on the CPU generator as on cpu and moved; each phase
ends with torch.cuda.synchronize(), so its seconds are the device's work, and each step row has
"peak_device_bytes" (torch.cuda.max_memory_allocated, reset at the step's start).

Usage: qwen2_moe_twin.py --config FILE [--steps N] [--threads T] [--attention eager|sdpa]
                         [--adamw-impl default|foreach|fused] [--seed S] [--device cpu|cuda]
Prints JSON lines on stdout: one per step {"step", "elapsed_s" (the step's wall time),
"tokens", "tokens_per_s", "loss", "grad_norm", "forward_s", "backward_s", "optimizer_s"
[, "peak_device_bytes"]}, then {"summary": {"median_tokens_per_s" (over steps 2..N: step 1
creates the optimizer state), "params", "active_params", "flops_per_token" (twin_model.py), ...}}.
One intra-op thread by default.
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

# torch warns at import when numpy is absent (our environment has none); nothing here uses it.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from twin_config import load_config  # noqa: E402
from twin_model import Qwen2MoeForCausalLM  # noqa: E402
from twin_optim import DTYPES, MixedPrecisionOptimizer  # noqa: E402


class Twin:
    """Model + optimizer for one config; step() is one optimizer step on given micro-batches."""

    def __init__(self, config, attention="eager", adamw_impl="default", seed=None,
                 device="cpu"):
        self.config = config
        self.device = torch.device(device)
        self.model = Qwen2MoeForCausalLM(config, attention)
        self.model.init_weights(config["train.seed"] if seed is None else seed)
        self.model.to(DTYPES[config["model_init_dtype"] or "float32"])
        self.model.to(self.device)  # before the optimizer: main params live beside the model
        self.optimizer = MixedPrecisionOptimizer(self.model, config, adamw_impl)
        self.accumulation = config["data.global_batch_size"] // config["data.micro_batch_size"]
        if self.accumulation * config["data.micro_batch_size"] != config["data.global_batch_size"]:
            raise ValueError("data.global_batch_size must be a multiple of data.micro_batch_size")

    def random_micro_batch(self, generator):
        c = self.config
        tokens = torch.randint(c["model.vocab_size"], (c["data.micro_batch_size"],
                                                       c["data.seq_len"] + 1), generator=generator)
        tokens = tokens.to(self.device)
        return tokens[:, :-1], tokens[:, 1:]

    def sync(self):
        """Waits for the device's queued work (cuda); nothing on the CPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def forward_loss(self, input_ids, labels):
        """(loss = cross-entropy + coef * aux as a graph, aux) for one micro-batch."""
        logits, aux = self.model(input_ids)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
        return ce + self.config["model.router_aux_loss_coef"] * aux, aux

    def step(self, micro_batches, step, total_steps, times=None):
        """-> (mean loss, mean aux loss, pre-clip grad norm) of one optimizer step; adds the
        seconds of forward (with the loss), backward and optimizer (clip, update, copy-back) to
        `times` when given (ours: train.profile)."""
        times = {} if times is None else times
        loss_sum = aux_sum = 0.0
        for input_ids, labels in micro_batches:
            start = time.perf_counter()
            loss, aux = self.forward_loss(input_ids, labels)
            self.sync()
            middle = time.perf_counter()
            (loss / len(micro_batches)).backward()
            loss_sum += loss.item()
            aux_sum += aux.item()
            self.sync()
            end = time.perf_counter()
            times["forward_s"] = times.get("forward_s", 0.0) + middle - start
            times["backward_s"] = times.get("backward_s", 0.0) + end - middle
        start = time.perf_counter()
        norm = self.optimizer.step(step, total_steps)
        self.sync()
        times["optimizer_s"] = times.get("optimizer_s", 0.0) + time.perf_counter() - start
        return loss_sum / len(micro_batches), aux_sum / len(micro_batches), norm


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a mixtrain YAML config")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: train.steps)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--attention", choices=("eager", "sdpa"), default="eager")
    parser.add_argument("--adamw-impl", choices=("default", "foreach", "fused"),
                        default="default")
    parser.add_argument("--seed", type=int, help="init and data seed (default: train.seed)")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="where the model computes (default: train.device)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    device = args.device or config["train.device"]
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    steps = args.steps or config["train.steps"]
    if steps < 2:
        parser.error("--steps must be >= 2 (step 1 is not counted)")
    seed = config["train.seed"] if args.seed is None else args.seed
    twin = Twin(config, args.attention, args.adamw_impl, seed, device)
    on_cuda = twin.device.type == "cuda"
    generator = torch.Generator().manual_seed(seed + 1)
    tokens = config["data.global_batch_size"] * config["data.seq_len"]
    rates, peaks = [], []
    for step in range(1, steps + 1):
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(twin.device)
        start = time.perf_counter()
        batches = [twin.random_micro_batch(generator) for _ in range(twin.accumulation)]
        times = {}
        loss, _, norm = twin.step(batches, step, steps, times)
        twin.sync()
        elapsed = time.perf_counter() - start
        if on_cuda:
            peaks.append(torch.cuda.max_memory_allocated(twin.device))
            times["peak_device_bytes"] = peaks[-1]
        if step > 1:
            rates.append(tokens / elapsed)
        print(json.dumps({"step": step, "elapsed_s": elapsed, "tokens": tokens,
                          "tokens_per_s": tokens / elapsed, "loss": loss, "grad_norm": norm,
                          **times}), flush=True)
    params, active = twin.model.param_counts()
    summary = {
        "median_tokens_per_s": statistics.median(rates), "steps": steps, "counted": f"2..{steps}",
        "params": params, "active_params": active,
        "flops_per_token": twin.model.flops_per_token(), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "attention": args.attention, "adamw_impl": args.adamw_impl,
        "device": str(twin.device)}
    if on_cuda:
        summary["device_name"] = torch.cuda.get_device_name(twin.device)
        summary["peak_device_bytes"] = max(peaks)
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
