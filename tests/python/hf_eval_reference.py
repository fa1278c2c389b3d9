"""Reference eval loss of a Hugging Face Qwen2ForCausalLM, for tests/tools/eval_command_test.cpp.

Usage: hf_eval_reference.py MODEL_DIR SEQ_LEN SHARD...
  MODEL_DIR  written: a tiny Qwen2ForCausalLM with random weights (seed 0), save_pretrained
             (config.json + model.safetensors), the shape of configs/qwen2_tiny.yaml. Not
             transformers' init as is: there the q/k/v biases are zeros and the RMSNorm scales
             ones, so a loader or model that dropped them would give the same loss. They are
             drawn (biases N(0, 0.5^2), norm scales U(0.5, 1.5)), and the other matrices scaled
             from std 0.02 to 0.2 so that attention and the logits are sharp enough for each of
             them to matter (see SENSITIVITY)
  SEQ_LEN    window length: windows of SEQ_LEN + 1 tokens start every SEQ_LEN tokens of a file,
             never across files; a file's tail shorter than a window is not used
  SHARD...   llm.c token shards (header of 256 int32, then uint16 tokens), in this order
Prints one line: the mean over every window's SEQ_LEN predictions of -log softmax(logits)[next
token], the model run in float64 (eager attention): the reference for mixtrain's float32 eval.
Exits 1 with a message when transformers is missing (scripts/python-requirements.txt), and when
putting any of the drawn groups (GROUPS) back to its init moves that loss by less than
SENSITIVITY: then the C++ test's bound (1e-4) could not tell whether that group is loaded and
used. When written, the smallest such move was 0.013 (post_attention_layernorm).
"""

import copy
import struct
import sys

# The parameters transformers initializes to constants, drawn here; each name is a substring.
GROUPS = ("q_proj.bias", "k_proj.bias", "v_proj.bias", "input_layernorm",
          "post_attention_layernorm", "model.norm")
# 10x the 1e-4 bound of tests/tools/eval_command_test.cpp.
SENSITIVITY = 1e-3


def windows(path, seq_len):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        count = header[2]
        tokens = struct.unpack(f"<{count}H", f.read(2 * count))
    return [tokens[s:s + seq_len + 1] for s in range(0, count - seq_len, seq_len)]


def randomize(model, torch):
    """Draws what transformers initializes to constants (see the usage) and sharpens the rest."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "embed_tokens" not in name:
                p.mul_(10.0)


def float64_loss(model, ids, torch):
    with torch.no_grad():
        logits = copy.deepcopy(model).to(torch.float64)(input_ids=ids[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                             ids[:, 1:].reshape(-1)).item()


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    try:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM
    except ImportError as error:
        sys.exit(f"FAIL: {sys.executable} cannot import {error.name!r}: run `make setup` "
                 "(scripts/python-requirements.txt pins transformers)")
    model_dir, seq_len = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
                         attention_dropout=0.0, attn_implementation="eager")
    model = Qwen2ForCausalLM(config).eval()
    randomize(model, torch)
    model.save_pretrained(model_dir)
    rows = [w for path in sys.argv[3:] for w in windows(path, seq_len)]
    ids = torch.tensor(rows, dtype=torch.long)
    loss = float64_loss(model, ids, torch)
    for group in GROUPS:
        at_init = copy.deepcopy(model)
        with torch.no_grad():
            for name, p in at_init.named_parameters():
                if group in name:
                    p.fill_(0.0 if name.endswith(".bias") else 1.0)
        moved = abs(float64_loss(at_init, ids, torch) - loss)
        print(f"{group} at its init moves the loss by {moved:.3g}", file=sys.stderr)
        if moved < SENSITIVITY:
            sys.exit(f"FAIL: {group} at its init moves the loss by only {moved:.3g} "
                     f"(< {SENSITIVITY}): the case does not test it")
    print(f"{loss:.17g}")


if __name__ == "__main__":
    main()
