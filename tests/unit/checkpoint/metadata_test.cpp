#include "mixtrain/checkpoint/metadata.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <functional>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

constexpr const char* kWhere = "/ckpt/step-00000012/.metadata.json";

// A valid document: a [4, 3] bfloat16 tensor in two row chunks, a scalar, an empty tensor.
nlohmann::json valid_json() {
  return nlohmann::json::parse(R"({
    "format": "mixtrain-checkpoint", "format_version": 2, "step": 12, "world_size": 2,
    "mesh": {"dp_replicate": 1, "dp_shard": 2, "ep": 1},
    "tensors": {
      "model.w": {"dtype": "bfloat16", "shape": [4, 3], "chunks": [
        {"file": "__0_0.safetensors", "offsets": [0, 0], "sizes": [2, 3], "xxh3_64": "0123456789abcdef"},
        {"file": "__1_0.safetensors", "offsets": [2, 0], "sizes": [2, 3], "xxh3_64": "FEDCBA9876543210"}]},
      "optimizer.state.w.step": {"dtype": "int64", "shape": [], "chunks": [
        {"file": "__0_0.safetensors", "offsets": [], "sizes": [], "xxh3_64": "0000000000000001"}]},
      "model.empty": {"dtype": "float32", "shape": [0, 5], "chunks": [
        {"file": "__1_0.safetensors", "offsets": [0, 0], "sizes": [0, 5], "xxh3_64": "0000000000000002"}]}
    },
    "state": {"lr_scheduler": {"last_epoch": 12}, "data": {"position": 96}}
  })");
}

void expect_rejected(const nlohmann::json& json, const std::string& field,
                     const std::string& fragment) {
  try {
    metadata_from_json(json, kWhere);
    ADD_FAILURE() << "accepted; expected an error about " << field;
  } catch (const DataError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(std::string(kWhere) + ": " + field + ":", 0), 0u) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

// Applies `edit` to a valid document and expects the error to name `field`.
void expect_edit_rejected(const std::function<void(nlohmann::json&)>& edit,
                          const std::string& field, const std::string& fragment) {
  nlohmann::json json = valid_json();
  edit(json);
  expect_rejected(json, field, fragment);
}

TEST(CheckpointMetadata, Names) {
  EXPECT_EQ(step_dir_name(12), "step-00000012");
  EXPECT_EQ(step_dir_name(123456789), "step-123456789");
  EXPECT_EQ(rank_file_name(3), "__3_0.safetensors");
  EXPECT_EQ(format_xxh3_64(0xab), "00000000000000ab");
}

TEST(CheckpointMetadata, RoundTrips) {
  const CheckpointMetadata m = metadata_from_json(valid_json(), kWhere);
  EXPECT_EQ(m.step, 12);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.mesh.dp_shard, 2);
  ASSERT_EQ(m.tensors.size(), 3u);
  const CheckpointTensor& w = m.tensors.at("model.w");
  EXPECT_EQ(w.dtype, c10::kBFloat16);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{4, 3}));
  ASSERT_EQ(w.chunks.size(), 2u);
  EXPECT_EQ(w.chunks[1].file, "__1_0.safetensors");
  EXPECT_EQ(w.chunks[1].offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(w.chunks[1].xxh3_64, 0xfedcba9876543210ull);  // upper-case hex accepted
  EXPECT_EQ(m.tensors.at("optimizer.state.w.step").dtype, c10::kLong);
  EXPECT_EQ(m.state["data"]["position"], 96);

  const nlohmann::json again = metadata_to_json(m);
  const CheckpointMetadata m2 = metadata_from_json(again, kWhere);
  EXPECT_EQ(metadata_to_json(m2), again);
  EXPECT_EQ(again["tensors"]["model.w"]["chunks"][1]["xxh3_64"], "fedcba9876543210");
  EXPECT_EQ(again["format"], "mixtrain-checkpoint");
  EXPECT_EQ(again["format_version"], kCheckpointFormatVersion);
}

