// Distributed Muon: the owner plan, the wiring helper, and the communicating paths of Muon
// (step_fsdp, step_ddp), which live here rather than in muon.cpp so the single-process leaf
// reads on its own. See distributed_muon.h for the contract.
#include "mixtrain/optim/distributed_muon.h"
#include "mixtrain/core/host_sync.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "mixtrain/core/dtype.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/muon_owner_plan.h"
#include "mixtrain/optim/normuon.h"

namespace mixtrain {
namespace {

int64_t product(const std::vector<int64_t>& dims, size_t from) {
  return c10::multiply_integers(dims.begin() + static_cast<std::ptrdiff_t>(from), dims.end());
}

std::string describe(const MuonSharding& sharding) {
  return sharding.name.empty() ? std::string("a parameter") : "'" + sharding.name + "'";
}

// Every rank of the group must step the same parameters, or the all_to_alls would pair
// mismatched shards (or wait forever). One 2-int sum tells: the group total equals size()
// times the local value on every rank iff all ranks agree. The sum travels on the params'
// device (a NCCL group takes device tensors only), filled there without a host copy; reading
// it back is a host synchronisation, as it must be: its value decides whether to throw before
// the all_to_alls could hang. So it runs on a path's first step and whenever this rank's count
// or numel changes (Muon::check_params_once), not on every step: the set of parameters with a
// gradient is fixed by the model and the layout, the same on every step. A rank whose set
// changed alone checks alone; its peers' next collective then mismatches it and the NCCL
// watchdog ends the run after distributed.timeout_s (Gloo: the collective timeout), not a hang.
void check_same_params(Collectives& comm, const char* path, int64_t count, int64_t numel,
                       c10::Device device) {
  at::Tensor totals = at::empty({2}, at::TensorOptions().dtype(at::kLong).device(device));
  totals.select(0, 0).fill_(count);
  totals.select(0, 1).fill_(numel);
  comm.all_reduce_sum(totals);
  totals = read_to_host(totals, "distributed muon: parameter check");
  const int64_t n = comm.size();
  const int64_t total_count = totals[0].item<int64_t>();
  const int64_t total_numel = totals[1].item<int64_t>();
  if (total_count != n * count || total_numel != n * numel) {
    throw std::logic_error(
        std::string("Muon ") + path + " over group '" + comm.name() +
        "': ranks step different parameters (rank " + std::to_string(comm.rank()) + ": " +
        std::to_string(count) + " params with a grad, " + std::to_string(numel) +
        " elements; group total: " + std::to_string(total_count) + " params, " +
        std::to_string(total_numel) + " elements over " + std::to_string(n) + " ranks)");
  }
}

}  // namespace

void Muon::check_params_once(Collectives& comm, const char* path, int64_t count, int64_t numel,
                             c10::Device device) {
  const auto key = std::make_pair(static_cast<const Collectives*>(&comm), std::string(path));
  const auto it = agreed_.find(key);
  if (it != agreed_.end() && it->second == std::make_pair(count, numel)) return;
  check_same_params(comm, path, count, numel, device);
  agreed_[key] = {count, numel};
}

std::string muon_sharding_kind_name(MuonSharding::Kind kind) {
  switch (kind) {
    case MuonSharding::Kind::kLocal:
      return "local";
    case MuonSharding::Kind::kFsdp:
      return "fsdp";
    case MuonSharding::Kind::kReplicated:
      return "replicated";
  }
  throw std::logic_error("muon_sharding_kind_name: bad enum value");
}

bool muon_steps_locally(const MuonSharding& sharding, int64_t ndim) {
  return sharding.kind == MuonSharding::Kind::kLocal ||
         (sharding.kind == MuonSharding::Kind::kFsdp && ndim >= 3);
}

std::vector<int64_t> fsdp_chunk_rows(int64_t dim0, int ranks) {
  if (ranks < 1) throw std::invalid_argument("fsdp_chunk_rows: ranks must be >= 1");
  if (dim0 < 0) throw std::invalid_argument("fsdp_chunk_rows: negative dim 0");
  const int64_t chunk = (dim0 + ranks - 1) / ranks;
  std::vector<int64_t> rows(ranks);
  for (int r = 0; r < ranks; ++r) rows[r] = std::clamp<int64_t>(dim0 - r * chunk, 0, chunk);
  return rows;
}

c10::ScalarType parse_muon_communication_dtype(const std::string& name) {
  const auto dtype = parse_float_dtype(name);
  if (!dtype || (*dtype != at::kBFloat16 && *dtype != at::kFloat)) {
    throw std::invalid_argument("unknown muon_communication_dtype '" + name +
                                "' (expected bfloat16 or float32)");
  }
  return *dtype;
}

std::vector<int64_t> MuonSharding::whole_shape(std::vector<int64_t> slice_shape) const {
  if (tp_split()) slice_shape.at(static_cast<size_t>(tp_dim)) *= tp_group->size();
  return slice_shape;
}

MuonSharding muon_sharding_of(const ParamPlacement& placement) {
  MuonSharding sharding;
  sharding.name = placement.name;
  if (placement.tp_split()) {
    sharding.tp_dim = placement.tp_dim;
    sharding.tp_group = placement.tp_group;
  }
  switch (placement.kind) {
    case ParamPlacement::Kind::kDim0Shard:
      sharding.kind = MuonSharding::Kind::kFsdp;
      sharding.full_shape = placement.tp_shape();
      sharding.group = placement.shard_group;
      break;
    case ParamPlacement::Kind::kReplicated:
      sharding.kind = MuonSharding::Kind::kReplicated;
      sharding.group = placement.replicate_group;
      break;
    case ParamPlacement::Kind::kWhole:
      if (sharding.tp_split()) {
        // One data-parallel rank: step_ddp over a one-rank group gathers the tp slices.
        static const std::shared_ptr<Collectives> one_rank = make_local_collectives("tp_whole");
        sharding.kind = MuonSharding::Kind::kReplicated;
        sharding.group = one_rank;
      }
      break;
    case ParamPlacement::Kind::kExpertSlice:
      if (sharding.tp_split()) {
        throw std::invalid_argument("Muon: expert tensor '" + placement.name +
                                    "' has a tensor-parallel split (experts are never tp-split)");
      }
      break;
  }
  return sharding;
}

// ---- Muon members for the distributed layouts ----

void Muon::set_placement(const at::Tensor& param, const ParamPlacement& placement) {
  set_sharding(param, muon_sharding_of(placement));
}

const MuonOptions& Muon::group_options(size_t group) const {
  return static_cast<const MuonOptions&>(param_groups_[group].options());
}

void Muon::set_sharding(const at::Tensor& param, MuonSharding sharding) {
  if (!batches_match_groups()) rebuild_batches();  // sizes sharding_ like the groups
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].is_same(param)) continue;
      const std::string what = "Muon::set_sharding(" + describe(sharding) + ", " +
                               muon_sharding_kind_name(sharding.kind) + ")";
      if (sharding.kind != MuonSharding::Kind::kLocal && !sharding.group) {
        throw std::invalid_argument(what + ": needs a Collectives group");
      }
      if (sharding.tp_split() && (sharding.kind == MuonSharding::Kind::kLocal || param.dim() != 2 ||
                                  sharding.tp_dim >= 2)) {
        throw std::invalid_argument(what + ": a tensor-parallel split (tp_dim " +
                                    std::to_string(sharding.tp_dim) +
                                    ") needs a 2-D parameter held kFsdp or kReplicated, not " +
                                    std::to_string(param.dim()) + "-D");
      }
      if (sharding.kind == MuonSharding::Kind::kFsdp) {
        const auto& full = sharding.full_shape;
        bool ok = static_cast<int64_t>(full.size()) == param.dim();
        for (size_t d = 1; ok && d < full.size(); ++d) ok = full[d] == param.size(d);
        if (ok) {
          const auto rows = fsdp_chunk_rows(full[0], sharding.group->size());
          ok = rows[sharding.group->rank()] == param.size(0);
        }
        if (!ok) {
          throw std::invalid_argument(what + ": shape " + c10::str(param.sizes()) +
                                      " is not the dim-0 chunk of rank " +
                                      std::to_string(sharding.group->rank()) + " of " +
                                      std::to_string(sharding.group->size()) + " of full shape " +
                                      c10::str(at::IntArrayRef(full)));
        }
      }
      if (sharding.kind == MuonSharding::Kind::kReplicated && !sharding.full_shape.empty() &&
          at::IntArrayRef(sharding.full_shape) != param.sizes()) {
        throw std::invalid_argument(what + ": a replicated parameter's full_shape " +
                                    c10::str(at::IntArrayRef(sharding.full_shape)) +
                                    " differs from its shape " + c10::str(param.sizes()));
      }
      sharding_[g][i] = std::move(sharding);
      rebuild_batches();
      return;
    }
  }
  throw std::invalid_argument("Muon::set_sharding(" + describe(sharding) +
                              "): parameter is not in any group");
}

