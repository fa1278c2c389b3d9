"""Hugging Face transformers as the reference of mixtrain's model families, for the parity tests in
tests/unit/model/qwen2_test.cpp (qwen2, llama) and qwen2_moe_test.cpp (qwen2_moe, qwen3_moe).
(Not named *_oracle.py: CTest runs those on their own; this one is called by the C++ tests.)

Usage:
  hf_parity.py model CASE_JSON DIR
    CASE_JSON: {"family": "qwen2" | "llama" | "qwen3" | "mistral" | "qwen2_moe" | "qwen3_moe" |
                          "deepseek_v3",
                "seed": int,
                "batch": int, "seq": int, "keys": {mixtrain's model.* keys, as in ModelConfig}}
    With keys.tie_word_embeddings the HF model ties lm_head to the embedding (one tensor; its
    gradient sums both uses).
    With keys.rope_scaling llama3 the config's rope_parameters are llama3's, and the run fails
    unless dropping the scaling (same weights, default rope) moves the logits by >= 1e-2 of
    their max |logit|.
    Builds the family's *ForCausalLM from a config made of those keys (no hub), draws random
    weights from the seed (far from HF's init: biases N(0, 0.3^2), norm scales N(1, 0.2^2),
    embeddings N(0, 1), matrices N(0, 1/in)), rounds them to float32 and writes
      DIR/config.json + DIR/model.safetensors   save_pretrained, float32 (the layout HF writes:
                                                MoE experts per expert, experts.E.*_proj.weight)
      DIR/reference.safetensors                 input_ids int64 [batch, seq] and, in float64:
                                                logits [batch, seq, vocab], loss (scalar),
                                                aux_loss (scalar, MoE; float32)
      DIR/grads/model.safetensors               float64: the gradient of every tensor of
                                                DIR/model.safetensors, under its name (so the
                                                per-expert 2-D grads are in the saved layout too)
    The reference runs in float64 on the float32 weights (exactly representable), eager attention,
    labels = input_ids: loss = HF ForCausalLM's loss (mean cross entropy of logits[:, :-1] against
    ids[:, 1:]) + router_aux_loss_coef * aux_loss (output_router_logits=True; MoE only), as HF
    computes it but with the cross entropy in float64 (HF's is in float32; checked equal to
    1e-6), and HF's aux loss (float32-accurate: HF sums the router probabilities in float32). It fails unless every token's k-th and (k+1)-th router probabilities differ by more
    than 1e-4, ~100x the float32 rounding of a probability here (a few 1e-7 to 1e-6), so float32
    cannot choose other experts than the float64 reference.
    deepseek_v3: the routers' selection biases (e_score_correction_bias, buffers saved with the
    weights) are drawn N(0, 0.1^2); the run fails unless, for every token of every MoE layer, the
    chosen groups and experts are more than 1e-4 from a tie (float64 recomputation of the float32
    router) and the biases change some token's experts.
  hf_parity.py router CASE_JSON DIR
    CASE_JSON: {"seed", "tokens", "hidden", "experts", "top_k"}
    Runs Qwen2MoeTopKRouter and Qwen3MoeTopKRouter, each with norm_topk_prob false and true, on the
    same random hidden states [T, H] and weight [E, H] (float32) and writes DIR/router.safetensors:
    hidden, weight, and "<family>.<plain|norm>.scores" [T, k] float32 and ".indices" [T, k] int64
    as HF returns them. Fails unless the top-k + 1 probabilities of every token are > 1e-4 apart.
  hf_parity.py deepseek_router CASE_JSON DIR
    CASE_JSON: {"seed", "tokens", "hidden", "experts", "top_k",
                "settings": {NAME: [n_group, topk_group, norm_topk_prob, routed_scaling_factor]}}
    Runs DeepseekV3TopkRouter per setting on the same random hidden [T, H], weight [E, H] and
    selection bias [E] (N(0, 0.1^2)), float32, and writes DIR/router.safetensors: hidden, weight,
    bias, "<NAME>.weights" [T, k] float32 and ".indices" [T, k] int64 as HF returns them (in
    topk's unsorted order). Fails unless every group and expert choice is > 1e-4 from a tie.
Exits 1 with a message when transformers is missing (scripts/python-requirements.txt).
"""

import json
import os
import sys