// Version 1 (before .metadata.json.xxh3_64) has the same fields and is still read; the reader
// (storage_test) decides what its missing checksum means.
TEST(CheckpointMetadata, ReadsVersionOne) {
  nlohmann::json json = valid_json();
  json["format_version"] = 1;
  EXPECT_EQ(metadata_from_json(json, kWhere).format_version, 1);
  EXPECT_EQ(metadata_from_json(valid_json(), kWhere).format_version, 2);
}

TEST(CheckpointMetadata, RejectsBadTopLevelFields) {
  expect_rejected(nlohmann::json::array(), "(top level)", "object");
  expect_edit_rejected([](auto& j) { j.erase("format"); }, "format", "missing");
  expect_edit_rejected([](auto& j) { j["format"] = "torch-dcp"; }, "format", "mixtrain-checkpoint");
  expect_edit_rejected([](auto& j) { j.erase("format_version"); }, "format_version", "missing");
  expect_edit_rejected([](auto& j) { j["format_version"] = 3; }, "format_version",
                       "this build reads versions 1 to 2");
  expect_edit_rejected([](auto& j) { j["format_version"] = 0; }, "format_version",
                       "this build reads versions 1 to 2");
  expect_edit_rejected([](auto& j) { j["format_version"] = "2"; }, "format_version",
                       "not supported");
  expect_edit_rejected([](auto& j) { j["step"] = -1; }, "step", ">= 0");
  expect_edit_rejected([](auto& j) { j["step"] = 1.5; }, "step", "integer");
  expect_edit_rejected([](auto& j) { j["world_size"] = 0; }, "world_size", ">= 1");
  expect_edit_rejected([](auto& j) { j.erase("mesh"); }, "mesh", "missing");
  expect_edit_rejected([](auto& j) { j["mesh"]["ep"] = 0; }, "mesh.ep", ">= 1");
  expect_edit_rejected([](auto& j) { j["mesh"]["tp"] = 0; }, "mesh.tp", ">= 1");
  expect_edit_rejected([](auto& j) { j["mesh"]["cp"] = "2"; }, "mesh.cp", "integer");
  expect_edit_rejected([](auto& j) { j.erase("state"); }, "state", "missing");
  expect_edit_rejected([](auto& j) { j["state"] = 3; }, "state", "object");
  expect_edit_rejected([](auto& j) { j["tensors"] = nlohmann::json::array(); }, "tensors",
                       "object");
}

TEST(CheckpointMetadata, RejectsBadTensors) {
  const std::string w = "tensors.model.w";
  expect_edit_rejected([](auto& j) { j["tensors"]["model.w"]["dtype"] = "float8"; }, w + ".dtype",
                       "unknown dtype \"float8\"");
  expect_edit_rejected([](auto& j) { j["tensors"]["model.w"]["dtype"] = "BF16"; }, w + ".dtype",
                       "unknown dtype");
  expect_edit_rejected(
      [](auto& j) {
        j["tensors"]["model.w"]["shape"] = {4, -3};
      },
      w + ".shape[1]", ">= 0");
  expect_edit_rejected([](auto& j) { j["tensors"]["model.w"].erase("chunks"); }, w + ".chunks",
                       "missing");
}

TEST(CheckpointMetadata, RejectsBadChunks) {
  const std::string c1 = "tensors.model.w.chunks[1]";
  auto chunk1 = [](nlohmann::json& j) -> nlohmann::json& {
    return j["tensors"]["model.w"]["chunks"][1];
  };
  expect_edit_rejected([&](auto& j) { chunk1(j)["offsets"] = {2}; }, c1 + ".offsets",
                       "has 1 entries but the shape [4, 3] has 2 dims");
  expect_edit_rejected(
      [&](auto& j) {
        chunk1(j)["sizes"] = {2, 3, 1};
      },
      c1 + ".sizes", "3 entries");
  expect_edit_rejected(
      [&](auto& j) {
        chunk1(j)["offsets"] = {3, 0};
      },
      c1, "fall outside the shape [4, 3]");
  expect_edit_rejected(
      [&](auto& j) {
        chunk1(j)["offsets"] = {-1, 0};
      },
      c1 + ".offsets[0]", ">= 0");
  expect_edit_rejected([&](auto& j) { chunk1(j)["file"] = "__2_0.safetensors"; }, c1 + ".file",
                       "world_size is 2");
  for (const char* bad : {"rank1.safetensors", "__01_0.safetensors", "__1_1.safetensors",
                          "__x_0.safetensors", "__1_0.safetensors.bak", "../__1_0.safetensors"}) {
    expect_edit_rejected([&](auto& j) { chunk1(j)["file"] = bad; }, c1 + ".file",
                         "__<rank>_0.safetensors");
  }
  expect_edit_rejected([&](auto& j) { chunk1(j)["xxh3_64"] = "0123"; }, c1 + ".xxh3_64",
                       "16 hex digits");
  expect_edit_rejected([&](auto& j) { chunk1(j)["xxh3_64"] = "0123456789abcdeg"; }, c1 + ".xxh3_64",
                       "16 hex digits");
  expect_edit_rejected([&](auto& j) { chunk1(j)["xxh3_64"] = 5; }, c1 + ".xxh3_64", "string");
}

