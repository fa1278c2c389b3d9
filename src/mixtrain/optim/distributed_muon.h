// Distributed Muon (docs/architecture.md §7): how one Muon
// step runs when a parameter is held sharded or replicated across ranks, with the single-process
// result. Muon (muon.h) takes a MuonSharding per parameter (unset = kLocal) and runs three paths:
//
// - step_experts (kLocal, and kFsdp 3-D tensors): the rank holds whole matrices (a 3-D expert
//   tensor's dim-0 chunk is a set of whole experts), so Newton–Schulz runs locally, batched by
//   shape as in the single-process Muon; no communication.
// - step_fsdp (kFsdp, 2-D): the rank holds the dim-0 chunk (torch.chunk: ceil(d0/n) rows, the
//   trailing ranks fewer or none) of a full_shape matrix. Who orthogonalizes which matrix is
//   the owner plan of muon_owner_plan.h: balanced by Newton–Schulz FLOPs (longest first to
//   the least-loaded rank, ties by name), cut into buckets in which no owner assembles more
//   than the largest matrix; a rank may own several matrices of a bucket, or none. Per
//   bucket: momentum on the shard (elementwise), one all_to_all of every rank's shards of u to
//   their owners, each owner runs Newton–Schulz on each assembled matrix, one all_to_all of
//   the update shards back, every rank applies p *= 1-lr*wd; p -= lr*scale*O (scale from the
//   full shape) to its shards and writes the copy-back. Every rank takes part in both
//   all_to_alls of every bucket, owning something there or not. Overlapped (the async
//   all_to_all of core/collectives.h): bucket k+1's u is in flight while bucket k runs
//   Newton–Schulz, and so is bucket k-1's update; every rank starts them in one order.
// - step_ddp (kReplicated): the same plan over the replicate group; every rank updates the
//   momentum of every param (replicated state), the owners orthogonalize, one all_gather per
//   bucket (each owner's O one after another, padded to the fullest rank) hands every update
//   to every rank; bucket k's all_gather is in flight while bucket k+1 is computed.
//
// Tensor parallelism (MuonSharding::tp_dim / tp_group): a 2-D parameter may be slice t of the
// whole matrix along tp_dim over tp_group (what the dp shards assemble, or the replicated copy,
// is that slice). Newton–Schulz must see the whole matrix, so whoever orthogonalizes it (the
// step_fsdp owner after assembling its slice, the step_ddp owner) all_gathers the slices of u
// over tp_group (every tp peer owns the same matrices: the plan is built from the same names,
// numels and whole-matrix FLOPs, so all of them take part, in the same order), concatenates them
// along tp_dim, runs Newton–Schulz on the whole matrix and keeps its own slice of O; the scale is
// the whole matrix's. The tp gather carries the bucket's wire dtype. A kWhole placement with a tp
// split (one data-parallel rank) takes step_ddp over a one-rank group. Expert (3-D) tensors are
// never tp-split (set_sharding refuses it).
//
// Per-head (Muon::set_head_split, muon_heads.h): the split applies to the whole matrix, so the
// owner cuts the matrix it assembled (after the tp gather) into heads for Newton–Schulz, and
// every rank scales by a head's shape. A tp slice of q/k/v/o holds whole heads, but gathering
// the whole matrix keeps one code path.
//
// Wire dtype: u and O travel in bfloat16 when every param of the bucket has ns_dtype
// bfloat16 (Newton–Schulz starts by casting u to bfloat16 and O is bfloat16, so this is
// exact and the cheapest), else in communication_dtype (the widest of the bucket's groups):
// float32 is exact for float32 Newton–Schulz, bfloat16 rounds u and O once more.
//
// NorMuon (normuon.h) is exact, not per shard: its row statistics and Frobenius norms are of
// the whole matrix, so whoever orthogonalizes it applies NorMuon (Muon::owner_update, to the
// whole O merged back from its heads under a head split: the rows of the parameter as stored).
// Each rank keeps normuon_v for the rows it holds (step_fsdp: its dim-0 chunk's rows; step_ddp:
// all, replicated). step_fsdp sends a shard's v rows right after its u (in each owner's block of
// the start_u all_to_all) and gets its update and new v rows back the same way; step_ddp's owner
// gathers nothing extra (its replica has the rows) and puts each matrix's new v rows after its
// update in its block of the all_gather. The plan's numel counts the v rows (one per row of
// u), so the bucket bound covers what an owner assembles. With a tp split, a row split
// (tp_dim 0) gathers the v rows over tp_group like u; a column split has all rows on every tp
// rank. A bucket with a NorMuon param travels in float32 both ways (the update is float32;
// float32 carries u, O and v exactly), so the result is the single-process one bit for bit.
//
// Before each path's first bucket a 2-int all_reduce checks that every rank steps the same
// parameters (count and total numel): a mismatch raises on every rank instead of hanging.
// Every rank must call step() with the same params having a grad (FSDP and DDP guarantee
// this: the gradient reduction writes every rank's grad).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "mixtrain/core/collectives.h"
#include "mixtrain/core/param_placement.h"