const MuonSharding& Muon::sharding(const at::Tensor& param) const {
  static const MuonSharding kLocal;
  for (size_t g = 0; g < param_groups_.size() && g < sharding_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size() && i < sharding_[g].size(); ++i) {
      if (params[i].is_same(param)) return sharding_[g][i];
    }
  }
  return kLocal;
}

void Muon::step_distributed() {
  // One path per (group, kind), in the order of the first parameter that uses it: the
  // parameter order is the same on every rank, so the collectives line up.
  struct Path {
    Collectives* comm;
    MuonSharding::Kind kind;
    std::vector<DistributedParam> params;
  };
  std::vector<Path> paths;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const MuonSharding& sharding = sharding_[g][i];
      if (muon_steps_locally(sharding, params[i].dim())) continue;  // step_experts
      // Every rank refuses a head split that does not fit the whole matrix, before any
      // collective (an owner throwing alone would leave the others waiting).
      muon_matrix_shape(sharding.whole_shape(sharding.kind == MuonSharding::Kind::kFsdp
                                                 ? sharding.full_shape
                                                 : params[i].sizes().vec()),
                        head_split_[g][i], describe(sharding));
      auto it = std::find_if(paths.begin(), paths.end(), [&](const Path& path) {
        return path.comm == sharding.group.get() && path.kind == sharding.kind;
      });
      if (it == paths.end())
        it = paths.insert(paths.end(), {sharding.group.get(), sharding.kind, {}});
      it->params.push_back({g, params[i], &sharding, &head_split_[g][i]});
    }
  }
  for (const auto& path : paths) {
    if (path.kind == MuonSharding::Kind::kFsdp) {
      step_fsdp(*path.comm, path.params);
    } else {
      step_ddp(*path.comm, path.params);
    }
  }
}

