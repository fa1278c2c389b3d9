"""Qwen2-MoE in eager PyTorch: mixtrain's model (src/mixtrain/model/qwen2_moe.{h,cpp}), written
the way Hugging Face's Qwen2MoeForCausalLM and torchtitan's MoE write it.

Same parameter names, shapes, registration order and init as ours, so a mixtrain checkpoint
loads 1:1 (under "model.") and the same seed gives the same initial weights:
  model.embed_tokens.weight [V, H]; per layer self_attn.{q,k,v}_proj.{weight,bias},
  o_proj.weight; mlp.gate.weight [E, H] (router); mlp.experts.{gate,up}_proj [E, I, H],
  down_proj [E, H, I]; mlp.shared_expert.{gate,up,down}_proj.weight; shared_expert_gate.weight
  [1, H]; {input,post_attention}_layernorm.weight; model.norm.weight; lm_head.weight (untied).
Numerics as ours and HF: RMSNorm in float32, cast back, scaled in the compute dtype; rotary
cos/sin in float32 per forward, cast to the compute dtype; GQA by repeat_kv; causal attention
with the softmax in float32 ("eager"; `sdpa` uses F.scaled_dot_product_attention instead);
router softmax in float32, top-k without renormalisation, weights cast to the compute dtype;
SwiGLU experts; shared expert scaled by sigmoid(shared_expert_gate(x)); HF's load-balancing
loss over all layers' router logits (float32).

MoE dispatch as torchtitan's for-loop path: the (token, slot) pairs sorted by expert (stable),
one gather, one SwiGLU per expert on its rows, the outputs weighted and added back with one
index_add_. The expert weights are unbound once per forward: HF and torchtitan index `w[e]`
per expert, whose backward writes a full-size zero gradient per expert; unbind gives one
stacked gradient, as ours does, so the twin is not handicapped by it.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rotary_cos_sin(seq_len, head_dim, theta, device):
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / torch.pow(theta, exponents)
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.int64, device=device).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x, cos, sin):
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


def repeat_kv(x, n_rep):
    if n_rep == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


class Attention(nn.Module):
    def __init__(self, c, attention):
        super().__init__()
        h, d = c["model.hidden_size"], c["model.head_dim"]
        self.heads, self.kv_heads, self.head_dim = c["model.num_heads"], c["model.num_kv_heads"], d
        self.q_proj = Linear(h, self.heads * d, True)
        self.k_proj = Linear(h, self.kv_heads * d, True)
        self.v_proj = Linear(h, self.kv_heads * d, True)
        self.o_proj = Linear(self.heads * d, h, False)
        self.attention = attention

    def forward(self, x, cos, sin, causal_mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        groups = self.heads // self.kv_heads
        if self.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=groups > 1)
        else:
            k, v = repeat_kv(k, groups), repeat_kv(v, groups)
            scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
            scores = scores.masked_fill(causal_mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(probs, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, False)
        self.up_proj = Linear(hidden, intermediate, False)
        self.down_proj = Linear(intermediate, hidden, False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.Module):
    def __init__(self, experts, hidden, intermediate):
        super().__init__()
        self.num_experts = experts
        self.gate_proj = nn.Parameter(torch.empty(experts, intermediate, hidden))
        self.up_proj = nn.Parameter(torch.empty(experts, intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, intermediate))

    def forward(self, hidden, selected, weights):
        top_k = selected.shape[1]
        flat = selected.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        token_index = order // top_k
        rows = hidden.index_select(0, token_index).split(counts)
        gate, up, down = self.gate_proj.unbind(0), self.up_proj.unbind(0), self.down_proj.unbind(0)
        outputs = [F.linear(F.silu(F.linear(x, gate[e])) * F.linear(x, up[e]), down[e])
                   for e, x in enumerate(rows) if counts[e] > 0]
        routed = torch.cat(outputs) * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(hidden).index_add_(0, token_index, routed)


class SparseMoeBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["model.hidden_size"]
        self.top_k = c["model.num_experts_per_tok"]
        self.gate = Linear(h, c["model.num_experts"], False)
        self.experts = Experts(c["model.num_experts"], h, c["model.moe_intermediate_size"])
        self.shared_expert = SwiGLU(h, c["model.shared_expert_intermediate_size"])
        self.shared_expert_gate = Linear(h, 1, False)

    def forward(self, x):
        hidden = x.reshape(-1, x.shape[-1])
        router_logits = self.gate(hidden)
        probs = torch.softmax(router_logits, dim=1, dtype=torch.float32)
        weights, selected = torch.topk(probs, self.top_k, dim=-1)
        out = self.experts(hidden, selected, weights.to(hidden.dtype))
        out = out + torch.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert(hidden)
        return out.view(x.shape), router_logits


class DecoderLayer(nn.Module):
    def __init__(self, c, attention):
        super().__init__()
        self.self_attn = Attention(c, attention)
        self.mlp = SparseMoeBlock(c)
        self.input_layernorm = RMSNorm(c["model.hidden_size"], c["model.rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["model.hidden_size"], c["model.rms_norm_eps"])

    def forward(self, x, cos, sin, causal_mask):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, causal_mask)
        mlp_out, router_logits = self.mlp(self.post_attention_layernorm(h))
        return h + mlp_out, router_logits


class Backbone(nn.Module):
    def __init__(self, c, attention):
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = nn.Parameter(
            torch.empty(c["model.vocab_size"], c["model.hidden_size"]))
        self.layers = nn.ModuleList(
            DecoderLayer(c, attention) for _ in range(c["model.num_layers"]))
        self.norm = RMSNorm(c["model.hidden_size"], c["model.rms_norm_eps"])


def load_balancing_loss(router_logits, num_experts, top_k):
    """HF load_balancing_loss_func, in float32 as ours: E * sum_e f_e * P_e."""
    probs = torch.softmax(torch.cat([l.float() for l in router_logits]), dim=-1)
    selected = torch.topk(probs, top_k, dim=-1).indices
    tokens_per_expert = F.one_hot(selected, num_experts).float().mean(0)  # [top_k, E]
    return (tokens_per_expert * probs.mean(0).unsqueeze(0)).sum() * num_experts


class Qwen2MoeForCausalLM(nn.Module):
    def __init__(self, c, attention="eager"):
        super().__init__()
        self.config = c
        self.model = Backbone(c, attention)
        self.lm_head = Linear(c["model.hidden_size"], c["model.vocab_size"], False)

    def param_counts(self):
        """(total, active): every parameter; those one token's forward multiplies by, for
        MFU's 6N: all but the input embedding (a lookup) and the experts the router does not
        pick (k of E per token, each expert the same size)."""
        c = self.config
        total = sum(p.numel() for p in self.parameters())
        experts = sum(p.numel() for layer in self.model.layers
                      for p in layer.mlp.experts.parameters())
        unpicked = experts * (c["model.num_experts"] - c["model.num_experts_per_tok"]) \
            // c["model.num_experts"]
        return total, total - self.model.embed_tokens.weight.numel() - unpicked

    def flops_per_token(self):
        """Training FLOPs per token, PaLM's MFU definition (Chowdhery et al. 2022, appendix
        B): 6 N (forward 2N + backward 4N, N the active params) + 12 L S (heads x head_dim)
        for the attention scores and their use (full S x S: causal masking not subtracted)."""
        c = self.config
        attention = 12 * c["model.num_layers"] * c["data.seq_len"] * c["model.num_heads"] \
            * c["model.head_dim"]
        return 6 * self.param_counts()[1] + attention

    @torch.no_grad()
    def init_weights(self, seed):
        """Ours (HF _init_weights): N(0, 0.02) drawn in named_parameters() order from a CPU
        generator seeded with `seed`, zero biases, ones for norms."""
        generator = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=generator)

    def forward(self, input_ids):
        """int64 [B, S] -> (logits [B, S, V] in the compute dtype, aux loss float32 scalar)."""
        c = self.config
        seq_len = input_ids.shape[1]
        device = input_ids.device
        cos, sin = rotary_cos_sin(seq_len, c["model.head_dim"], c["model.rope_theta"], device)
        causal_mask = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)
        h = F.embedding(input_ids, self.model.embed_tokens.weight)
        router_logits = []
        for layer in self.model.layers:
            h, logits = layer(h, cos, sin, causal_mask)
            router_logits.append(logits)
        logits = self.lm_head(self.model.norm(h))
        aux = load_balancing_loss(router_logits, c["model.num_experts"],
                                  c["model.num_experts_per_tok"])
        return logits, aux
