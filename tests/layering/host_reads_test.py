"""No raw host read in the training step's code: a blocking read of a device value by the host,
or a blocking copy to the device, goes through core/host_sync.h (read_to_host, read_double,
read_int64, copy_to_device; per-step inputs stage_to_device), which counts it per site
(docs/architecture.md §12, "Host reads are counted"). On the CPU such a read costs nothing, so no
CPU test notices a new one; on a GPU it stalls the step. tests/scenarios/
gpu_step_host_reads_test.cpp counts the wrapped reads; this test keeps reads from going around
the wrappers.

Scanned (the code a `mixtrain train` step runs through, trainer.cpp's step_unread and the
run_training loop around it):
  model/        forward and backward of every model (layers, attention, MoE routing, DeepSeek-V3)
  optim/        the optimizer step (leaves, fp32 main params, chained), grad clip, loss scaler,
                QK-clip, Muon telemetry, optimizer-state swap; kernels/ for explicit waits
  distributed/  FSDP, tensor, expert and context parallelism, the Gloo and NCCL collectives
  trainer/      the step, its hooks and the loop, except the files in NOT_IN_STEP
  core/         collectives and parameter placement (the step's collective interface)
Not scanned: data/ (builds batches on the host; the trainer stages them), checkpoint/, config/
and cli/ (no step code), core/host_sync.cpp (the wrappers), python/ (the torch.optim shell over
the same C++ leaves, scanned here).

Patterns (PATTERNS, in C++ with comments and string literals blanked) are textual: a read
through a name the text does not show (a tensor.copy_() into a host tensor named `out`, a
.to(other_tensor)) is left to the runtime tests (the counting test above; on a GPU
gpu_step_sync_cuda_test.cpp, LibTorch's sync debug mode). Python's tolist()/bool(tensor) have no
C++ form. An existing use that is not a read of a device value in the step is listed in ALLOWED
with its reason; an entry that matches nothing fails too, so the list stays current.

Usage: python3 host_reads_test.py <source dir>. Exit 1 listing every unlisted use as
file:line: pattern: line."""
import pathlib
import re
import sys
import time

SCANNED_DIRS = ["model", "optim", "distributed", "trainer"]
SCANNED_FILES = ["core/collectives.h", "core/collectives.cpp", "core/param_placement.h",
                 "core/param_placement.cpp", "core/main_grad_sink.h"]
NOT_IN_STEP = {
    "trainer/checkpointing.cpp": "checkpoint save and restore (checkpoint.interval), not the step",
    "trainer/checkpoint_state.cpp": "checkpoint metadata, host bytes",
    "trainer/evaluator.cpp": "evaluation (train.eval_every, mixtrain eval): reads its loss sums",
    "trainer/optim_replay.cpp": "the optim-replay command: reads its inputs and writes results",
    "trainer/optimizer_report.cpp": "logs the optimizer's hyper-parameters after build/restore",
}
SUFFIXES = (".h", ".cpp", ".cu", ".cuh")

# .to()'s first argument (at::tensor's later ones) naming a device or tensor options: a dtype
# alone converts on the tensor's device (`options.ns_dtype()` is a dtype, a bare `...options`
# name is options).
DEVICE_ARG = re.compile(r"device|Device|kCPU|kCUDA|TensorOptions|^\s*[\w.>-]*options\s*$")
# A copy_ between tensors so named (the swap tier's pinned copies are its "homes").
HOST_NAME = re.compile(r"host|cpu|pinned|pin_memory|home", re.I)

# name: (regex, what the host waits for). .to(device), tensor(device) and copy_ host are
# reads only with the arguments is_read looks for.
PATTERNS = {
    "item": (r"\.item\s*[<(]", "a Scalar read of the tensor's value"),
    "_local_scalar_dense": (r"\b_local_scalar_dense\b", "what .item() calls"),
    "cpu()": (r"\.cpu\s*\(", "a copy to the host"),
    ".to(device)": (r"\.to\s*\(", "to the host: a read; from pageable host memory: a blocking copy"),
    "tensor(device)": (r"\b(?:at|torch)::tensor\s*\(", "a blocking copy of host values"),
    "data_ptr": (r"(?:\.|->)\s*(?:const_|mutable_)?data_ptr\s*[<(]",
                 "a raw pointer: read by the host, the tensor must be a host tensor"),
    "equal": (r"(?:\.|\b(?:at|torch)::)equal\s*\(", "a comparison the host reads"),
    "allclose": (r"(?:\.|\b(?:at|torch)::)allclose\s*\(", "a comparison the host reads"),
    "is_nonzero": (r"\bis_nonzero\s*\(", "a bool read of the tensor's value"),
    "copy_ host": (r"\.copy_\s*\(", "a blocking copy between the host and the device"),
    "synchronize": (r"\b\w*[Ss]ynchronize\w*\s*\(", "the host waits for the device"),
    "cudaMemcpy": (r"\bcudaMemcpy(?!Async)\w*\s*\(", "a blocking copy"),
    "data-dependent size": (
        r"(?:\.|\b(?:at|torch)::)(?:nonzero|masked_select|_?unique\w*|argwhere|bincount|"
        r"repeat_interleave)\s*\(",
        "the host reads the output's size from the device"),
}

