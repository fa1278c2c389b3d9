"""Tiny Hugging Face models for the HF import/export tests (tests/unit/model/hf_config_test.cpp,
tests/unit/checkpoint/hf_import_test.cpp, tests/tools/export_hf_command_test.cpp). No hub access:
every model is built from a config with random weights.

Usage:
  hf_models.py config DIR
      DIR/FAMILY/config.json as transformers writes it for each tiny FAMILY (qwen2_moe, qwen3_moe,
      qwen2, llama, qwen3, llama3: llama with llama3 rope scaling, mistral, qwen2_tied, llama_tied,
      deepseek_v3).
  hf_models.py save FAMILY DIR REFERENCE [--dtype float32|bfloat16|float16] [--max-shard-size N]
                    [--layout per-expert|fused] [--seed S] [--max-position P]
      save_pretrained of a random tiny FAMILY model into DIR (per-expert experts, as transformers
      writes them; --max-shard-size gives shards and model.safetensors.index.json); --layout fused
      rewrites DIR/model.safetensors with the in-memory 3-D experts (gate_up_proj [E, 2I, H],
      down_proj [E, H, I]). REFERENCE: safetensors of the state dict under mixtrain's names (the
      experts of each layer stacked into [E, I, H] / [E, H, I]; gate = first half of
      gate_up_proj), in the saved dtype.
  hf_models.py logits DIR IDS OUT
      from_pretrained(DIR) in float32 with eager attention and experts; IDS: safetensors
      "input_ids" int64 [batch, seq]; OUT: "logits" float32.
Exits 1 with a message when transformers is missing (scripts/python-requirements.txt).
"""

import argparse
import json
import os
import sys

try:
    import torch
    from safetensors.torch import load_file, save_file
    import transformers
except ImportError as error:
    sys.exit(f"FAIL: {sys.executable} cannot import {error.name!r}: run `make setup` "
             "(scripts/python-requirements.txt pins transformers)")

# Every size distinct, num_heads * head_dim != hidden_size: a transposed or mixed-up dimension
# cannot load.
COMMON = dict(vocab_size=61, hidden_size=24, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6,
              rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
              tie_word_embeddings=False, attention_dropout=0.0)
FAMILIES = {
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(moe_intermediate_size=12, shared_expert_intermediate_size=20, num_experts=4,
                       num_experts_per_tok=2, norm_topk_prob=False, intermediate_size=28,
                       router_aux_loss_coef=0.01, use_sliding_window=False)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(moe_intermediate_size=12, num_experts=4, num_experts_per_tok=2,
                       norm_topk_prob=True, intermediate_size=28, router_aux_loss_coef=0.01,
                       attention_bias=False, use_sliding_window=False)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(intermediate_size=20, use_sliding_window=False)),
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(intermediate_size=20, attention_bias=False, mlp_bias=False)),
    # Mistral with a window shorter than the tests' 12-position sequences.
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(intermediate_size=20, sliding_window=5)),
    # Tied embeddings (Qwen2.5-0.5B, Llama-3.2-1B): lm_head is the embedding. save_pretrained
    # writes no lm_head.weight; --layout fused (the state dict) writes it, equal to the embedding.
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM",
                   dict(intermediate_size=20, use_sliding_window=False, tie_word_embeddings=True)),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM",
                   dict(intermediate_size=20, attention_bias=False, mlp_bias=False,
                        tie_word_embeddings=True)),
    # DeepSeek-V3: MLA with query compression (every dim distinct), 8 experts in 4 groups, a
    # dense first layer. save draws its selection biases (buffers) too.
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(num_key_value_heads=4, q_lora_rank=10, kv_lora_rank=11,
                         qk_nope_head_dim=7, qk_rope_head_dim=6, v_head_dim=9,
                         n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=5,
                         n_shared_experts=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                         first_k_dense_replace=1, intermediate_size=20, norm_topk_prob=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(intermediate_size=20, attention_bias=False, use_sliding_window=False)),
    # Llama 3.1's rope scaling (factor 8, low_freq_factor 1, high_freq_factor 4) with the original
    # context shrunk to 100, so head_dim 8's wavelengths 2 pi theta^(2i/8) = 6.3 (theta 10000),
    # 63, 628, 6283 fall in all three bands (kept < 25, smoothed, divided > 100) and the scaling
    # moves the logits of a short sequence.
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(intermediate_size=20, attention_bias=False, mlp_bias=False,
                    rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 100},
                    max_position_embeddings=128)),
}