namespace {

// float32 when a param of the bucket has NorMuon; bfloat16 when every param's Newton–Schulz
// runs in bfloat16 (exact: NS casts u to bfloat16 first and returns bfloat16), else the widest
// communication_dtype among them.
template <typename OptionsOf>
c10::ScalarType wire_dtype(const std::vector<size_t>& bucket, OptionsOf options_of) {
  bool all_bf16 = true;
  bool any_fp32 = false;
  for (size_t item : bucket) {
    const MuonOptions& options = options_of(item);
    // NorMuon's update and its v rows are float32 (exact only on a float32 wire).
    if (options.normuon()) return at::kFloat;
    all_bf16 = all_bf16 && options.ns_dtype() == at::kBFloat16;
    any_fp32 = any_fp32 || options.communication_dtype() == at::kFloat;
  }
  if (all_bf16) return at::kBFloat16;
  return any_fp32 ? at::kFloat : at::kBFloat16;
}

// The whole matrix from this rank's tp slice `slice` (the shape MuonSharding::tp_dim splits):
// every tp peer's slice, concatenated along tp_dim. Collective over tp_group when tp_split().
at::Tensor gather_tp(const MuonSharding& sharding, const at::Tensor& slice) {
  if (!sharding.tp_split()) return slice;
  const int64_t tp = sharding.tp_group->size();
  const at::Tensor stacked = sharding.tp_group->all_gather(slice.contiguous());  // dim 0
  return at::cat(stacked.chunk(tp, 0), sharding.tp_dim);
}

// This rank's tp slice of the whole matrix `whole` (contiguous).
at::Tensor tp_slice(const MuonSharding& sharding, const at::Tensor& whole) {
  if (!sharding.tp_split()) return whole;
  const int64_t n = whole.size(sharding.tp_dim) / sharding.tp_group->size();
  return whole.narrow(sharding.tp_dim, sharding.tp_group->rank() * n, n).contiguous();
}

// The update scale of a matrix whose tp slice is `slice_shape`: from the whole matrix's shape,
// or its heads' under a head split.
double whole_scale(const MuonSharding& sharding, const MuonHeadSplit& split,
                   const std::vector<int64_t>& slice_shape, const MuonOptions& options) {
  const auto [rows, cols] =
      muon_matrix_shape(sharding.whole_shape(slice_shape), split, describe(sharding));
  return muon_update_scale(rows, cols, options.adjust_lr_fn(), options.matched_adamw_rms());
}

// NorMuon's v rows (the param's shape without its last dim) travel with u: that many per
// matrix of `shape` with NorMuon on, else none.
int64_t normuon_rows(c10::IntArrayRef shape, const MuonOptions& options) {
  if (!options.normuon() || shape.empty() || shape.back() == 0) return 0;
  return c10::multiply_integers(shape) / shape.back();
}

// v rows of a tp slice are split like the slice's rows unless tp_dim is the last (column) dim,
// where every tp peer holds all of them.
bool tp_splits_rows(const MuonSharding& sharding, const at::Tensor& v) {
  return sharding.tp_split() && sharding.tp_dim < v.dim();
}

at::Tensor concat_flat(const std::vector<at::Tensor>& pieces, c10::ScalarType dtype,
                       c10::Device device) {
  if (pieces.empty()) return at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
  return at::cat(pieces);
}

}  // namespace