# (file under src/mixtrain, pattern, text on the hit's line or None for every hit of that
# pattern in the file, why it is not a device read in the step)
ALLOWED = [
    # trainer/
    ("trainer/trainer.cpp", "item", "losses[row][0].item<double>()",
     "read_step_results: rows of the host copy read_to_host made"),
    ("trainer/trainer.cpp", "item", "losses[row][1].item<double>()", "the same host copy"),
    ("trainer/trainer.cpp", "item", "host[row][2].item<double>()", "the same host copy"),
    ("trainer/trainer.cpp", "item", "flag.item<int64_t>()",
     "any_rank_interrupted: a host flag all-reduced over the world between steps"),
    ("trainer/trainer.cpp", "synchronize", "synchronizeDevice(index)",
     "train.profile only: each phase waits for the device to be timed"),
    ("trainer/step_recorder.h", "synchronize", None,
     "train.profile only: the phase timer's wait (set by the trainer)"),
    # model/
    ("model/routed_experts.cpp", "data_ptr", "src.data_ptr<int64_t>()",
     "the host-side permutation of host index tensors"),
    ("model/routed_experts.cpp", "data_ptr", "out.data_ptr<int64_t>()", "the same"),
    ("model/routed_experts.cpp", "data_ptr", "counts.data_ptr<int64_t>()",
     "the loop form's counts, after their counted read_to_host"),
    ("model/routed_experts.cpp", "data_ptr", "w.data_ptr()",
     "the pointer's alignment only, never dereferenced"),
    ("model/routed_experts.cpp", "data-dependent size", "torch::bincount(",
     "the loop form's tokens per expert, read at once by the counted read_to_host"),
    ("model/deepseek_v3.cpp", ".to(device)", "gate->bias.to(logits.device())",
     "the router's bias buffer follows the model to its device: a no-op once there"),
    ("model/deepseek_v3.cpp", ".to(device)", "gate->load.to(logits.device())", "the same"),
    ("model/deepseek_v3.cpp", ".to(device)", "value.to(moe->gate->bias.device()",
     "load_model_state: a checkpoint restore, not the step"),
    ("model/init_dtype.cpp", "data_ptr", None, "model_init_dtype: once, before training"),
    ("model/init_dtype.cpp", "equal", None, "model_init_dtype: once, before training"),
    # optim/
    ("optim/qk_clip.cpp", ".to(device)", "heads.detach().to(layers.begin()->second.device()",
     "gathers the layers' max logits on their own device for the one counted read"),
    ("optim/qk_clip.cpp", "data_ptr", "reduced.data_ptr<double>()",
     "the host copy the counted read_to_host made"),
    ("optim/chained_optimizer.cpp", ".to(device)", "saved.to(live.device()",
     "import_state: a checkpoint restore, not the step"),
    ("optim/muon.cpp", ".to(device)", None, "import_state: a checkpoint restore, not the step"),
    ("optim/leaf_optimizer.cpp", "item", None,
     "hyper-parameters and counts from a saved state (host tensors): a restore, not the step"),
    ("optim/muon_telemetry.cpp", "item", "errors.sum().item<double>()",
     "the host copy the counted read_to_host made (log steps)"),
    ("optim/muon_telemetry.cpp", "item", "errors.max().item<double>()", "the same"),
    ("optim/muon_telemetry.cpp", "item", "totals[", "host tensors all-reduced over Gloo"),
    ("optim/muon_telemetry.cpp", "item", ".max().item<double>()", "a host tensor gathered"),
    ("optim/grad_clip.cpp", "item", "sum_of_squares_fused(on_cpu, at::kCPU).item<double>()",
     "the CPU grads' sum: a host tensor"),
    ("optim/grad_clip.cpp", "item", "total.item<double>()",
     "the host form: a host double summed over the group"),
    ("optim/grad_clip.cpp", "item", "reduced.item<double>()", "the same"),
    ("optim/distributed_muon.cpp", "item", "totals[",
     "the host copy the counted read_to_host made (the parameter-count check)"),
    ("optim/swap_pinned_tier.cpp", "copy_ host", None,
     "optimizer-state swap to pinned host memory: on the swap's side stream, non_blocking"),
    ("optim/swap_pinned_tier.cpp", "synchronize", None,
     "the swap's side stream, waited for at drain (outside the step) and for a state export"),
    ("optim/swap_pinned_tier.cpp", "data_ptr", "storage().data_ptr()",
     "recordDataPtrOnStream: the pointer as an allocator key, not read"),
    ("optim/swap_file_tier.cpp", "data_ptr", None,
     "the file tier's host buffers (CPU runs only), written to and read from its file"),
    # Kernel launches: the pointers go to the kernel of the tensor's own device (CUDA or CPU).
    ("optim/muon_fused.cpp", "data_ptr", None, "kernel arguments"),
    ("optim/adamw_fused.cpp", "data_ptr", None, "kernel arguments"),
    ("optim/widen_add_fused.cpp", "data_ptr", None, "kernel arguments"),
    ("optim/scale_fused.cpp", "data_ptr", None, "kernel arguments"),
    ("optim/sum_of_squares_fused.cpp", "data_ptr", None, "kernel arguments"),
    # distributed/
    ("distributed/nccl_collectives.cpp", ".to(device)", None,
     "a host tensor given to an NCCL group goes to its device and back (the step's "
     "collectives take device tensors: a no-op for them)"),
    ("distributed/nccl_collectives.cpp", "synchronize", None,
     "barrier(): blocks the host by contract (nccl_collectives.h), never in the step"),
    ("distributed/data_parallel.cpp", "item", None,
     "average_over_data_parallel of a host double, for values the host already holds"),
    ("distributed/expert_parallel.cpp", "data_ptr", "received_counts.data_ptr<int64_t>()",
     "the dispatch sizes, host values exchanged over the group"),
    ("distributed/config_agreement.cpp", "data_ptr", None, "the start-up config check"),
    # core/
    ("core/collectives.cpp", "data_ptr", None,
     "all_gather_strings: host bytes, at start-up and around checkpoints"),
]


