#include "mixtrain/distributed/context_parallel.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "mixtrain/core/cpu_gemm.h"
#include "mixtrain/core/host_sync.h"
#include "mixtrain/model/attention.h"

namespace mixtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Collectives* group_of(AutogradContext* ctx) {
  return reinterpret_cast<Collectives*>(ctx->saved_data.at("group").toInt());
}

// Rows of `x` (dim 0) travel `step` ranks forward (next = rank + step); backward sends the
// gradient the same distance back.
at::Tensor shift_rows(Collectives& group, const at::Tensor& x, int64_t step) {
  const int64_t n = group.size(), rank = group.rank();
  std::vector<int64_t> send(n, 0), recv(n, 0);
  send[(rank + step + n) % n] = x.size(0);
  recv[(rank - step + n) % n] = x.size(0);
  return group.all_to_all(x.contiguous(), send, recv);
}

struct RingShift : public torch::autograd::Function<RingShift> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Collectives* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["device"] = x.device();
    return shift_rows(*group, x, +1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Collectives* group = group_of(ctx);
    at::Tensor grad = grads[0];
    // Every rank takes part in the exchange, with zeros if nothing used the block.
    if (!grad.defined()) {
      grad = at::zeros(ctx->saved_data.at("shape").toIntVector(),
                       at::TensorOptions()
                           .dtype(static_cast<at::ScalarType>(ctx->saved_data.at("dtype").toInt()))
                           .device(ctx->saved_data.at("device").toDevice()));
    }
    return {shift_rows(*group, grad, -1), at::Tensor()};
  }
};

// Concatenation over the group along dim 0; backward: the float32 sum over the group of the
// gradient of this rank's rows (reduce-scatter), in the input's dtype.
struct GatherRows : public torch::autograd::Function<GatherRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Collectives* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    return group->all_gather(x.contiguous());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Collectives* group = group_of(ctx);
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data.at("dtype").toInt());
    return {group->reduce_scatter_sum(grads[0].to(at::kFloat).contiguous()).to(dtype),
            at::Tensor()};
  }
};

// Sum over the group forward and backward.
struct SumOverGroup : public torch::autograd::Function<SumOverGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Collectives* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    at::Tensor sum = x.contiguous().clone();
    group->all_reduce_sum(sum);
    return sum;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad = grads[0].contiguous().clone();
    group_of(ctx)->all_reduce_sum(grad);
    return {grad, at::Tensor()};
  }
};

// Attention of q [B, Hq, Lq, D] over k, v [B, Hkv, Lk, D] (diagonal causal mask when `causal`,
// Lq == Lk): out [B, Hq, Lq, D] and lse [B, Hq, Lq], both float32, unnormalised over other
// blocks. The precision of attention.h's kernel (see the header).
struct Partial {
  at::Tensor out, lse;
};