namespace {

// A plan item of a 2-D matrix: `numel` elements assembled by its owner, the Newton–Schulz
// FLOPs of the whole matrix (tp slices gathered) that `slice_shape` belongs to.
MuonOwnerItem owner_item(const MuonSharding& sharding, const MuonHeadSplit& split,
                         const std::vector<int64_t>& slice_shape, const MuonOptions& options) {
  const auto whole = sharding.whole_shape(slice_shape);
  const auto [rows, cols] = muon_matrix_shape(whole, split, describe(sharding));
  const int64_t matrices = product(whole, 0) / (rows * cols);  // heads under a split, else 1
  // With NorMuon the owner assembles the v rows too: counted, so the bucket bound holds.
  return {product(slice_shape, 0) + normuon_rows(slice_shape, options), sharding.name,
          matrices * newton_schulz_flops(rows, cols, options.ns_steps())};
}

}  // namespace

at::Tensor Muon::owner_update(const DistributedParam& d, const at::Tensor& u, c10::ScalarType wire,
                              at::Tensor& v) {
  const MuonOptions& options = group_options(d.group);
  const at::Tensor whole = gather_tp(*d.sharding, u);
  // O merged back to the whole matrix's layout (per head or not): NorMuon's rows are its rows.
  at::Tensor o = orthogonalize(d.group, options, *d.head_split, whole);
  if (options.normuon()) {
    const bool split_rows = tp_splits_rows(*d.sharding, v);
    at::Tensor whole_v = split_rows ? gather_tp(*d.sharding, v) : v.clone();
    o = normuon_normalize(o, whole_v, options.normuon_beta2(), options.normuon_epsilon());
    v = split_rows ? tp_slice(*d.sharding, whole_v) : whole_v;
  }
  return tp_slice(*d.sharding, o).reshape({-1}).to(wire);
}