def strip_cpp(text):
    """Comments and the insides of string and character literals as spaces, lines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def call_args(text, open_paren):
    """The arguments of the call whose "(" is at open_paren, split at top-level commas."""
    depth, args, start = 0, [], open_paren + 1
    for j in range(open_paren, len(text)):
        if text[j] in "([{":
            depth += 1
        elif text[j] in ")]}":
            depth -= 1
            if depth == 0:
                return args + [text[start:j]]
        elif text[j] == "," and depth == 1:
            args.append(text[start:j])
            start = j + 1
    return args


def receiver(text, dot):
    """The expression a .method() is called on, back to the start of its statement part."""
    j = dot
    while j > 0 and text[j - 1] not in ";{}=,\n(" and not text[j - 1].isspace():
        j -= 1
    return text[j:dot]


def is_read(name, text, match):
    """For the patterns that are reads only with some arguments: whether this call is one."""
    if name == ".to(device)":
        args = call_args(text, match.end() - 1)
        return bool(args) and bool(DEVICE_ARG.search(args[0]))
    if name == "tensor(device)":
        return any(DEVICE_ARG.search(a) for a in call_args(text, match.end() - 1)[1:])
    if name == "copy_ host":
        args = call_args(text, match.end() - 1)
        return bool(HOST_NAME.search(receiver(text, match.start())) or
                    (args and HOST_NAME.search(args[0])))
    return True


def scanned_files(src):
    files = [src / f for f in SCANNED_FILES]
    for d in SCANNED_DIRS:
        files += sorted(p for p in (src / d).rglob("*") if p.suffix in SUFFIXES)
    return [p for p in files if p.relative_to(src).as_posix() not in NOT_IN_STEP]


def main():
    started = time.monotonic()
    root = pathlib.Path(sys.argv[1])
    src = root / "src" / "mixtrain"
    compiled = {name: re.compile(regex) for name, (regex, _) in PATTERNS.items()}
    used = [0] * len(ALLOWED)
    found, hits, files = [], 0, scanned_files(src)
    for path in files:
        rel = path.relative_to(src).as_posix()
        raw = path.read_text()
        lines = raw.split("\n")
        text = strip_cpp(raw)
        for name, regex in compiled.items():
            for m in regex.finditer(text):
                if not is_read(name, text, m):
                    continue
                hits += 1
                line_no = text.count("\n", 0, m.start()) + 1
                line = lines[line_no - 1].strip()
                allowed = False
                for k, (f, pattern, snippet, _) in enumerate(ALLOWED):
                    if f == rel and pattern == name and (snippet is None or snippet in line):
                        used[k] += 1
                        allowed = True
                        break
                if not allowed:
                    found.append((rel, line_no, f"src/mixtrain/{rel}:{line_no}: {name} "
                                                f"({PATTERNS[name][1]}): {line}"))
    violations = [v for _, _, v in sorted(found)]
    for k, (f, pattern, snippet, why) in enumerate(ALLOWED):
        if used[k] == 0:
            violations.append(f"ALLOWED entry matches nothing (remove it): src/mixtrain/{f}: "
                              f"{pattern} {snippet!r} ({why})")
    for v in violations:
        print(v)
    if any(not v.startswith("ALLOWED") for v in violations):
        print("A read of a device value in the step goes through core/host_sync.h "
              "(read_to_host, read_double, read_int64, copy_to_device, stage_to_device), which "
              "counts it; a use that is not one gets an ALLOWED entry in "
              "tests/layering/host_reads_test.py with its reason.")
    print(f"{len(files)} files, {hits} uses of {len(PATTERNS)} patterns ({sum(used)} allowed), "
          f"{len(violations)} violations, {time.monotonic() - started:.2f} s")
    return 1 if violations or len(files) < 50 else 0


if __name__ == "__main__":
    sys.exit(main())