def imports():
    try:
        import torch
        import transformers
        from safetensors.torch import load_file, save_file
    except ImportError as error:
        sys.exit(f"FAIL: {sys.executable} cannot import {error.name!r}: run `make setup` "
                 "(scripts/python-requirements.txt pins transformers)")
    return torch, transformers, load_file, save_file


def rope_parameters(k, scaled=True):
    """transformers 5's rope_parameters for the keys: default, llama3 with its four fields, or
    yarn with its factor, original length, betas and mscales (0: not given)."""
    rope = {"rope_type": "default", "rope_theta": k["rope_theta"]}
    if scaled and k["rope_scaling"] == "yarn":
        rope.update(rope_type="yarn", factor=float(k["rope_scaling_factor"]),
                    original_max_position_embeddings=k["rope_original_max_seq_len"],
                    beta_fast=float(k["rope_yarn_beta_fast"]),
                    beta_slow=float(k["rope_yarn_beta_slow"]))
        for key in ("mscale", "mscale_all_dim"):
            if k["rope_yarn_" + key]:
                rope[key] = float(k["rope_yarn_" + key])
    if scaled and k["rope_scaling"] == "llama3":
        rope.update(rope_type="llama3", factor=k["rope_scaling_factor"],
                    low_freq_factor=k["rope_low_freq_factor"],
                    high_freq_factor=k["rope_high_freq_factor"],
                    original_max_position_embeddings=k["rope_original_max_seq_len"])
    return rope


def hf_config(transformers, family, k, scaled=True):
    common = dict(
        vocab_size=k["vocab_size"], hidden_size=k["hidden_size"],
        num_hidden_layers=k["num_layers"], num_attention_heads=k["num_heads"],
        num_key_value_heads=k["num_kv_heads"], head_dim=k["head_dim"],
        max_position_embeddings=k["max_seq_len"],
        rope_parameters=rope_parameters(k, scaled),
        rms_norm_eps=k["rms_norm_eps"], tie_word_embeddings=k.get("tie_word_embeddings", False),
        attention_dropout=0.0,
        hidden_act="silu")
    moe = dict(moe_intermediate_size=k["moe_intermediate_size"], num_experts=k["num_experts"],
               num_experts_per_tok=k["num_experts_per_tok"], norm_topk_prob=k["norm_topk_prob"],
               router_aux_loss_coef=k["router_aux_loss_coef"], decoder_sparse_step=1,
               mlp_only_layers=[], output_router_logits=True)
    if family == "qwen2":
        if not k["attention_bias"]:
            sys.exit("FAIL: Qwen2 always has q/k/v biases")
        return transformers.Qwen2ForCausalLM, transformers.Qwen2Config(
            intermediate_size=k["intermediate_size"], use_sliding_window=False, **common)
    if family == "llama":
        return transformers.LlamaForCausalLM, transformers.LlamaConfig(
            intermediate_size=k["intermediate_size"], attention_bias=k["attention_bias"],
            mlp_bias=False, **common)
    if family == "mistral":
        window = k.get("sliding_window", 0)
        return transformers.MistralForCausalLM, transformers.MistralConfig(
            intermediate_size=k["intermediate_size"], sliding_window=window or None, **common)
    if family == "qwen3":
        return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
            intermediate_size=k["intermediate_size"], attention_bias=k["attention_bias"],
            use_sliding_window=False, **common)
    if family == "qwen2_moe":
        return transformers.Qwen2MoeForCausalLM, transformers.Qwen2MoeConfig(
            shared_expert_intermediate_size=k["shared_expert_intermediate_size"],
            qkv_bias=k["attention_bias"], use_sliding_window=False, **moe, **common)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
            attention_bias=k["attention_bias"], use_sliding_window=False, **moe, **common)
    if family == "deepseek_v3":
        common.pop("head_dim")  # DeepseekV3Config sets it to qk_rope_head_dim
        return transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config(
            intermediate_size=k["intermediate_size"],
            moe_intermediate_size=k["moe_intermediate_size"], n_routed_experts=k["num_experts"],
            num_experts_per_tok=k["num_experts_per_tok"], norm_topk_prob=k["norm_topk_prob"],
            n_shared_experts=k["n_shared_experts"], n_group=k["n_group"],
            topk_group=k["topk_group"],
            routed_scaling_factor=float(k["routed_scaling_factor"]),
            first_k_dense_replace=k["first_k_dense_replace"],
            q_lora_rank=k["q_lora_rank"] or None, kv_lora_rank=k["kv_lora_rank"],
            qk_nope_head_dim=k["qk_nope_head_dim"], qk_rope_head_dim=k["qk_rope_head_dim"],
            v_head_dim=k["v_head_dim"], rope_interleave=k["rope_interleave"],
            attention_bias=k["attention_bias"], **common)
    sys.exit(f"FAIL: unknown family {family!r}")


