// parallelize (distributed/parallelize.h): the parallelisms as ordered steps, seen from one rank
// of a larger mesh without communicating (every group a RankOnlyGroup: planning, applying the
// plan and building the runtime issue no collective). Each parameter's piece is checked against
// torch's own chunking of the untouched model (at::chunk along the model's tp dim, then along
// dim 0), its placement against the step that owns it, and a step's refusal against the model
// it must leave as it was. The gradient paths are the multi-rank tests' (fsdp_test,
// expert_parallel_test, tensor_parallel_test, context_parallel_test).
#include <gtest/gtest.h>

#include <torch/types.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/distributed/parallelize.h"
#include "mixtrain/model/registry.h"
#include "support/rank_only_group.h"
#include "support/tiny_model_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_support::RankOnlyGroup;

std::shared_ptr<Collectives> group(int rank, int size) {
  return std::make_shared<RankOnlyGroup>(rank, size);
}

// The tiny Qwen2-MoE with an even vocabulary (38), so tp = 2 splits every tp dim.
ModelConfig even_config() {
  ModelConfig c = test_support::tiny_config();
  c.name = "qwen2_moe";
  c.vocab_size = 38;
  return c;
}

// One rank's view of a mesh: its index in each group, the groups' sizes.
struct MeshPosition {
  int replicate = 0, shard = 0, tp = 0, ep = 0;
  int dp_replicate = 1, dp_shard = 1, tp_size = 1, ep_size = 1, cp_size = 1;
};

DeviceMesh mesh_at(const MeshPosition& p) {
  DeviceMesh mesh;
  mesh.dp_replicate = p.dp_replicate;
  mesh.dp_shard = p.dp_shard;
  mesh.tp = p.tp_size;
  mesh.ep = p.ep_size;
  mesh.cp = p.cp_size;
  mesh.world_size = p.dp_replicate * p.dp_shard * p.tp_size * p.cp_size;
  mesh.world = group(0, mesh.world_size);
  mesh.dp_shard_group = group(p.shard, p.dp_shard * p.cp_size);
  mesh.dp_replicate_group = group(p.replicate, p.dp_replicate);
  mesh.tp_group = group(p.tp, p.tp_size);
  mesh.cp_group = group(0, p.cp_size);
  mesh.ep_group = group(p.ep, p.ep_size);
  mesh.expert_dp_group = group(0, p.dp_replicate * p.dp_shard * p.cp_size * p.tp_size / p.ep_size);
  return mesh;
}

std::map<std::string, at::Tensor> copies(CausalLM& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

// Chunk `index` of torch.chunk(t, parts, dim); empty (0 rows along dim) where torch.chunk
// returns fewer chunks than parts.
at::Tensor chunk_of(const at::Tensor& t, int64_t parts, int64_t index, int64_t dim) {
  const auto chunks = t.chunk(parts, dim);
  if (index < static_cast<int64_t>(chunks.size())) return chunks[index];
  return t.narrow(dim, 0, 0);
}

void expect_untouched(CausalLM& model, const std::map<std::string, at::Tensor>& before) {
  for (const auto& item : model.named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), before.at(item.key()))) << item.key();
  }
}

TEST(Parallelize, EachStepPlacesTheParametersItOwns) {
  // Rank (shard 1, tp 1) of dp_shard 2 x tp 2 with ep 2 (ep rank 1 of its shard row).
  const MeshPosition pos{0, 1, 1, 1, 1, 2, 2, 2, 1};
  const DeviceMesh mesh = mesh_at(pos);
  auto model = build_model(even_config(), 3);
  const auto before = copies(*model);
  std::map<std::string, const at::TensorImpl*> impls;
  for (const auto& item : model->named_parameters()) {
    impls[item.key()] = item.value().unsafeGetTensorImpl();
  }

  const auto fsdp = parallelize(*model, mesh, FsdpOptions{});
  ASSERT_NE(fsdp->tensor_parallel(), nullptr);
  ASSERT_NE(fsdp->expert_dispatcher(), nullptr);
  EXPECT_EQ(fsdp->context_parallel(), nullptr);  // cp = 1: no step 2
  int experts = 0, split = 0;
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    EXPECT_EQ(item.value().unsafeGetTensorImpl(), impls.at(name)) << "identity of " << name;
    const ParamPlacement& placement = fsdp->placement(name);
    EXPECT_EQ(placement.global_shape, before.at(name).sizes().vec()) << name;
    at::Tensor expected;
    if (model->is_expert(name)) {
      ++experts;
      EXPECT_EQ(placement.kind, ParamPlacement::Kind::kExpertSlice) << name;
      EXPECT_EQ(placement.shard_group, mesh.ep_group) << name;
      EXPECT_EQ(placement.replicate_group, mesh.expert_dp_group) << name;
      EXPECT_EQ(placement.tp_dim, -1) << name;
      expected = chunk_of(before.at(name), pos.ep_size, pos.ep, 0);
    } else {
      EXPECT_EQ(placement.kind, ParamPlacement::Kind::kDim0Shard) << name;
      EXPECT_EQ(placement.shard_group, mesh.dp_shard_group) << name;
      EXPECT_EQ(placement.replicate_group, mesh.dp_replicate_group) << name;
      const int64_t tp_dim = model->tp_dim(name);
      EXPECT_EQ(placement.tp_dim, tp_dim) << name;
      at::Tensor slice = before.at(name);
      if (tp_dim >= 0) {
        ++split;
        EXPECT_EQ(placement.tp_group, mesh.tp_group) << name;
        slice = chunk_of(slice, pos.tp_size, pos.tp, tp_dim);
      }
      expected = chunk_of(slice, pos.dp_shard, pos.shard, 0);
    }
    EXPECT_EQ(item.value().sizes(), expected.sizes()) << name;
    EXPECT_EQ(placement.local_sizes(), expected.sizes().vec()) << name;
    EXPECT_TRUE(at::equal(item.value(), expected)) << name;
    EXPECT_TRUE(item.value().is_contiguous()) << name;
  }
  EXPECT_GT(experts, 0);
  EXPECT_GT(split, 0);
}

