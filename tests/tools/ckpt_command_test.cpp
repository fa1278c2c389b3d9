// `mixtrain ckpt inspect|verify|diff` on small checkpoints written here with the storage API.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "mixtrain/checkpoint/storage.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// model.w float32 [4, 3] split over two ranks by rows, model.e bfloat16 [2, 2] on rank 0,
// optimizer.state.w.step int64 0-dim; w holds a NaN; state {"data": {"position": position}}.
struct Content {
  Content() { w[0][1] = std::nanf(""); }  // NaN == NaN with the same bits counts as identical
  at::Tensor w = at::arange(12, at::kFloat).reshape({4, 3}) * 0.5f;
  at::Tensor e = at::tensor({1.5f, -2.0f, 0.25f, 8.0f}).reshape({2, 2}).to(at::kBFloat16);
  at::Tensor step = at::scalar_tensor(5, at::kLong);
  int64_t position = 40;
};

void save(const std::string& dir, int64_t step, const Content& c) {
  prepare_step_tmp_dir(dir, step);
  const std::string tmp = step_tmp_dir(dir, step);
  const std::vector<std::vector<LocalChunk>> ranks = {
      {{"model.w", c.w.narrow(0, 0, 2), {4, 3}, {0, 0}},
       {"model.e", c.e, {2, 2}, {0, 0}},
       {"optimizer.state.w.step", c.step, {}, {}}},
      {{"model.w", c.w.narrow(0, 2, 2), {4, 3}, {2, 0}}},
  };
  CheckpointMetadata m;
  m.step = step;
  m.world_size = 2;
  m.mesh.dp_shard = 2;
  m.state = {{"data", {{"position", c.position}}}, {"lr_scheduler", {{"last_epoch", step}}}};
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    const auto written = write_rank_file(tmp, static_cast<int64_t>(rank), ranks[rank]);
    for (size_t i = 0; i < written.size(); ++i) {
      CheckpointTensor& t = m.tensors[ranks[rank][i].key];
      t.dtype = ranks[rank][i].data.scalar_type();
      t.shape = ranks[rank][i].global_shape;
      t.chunks.push_back(written[i]);
    }
  }
  write_metadata(tmp, m);
  publish_step_dir(dir, step);
  write_latest(dir, step);
}

// Flips one bit of rank 1's model.w bytes (the file's only tensor, at the end of the file).
void corrupt_rank1(const std::string& step_dir) {
  const std::string path = step_dir + "/__1_0.safetensors";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-3, std::ios::end);
  const char byte = static_cast<char>(f.get() ^ 0x04);
  f.seekp(-3, std::ios::end);
  f.put(byte);
}

TEST(CkptCommand, InspectListsLayoutTensorsAndState) {
  TempDir dir;
  save(dir.file("ckpt"), 7, Content{});
  const CommandResult r = run_mixtrain("ckpt inspect " + dir.file("ckpt"));  // through latest
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "checkpoint: " + dir.file("ckpt/step-00000007"))) << r.output;
  EXPECT_TRUE(contains(r.output, "step: 7\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "world size: 2\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "mesh: dp_replicate=1 dp_shard=2 ep=1 cp=1 tp=1")) << r.output;
  EXPECT_TRUE(contains(r.output, "tensors: 3 (64 bytes in 2 files)")) << r.output;
  // One line per key: key, dtype, shape, bytes, chunks (column widths are not checked).
  for (const auto& fields : std::vector<std::vector<std::string>>{
           {"model.e", "bfloat16", "[2, 2]", " 8 bytes", "1 chunk\n"},
           {"model.w", "float32", "[4, 3]", " 48 bytes", "2 chunks\n"},
           {"optimizer.state.w.step", "int64", "[]", " 8 bytes", "1 chunk\n"}}) {
    size_t at = r.output.find("\n  " + fields[0] + " ");
    for (const auto& field : fields) {
      at = at == std::string::npos ? at : r.output.find(field, at);
      EXPECT_NE(at, std::string::npos) << field << "\n" << r.output;
    }
  }
  EXPECT_TRUE(contains(r.output, "  data: {\"position\":40}\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "  lr_scheduler: {\"last_epoch\":7}\n")) << r.output;
}