def randomize(torch, model, generator):
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's selection bias
                b.normal_(0.0, 0.1, generator=generator)
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.3, generator=generator)
            elif p.dim() == 1:  # norm scales
                p.normal_(1.0, 0.2, generator=generator)
            elif name == "model.embed_tokens.weight":
                p.normal_(0.0, 1.0, generator=generator)
            else:  # [out, in] or [E, out, in]
                p.normal_(0.0, p.size(-1) ** -0.5, generator=generator)


def deepseek_margins(torch, model, router_logits, k, seed):
    """DeepSeek-V3's routing must be ties-free at float32 rounding, or float32 could choose other
    groups or experts than the reference: for every token of every MoE layer, the topk_group-th
    and next group scores, and the k-th and next selection scores among the kept groups'
    experts, more than 1e-4 apart (the scores are sigmoids in (0, 1), rounded to ~6e-8)."""
    biases = [b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")]
    groups, per_group, top_k = k["n_group"], k["num_experts"] // k["n_group"], k["num_experts_per_tok"]
    margin = float("inf")
    for logits, bias in zip(router_logits, biases):
        choice = torch.sigmoid(logits.double()) + bias.double()
        group_scores = choice.view(-1, groups, per_group).topk(2, -1).values.sum(-1)
        if k["topk_group"] < groups:
            top = group_scores.topk(k["topk_group"] + 1, -1).values
            margin = min(margin, float((top[:, -2] - top[:, -1]).min()))
        kept = group_scores.topk(k["topk_group"], -1).indices
        mask = torch.zeros_like(group_scores).scatter_(1, kept, 1.0).bool()
        mask = mask.unsqueeze(-1).expand(-1, groups, per_group).reshape(choice.shape)
        masked = choice.masked_fill(~mask, float("-inf"))
        top = masked.topk(top_k + 1, -1).values
        finite = torch.isfinite(top[:, -1])
        if finite.any():
            margin = min(margin, float((top[finite, -2] - top[finite, -1]).min()))
    if margin <= 1e-4:
        sys.exit(f"FAIL: seed {seed}: a DeepSeek-V3 routing margin of {margin:.3g} <= 1e-4; "
                 "float32 could choose other groups or experts: pick another seed")
    # The biases must matter: without them some token would choose other experts.
    moved = 0
    for logits, bias in zip(router_logits, biases):
        def chosen(b):
            choice = torch.sigmoid(logits.double()) + b
            scores = choice.view(-1, groups, per_group).topk(2, -1).values.sum(-1)
            kept = scores.topk(k["topk_group"], -1).indices
            mask = torch.zeros_like(scores).scatter_(1, kept, 1.0).bool()
            mask = mask.unsqueeze(-1).expand(-1, groups, per_group).reshape(choice.shape)
            return choice.masked_fill(~mask, float("-inf")).topk(top_k, -1).indices.sort(-1).values
        moved += int((chosen(bias.double()) != chosen(torch.zeros_like(bias.double()))).any(-1).sum())
    if moved == 0:
        sys.exit(f"FAIL: seed {seed}: the selection biases change no token's experts")
    print(f"deepseek routing margin {margin:.3g}; the biases change {moved} tokens' experts")


def in_memory(params, name, moe_intermediate):
    """The in-memory parameter tensor behind saved name `name`: the parameter itself, or, for a
    per-expert name model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight, slice E of the 3-D
    parameter (gate_up_proj [E, 2I, H] holds gate in rows [0, I) and up in [I, 2I), as HF's
    forward chunks it). Returns (parameter, index) to apply to the parameter or its grad."""
    if name in params:
        return params[name], (slice(None),)
    parts = name.split(".")
    prefix, expert, proj = ".".join(parts[:-3]), int(parts[-3]), parts[-2]
    if proj == "down_proj":
        return params[prefix + ".down_proj"], (expert,)
    rows = slice(0, moe_intermediate) if proj == "gate_proj" else slice(moe_intermediate, None)
    return params[prefix + ".gate_up_proj"], (expert, rows)


def run_model(case, out_dir):
    torch, transformers, load_file, save_file = imports()
    k = case["keys"]
    cls, config = hf_config(transformers, case["family"], k)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the loop over experts; grouped_mm has no float64
    generator = torch.Generator().manual_seed(case["seed"])
    model = cls(config).to(torch.float32)
    randomize(torch, model, generator)
    model.save_pretrained(out_dir, safe_serialization=True)
    saved = load_file(os.path.join(out_dir, "model.safetensors"))

    model = model.to(torch.float64)
    ids = torch.randint(k["vocab_size"], (case["batch"], case["seq"]), generator=generator)
    is_moe = case["family"].endswith("_moe")
    deepseek = case["family"] == "deepseek_v3"
    out = model(input_ids=ids, labels=ids, output_router_logits=is_moe or deepseek) \
        if is_moe or deepseek else model(input_ids=ids, labels=ids)
    if deepseek:
        deepseek_margins(torch, model, out.router_logits, k, case["seed"])
    if is_moe:
        top = torch.stack([torch.softmax(r.detach(), -1).topk(k["num_experts_per_tok"] + 1, -1)
                           .values for r in out.router_logits])
        margin = float((top[..., -2] - top[..., -1]).min())
        if margin <= 1e-4:
            sys.exit(f"FAIL: seed {case['seed']}: a router top-k margin of {margin:.3g} <= 1e-4; "
                     "float32 could choose other experts: pick another seed")
        print(f"router top-k margin {margin:.3g}")
    if k["rope_scaling"] != "none":
        # The same weights without the scaling: the case must move the logits, or it would not
        # test the scaled frequencies (float32 parity is a few 1e-7 of the logits' scale).
        plain_cls, plain_config = hf_config(transformers, case["family"], k, scaled=False)
        plain_config._attn_implementation = "eager"
        plain_config._experts_implementation = "eager"
        plain = plain_cls(plain_config).to(torch.float64)
        plain.load_state_dict(model.state_dict())
        with torch.no_grad():
            moved = float((plain(input_ids=ids).logits - out.logits).abs().max())
        scale = float(out.logits.detach().abs().max())
        print(f"rope scaling {k['rope_scaling']} moves the logits by up to {moved:.3g} "
              f"(max |logit| {scale:.3g})")
        if moved < 1e-2 * scale:
            sys.exit(f"FAIL: rope scaling moves the logits by only {moved:.3g}: the case does "
                     "not exercise the scaled frequencies")
    # HF's ForCausalLMLoss casts the logits to float32 and its load-balancing loss sums the router
    # probabilities in float32: out.loss is float32-accurate. The reference loss (and the
    # gradients) use the same formula with the cross entropy in float64, checked against HF's.
    vocab = k["vocab_size"]
    loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, vocab),
                                             ids[:, 1:].reshape(-1))
    if is_moe:
        loss = loss + config.router_aux_loss_coef * out.aux_loss
    if abs(float(loss) - float(out.loss)) > 1e-6 * abs(float(out.loss)):
        sys.exit(f"FAIL: float64 loss {float(loss)!r} is not HF's {float(out.loss)!r}")
    loss.backward()
    result = {"input_ids": ids, "logits": out.logits.detach().contiguous(),
              "loss": loss.detach()}
    if is_moe:
        result["aux_loss"] = out.aux_loss.detach()
    params = dict(model.named_parameters())
    grads = {}
    for name, weight in saved.items():
        if name.endswith("e_score_correction_bias"):  # a buffer: no gradient
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings and name not in params:
            # A tied head saved beside the embedding: the same tensor, whose gradient is the
            # embedding's (named_parameters lists the tied pair once).
            if not torch.equal(weight, saved["model.embed_tokens.weight"]):
                sys.exit("FAIL: the saved tied lm_head.weight is not the embedding")
            continue
        param, index = in_memory(params, name, k.get("moe_intermediate_size"))
        # The saved tensor is the in-memory slice: checks the layout in_memory assumes.
        if not torch.equal(param.detach()[index], weight.to(torch.float64)):
            sys.exit(f"FAIL: saved {name} is not the in-memory tensor assumed here")
        grads[name] = param.grad[index].contiguous()
    save_file(result, os.path.join(out_dir, "reference.safetensors"))
    os.makedirs(os.path.join(out_dir, "grads"))
    save_file(grads, os.path.join(out_dir, "grads", "model.safetensors"))


