// QK-clip (MuonClip: Kimi K2, arXiv 2507.20534 §2.1), applied after the optimizer step.
//
// The forward records, per attention layer and query head h, S_h = the max over the step's
// micro-batches (and, after reduce_max_logits, over every rank) of the scaled logit
// q_i . k_j / sqrt(D) the causal mask lets through (model/max_logit_recorder.h). With tau > 0
// the heads with S_h > tau are clipped: gamma_h = tau / S_h (1 for the others), and the q and k
// projections are rescaled so that head h's logits are multiplied by exactly gamma_h.
//   MHA (K2's case): W_q^h and W_k^h each times sqrt(gamma_h).
//   GQA (K2 has no GQA; our choice): kv head g serves query heads G_g = [g n, (g+1) n),
//     n = Hq / Hkv. With m_g = min over G_g of gamma_h, k_g is scaled by sqrt(m_g) and q_h by
//     gamma_h / sqrt(m_g): every logit of head h scales by gamma_h exactly, an unclipped head's
//     logits are unchanged (its q grows by 1 / sqrt(m_g) to cancel its shared k's shrink), and
//     n = 1 is K2's sqrt(gamma_h) on both.
// A head's rows (rows [h D, (h+1) D) of q_proj.weight / q_proj.bias, likewise k_proj) are scaled,
// biases included: (a W x + a b) = a (W x + b), and rotary is linear, so the logit scales by the
// product of the q and k factors. Models with per-head q/k RMSNorm are refused by the
// config check (muon_config.cpp): their logits do not depend on the projections' scale.
//   Multi-head latent attention (K2's own case; the projections with a HeadLayout, core/
//   param_role.h): per head the logit is q_content . k_content + q_rotary . k_rotary, the rotary
//   key shared by every head. K2 scales head h's query content rows (q_b_proj / q_proj) and key
//   content rows (kv_b_proj) by sqrt(gamma_h) and its query rotary rows by gamma_h, leaving the
//   shared rotary key (kv_a_proj_with_mqa) and the value rows untouched: both terms scale by
//   gamma_h.
//
// Where: on the tensors the optimizer updates (the fp32 main params with fp32_main_params, the
// parameters themselves otherwise), each rank scaling the rows it holds (FSDP dim-0 chunks,
// tensor-parallel slices: core/param_placement.h global_offsets), then the low-precision model
// param is rewritten from its main param (round to nearest even, as the optimizer's copy-back),
// so both agree.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/core/collectives.h"
#include "mixtrain/core/param_placement.h"
#include "mixtrain/core/param_role.h"
#include "mixtrain/optim/chained_optimizer.h"

namespace mixtrain {

// Factors for one layer: q [Hq], k [Hkv] (see above). max_logits [Hq]; tau > 0.
struct QkClipScales {
  std::vector<double> q, k;
};
QkClipScales qk_clip_scales(const std::vector<double>& max_logits, int64_t num_kv_heads,
                            double tau);

// The factor of every global row of a projection with HeadLayout `layout` (block > 0; the
// standard layout through head_layout_or_standard) whose
// heads get `head_scale`: content rows head_scale[h], rotary rows head_scale[h]^2 (a query's
// rotary part: gamma where content gets sqrt(gamma)), the rest 1.
std::vector<double> head_layout_row_scales(const HeadLayout& layout,
                                           const std::vector<double>& head_scale);

struct QkClipStats {
  int64_t heads = 0;          // query heads over all layers
  int64_t heads_clipped = 0;  // of them with S_h > tau this step
  double max_logit = 0.0;     // max over every head and layer of S_h
};

// The recorder's layers (prefix -> float32 [Hq], any device), max-reduced elementwise over
// `world` (every rank must hold the same layer keys): -> prefix -> the global S_h on the host.
// Collective over world (one max all_reduce of layers x Hq float32).
std::map<std::string, std::vector<double>> reduce_max_logits(
    Collectives& world, const std::map<std::string, at::Tensor>& layers);

// Clips every layer of `max_logits` (keys: the attention layer's recorder key, e.g.
// "model.layers.0.self_attn.") in `chain`'s query and key projections of that layer (weights
// and biases, by the model's `roles`: kAttentionQuery / kAttentionKey with that
// attention_layer): the optimizer param scaled, then the model param rewritten from it where it
// is a separate tensor. placements: how each parameter is held (by name; absent: whole). Throws
// std::invalid_argument when a layer's query or key weight is not in the chain.
QkClipStats apply_qk_clip(ChainedOptimizer& chain,
                          const std::map<std::string, std::vector<double>>& max_logits,
                          const std::vector<ParamPlacement>& placements, const ModelConfig& model,
                          double tau, const ParamRoles& roles);

}  // namespace mixtrain