namespace mixtrain {

struct MuonSharding {
  enum class Kind { kLocal, kFsdp, kReplicated };
  Kind kind = Kind::kLocal;
  // kFsdp: the unsharded shape (the parameter as held is chunk group->rank() of it on dim 0).
  std::vector<int64_t> full_shape;
  // kFsdp: the group the parameter is sharded over (dp_shard); kReplicated: the group it is
  // replicated over (dp_replicate). Unused for kLocal.
  std::shared_ptr<Collectives> group;
  // The parameter's fully qualified name: breaks numel ties in the owner order, so every
  // rank builds the same buckets; also names the parameter in errors.
  std::string name;
  // kFsdp / kReplicated, 2-D only: the matrix above (full_shape; the parameter for kReplicated)
  // is slice tp_group->rank() of the whole matrix, split evenly along tp_dim over tp_group.
  int64_t tp_dim = -1;
  std::shared_ptr<Collectives> tp_group = nullptr;

  bool tp_split() const { return tp_dim >= 0 && tp_group && tp_group->size() > 1; }
  // `slice_shape` (this tp rank's matrix) with tp_dim multiplied by the tp degree.
  std::vector<int64_t> whole_shape(std::vector<int64_t> slice_shape) const;
};

std::string muon_sharding_kind_name(MuonSharding::Kind kind);

// Whether a parameter of `ndim` dims held as `sharding` takes the local path (step_experts):
// kLocal, or kFsdp with ndim >= 3 (its dim-0 chunk is a set of whole matrices).
bool muon_steps_locally(const MuonSharding& sharding, int64_t ndim);

// Rows of each rank's dim-0 chunk under torch.chunk semantics: c = ceil(dim0 / ranks), rank r
// holds clamp(dim0 - r*c, 0, c) rows.
std::vector<int64_t> fsdp_chunk_rows(int64_t dim0, int ranks);

// "bfloat16" | "float32" (the spellings parse_float_dtype accepts); invalid_argument otherwise.
c10::ScalarType parse_muon_communication_dtype(const std::string& name);

// How Muon steps a parameter held as `placement` (core/param_placement.h): kDim0Shard -> kFsdp
// over the shard group with the tp slice's shape (tp_shape(); HSDP replicas compute identical
// updates from identical main grads); kReplicated -> kReplicated over the replicate group
// (DDP); kWhole -> kLocal, or with a tp split kReplicated over a one-rank group (so the tp
// slices are gathered); kExpertSlice (whole experts, identical gradients over expert_dp) ->
// kLocal. The tp split (tp_dim, tp_group) is carried over when tp_split(); an expert slice with
// one is std::invalid_argument.
MuonSharding muon_sharding_of(const ParamPlacement& placement);

}  // namespace mixtrain