def run_router(case, out_dir):
    torch, transformers, _, save_file = imports()
    generator = torch.Generator().manual_seed(case["seed"])
    hidden = torch.randn(case["tokens"], case["hidden"], generator=generator)
    weight = torch.randn(case["experts"], case["hidden"], generator=generator) * case["hidden"] ** -0.5
    result = {"hidden": hidden, "weight": weight}
    models = transformers.models
    for family, config_cls, router_cls in (
            ("qwen2_moe", transformers.Qwen2MoeConfig, models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeTopKRouter),
            ("qwen3_moe", transformers.Qwen3MoeConfig, models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter)):
        for norm in (False, True):
            config = config_cls(hidden_size=case["hidden"], num_experts=case["experts"],
                                num_experts_per_tok=case["top_k"], norm_topk_prob=norm)
            router = router_cls(config)
            with torch.no_grad():
                router.weight.copy_(weight)
                logits, scores, indices = router(hidden)
            key = f"{family}.{'norm' if norm else 'plain'}"
            result[key + ".scores"] = scores.contiguous()
            result[key + ".indices"] = indices.contiguous()
    top = torch.softmax(logits.double(), -1).topk(case["top_k"] + 1, -1).values
    margin = float((top[:, :-1] - top[:, 1:]).min())
    if margin <= 1e-4:
        sys.exit(f"FAIL: seed {case['seed']}: router probabilities within {margin:.3g}: not "
                 "ties-free, pick another seed")
    save_file(result, os.path.join(out_dir, "router.safetensors"))


