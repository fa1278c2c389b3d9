"""A plain PyTorch training loop with mixtrain's optimizers: a bfloat16 model, fp32 main params,
Muon for the matrices and AdamW for the rest, an LR warmup, gradient clipping.

    .venv/bin/python examples/plain_pytorch_loop.py       (after `make python`)

The task: learn a fixed random linear map y = x W* (a regression a 2-layer MLP fits quickly).
It prints the loss every 20 steps and exits 1 if it did not fall by 10x (CTest runs it).
"""

import sys

import torch

import mixtrain.optim

torch.manual_seed(0)
DIM, HIDDEN, BATCH, STEPS = 32, 128, 64, 200

model = torch.nn.Sequential(
    torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(), torch.nn.LayerNorm(HIDDEN),
    torch.nn.Linear(HIDDEN, DIM)).to(torch.bfloat16)
target = torch.randn(DIM, DIM) / DIM ** 0.5

# Matrices -> Muon; biases and the norm -> AdamW (no weight decay for them).
groups = mixtrain.optim.muon_param_groups(model)
muon = mixtrain.optim.Muon(groups.muon, lr=0.02, weight_decay=0.01,
                           adjust_lr_fn="match_rms_adamw")
adamw = mixtrain.optim.AdamW(groups.adamw, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
# The bfloat16 weights get float32 masters; each step updates the masters and rounds them back.
opt = mixtrain.optim.FP32MainParams([muon, adamw], model)
warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 20))

losses = []
for step in range(STEPS):
    x = torch.randn(BATCH, DIM)
    y = x @ target
    loss = torch.nn.functional.mse_loss(model(x.bfloat16()).float(), y)
    (loss * opt.loss_scale).backward()   # loss_scale is 1.0: no float16 parameter here
    norm = opt.clip_grad_norm_(1.0)
    opt.step()
    warmup.step()
    opt.zero_grad()
    losses.append(loss.item())
    if step % 20 == 0 or step == STEPS - 1:
        print(f"step {step:4d}  loss {loss.item():.5f}  grad norm {norm:.3f}  "
              f"lr muon {muon.param_groups[0]['lr']:.4f}")

first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
print(f"loss {first:.4f} -> {last:.4f}")
sys.exit(0 if last < first / 10 else 1)
