#!/bin/bash
# Runs two mixtrain binaries (say, main before and after a refactor) on the same inputs and
# compares what they write, byte for byte:
#   optim-replay, 1 and 2 ranks (Muon + AdamW, fp32 main params, clipping on, 3 steps);
#   mixtrain train on configs/qwen2_moe_tiny.yaml, 1 rank, 2 ranks (FSDP), and 2 ranks with
#   expert, tensor and context parallelism, 6 steps, a checkpoint at step 6 (every file) and the logged loss,
#   aux loss and gradient norm of each step.
# Usage: scripts/bitwise_compare.sh OLD_BINARY NEW_BINARY [WORK_DIR]. Needs the project's .venv
# (torch, safetensors) for the inputs. Exit 0 when everything is identical, 1 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old=$(realpath "$1")
new=$(realpath "$2")
work=${3:-$(mktemp -d)}
mkdir -p "$work"

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
    "$bin" optim-replay --config c.yaml --params p.safetensors --grads g.safetensors \
      --out replay$n.safetensors --nproc $n > replay$n.log 2>&1
  done
  local -a layouts=("1" "2" "2 --set parallel.ep=2" "2 --set parallel.tp=2" "2 --set parallel.cp=2")
  local i=0
  for layout in "${layouts[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    "$bin" train --config "$root/configs/qwen2_moe_tiny.yaml" --nproc $layout --set train.steps=6 \
      --set checkpoint.interval=6 --run-dir train$i > train$i.log 2>&1
    grep -o '"step":[0-9]*,"loss":[^,]*,"grad_norm":[^,]*\|"aux_loss":[^,]*' train$i/metrics.jsonl \
      > train$i.numbers
  done
}

(run_all "$old" "$work/old")
(run_all "$new" "$work/new")
status=0
cd "$work/new"
for f in replay1.safetensors replay2.safetensors train{1,2,3,4,5}.numbers \
  $(find train{1,2,3,4,5}/checkpoints -type f | sort); do
  if cmp -s "$work/old/$f" "$work/new/$f"; then
    echo "identical  $f"
  else
    echo "DIFFERENT  $f"
    status=1
  fi
done
echo "work dir: $work"
exit $status