// step_fsdp, per bucket of the plan (muon_owner_plan.h), on this rank:
//   send: for each rank r, for each item r owns (bucket order): this rank's shard of u, then
//         (NorMuon) the shard's v rows
//   recv: for each rank j, for each item this rank owns (bucket order): rank j's rows of it
//         (and their v rows)
// The update (and the new v rows) comes back on the mirrored layout. Pipelined: bucket k+1's u is
// in flight while bucket k is orthogonalized, and bucket k-1's update while bucket k is, too; every
// rank starts the exchanges in the same order (u0, u1, O0, u2, O1, ...).
void Muon::step_fsdp(Collectives& comm, const std::vector<DistributedParam>& all_params) {
  const int n = comm.size();
  const int rank = comm.rank();
  std::vector<const DistributedParam*> params;
  std::vector<MuonOwnerItem> items;
  int64_t numel = 0;
  for (const auto& d : all_params) {
    if (!d.param.grad().defined()) continue;
    TORCH_CHECK(!d.param.grad().is_sparse(), "Muon does not support sparse gradients");
    params.push_back(&d);
    items.push_back(
        owner_item(*d.sharding, *d.head_split, d.sharding->full_shape, group_options(d.group)));
    numel += items.back().numel;
  }
  // Every buffer of the path lives on the params' device (the first one's: one rank, one device).
  const c10::Device device = all_params.front().param.device();
  check_params_once(comm, "step_fsdp", static_cast<int64_t>(params.size()), numel, device);
  auto options_of = [&](size_t item) -> const MuonOptions& {
    return group_options(params[item]->group);
  };
  const std::vector<MuonOwnerBucket>& plan =
      plans_[{&comm, "step_fsdp"}].plan(items, n, owner_min_bucket_numel_);
  // NorMuon's v rows of this rank's shard of `item` (0 without NorMuon), and the elements one
  // row of the assembled matrix travels as (its u row, then its v row).
  auto v_rows_of = [&](size_t item) {
    return normuon_rows(params[item]->param.sizes(), options_of(item));
  };
  auto row_payload = [&](size_t item) {
    return product(params[item]->sharding->full_shape, 1) + (options_of(item).normuon() ? 1 : 0);
  };

  // This rank's side of one bucket's exchange.
  struct Layout {
    c10::ScalarType wire;
    std::vector<size_t> sent;   // items whose shard this rank sends, in send order
    std::vector<size_t> owned;  // items this rank orthogonalizes, bucket order
    std::vector<int64_t> send_counts, recv_counts;
  };
  auto layout_of = [&](const MuonOwnerBucket& bucket) {
    Layout layout{wire_dtype(bucket.items, options_of),
                  {},
                  {},
                  std::vector<int64_t>(n, 0),
                  std::vector<int64_t>(n, 0)};
    for (int r = 0; r < n; ++r) {
      for (size_t j = 0; j < bucket.items.size(); ++j) {
        if (bucket.owners[j] != r) continue;
        const size_t item = bucket.items[j];
        layout.sent.push_back(item);
        layout.send_counts[r] += params[item]->param.numel() + v_rows_of(item);
        if (r != rank) continue;
        layout.owned.push_back(item);
        const auto& full = params[item]->sharding->full_shape;
        const auto rows = fsdp_chunk_rows(full[0], n);
        for (int s = 0; s < n; ++s) layout.recv_counts[s] += rows[s] * row_payload(item);
      }
    }
    return layout;
  };
  // 1. Momentum on the shards, written straight into one send buffer (every owner's part, in
  //    send order), and its exchange started.
  auto start_u = [&](const Layout& layout) {
    const int64_t total =
        std::accumulate(layout.send_counts.begin(), layout.send_counts.end(), int64_t{0});
    at::Tensor packed = at::empty({total}, at::TensorOptions().dtype(layout.wire).device(device));
    int64_t offset = 0;
    for (size_t item : layout.sent) {
      const DistributedParam& d = *params[item];
      const int64_t count = d.param.numel();
      momentum_direction_into(d.param, d.param.grad(), group_options(d.group),
                              packed.narrow(0, offset, count).view(d.param.sizes()));
      offset += count;
      const int64_t v_rows = v_rows_of(item);
      if (v_rows == 0) continue;
      packed.narrow(0, offset, v_rows).copy_(read_normuon_v(d.param).reshape({-1}));
      offset += v_rows;
    }
    return comm.all_to_all_async(packed, layout.send_counts, layout.recv_counts);
  };
  // 2. The owner assembles each owned matrix (and NorMuon's v rows) from every rank's rows
  //    (rank order: row-major), orthogonalizes it, applies NorMuon to the whole O and sends
  //    each rank its rows of the update (and of the new v) back.
  auto start_o = [&](const Layout& layout, const at::Tensor& received) {
    const size_t owned = layout.owned.size();
    std::vector<std::vector<at::Tensor>> rows_of(owned), v_of(owned);
    std::vector<std::vector<int64_t>> chunk_rows;
    for (size_t item : layout.owned) {
      chunk_rows.push_back(fsdp_chunk_rows(params[item]->sharding->full_shape[0], n));
    }
    int64_t offset = 0;
    for (int s = 0; s < n; ++s) {
      for (size_t o = 0; o < owned; ++o) {
        const size_t item = layout.owned[o];
        const int64_t count = chunk_rows[o][s] * product(params[item]->sharding->full_shape, 1);
        rows_of[o].push_back(received.narrow(0, offset, count));
        offset += count;
        if (!options_of(item).normuon()) continue;
        v_of[o].push_back(received.narrow(0, offset, chunk_rows[o][s]));
        offset += chunk_rows[o][s];
      }
    }
    std::vector<at::Tensor> updates, new_v(owned);
    for (size_t o = 0; o < owned; ++o) {
      const DistributedParam& d = *params[layout.owned[o]];
      const auto& full = d.sharding->full_shape;
      const at::Tensor u = at::cat(rows_of[o]).view(full);
      // v of the matrix: its shape without the last dim, float32 (the wire is then float32).
      if (!v_of[o].empty())
        new_v[o] = at::cat(v_of[o]).view(at::IntArrayRef(full).slice(0, full.size() - 1));
      updates.push_back(owner_update(d, u, layout.wire, new_v[o]));
      if (new_v[o].defined()) new_v[o] = new_v[o].reshape({-1});
    }
    std::vector<at::Tensor> back;
    for (int s = 0; s < n; ++s) {
      for (size_t o = 0; o < owned; ++o) {
        const auto& full = params[layout.owned[o]]->sharding->full_shape;
        int64_t start = 0;
        for (int r = 0; r < s; ++r) start += chunk_rows[o][r];
        const int64_t row_numel = product(full, 1);
        back.push_back(updates[o].narrow(0, start * row_numel, chunk_rows[o][s] * row_numel));
        if (new_v[o].defined()) back.push_back(new_v[o].narrow(0, start, chunk_rows[o][s]));
      }
    }
    return comm.all_to_all_async(concat_flat(back, layout.wire, device), layout.recv_counts,
                                 layout.send_counts);
  };
  // 3. Every rank applies its shard of each update, scaled by the whole matrix's shape, back in
  //    ns_dtype (exact: O was ns_dtype or travelled wider; NorMuon's is float32), as the
  //    single-process update adds, and keeps its new v rows.
  auto apply = [&](const Layout& layout, const at::Tensor& updates) {
    int64_t offset = 0;
    for (size_t item : layout.sent) {
      const DistributedParam& d = *params[item];
      const MuonOptions& options = group_options(d.group);
      const int64_t count = d.param.numel();
      const at::Tensor o = updates.narrow(0, offset, count)
                               .view(d.param.sizes())
                               .to(options.normuon() ? at::kFloat : options.ns_dtype());
      offset += count;
      if (v_rows_of(item) > 0) write_normuon_v(d.param, updates.narrow(0, offset, v_rows_of(item)));
      offset += v_rows_of(item);
      apply_update(d.param, o, options,
                   whole_scale(*d.sharding, *d.head_split, d.sharding->full_shape, options));
    }
  };

  std::vector<Layout> layouts;
  for (const auto& bucket : plan) layouts.push_back(layout_of(bucket));
  std::unique_ptr<CollectiveWork> u_next = layouts.empty() ? nullptr : start_u(layouts[0]);
  std::unique_ptr<CollectiveWork> o_previous;
  for (size_t k = 0; k < layouts.size(); ++k) {
    std::unique_ptr<CollectiveWork> u_here = std::move(u_next);
    if (k + 1 < layouts.size()) u_next = start_u(layouts[k + 1]);
    std::unique_ptr<CollectiveWork> o_here = start_o(layouts[k], u_here->wait());
    if (o_previous) apply(layouts[k - 1], o_previous->wait());
    o_previous = std::move(o_here);
  }
  if (o_previous) apply(layouts.back(), o_previous->wait());
}