TEST(CheckpointMetadata, RejectsChunksThatDoNotCoverExactlyOnce) {
  const std::string chunks = "tensors.model.w.chunks";
  auto chunk1 = [](nlohmann::json& j) -> nlohmann::json& {
    return j["tensors"]["model.w"]["chunks"][1];
  };
  // A gap: rows 2..3 only partly covered.
  expect_edit_rejected([&](auto& j) { chunk1(j)["sizes"] = {1, 3}; }, chunks, "cover 9 of the 12");
  // An overlap with the same element count: rows [0, 2) and [1, 3), row 3 missing.
  expect_edit_rejected(
      [&](auto& j) {
        chunk1(j)["offsets"] = {1, 0};
      },
      chunks, "chunks[0] and chunks[1] overlap");
  // Two chunks of a key in one file.
  expect_edit_rejected([&](auto& j) { chunk1(j)["file"] = "__0_0.safetensors"; }, chunks,
                       "both in __0_0.safetensors");
  // No chunk for a scalar.
  expect_edit_rejected(
      [](auto& j) { j["tensors"]["optimizer.state.w.step"]["chunks"] = nlohmann::json::array(); },
      "tensors.optimizer.state.w.step.chunks", "cover 0 of the 1");
}

TEST(CheckpointMetadata, ZeroElementChunksAreAllowed) {
  nlohmann::json j = valid_json();
  // A third rank holding 0 rows at the end of the tensor (torch.chunk leaves such ranks).
  j["world_size"] = 3;
  j["tensors"]["model.w"]["chunks"].push_back(
      {{"file", "__2_0.safetensors"},
       {"offsets", {4, 0}},
       {"sizes", {0, 3}},
       {"xxh3_64", format_xxh3_64(XXH3_64bits(nullptr, 0))}});
  EXPECT_EQ(metadata_from_json(j, kWhere).tensors.at("model.w").chunks.size(), 3u);
}

TEST(CheckpointMetadata, ChecksumIsXxh3OfTheContiguousBytes) {
  const at::Tensor t = at::arange(12, at::kFloat).reshape({3, 4}).to(at::kBFloat16);
  // The same bytes, hashed by the library directly.
  EXPECT_EQ(tensor_xxh3_64(t), XXH3_64bits(t.data_ptr(), 12 * 2));
  // A non-contiguous view hashes as its contiguous copy (row-major order of the view).
  const at::Tensor transposed = t.t();
  const at::Tensor copy = transposed.contiguous();
  EXPECT_EQ(tensor_xxh3_64(transposed), XXH3_64bits(copy.data_ptr(), 12 * 2));
  EXPECT_NE(tensor_xxh3_64(transposed), tensor_xxh3_64(t));
  // One known value pins seed 0 and the byte order: four little-endian int32 1, 2, 3, 4.
  const unsigned char bytes[16] = {1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0};
  EXPECT_EQ(tensor_xxh3_64(at::tensor({1, 2, 3, 4}, at::kInt)), XXH3_64bits(bytes, 16));
  EXPECT_EQ(tensor_xxh3_64(at::empty({0, 3})), XXH3_64bits(nullptr, 0));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
