// import_hf_weights against transformers' own files (tests/python/hf_models.py save): the
// per-expert layout save_pretrained writes, shards with an index, the fused 3-D layout and our
// own 3-D names all give the HF state dict bit for bit (converted dtypes: as torch rounds);
// FSDP and expert-parallel pieces read exactly their rows' bytes; every malformed directory is
// one DataError naming file and key. Tensor-parallel boxes (tp 2 x dp_shard 2 of a dense
// qwen2: column-parallel tp_dim 0, row-parallel tp_dim 1, norms whole on every tp rank) read
// exactly their box, each tp_dim 1 piece by reading its rows whole.
#include "mixtrain/checkpoint/hf_import.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/core/collectives.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/safetensors.h"
#include "support/python_script.h"
#include "support/rank_only_group.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "hf_import_test_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Saves a random tiny HF model into <tmp>/<name>; returns its state dict under our names.
NamedTensors save_hf(const TempDir& tmp, const std::string& name, const std::string& family,
                     const std::string& options = "") {
  const std::string dir = tmp.path() + "/" + name, reference = dir + ".reference.safetensors";
  std::vector<std::string> argv = {"hf_models.py", "save", family, dir, reference};
  std::istringstream words(options);
  for (std::string word; words >> word;) argv.push_back(word);
  EXPECT_TRUE(test_support::python_script_succeeds(argv));
  return read_safetensors(reference).tensors;
}

struct Pieces {
  std::vector<HfImportTarget> targets;
};

// Targets like rank `rank` of `ranks` FSDP ranks (torch.chunk rows of dim 0), in `dtype`; or the
// whole tensors for ranks == 1.
Pieces pieces_of(const NamedTensors& reference, at::ScalarType dtype, int64_t rank = 0,
                 int64_t ranks = 1) {
  Pieces pieces;
  for (const auto& [name, tensor] : reference) {
    ParamPlacement placement = whole_placement(name, tensor.sizes().vec());
    const int64_t rows = tensor.size(0), chunk = (rows + ranks - 1) / ranks;
    placement.offset = std::min(rows, rank * chunk);
    placement.rows = std::min(rows, placement.offset + chunk) - placement.offset;
    if (ranks > 1) placement.kind = ParamPlacement::Kind::kDim0Shard;
    std::vector<int64_t> shape = tensor.sizes().vec();
    shape[0] = placement.rows;
    pieces.targets.push_back(
        {name, at::full(shape, -7.0, at::TensorOptions().dtype(dtype)), placement});
  }
  return pieces;
}

void expect_equal_bits(const Pieces& pieces, const NamedTensors& reference, at::ScalarType dtype) {
  ASSERT_EQ(pieces.targets.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    const HfImportTarget& t = pieces.targets[i];
    const at::Tensor want =
        reference[i].second.narrow(0, t.placement.offset, t.placement.rows).to(dtype);
    EXPECT_TRUE(at::equal(t.local, want)) << t.name;
  }
}

uint64_t bytes_of(const NamedTensors& tensors) {
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) total += t.numel() * t.element_size();
  return total;
}

TEST(HfImport, PerExpertLayoutOfSavePretrainedLoadsBitForBit) {
  TempDir tmp;
  for (const std::string family : {"qwen2_moe", "qwen3_moe"}) {
    const NamedTensors reference = save_hf(tmp, family, family);
    Pieces pieces = pieces_of(reference, at::kFloat);
    const HfImportStats stats = import_hf_weights(tmp.path() + "/" + family, pieces.targets);
    expect_equal_bits(pieces, reference, at::kFloat);
    EXPECT_EQ(stats.files, 1);
    EXPECT_EQ(stats.data_bytes_read, bytes_of(reference));  // every byte once
  }
}

TEST(HfImport, ShardsWithAnIndexAndEveryDtypeConversion) {
  TempDir tmp;
  // ~1 KB shards: the tiny model's 2 x 19 KB of layers spread over several files.
  const NamedTensors reference =
      save_hf(tmp, "s", "qwen2", "--dtype bfloat16 --max-shard-size 4000");
  ASSERT_TRUE(fs::exists(tmp.path() + "/s/model.safetensors.index.json"));
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat, at::kHalf}) {
    Pieces pieces = pieces_of(reference, dtype);
    const HfImportStats stats = import_hf_weights(tmp.path() + "/s", pieces.targets);
    EXPECT_GT(stats.files, 2);
    expect_equal_bits(pieces, reference, dtype);  // bf16 -> f32 exact; -> f16 as torch rounds
  }
  const NamedTensors f16 = save_hf(tmp, "h", "llama", "--dtype float16");
  Pieces pieces = pieces_of(f16, at::kBFloat16);
  import_hf_weights(tmp.path() + "/h", pieces.targets);
  expect_equal_bits(pieces, f16, at::kBFloat16);
}

