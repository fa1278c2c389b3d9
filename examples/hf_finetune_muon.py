"""Fine-tune a Hugging Face transformers model with mixtrain.optim.Muon + FP32MainParams, then
save and reload it with mixtrain.checkpoint (the trainer's format: `mixtrain train` can resume
from it given a run's config, docs/python.md).

    .venv/bin/python examples/hf_finetune_muon.py [OUT_DIR]      (after `make python`)

The model is a tiny random Qwen2 made here (no download); the data are counting sequences (each
token the previous one + 1, from a random start), which a language model learns in a few dozen
steps. Exits 1 if the loss
did not fall by half or the reloaded model differs (CTest runs it).
"""

import sys
import tempfile

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import mixtrain.checkpoint
import mixtrain.optim

torch.manual_seed(0)
VOCAB, SEQ, BATCH, STEPS = 256, 64, 8, 60

config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=SEQ, tie_word_embeddings=False)
model = Qwen2ForCausalLM(config).to(torch.bfloat16)


def batch():
    """Each row: start, start + 1, ... (mod VOCAB) from a random start."""
    return (torch.randint(0, VOCAB, (BATCH, 1)) + torch.arange(SEQ)) % VOCAB


# The yaml rule: attention and MLP matrices -> Muon; embeddings, lm_head, norms, biases -> AdamW.
groups = mixtrain.optim.muon_param_groups(model)
muon = mixtrain.optim.Muon(groups.muon, lr=0.02, weight_decay=0.0,
                           adjust_lr_fn="match_rms_adamw")
adamw = mixtrain.optim.AdamW(groups.adamw, lr=1e-2, weight_decay=0.0)
opt = mixtrain.optim.FP32MainParams([muon, adamw], model)
print(f"{len(groups.muon)} matrices on Muon, "
      f"{sum(len(g['params']) for g in groups.adamw)} tensors on AdamW")

losses = []
for step in range(STEPS):
    tokens = batch()
    loss = model(input_ids=tokens, labels=tokens).loss   # transformers shifts the labels
    loss.backward()                                      # bf16 grads -> fp32 main_grad
    opt.clip_grad_norm_(1.0)
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
    if step % 10 == 0 or step == STEPS - 1:
        print(f"step {step:3d}  loss {loss.item():.4f}")

with tempfile.TemporaryDirectory(prefix="mixtrain-example-") as scratch:
    out = sys.argv[1] if len(sys.argv) > 1 else scratch
    mixtrain.checkpoint.save(out, STEPS, model, opt)
    print(f"saved {out}/step-{STEPS:08d}")

    # Reload into a fresh model: the weights and the optimizer state come back bit for bit.
    fresh = Qwen2ForCausalLM(config).to(torch.bfloat16)
    ckpt = mixtrain.checkpoint.load(out, fresh)
    fresh_opt = ckpt.optimizer(fresh)
    same = all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))
    state, fresh_state = opt.state_dict()["tensors"], fresh_opt.state_dict()["tensors"]
    same = same and all(torch.equal(state[k], fresh_state[k]) for k in state)
    print(f"reloaded step {ckpt.step}: {'identical' if same else 'DIFFERENT'}")

first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
print(f"loss {first:.3f} -> {last:.3f}")
sys.exit(0 if same and last < first / 2 else 1)