TEST(CkptCommand, VerifyPassesThenNamesTheCorruptChunk) {
  TempDir dir;
  save(dir.file("ckpt"), 7, Content{});
  const std::string step_dir = dir.file("ckpt/step-00000007");
  CommandResult r = run_mixtrain("ckpt verify " + step_dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "ok: 4 chunks in 2 files, .metadata.json matches "
                       ".metadata.json.xxh3_64\n"))
      << r.output;

  corrupt_rank1(step_dir);
  r = run_mixtrain("ckpt verify " + dir.file("ckpt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, step_dir + "/__1_0.safetensors: model.w chunk at offsets [2, 0]: "
                                            "checksum "))
      << r.output;
  EXPECT_TRUE(contains(r.output, "FAILED: 1 of 4 chunks")) << r.output;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// One flipped bit inside a parameter name in .metadata.json ('w' 0x77 -> '7' 0x37 still parses
// and is consistent: only the checksum can tell) fails verify, naming the file. A flip that
// leaves a raw byte in the file (0x37 '7' -> 0xb7) reaches no message raw, on a version-1
// checkpoint (no checksum file, so the JSON parser sees and quotes it) either.
TEST(CkptCommand, VerifyFailsOnABitFlipInTheMetadataWithACleanMessage) {
  TempDir dir;
  save(dir.file("ckpt"), 7, Content{});
  const std::string meta = dir.file("ckpt/step-00000007/.metadata.json");
  const std::string good = read_bytes(meta);
  const size_t at = good.find("\"model.w\"");
  ASSERT_NE(at, std::string::npos);
  std::string bad = good;
  bad[at + 7] = static_cast<char>(bad[at + 7] ^ 0x40);  // 'w' -> '7'
  std::ofstream(meta, std::ios::binary | std::ios::trunc) << bad;
  CommandResult r = run_mixtrain("ckpt verify " + dir.file("ckpt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "mixtrain: error: " + meta + ": checksum ")) << r.output;

  // Version 1: no checksum; intact, verify passes with a note.
  nlohmann::json v1 = nlohmann::json::parse(good);
  v1["format_version"] = 1;
  std::ofstream(meta, std::ios::binary | std::ios::trunc) << v1.dump();
  std::filesystem::remove(meta + ".xxh3_64");
  r = run_mixtrain("ckpt verify " + dir.file("ckpt"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "ok: 4 chunks in 2 files\nnote: format_version 1 has no "
                       ".metadata.json.xxh3_64"))
      << r.output;
  bad = v1.dump();
  const size_t key = bad.find("\"model.w\"");
  bad[key + 7] = static_cast<char>(0xb7);
  std::ofstream(meta, std::ios::binary | std::ios::trunc) << bad;
  for (const char* command : {"ckpt verify ", "ckpt inspect "}) {
    r = run_mixtrain(command + dir.file("ckpt"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "mixtrain: error: " + meta + ": not valid JSON")) << r.output;
    EXPECT_TRUE(contains(r.output, "\\xb7")) << r.output;
    for (char c : r.output) ASSERT_LT(static_cast<unsigned char>(c), 0x80) << r.output;
  }
}

TEST(CkptCommand, DiffReportsEachDifferenceAndHonoursAtol) {
  TempDir dir;
  Content content;
  save(dir.file("a"), 7, content);
  save(dir.file("b"), 7, content);
  CommandResult r = run_mixtrain("ckpt diff " + dir.file("a") + " " + dir.file("b"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "identical: 3 tensors and the state")) << r.output;

  // One value of model.w changes by 0.25 (exact in float32: 5.5 -> 5.75); relative 0.25/5.75.
  Content changed = content;
  changed.w = content.w.clone();
  changed.w[3][2] = 5.75f;
  save(dir.file("b"), 7, changed);
  r = run_mixtrain("ckpt diff " + dir.file("a") + " " + dir.file("b"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "model.w: max abs diff 0.25, max rel diff 0.0434783 (1 of 12 "
                       "elements differ)"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "model.e:")) << r.output;
  // The difference is exactly 0.25 (both values and their difference are exact in float32
  // and float64): --atol 0.25 passes, anything smaller fails.
  r = run_mixtrain("ckpt diff " + dir.file("a") + " " + dir.file("b") + " --atol 0.25");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "within --atol 0.25")) << r.output;
  r = run_mixtrain("ckpt diff " + dir.file("a") + " " + dir.file("b") + " --atol 0.2499999");
  EXPECT_EQ(r.exit_code, 1) << r.output;

  // A NaN on one side only is an infinite difference.
  changed.w[0][0] = std::nanf("");
  save(dir.file("b"), 7, changed);
  r = run_mixtrain("ckpt diff " + dir.file("a") + " " + dir.file("b") + " --atol 1e9");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "model.w: max abs diff inf, max rel diff inf (2 of 12"))
      << r.output;

  // State, step and keys: a missing key fails even with --atol.
  changed = content;
  changed.position = 41;
  save(dir.file("c"), 8, changed);
  r = run_mixtrain("ckpt diff " + dir.file("a") + " " + dir.file("c"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "step: 7 vs 8")) << r.output;
  EXPECT_TRUE(contains(r.output, "state.data: {\"position\":40} vs {\"position\":41}")) << r.output;
  EXPECT_TRUE(contains(r.output, "state.lr_scheduler:")) << r.output;

  // Another layout of the same global tensors (one rank holding everything) is identical;
  // with an extra key it is not, even with --atol.
  const std::string a7 = dir.file("a/step-00000007");
  auto save_one_rank = [&](const std::string& out, bool extra) {
    prepare_step_tmp_dir(out, 7);
    CheckpointMetadata m = CheckpointReader(a7).metadata();
    m.world_size = 1;
    m.mesh.dp_shard = 1;
    std::vector<LocalChunk> chunks = {{"model.w", content.w, {4, 3}, {0, 0}},
                                      {"model.e", content.e, {2, 2}, {0, 0}},
                                      {"optimizer.state.w.step", content.step, {}, {}}};
    if (extra) chunks.push_back({"model.extra", at::zeros({2}), {2}, {0}});
    const auto written = write_rank_file(step_tmp_dir(out, 7), 0, chunks);
    m.tensors["model.w"].chunks = {written[0]};
    if (extra) m.tensors["model.extra"] = {c10::kFloat, {2}, {written[3]}};
    write_metadata(step_tmp_dir(out, 7), m);
    publish_step_dir(out, 7);
    return out + "/step-00000007";
  };
  r = run_mixtrain("ckpt diff " + a7 + " " + save_one_rank(dir.file("one"), false));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "note: world size 2 vs 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "identical: 3 tensors")) << r.output;
  const std::string extra = save_one_rank(dir.file("extra"), true);
  r = run_mixtrain("ckpt diff " + a7 + " " + extra);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "model.extra: only in B")) << r.output;
  r = run_mixtrain("ckpt diff " + a7 + " " + extra + " --atol 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
}

TEST(CkptCommand, BadInputIsOneErrorLineAndExitOne) {
  TempDir dir;
  CommandResult r = run_mixtrain("ckpt inspect " + dir.file("missing"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output,
            "mixtrain: error: " + dir.file("missing") + ": no such checkpoint directory\n");
  save(dir.file("ckpt"), 7, Content{});
  const std::string meta = dir.file("ckpt/step-00000007/.metadata.json");
  std::ofstream(meta) << "{\"format\": ";
  r = run_mixtrain("ckpt diff " + dir.file("ckpt") + " " + dir.file("ckpt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "mixtrain: error: " + meta + ": checksum ")) << r.output;
  EXPECT_TRUE(contains(r.output, "(the file is corrupt or was edited)\n")) << r.output;
  std::filesystem::remove(meta + ".xxh3_64");  // as a version-1 directory would be
  r = run_mixtrain("ckpt diff " + dir.file("ckpt") + " " + dir.file("ckpt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "mixtrain: error: " + meta + ": not valid JSON")) << r.output;
  r = run_mixtrain("ckpt diff " + dir.file("ckpt"));  // flags: exit 2
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