TEST(HfImport, FusedAndOurOwnExpertLayouts) {
  TempDir tmp;
  const NamedTensors reference = save_hf(tmp, "f", "qwen2_moe", "--layout fused --seed 3");
  Pieces pieces = pieces_of(reference, at::kFloat);
  import_hf_weights(tmp.path() + "/f", pieces.targets);
  expect_equal_bits(pieces, reference, at::kFloat);

  fs::create_directories(tmp.path() + "/o");
  write_safetensors(tmp.path() + "/o/model.safetensors", reference);
  Pieces again = pieces_of(reference, at::kFloat);
  import_hf_weights(tmp.path() + "/o", again.targets);
  expect_equal_bits(again, reference, at::kFloat);
}

// Three FSDP ranks (qwen2_moe's 4 experts split 2/2/0: a rank with no rows of some tensors),
// per-expert and fused files: each rank reads exactly its rows' bytes, and together every byte.
TEST(HfImport, EachRankReadsOnlyItsRows) {
  TempDir tmp;
  for (const std::string layout : {"per-expert", "fused"}) {
    const NamedTensors reference =
        save_hf(tmp, layout, "qwen2_moe", "--layout " + layout + " --dtype bfloat16");
    uint64_t together = 0;
    for (int64_t rank = 0; rank < 3; ++rank) {
      Pieces pieces = pieces_of(reference, at::kFloat, rank, 3);
      const HfImportStats stats = import_hf_weights(tmp.path() + "/" + layout, pieces.targets);
      expect_equal_bits(pieces, reference, at::kFloat);
      uint64_t own = 0;
      for (const HfImportTarget& t : pieces.targets) own += t.local.numel() * 2;  // bf16 file
      EXPECT_EQ(stats.data_bytes_read, own) << layout << " rank " << rank;
      together += stats.data_bytes_read;
    }
    EXPECT_EQ(together, bytes_of(reference)) << layout;
  }
}

using test_support::RankOnlyGroup;

// Megatron's split of a dense decoder: o_proj / down_proj by columns (tp_dim 1), norms whole,
// the rest (q/k/v with biases, gate/up, embedding, lm_head) by rows; -1 where 2 does not divide.
int64_t tp_dim_of(const std::string& name, const at::Tensor& t) {
  if (name.find("norm") != std::string::npos) return -1;
  const bool row_parallel =
      name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos;
  const int64_t dim = row_parallel && t.dim() == 2 ? 1 : 0;
  return t.size(dim) % 2 == 0 ? dim : -1;
}

TEST(HfImport, TensorParallelBoxesWithDpShardRows) {
  TempDir tmp;
  const NamedTensors reference = save_hf(tmp, "d", "qwen2");
  int64_t columns = 0, rows_split = 0;
  for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
    const auto tp = std::make_shared<RankOnlyGroup>(tp_rank, 2);
    for (int64_t shard = 0; shard < 2; ++shard) {
      std::vector<HfImportTarget> targets;
      uint64_t expected_bytes = 0;
      for (const auto& [name, tensor] : reference) {
        ParamPlacement p = whole_placement(name, tensor.sizes().vec());
        p.kind = ParamPlacement::Kind::kDim0Shard;
        p.tp_dim = tp_dim_of(name, tensor);
        p.tp_group = tp;
        const int64_t dim0 = p.tp_shape()[0], chunk = (dim0 + 1) / 2;  // torch.chunk over 2
        p.offset = std::min(dim0, shard * chunk);
        p.rows = std::min(dim0, p.offset + chunk) - p.offset;
        columns += p.tp_dim == 1;
        rows_split += p.tp_dim == 0;
        // The rows this box spans, whole: a tp_dim 1 box reads its rows' other columns too.
        expected_bytes += static_cast<uint64_t>(p.rows * (tensor.numel() / tensor.size(0)) *
                                                tensor.element_size());
        targets.push_back({name, at::full(p.local_sizes(), -7.0), p});
      }
      const HfImportStats stats = import_hf_weights(tmp.path() + "/d", targets);
      EXPECT_EQ(stats.data_bytes_read, expected_bytes);
      for (const HfImportTarget& t : targets) {
        at::Tensor want = reference[&t - targets.data()].second;
        const auto offsets = t.placement.global_offsets();
        const auto sizes = t.placement.local_sizes();
        for (size_t d = 0; d < sizes.size(); ++d) want = want.narrow(d, offsets[d], sizes[d]);
        EXPECT_TRUE(at::equal(t.local, want)) << t.name << " tp " << tp_rank << " shard " << shard
                                              << " tp_dim " << t.placement.tp_dim;
      }
    }
  }
  EXPECT_GT(columns, 0);  // both splits were exercised
  EXPECT_GT(rows_split, 0);
}

