#!/bin/bash
# Runs two mixtrain binaries (say, main before and after a refactor) on the same inputs and
# compares what they write (docs/development.md says exactly what):
#   optim-replay, 1 and 2 ranks (Muon + AdamW, fp32 main params, clipping on, 3 steps);
#   mixtrain train, 6 steps, a checkpoint at step 6, on configs/qwen2_moe_tiny.yaml (1 rank,
#   2 ranks FSDP, and 2 ranks each with expert, tensor and context parallelism),
#   configs/deepseek_v3_tiny.yaml (1 rank, 2 ranks with expert parallelism) and the dense
#   configs/qwen2_tiny.yaml (1 rank, 2 ranks FSDP).
# Then: the two sides' file lists (a file only one side wrote is a difference), every file byte
# for byte except the logs and metrics.jsonl (their times differ from run to run), and of each
# metrics.jsonl every logged value but the times (keys ending in _s), step by step.
# Usage: scripts/bitwise_compare.sh OLD_BINARY NEW_BINARY [WORK_DIR]. Needs the project's .venv
# (torch, safetensors) for the inputs. Exit 0 when every run succeeded on both sides and
# everything is identical, 1 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old=$(realpath "$1")
new=$(realpath "$2")
work=${3:-$(mktemp -d)}
mkdir -p "$work"

# Runs `$@` with its output in $log; a failed run leaves its exit status in $log.rc, so that a
# binary that fails where the other does not shows as a difference rather than stopping here.
run() {  # log command...
  local log=$1 rc=0
  shift
  "$@" > "$log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then echo "exit $rc" > "$log.rc"; fi
}

run_all() {  # binary out_dir
  local bin=$1 out=$2
  mkdir -p "$out"
  cd "$out"
  "$root/.venv/bin/python" - <<'PY'
import torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(7)
shapes = {"model.embed_tokens.weight": (64, 32), "model.layers.0.self_attn.q_proj.weight": (32, 32),
          "model.layers.0.self_attn.q_proj.bias": (32,), "model.layers.0.mlp.experts.gate_proj": (4, 16, 32),
          "model.layers.0.mlp.shared_expert.down_proj.weight": (32, 48), "model.norm.weight": (32,),
          "lm_head.weight": (64, 32)}
save_file({k: torch.randn(s, generator=g).bfloat16() for k, s in shapes.items()}, "p.safetensors")
save_file({f"step.{k}.{n}": torch.randn(s, generator=g)
           for k in (1, 2, 3) for n, s in shapes.items()}, "g.safetensors")
PY
  cat > c.yaml <<'Y'
optimizer:
  _target_: Muon
  fp32_main_params: true
fsdp_config:
  mix_precision:
    param_dtype: bfloat16
    reduce_dtype: float32
train:
  max_grad_norm: 1.0
Y
  for n in 1 2; do
    run replay$n.log "$bin" optim-replay --config c.yaml --params p.safetensors \
      --grads g.safetensors --out replay$n.safetensors --nproc $n
  done
  # "<config> <nproc> [--set ...]": train<i> is the i-th.
  local -a runs=(
    "qwen2_moe_tiny 1" "qwen2_moe_tiny 2" "qwen2_moe_tiny 2 --set parallel.ep=2"
    "qwen2_moe_tiny 2 --set parallel.tp=2" "qwen2_moe_tiny 2 --set parallel.cp=2"
    "deepseek_v3_tiny 1" "deepseek_v3_tiny 2 --set parallel.ep=2"
    "qwen2_tiny 1" "qwen2_tiny 2 --set data.micro_batch_size=4")  # FSDP: 2 x 4 = its batch of 8
  local i=0 config layout
  for spec in "${runs[@]}"; do
    i=$((i + 1))
    read -r config layout <<< "$spec"
    # shellcheck disable=SC2086
    run train$i.log "$bin" train --config "$root/configs/$config.yaml" --nproc $layout \
      --set train.steps=6 --set checkpoint.interval=6 --run-dir train$i
    # Every logged value but the times (tokens_per_s, elapsed_s, a profile's phase seconds).
    if [ -f train$i/metrics.jsonl ]; then
      sed -E 's/"[a-z_]+_s":[^,}]*,?//g' train$i/metrics.jsonl > train$i.numbers
    fi
  done
}

(run_all "$old" "$work/old")
(run_all "$new" "$work/new")
status=0
list() { (cd "$1" && find . -type f | sed 's|^\./||' | LC_ALL=C sort); }
list "$work/old" > "$work/old.files"
list "$work/new" > "$work/new.files"
while read -r f; do
  echo "ONLY OLD   $f"
  status=1
done < <(LC_ALL=C comm -23 "$work/old.files" "$work/new.files")
while read -r f; do
  echo "ONLY NEW   $f"
  status=1
done < <(LC_ALL=C comm -13 "$work/old.files" "$work/new.files")
compared=0
while read -r f; do
  case "$f" in
    *.log | */metrics.jsonl) continue ;;  # times; metrics.jsonl's values are in train<i>.numbers
  esac
  compared=$((compared + 1))
  if cmp -s "$work/old/$f" "$work/new/$f"; then
    echo "identical  $f"
  else
    echo "DIFFERENT  $f"
    status=1
  fi
done < <(LC_ALL=C comm -12 "$work/old.files" "$work/new.files")
# A run that failed on either side fails the comparison, even with the same failure on both.
for side in old new; do
  while read -r f; do
    echo "FAILED     $side/${f%.rc}: $(cat "$work/$side/$f")"
    status=1
  done < <(grep '\.log\.rc$' "$work/$side.files" || true)
done
if [ "$status" = 0 ]; then
  echo "identical: $compared files on both sides, no file on one side only"
else
  echo "DIFFERENT: see the lines above (ONLY OLD/NEW: a file one binary did not write; FAILED:"\
    "a run that exited non-zero, its log named)"
fi
echo "work dir: $work"
exit $status