Partial partial_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          bool causal, AttentionKernel kernel) {
  const int64_t groups = q.size(1) / k.size(1), head_dim = q.size(3);
  const at::Tensor key = repeat_kv(k, groups), value = repeat_kv(v, groups);
  at::Tensor scores;
  if (kernel == AttentionKernel::kMath) {
    scores = (gemm::matmul(q, key.transpose(2, 3)) / std::sqrt(double(head_dim))).to(at::kFloat);
  } else {
    scores = at::matmul(q.to(at::kFloat), key.to(at::kFloat).transpose(2, 3)) *
             (1.0 / std::sqrt(double(head_dim)));
  }
  if (causal) {
    const int64_t len = q.size(2);
    const auto future = at::ones({len, len}, q.options().dtype(at::kBool)).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  Partial p;
  p.lse = at::logsumexp(scores, -1);
  // P rounded to the compute dtype as the second GEMM's operand, the GEMM in float32.
  const at::Tensor probs = at::exp(scores - p.lse.unsqueeze(-1)).to(q.scalar_type());
  p.out = at::matmul(probs.to(at::kFloat), value.to(at::kFloat));
  return p;
}

// Online softmax merge of `next` into `acc`.
void merge(Partial& acc, const Partial& next) {
  if (!acc.out.defined()) {
    acc = next;
    return;
  }
  const at::Tensor lse = at::logaddexp(acc.lse, next.lse);
  acc.out = acc.out * at::exp(acc.lse - lse).unsqueeze(-1) +
            next.out * at::exp(next.lse - lse).unsqueeze(-1);
  acc.lse = lse;
}

// Global chunk indices held by cp rank `rank` of `n`.
std::array<int64_t, 2> chunks_of(int64_t rank, int64_t n) {
  return {rank, 2 * n - 1 - rank};
}

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && k.dim() == 4 && q.size(0) == k.size(0) &&
                  q.size(2) == k.size(2) && q.size(3) == k.size(3) && q.size(1) % k.size(1) == 0,
              "context-parallel attention: q ", q.sizes(), " and k/v ", k.sizes(), " ", v.sizes(),
              " do not fit");
  TORCH_CHECK(q.size(2) % 2 == 0, "context-parallel attention: the local sequence ", q.size(2),
              " is not two equal chunks");
}

// The ring with LibTorch's CPU flash-attention kernel (kFlash on the CPU), as one Function
// that keeps no scores: forward saves q, the merged output and log-sum-exp, and the K/V blocks
// it received; backward runs the kernel's backward per chunk pair with the merged output and
// log-sum-exp (so each block's P is the whole sequence's softmax), summing dq locally and the
// K/V gradients in float32 on an accumulator that walks back along the ring to the block's
// owner (cp - 1 shifts, as many as the forward's).
struct RingFlashAttention : public torch::autograd::Function<RingFlashAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, Collectives* group) {
    const int64_t n = group->size(), rank = group->rank(), chunk = q.size(2) / 2;
    const auto q_ids = chunks_of(rank, n);
    std::array<Partial, 2> acc;
    std::vector<at::Tensor> blocks;
    at::Tensor kv = at::stack({k, v});
    for (int64_t step = 0; step < n; ++step) {
      if (step > 0) kv = shift_rows(*group, kv, +1);
      blocks.push_back(kv);
      const auto k_ids = chunks_of((rank - step + n) % n, n);
      for (int64_t a = 0; a < 2; ++a) {
        for (int64_t b = 0; b < 2; ++b) {
          if (k_ids[b] > q_ids[a]) continue;
          auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
              q.narrow(2, a * chunk, chunk), kv[0].narrow(2, b * chunk, chunk),
              kv[1].narrow(2, b * chunk, chunk), 0.0, k_ids[b] == q_ids[a]);
          merge(acc[a], Partial{out.to(at::kFloat), lse});
        }
      }
    }
    const at::Tensor out = at::cat({acc[0].out, acc[1].out}, 2).to(q.scalar_type());
    ctx->save_for_backward({q, out, at::cat({acc[0].lse, acc[1].lse}, 2)});
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["blocks"] = blocks;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Collectives* group = group_of(ctx);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &out = saved[1], &lse = saved[2];
    const auto blocks = ctx->saved_data.at("blocks").toTensorVector();
    const int64_t n = group->size(), rank = group->rank(), chunk = q.size(2) / 2;
    const auto q_ids = chunks_of(rank, n);
    const at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(out);
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    at::Tensor dkv;  // the K/V gradient of the block held at `step`, float32
    for (int64_t step = n - 1; step >= 0; --step) {
      const at::Tensor& kv = blocks[step];
      const at::Tensor contrib = at::zeros(kv.sizes(), kv.options().dtype(at::kFloat));
      const auto k_ids = chunks_of((rank - step + n) % n, n);
      for (int64_t a = 0; a < 2; ++a) {
        for (int64_t b = 0; b < 2; ++b) {
          if (k_ids[b] > q_ids[a]) continue;
          auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
              dout.narrow(2, a * chunk, chunk), q.narrow(2, a * chunk, chunk),
              kv[0].narrow(2, b * chunk, chunk), kv[1].narrow(2, b * chunk, chunk),
              out.narrow(2, a * chunk, chunk), lse.narrow(2, a * chunk, chunk), 0.0,
              k_ids[b] == q_ids[a]);
          dq.narrow(2, a * chunk, chunk).add_(gq);
          contrib[0].narrow(2, b * chunk, chunk).add_(gk);
          contrib[1].narrow(2, b * chunk, chunk).add_(gv);
        }
      }
      // The accumulator of step + 1's block (owner rank - step - 1) moves to rank - 1, where
      // that block was the step-th one; after step 0 it is at its owner.
      dkv = step == n - 1 ? contrib : shift_rows(*group, dkv, -1).add_(contrib);
    }
    const auto dtype = q.scalar_type();
    return {dq.to(dtype), dkv[0].to(dtype), dkv[1].to(dtype), at::Tensor()};
  }
};

}  // namespace

