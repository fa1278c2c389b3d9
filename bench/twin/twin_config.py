"""Reads a mixtrain YAML config (docs/config.md, YAML dialect) for the eager PyTorch twin.

Only what the twin needs: a block-mapping subset of YAML (nested `key: value` by indentation,
`#` comments, scalars, inline lists such as `[0.9, 0.95]` or `[[a, b, c], ...]`), enough for
configs/*.yaml and the configs the benches write. The environment has no PyYAML, and this
keeps the twin free of extra packages. Every key docs/config.md lists is known: the ones that
change the computation are read (with the documented defaults), those that do not (data
source, logging, checkpointing, timeouts, swap) are accepted and ignored, and any other key is
an error, so a config the twin would silently compute differently from mixtrain is refused.
"""

import re

# Canonical key -> default (docs/config.md). None: YAML null.
DEFAULTS = {
    "model_init_dtype": None,
    "fsdp_config.mix_precision.param_dtype": "float32",
    "fsdp_config.mix_precision.reduce_dtype": None,
    "fsdp_config.mix_precision.output_dtype": "float32",
    "fsdp_config.mix_precision.cast_forward_inputs": True,
    "optimizer._target_": "AdamW",
    "optimizer.fp32_main_params": False,
    "optimizer.adamw_config.adamw_lr": 0.001,
    "optimizer.adamw_config.adamw_weight_decay": 0.01,
    "optimizer.adamw_config.adamw_betas": [0.9, 0.999],
    "optimizer.adamw_config.adamw_eps": 1e-8,
    "optimizer.muon_config.muon_lr": 0.02,
    "optimizer.muon_config.muon_weight_decay": 0.0,
    "optimizer.muon_config.muon_momentum": 0.95,
    "optimizer.muon_config.muon_nesterov": True,
    "optimizer.muon_config.muon_ns_steps": 5,
    "optimizer.muon_config.muon_ns_variant": "asym5",
    "optimizer.muon_config.muon_ns_coefficients": [],
    "optimizer.muon_config.muon_ns_epsilon": 1e-7,
    "optimizer.muon_config.muon_ns_dtype": "bfloat16",
    "optimizer.muon_config.muon_matched_adamw_rms": 0.2,
    "optimizer.muon_config.muon_adjust_lr_fn": "match_rms_adamw",
    "optimizer.muon_config.muon_momentum_style": "sum",
    "optimizer.muon_config.muon_adamw_keywords": [],
    "model.name": "qwen2_moe",
    "model.vocab_size": 512,
    "model.hidden_size": 64,
    "model.num_layers": 2,
    "model.num_heads": 4,
    "model.num_kv_heads": 2,
    "model.head_dim": 16,
    "model.moe_intermediate_size": 64,
    "model.num_experts": 4,
    "model.num_experts_per_tok": 2,
    "model.shared_expert_intermediate_size": 128,
    "model.max_seq_len": 256,
    "model.rope_theta": 10000.0,
    "model.rope_scaling": "none",
    "model.rope_scaling_factor": 8.0,
    "model.rope_low_freq_factor": 1.0,
    "model.rope_high_freq_factor": 4.0,
    "model.rope_original_max_seq_len": 8192,
    "model.rms_norm_eps": 1e-6,
    "model.router_aux_loss_coef": 0.001,
    "data.seq_len": 64,
    "data.micro_batch_size": 8,
    "data.global_batch_size": 8,
    "train.device": "cpu",
    "train.steps": 100,
    "train.seed": 1234,
    "train.max_grad_norm": 1.0,
    "train.lr_scheduler.warmup_steps": 10,
    "train.lr_scheduler.decay": "cosine",
    "train.lr_scheduler.min_lr_ratio": 0.1,
    "parallel.dp_shard": 1,
    "parallel.dp_replicate": 1,
    "parallel.ep": 1,
}