def run_deepseek_router(case, out_dir):
    torch, transformers, _, save_file = imports()
    generator = torch.Generator().manual_seed(case["seed"])
    hidden = torch.randn(case["tokens"], case["hidden"], generator=generator)
    weight = torch.randn(case["experts"], case["hidden"], generator=generator) * case["hidden"] ** -0.5
    bias = torch.randn(case["experts"], generator=generator) * 0.1
    result = {"hidden": hidden, "weight": weight, "bias": bias}
    router_cls = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter
    for name, (groups, keep, norm, scaling) in case["settings"].items():
        config = transformers.DeepseekV3Config(
            hidden_size=case["hidden"], n_routed_experts=case["experts"],
            num_experts_per_tok=case["top_k"], n_group=groups, topk_group=keep,
            norm_topk_prob=norm, routed_scaling_factor=float(scaling))
        router = router_cls(config)
        with torch.no_grad():
            router.weight.copy_(weight)
            router.e_score_correction_bias.copy_(bias)
            logits, weights, indices = router(hidden)
        # Ties-free at float32 rounding, as the model oracle checks.
        per = case["experts"] // groups
        choice = torch.sigmoid(logits.double()) + bias.double()
        group_scores = choice.view(-1, groups, per).topk(2, -1).values.sum(-1)
        kept = group_scores.topk(keep, -1).indices
        mask = torch.zeros_like(group_scores).scatter_(1, kept, 1.0).bool()
        mask = mask.unsqueeze(-1).expand(-1, groups, per).reshape(choice.shape)
        top = choice.masked_fill(~mask, float("-inf")).topk(case["top_k"] + 1, -1).values
        margin = float((top[:, -2] - top[:, -1]).min())
        if keep < groups:
            g = group_scores.topk(keep + 1, -1).values
            margin = min(margin, float((g[:, -2] - g[:, -1]).min()))
        if margin <= 1e-4:
            sys.exit(f"FAIL: {name}: a routing margin of {margin:.3g}: pick another seed")
        result[name + ".weights"] = weights.contiguous()
        result[name + ".indices"] = indices.contiguous()
    save_file(result, os.path.join(out_dir, "router.safetensors"))


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("model", "router", "deepseek_router"):
        sys.exit(__doc__)
    with open(sys.argv[2], encoding="utf-8") as f:
        case = json.load(f)
    {"model": run_model, "router": run_router,
     "deepseek_router": run_deepseek_router}[sys.argv[1]](case, sys.argv[3])


if __name__ == "__main__":
    main()