def make_config(family, max_position=None):
    config_class, _, extra = FAMILIES[family]
    kwargs = dict(COMMON, **extra)
    if family == "deepseek_v3":
        del kwargs["head_dim"]  # DeepseekV3Config sets it to qk_rope_head_dim
    if max_position:
        kwargs["max_position_embeddings"] = max_position
    return getattr(transformers, config_class)(**kwargs)


def ours(state):
    """mixtrain's names: per-expert 2-D weights stacked into 3-D tensors per layer; in-memory
    fused gate_up_proj split into gate (first half) and up."""
    out, experts = {}, {}
    for key, value in state.items():
        parts = key.split(".")
        if ".mlp.experts." in key and parts[-1] == "weight" and parts[-3].isdigit():
            prefix = ".".join(parts[:-3])
            experts.setdefault((prefix, parts[-2]), {})[int(parts[-3])] = value
        elif key.endswith(".mlp.experts.gate_up_proj"):
            prefix = key[: -len(".gate_up_proj")]
            half = value.shape[1] // 2
            out[prefix + ".gate_proj"] = value[:, :half].contiguous()
            out[prefix + ".up_proj"] = value[:, half:].contiguous()
        else:
            out[key] = value.contiguous()
    for (prefix, proj), by_index in experts.items():
        out[prefix + "." + proj] = torch.stack([by_index[e] for e in sorted(by_index)])
    return out


def save(args):
    torch.manual_seed(args.seed)
    _, model_class, _ = FAMILIES[args.family]
    model = getattr(transformers, model_class)(make_config(args.family, args.max_position))
    dtype = getattr(torch, args.dtype)
    # Weights far from the init (zero biases, unit norms), so every tensor matters.
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's selection biases
                b.normal_(0.0, 0.1)
    model = model.to(dtype)
    kwargs = {"max_shard_size": args.max_shard_size} if args.max_shard_size else {}
    model.save_pretrained(args.dir, **kwargs)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}  # tied: own copies
    if args.layout == "fused":
        for name in os.listdir(args.dir):
            if name.endswith(".safetensors") or name.endswith(".index.json"):
                os.remove(os.path.join(args.dir, name))
        save_file({k: v.contiguous() for k, v in state.items()},
                  os.path.join(args.dir, "model.safetensors"), metadata={"format": "pt"})
    else:
        state = {}
        for name in os.listdir(args.dir):
            if name.endswith(".safetensors"):
                state.update(load_file(os.path.join(args.dir, name)))
    save_file(ours(state), args.reference)


def logits(args):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.dir, dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager").eval()  # grouped_mm needs 16-byte strides: odd dims
    ids = load_file(args.ids)["input_ids"]
    with torch.no_grad():
        out = model(input_ids=ids).logits.float()
    save_file({"logits": out.contiguous()}, args.out)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("config")
    c.add_argument("dir")
    s = sub.add_parser("save")
    s.add_argument("family", choices=FAMILIES)
    s.add_argument("dir")
    s.add_argument("reference")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    s.add_argument("--max-shard-size", type=int, default=0)
    s.add_argument("--layout", default="per-expert", choices=["per-expert", "fused"])
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-position", type=int, default=0)
    lg = sub.add_parser("logits")
    lg.add_argument("dir")
    lg.add_argument("ids")
    lg.add_argument("out")
    args = parser.parse_args()
    if args.command == "config":
        for family in FAMILIES:
            make_config(family).save_pretrained(os.path.join(args.dir, family))
    elif args.command == "save":
        save(args)
    else:
        logits(args)


if __name__ == "__main__":
    main()