TEST(Parallelize, DataParallelAloneReplicatesWithoutCopying) {
  // DDP: dp_replicate 2, dp_shard 1: every parameter whole, its tensor untouched.
  const MeshPosition pos{1, 0, 0, 0, 2, 1, 1, 1, 1};
  auto model = build_model(even_config(), 3);
  std::map<std::string, const void*> data;
  for (const auto& item : model->named_parameters()) data[item.key()] = item.value().data_ptr();
  const auto fsdp = parallelize(*model, mesh_at(pos), FsdpOptions{});
  EXPECT_EQ(fsdp->tensor_parallel(), nullptr);
  EXPECT_EQ(fsdp->expert_dispatcher(), nullptr);
  for (const auto& item : model->named_parameters()) {
    const ParamPlacement& placement = fsdp->placement(item.key());
    EXPECT_EQ(placement.kind, ParamPlacement::Kind::kReplicated) << item.key();
    EXPECT_EQ(placement.rows, item.value().size(0)) << item.key();
    EXPECT_EQ(item.value().data_ptr(), data.at(item.key())) << item.key();
  }
}

TEST(Parallelize, ContextParallelPlacesNothingAndGivesRingAttention) {
  // dp_shard 1 x cp 2: the cp ranks form the shard group, so FSDP shards over them.
  MeshPosition pos{0, 1, 0, 0, 1, 1, 1, 1, 2};
  auto model = build_model(even_config(), 3);
  const auto before = copies(*model);
  const auto fsdp = parallelize(*model, mesh_at(pos), FsdpOptions{});
  ASSERT_NE(fsdp->context_parallel(), nullptr);
  EXPECT_EQ(fsdp->context_parallel()->cp_size(), 2);
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(fsdp->placement(item.key()).kind, ParamPlacement::Kind::kDim0Shard);
    EXPECT_TRUE(at::equal(item.value(), chunk_of(before.at(item.key()), 2, 1, 0))) << item.key();
  }
}

// A step that refuses leaves every parameter as it was: the plan is made before any is touched.
TEST(Parallelize, ARefusingStepLeavesTheModelAsItWas) {
  {  // Expert parallelism: 3 does not divide 4 experts (after tp and before dp have planned).
    const MeshPosition pos{0, 1, 0, 1, 1, 3, 1, 3, 1};
    auto model = build_model(even_config(), 3);
    const auto before = copies(*model);
    try {
      parallelize(*model, mesh_at(pos), FsdpOptions{});
      ADD_FAILURE() << "ep 3 over 4 experts accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("the ep group of 3 does not divide the 4 experts of "
                                           "model.layers.0.mlp.experts."),
                std::string::npos)
          << e.what();
    }
    expect_untouched(*model, before);
    EXPECT_EQ(model->parameter_materializer(), nullptr);
  }
  {  // Tensor parallelism: tp 2 cannot split the tiny config's 37-row vocabulary.
    const MeshPosition pos{0, 0, 1, 0, 1, 1, 2, 1, 1};
    auto model = build_model(test_support::tiny_config(), 3);
    const auto before = copies(*model);
    try {
      parallelize(*model, mesh_at(pos), FsdpOptions{});
      ADD_FAILURE() << "tp 2 over a vocabulary of 37 accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                "parallelize: the tp group of 2 cannot split model.embed_tokens.weight along "
                "dim 0");
    }
    expect_untouched(*model, before);
  }
  {  // The runtime's own options, refused after every step has planned.
    const MeshPosition pos{0, 1, 0, 0, 1, 2, 1, 1, 1};
    auto model = build_model(even_config(), 3);
    const auto before = copies(*model);
    FsdpOptions options;
    options.fp32_main_params = true;  // reduce_dtype unset
    EXPECT_THROW(parallelize(*model, mesh_at(pos), options), std::invalid_argument);
    expect_untouched(*model, before);
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