// step_ddp, per bucket of the plan: every rank updates the replicated momentum of every item;
// each owner orthogonalizes its items (NorMuon: with its replica's v rows) and puts their
// update (then the new v rows) one after another (bucket order) in its block of an all_gather,
// padded to the fullest block. Bucket k's gather is in flight while
// bucket k+1's momentum and Newton–Schulz run.
void Muon::step_ddp(Collectives& comm, const std::vector<DistributedParam>& all_params) {
  const int n = comm.size();
  const int rank = comm.rank();
  std::vector<const DistributedParam*> params;
  std::vector<MuonOwnerItem> items;
  int64_t numel = 0;
  for (const auto& d : all_params) {
    if (!d.param.grad().defined()) continue;
    TORCH_CHECK(!d.param.grad().is_sparse(), "Muon does not support sparse gradients");
    params.push_back(&d);
    items.push_back(
        owner_item(*d.sharding, *d.head_split, d.param.sizes().vec(), group_options(d.group)));
    numel += d.param.numel();
  }
  const c10::Device device = all_params.front().param.device();
  check_params_once(comm, "step_ddp", static_cast<int64_t>(params.size()), numel, device);
  auto options_of = [&](size_t item) -> const MuonOptions& {
    return group_options(params[item]->group);
  };
  const std::vector<MuonOwnerBucket>& plan =
      plans_[{&comm, "step_ddp"}].plan(items, n, owner_min_bucket_numel_);

  // NorMuon's v rows of `item` (one per row of each of its matrices; 0 without NorMuon).
  auto v_rows_of = [&](size_t item) {
    return normuon_rows(params[item]->param.sizes(), options_of(item));
  };
  auto padded_of = [&](const MuonOwnerBucket& bucket) {
    std::vector<int64_t> block(n, 0);
    for (size_t j = 0; j < bucket.items.size(); ++j) {
      block[bucket.owners[j]] +=
          params[bucket.items[j]]->param.numel() + v_rows_of(bucket.items[j]);
    }
    return *std::max_element(block.begin(), block.end());
  };
  auto start = [&](const MuonOwnerBucket& bucket) {
    const c10::ScalarType wire = wire_dtype(bucket.items, options_of);
    // Ranks owning less (or nothing) send zeros after their O: all_gather needs equal shapes.
    at::Tensor mine =
        at::zeros({padded_of(bucket)}, at::TensorOptions().dtype(wire).device(device));
    int64_t offset = 0;
    for (size_t j = 0; j < bucket.items.size(); ++j) {
      const DistributedParam& d = *params[bucket.items[j]];
      const MuonOptions& options = group_options(d.group);
      at::Tensor u = momentum_direction(d.param, d.param.grad(), options, options.ns_dtype());
      if (bucket.owners[j] != rank) continue;
      // A tp slice: the owner and its tp peers (same plan) gather u in the wire dtype, as
      // step_fsdp's u travels, and orthogonalize the whole matrix.
      if (d.sharding->tp_split()) u = u.to(wire);
      at::Tensor v;  // the replica's v rows (a copy), updated by owner_update
      if (options.normuon()) v = read_normuon_v(d.param);
      const at::Tensor o = owner_update(d, u, wire, v);
      mine.narrow(0, offset, o.numel()).copy_(o);
      offset += o.numel();
      if (!options.normuon()) continue;
      mine.narrow(0, offset, v.numel()).copy_(v.reshape({-1}));
      offset += v.numel();
    }
    return comm.all_gather_async(mine);
  };
  auto apply = [&](const MuonOwnerBucket& bucket, const at::Tensor& gathered) {
    const int64_t padded = padded_of(bucket);
    std::vector<int64_t> offset(n, 0);
    for (int r = 0; r < n; ++r) offset[r] = r * padded;
    for (size_t j = 0; j < bucket.items.size(); ++j) {
      const DistributedParam& d = *params[bucket.items[j]];
      const MuonOptions& options = group_options(d.group);
      int64_t& at_owner = offset[bucket.owners[j]];
      const at::Tensor o = gathered.narrow(0, at_owner, d.param.numel())
                               .view(d.param.sizes())
                               .to(options.normuon() ? at::kFloat : options.ns_dtype());
      at_owner += d.param.numel();
      const int64_t v_rows = v_rows_of(bucket.items[j]);
      if (v_rows > 0) write_normuon_v(d.param, gathered.narrow(0, at_owner, v_rows));
      at_owner += v_rows;
      apply_update(d.param, o, options,
                   whole_scale(*d.sharding, *d.head_split, d.param.sizes().vec(), options));
    }
  };

  std::unique_ptr<CollectiveWork> previous;
  for (size_t k = 0; k < plan.size(); ++k) {
    std::unique_ptr<CollectiveWork> here = start(plan[k]);
    if (previous) apply(plan[k - 1], previous->wait());
    previous = std::move(here);
  }
  if (previous) apply(plan.back(), previous->wait());
}

}  // namespace mixtrain