CpRotateMethod parse_cp_rotate_method(const std::string& name) {
  if (name == "alltoall") return CpRotateMethod::kAllToAll;
  if (name == "allgather") return CpRotateMethod::kAllGather;
  throw std::invalid_argument("cp_rotate_method must be \"alltoall\" or \"allgather\", not \"" +
                              name + "\"");
}

at::Tensor context_parallel_local(const at::Tensor& t, const DeviceMesh& mesh) {
  return mesh.cp > 1 ? context_parallel_slice(t, mesh.cp_index(), mesh.cp) : t;
}

at::Tensor context_parallel_slice(const at::Tensor& t, int64_t cp_rank, int64_t cp_size,
                                  int64_t dim) {
  const int64_t len = t.size(dim);
  TORCH_CHECK(len % (2 * cp_size) == 0, "context_parallel_slice: length ", len,
              " is not a multiple of 2 x cp = ", 2 * cp_size);
  const int64_t chunk = len / (2 * cp_size);
  const auto [first, second] = chunks_of(cp_rank, cp_size);
  return at::cat({t.narrow(dim, first * chunk, chunk), t.narrow(dim, second * chunk, chunk)}, dim);
}

ContextParallel::ContextParallel(std::shared_ptr<Collectives> cp_group, CpRotateMethod method)
    : group_(std::move(cp_group)), method_(method) {}

torch::Tensor ContextParallel::positions(int64_t local_seq) const {
  TORCH_CHECK(local_seq % 2 == 0, "context parallelism: local sequence ", local_seq,
              " is not two equal chunks");
  return context_parallel_slice(at::arange(local_seq * cp_size(), at::kLong), cp_rank(), cp_size(),
                                0);
}

torch::Tensor ContextParallel::attention(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v, AttentionKernel kernel) {
  check_shapes(q, k, v);
  return method_ == CpRotateMethod::kAllToAll ? ring_attention(q, k, v, kernel)
                                              : allgather_attention(q, k, v, kernel);
}

torch::Tensor ContextParallel::ring_attention(const torch::Tensor& q, const torch::Tensor& k,
                                              const torch::Tensor& v, AttentionKernel kernel) {
  if (kernel == AttentionKernel::kFlash && q.device().is_cpu()) {
    return RingFlashAttention::apply(q, k, v, group_.get());
  }
  const int64_t n = cp_size(), rank = cp_rank(), chunk = q.size(2) / 2;
  const auto q_ids = chunks_of(rank, n);
  std::array<Partial, 2> acc;
  at::Tensor kv = at::stack({k, v});  // [2, B, Hkv, S_local, D]: one block travels
  for (int64_t step = 0; step < n; ++step) {
    if (step > 0) kv = RingShift::apply(kv, group_.get());
    const auto k_ids = chunks_of((rank - step + n) % n, n);
    for (int64_t a = 0; a < 2; ++a) {
      const at::Tensor qa = q.narrow(2, a * chunk, chunk);
      for (int64_t b = 0; b < 2; ++b) {
        if (k_ids[b] > q_ids[a]) continue;  // a later chunk: fully masked
        merge(acc[a],
              partial_attention(qa, kv[0].narrow(2, b * chunk, chunk),
                                kv[1].narrow(2, b * chunk, chunk), k_ids[b] == q_ids[a], kernel));
      }
    }
  }
  return at::cat({acc[0].out, acc[1].out}, 2).to(q.scalar_type());
}