TEST(HfImport, ExpertsWithATensorParallelSplitAreRefused) {
  TempDir tmp;
  const NamedTensors reference = save_hf(tmp, "e", "qwen2_moe");
  std::vector<HfImportTarget> targets;
  bool split = false;
  for (const auto& [name, tensor] : reference) {
    ParamPlacement p = whole_placement(name, tensor.sizes().vec());
    if (tensor.dim() == 3 && !split && tensor.size(1) % 2 == 0) {
      p.tp_dim = 1;
      p.tp_group = std::make_shared<RankOnlyGroup>(0, 2);
      split = true;
    }
    targets.push_back({name, at::empty(p.local_sizes()), p});
  }
  ASSERT_TRUE(split);
  EXPECT_THROW(import_hf_weights(tmp.path() + "/e", targets), std::invalid_argument);
}

std::string import_error_of(const std::string& dir, const NamedTensors& reference) {
  Pieces pieces = pieces_of(reference, at::kFloat);
  try {
    import_hf_weights(dir, pieces.targets);
  } catch (const DataError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no DataError for " << dir;
  return "";
}

TEST(HfImport, EveryProblemIsOneErrorNamingFileAndKey) {
  TempDir tmp;
  const NamedTensors reference = save_hf(tmp, "m", "qwen2_moe");
  const std::string file = tmp.path() + "/x/model.safetensors";
  fs::create_directories(tmp.path() + "/x");
  auto write_variant = [&](auto change) {
    NamedTensors tensors = reference;
    change(tensors);
    fs::remove(file);
    write_safetensors(file, tensors);
    return import_error_of(tmp.path() + "/x", reference);
  };
  const std::string key = "model.layers.1.self_attn.k_proj.weight";
  auto index_of = [&](const NamedTensors& t) {
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i].first == key) return i;
    }
    return t.size();
  };
  std::string message = write_variant([&](NamedTensors& t) { t.erase(t.begin() + index_of(t)); });
  EXPECT_NE(
      message.find(tmp.path() + "/x: " + key + ": missing (the model has it, shape [16, 24])"),
      std::string::npos)
      << message;
  message = write_variant([&](NamedTensors& t) { t.emplace_back("model.extra", at::zeros({2})); });
  EXPECT_NE(message.find(file + ": model.extra: extra"), std::string::npos) << message;
  message = write_variant([&](NamedTensors& t) { t[index_of(t)].second = at::zeros({16, 25}); });
  EXPECT_NE(message.find(file + ": " + key + ": shape [16, 25], the model's is [16, 24]"),
            std::string::npos)
      << message;
  message = write_variant([&](NamedTensors& t) {
    t[index_of(t)].second = at::zeros({16, 24}, at::kInt);
  });
  EXPECT_NE(message.find(file + ": " + key + ": dtype I32 cannot be converted"), std::string::npos)
      << message;

  // Shards: a missing shard, and a key the index places in a file that lacks it.
  const NamedTensors sharded = save_hf(tmp, "s", "qwen2_moe", "--max-shard-size 4000");
  const std::string index = tmp.path() + "/s/model.safetensors.index.json";
  const std::string second = tmp.path() + "/s/model-00002-of-";
  for (const auto& entry : fs::directory_iterator(tmp.path() + "/s")) {
    if (entry.path().string().rfind(second, 0) == 0) fs::remove(entry.path());
  }
  message = import_error_of(tmp.path() + "/s", sharded);
  EXPECT_NE(message.find("the shard the index names for it is missing"), std::string::npos)
      << message;
  EXPECT_NE(message.find(second), std::string::npos) << message;
  std::ofstream(index)
      << R"({"weight_map": {"model.norm.weight": "model-00001-of-00009.safetensors"}})";
  message = import_error_of(tmp.path() + "/s", sharded);
  EXPECT_NE(message.find("model.norm.weight: the shard the index names for it is missing"),
            std::string::npos)
      << message;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
