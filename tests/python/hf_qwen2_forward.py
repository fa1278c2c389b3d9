"""Reference forward of Hugging Face transformers' Qwen2ForCausalLM, for tests/unit/model/qwen2_test.cpp.

Usage: hf_qwen2_forward.py CONFIG_JSON WEIGHTS IDS OUT
  CONFIG_JSON  a JSON file of mixtrain's model keys (vocab_size, hidden_size, num_layers, num_heads,
               num_kv_heads, head_dim, intermediate_size, max_seq_len, rope_theta, rms_norm_eps)
  WEIGHTS      safetensors with mixtrain's parameters (HF names; loaded strictly: a missing or
               extra name fails)
  IDS          safetensors with "input_ids" int64 [batch, seq]
  OUT          written: "logits" float64 [batch, seq, vocab]
The model runs in float64 with eager attention, so it is a reference to compare float32 against.
Exits 1 with a message when transformers is missing (scripts/python-requirements.txt).
"""

import json
import sys


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    try:
        import torch
        from safetensors.torch import load_file, save_file
        from transformers import Qwen2Config, Qwen2ForCausalLM
    except ImportError as error:
        sys.exit(f"FAIL: {sys.executable} cannot import {error.name!r}: run `make setup` "
                 "(scripts/python-requirements.txt pins transformers)")
    with open(sys.argv[1], encoding="utf-8") as f:
        keys = json.load(f)
    config = Qwen2Config(
        vocab_size=keys["vocab_size"],
        hidden_size=keys["hidden_size"],
        intermediate_size=keys["intermediate_size"],
        num_hidden_layers=keys["num_layers"],
        num_attention_heads=keys["num_heads"],
        num_key_value_heads=keys["num_kv_heads"],
        head_dim=keys["head_dim"],
        max_position_embeddings=keys["max_seq_len"],
        rope_parameters={"rope_type": "default", "rope_theta": keys["rope_theta"]},
        rms_norm_eps=keys["rms_norm_eps"],
        tie_word_embeddings=False,
        use_sliding_window=False,
        attention_dropout=0.0,
        attn_implementation="eager",
    )
    model = Qwen2ForCausalLM(config).to(torch.float64).eval()
    # HF reads head_dim from the config; a wrong reading shows up as a shape error on load.
    weights = {k: v.to(torch.float64) for k, v in load_file(sys.argv[2]).items()}
    model.load_state_dict(weights, strict=True)
    ids = load_file(sys.argv[3])["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    save_file({"logits": logits.contiguous()}, sys.argv[4])


if __name__ == "__main__":
    main()