torch::Tensor ContextParallel::allgather_attention(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v, AttentionKernel kernel) {
  const int64_t n = cp_size(), local = q.size(2), seq = local * n, head_dim = q.size(3);
  // [S_local, 2, B, Hkv, D]: the sequence on dim 0, which all_gather concatenates.
  const at::Tensor kv = at::stack({k, v}).permute({3, 0, 1, 2, 4});
  const at::Tensor gathered = GatherRows::apply(kv, group_.get());  // rank-major
  // Row of `gathered` holding global position p: rank r's token t sits at r * local + t.
  const at::Tensor order = at::empty({seq}, at::kLong);
  for (int64_t r = 0; r < n; ++r) {
    order.index_put_({context_parallel_slice(at::arange(seq, at::kLong), r, n, 0)},
                     at::arange(r * local, (r + 1) * local, at::kLong));
  }
  const at::Tensor full =
      gathered.index_select(0, copy_to_device(order, q.device(), "cp allgather: order"))
          .permute({1, 2, 3, 0, 4});
  const at::Tensor key = full[0], value = full[1];  // [B, Hkv, S, D], global order
  const at::Tensor q_pos = copy_to_device(positions(local), q.device(), "cp allgather: positions");
  const at::Tensor allowed =
      at::arange(seq, q_pos.options()).unsqueeze(0) <= q_pos.unsqueeze(1);  // [S_local, S]
  if (kernel == AttentionKernel::kFlash) {
    return at::scaled_dot_product_attention(q, key, value, allowed, /*dropout_p=*/0.0,
                                            /*is_causal=*/false, 1.0 / std::sqrt(double(head_dim)),
                                            /*enable_gqa=*/true);
  }
  const int64_t groups = q.size(1) / k.size(1);
  auto weights =
      gemm::matmul(q, repeat_kv(key, groups).transpose(2, 3)) / std::sqrt(double(head_dim));
  weights = weights.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  weights = at::softmax(weights, -1, at::kFloat).to(q.scalar_type());
  return gemm::matmul(weights, repeat_kv(value, groups));
}

torch::Tensor ContextParallel::max_logits(const torch::Tensor& q, const torch::Tensor& k) {
  at::NoGradGuard no_grad;
  const int64_t n = cp_size(), local = k.size(2), seq = local * n;
  // [S_local, B, Hkv, D] gathered rank-major; rank r's rows hold its two chunks' positions.
  const at::Tensor gathered = group_->all_gather(k.permute({2, 0, 1, 3}).contiguous());
  std::vector<at::Tensor> key_positions;
  for (int64_t r = 0; r < n; ++r) {
    key_positions.push_back(context_parallel_slice(at::arange(seq, at::kLong), r, n, 0));
  }
  return causal_max_logits(q, gathered.permute({1, 2, 0, 3}), positions(local),
                           at::cat(key_positions));
}

torch::Tensor ContextParallel::all_reduce_sum(const torch::Tensor& x) {
  return SumOverGroup::apply(x, group_.get());
}

void plan_context_parallel(const DeviceMesh& mesh, CpRotateMethod method, ParallelPlan& plan) {
  plan.context_parallel = std::make_shared<ContextParallel>(mesh.cp_group, method);
}

}  // namespace mixtrain