# Keys that do not change one process's step computation: accepted, not used.
IGNORED = {
    "fsdp_config.reshard_after_forward", "optimizer.swap_optimizer",
    "optimizer.swap_merge_buckets", "optimizer.swap_dir", "optimizer.swap_bucket_mb",
    "optimizer.muon_config.muon_communication_dtype", "data.kind", "data.path",
    "train.log_every", "train.profile", "distributed.timeout_s", "checkpoint.dir",
    "checkpoint.interval", "checkpoint.keep_last", "checkpoint.async",
    "checkpoint.save_optimizer", "checkpoint.restore_from", "checkpoint.restore_optimizer",
}

_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class ConfigError(ValueError):
    pass


def _strip_comment(line):
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _split_top_level(text):
    """Splits `a, [b, c], d` at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_scalar(text):
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [] if not inner else [parse_scalar(p) for p in _split_top_level(inner)]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    if text in ("null", "~", ""):
        return None
    if text in ("true", "false"):
        return text == "true"
    if _NUMBER.match(text):
        value = float(text)
        return int(text) if re.match(r"^[-+]?\d+$", text) else value
    return text


def parse_yaml_mapping(text, source="<config>"):
    """Nested block mappings of `key: value` lines -> {dotted key: value}."""
    flat = {}
    stack = []  # (indent, key prefix)
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        if body.startswith("- ") or body == "-":
            raise ConfigError(f"{source}:{number}: block lists are not supported by the twin's "
                              "reader; write the list inline ([a, b])")
        key, sep, value = body.partition(":")
        if not sep or not key.strip():
            raise ConfigError(f"{source}:{number}: expected 'key: value', got {body!r}")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        full = ".".join([prefix for _, prefix in stack] + [key.strip()])
        if value.strip():
            flat[full] = parse_scalar(value)
        else:
            stack.append((indent, key.strip()))
            flat.setdefault(full + ".", None)  # a section; dropped below
    return {k: v for k, v in flat.items() if not k.endswith(".")}


def load_config(path):
    """{canonical key: value} with every DEFAULTS key present; ConfigError for unknown keys
    and for configs the twin does not compute like mixtrain (TOML, ranks, float16)."""
    if not path.endswith((".yaml", ".yml")):
        raise ConfigError(f"{path}: the twin reads the YAML dialect only")
    with open(path) as f:
        given = parse_yaml_mapping(f.read(), path)
    config = dict(DEFAULTS)
    for key, value in given.items():
        if key in IGNORED:
            continue
        if key not in DEFAULTS:
            raise ConfigError(f"{path}: {key}: unknown to the twin (docs/config.md keys only)")
        config[key] = value
    target = str(config["optimizer._target_"]).rsplit(".", 1)[-1]
    if target not in ("AdamW", "Muon"):
        raise ConfigError(f"{path}: optimizer._target_: {target!r} is not AdamW or Muon")
    config["optimizer._target_"] = target
    for key in ("parallel.dp_shard", "parallel.dp_replicate", "parallel.ep"):
        if config[key] != 1:
            raise ConfigError(f"{path}: {key}: the twin is one process; must be 1")
    model_dtype = config["model_init_dtype"] or "float32"
    if config["fsdp_config.mix_precision.param_dtype"] != model_dtype:
        raise ConfigError(f"{path}: fsdp_config.mix_precision.param_dtype must equal "
                          "model_init_dtype (float32 when null) in the twin")
    if model_dtype == "float16":
        raise ConfigError(f"{path}: float16 models need loss scaling, which the twin lacks")
    if config["train.device"] not in ("cpu", "cuda"):
        raise ConfigError(f"{path}: train.device must be cpu or cuda")
    if config["model.name"] != "qwen2_moe":
        raise ConfigError(f"{path}: model.name: only qwen2_moe")
    if config["model.rope_scaling"] != "none":
        raise ConfigError(f"{path}: model.rope_scaling: the twin has unscaled rotary embeddings")
    return config
