#include "mixtrain/checkpoint/storage.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "mixtrain/core/error.h"
#include "support/checkpoint_surgery.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Same dtype, shape and bytes: comparison by bits, so NaN payloads and -0.0 count.
::testing::AssertionResult bits_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return ::testing::AssertionFailure()
           << a.toString() << a.sizes() << " vs " << b.toString() << b.sizes();
  }
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  if (std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) != 0) {
    return ::testing::AssertionFailure() << "bytes differ";
  }
  return ::testing::AssertionSuccess();
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

// The test checkpoint, as the global tensors and how two ranks split them on dim 0:
//   model.w        float32  [6, 4]    rows [0, 4) on rank 0, [4, 6) on rank 1 (uneven)
//   model.experts  bfloat16 [4, 3, 2] rows [0, 2) / [2, 4)
//   model.bias     float32  [1]       rank 0 holds it, rank 1 an empty chunk at [1]
//   optimizer.state.w.step  int64 0-dim, on rank 0
struct Tensors {
  at::Tensor w, experts, bias, step;
};

Tensors make_tensors(double shift) {
  Tensors t;
  t.w = (at::arange(24, at::kFloat).reshape({6, 4}) * 0.37f + shift).sin();
  t.w[1][2] = std::numeric_limits<float>::quiet_NaN();
  t.w[5][0] = -0.0f;
  t.experts = (at::arange(24, at::kFloat).reshape({4, 3, 2}) * 1.3f + shift).to(at::kBFloat16);
  t.bias = at::tensor({static_cast<float>(0.25 + shift)});
  t.step = at::scalar_tensor(7, at::kLong);
  return t;
}

class StorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "ckpt-XXXXXX").string();
    root_ = mkdtemp(pattern.data());
    dir_ = root_ + "/ckpt";
  }
  void TearDown() override { fs::remove_all(root_); }

  // Saves step `step` the way the distributed save does: each rank's file, the metadata,
  // publish, latest.
  CheckpointMetadata save(int64_t step, const Tensors& t) {
    prepare_step_tmp_dir(dir_, step);
    const std::string tmp = step_tmp_dir(dir_, step);
    const std::vector<LocalChunk> rank0 = {
        {"model.w", t.w.narrow(0, 0, 4), {6, 4}, {0, 0}},
        {"model.experts", t.experts.narrow(0, 0, 2), {4, 3, 2}, {0, 0, 0}},
        {"model.bias", t.bias, {1}, {0}},
        {"optimizer.state.w.step", t.step, {}, {}},
    };
    const std::vector<LocalChunk> rank1 = {
        {"model.w", t.w.narrow(0, 4, 2), {6, 4}, {4, 0}},
        {"model.experts", t.experts.narrow(0, 2, 2), {4, 3, 2}, {2, 0, 0}},
        {"model.bias", t.bias.narrow(0, 1, 0), {1}, {1}},
    };
    CheckpointMetadata m;
    m.step = step;
    m.world_size = 2;
    m.mesh.dp_shard = 2;
    m.state = {{"data", {{"position", 96}}}};
    for (int64_t rank = 0; rank < 2; ++rank) {
      const auto& chunks = rank == 0 ? rank0 : rank1;
      const std::vector<CheckpointChunk> written = write_rank_file(tmp, rank, chunks);
      EXPECT_EQ(written.size(), chunks.size());
      for (size_t i = 0; i < chunks.size(); ++i) {
        CheckpointTensor& entry = m.tensors[chunks[i].key];
        entry.dtype = chunks[i].data.scalar_type();
        entry.shape = chunks[i].global_shape;
        entry.chunks.push_back(written[i]);
      }
    }
    write_metadata(tmp, m);
    publish_step_dir(dir_, step);
    write_latest(dir_, step);
    return m;
  }
  std::string file(int64_t step, const std::string& name) const {
    return step_dir(dir_, step) + "/" + name;
  }

  std::string root_, dir_;
};

TEST_F(StorageTest, LayoutAndNames) {
  save(3, make_tensors(0));
  EXPECT_EQ(step_dir(dir_, 3), dir_ + "/step-00000003");
  EXPECT_EQ(step_tmp_dir(dir_, 3), dir_ + "/.tmp-step-00000003");
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"latest", "step-00000003"}));
  names.clear();
  for (const auto& e : fs::directory_iterator(step_dir(dir_, 3))) {
    names.insert(e.path().filename().string());
  }
  EXPECT_EQ(names, (std::set<std::string>{".metadata.json", ".metadata.json.xxh3_64",
                                          "__0_0.safetensors", "__1_0.safetensors"}));
  // The checksum file is XXH3-64 of .metadata.json's bytes, 16 hex digits and a newline.
  const std::string text = read_text(file(3, ".metadata.json"));
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
  EXPECT_EQ(read_text(file(3, ".metadata.json.xxh3_64")), std::string(hex) + "\n");
  EXPECT_EQ(read_text(dir_ + "/latest"), "step-00000003\n");
}

TEST_F(StorageTest, ReadsBackFullTensorsAndAnyRegionBitExact) {
  const Tensors t = make_tensors(0);
  save(3, t);
  CheckpointReader reader(step_dir(dir_, 3));
  EXPECT_EQ(reader.metadata().step, 3);
  EXPECT_EQ(reader.metadata().state["data"]["position"], 96);
  EXPECT_TRUE(reader.contains("model.w"));
  EXPECT_FALSE(reader.contains("model.v"));
  EXPECT_TRUE(bits_equal(reader.read_full("model.w"), t.w));
  EXPECT_TRUE(bits_equal(reader.read_full("model.experts"), t.experts));
  EXPECT_TRUE(bits_equal(reader.read_full("model.bias"), t.bias));
  const at::Tensor step = reader.read_full("optimizer.state.w.step");
  EXPECT_EQ(step.dim(), 0);
  EXPECT_TRUE(bits_equal(step, t.step));
  EXPECT_TRUE(bits_equal(reader.read("optimizer.state.w.step", {}, {}), t.step));

  // Every row range, as a reader with another world size asks for it (resharding).
  for (int64_t lo = 0; lo <= 6; ++lo) {
    for (int64_t hi = lo; hi <= 6; ++hi) {
      EXPECT_TRUE(
          bits_equal(reader.read("model.w", {lo, 0}, {hi - lo, 4}), t.w.narrow(0, lo, hi - lo)))
          << lo << ".." << hi;
    }
  }
  // Boxes cut in every dim, across the chunk boundary.
  EXPECT_TRUE(
      bits_equal(reader.read("model.w", {3, 1}, {2, 2}), t.w.narrow(0, 3, 2).narrow(1, 1, 2)));
  EXPECT_TRUE(bits_equal(reader.read("model.experts", {1, 1, 1}, {2, 2, 1}),
                         t.experts.narrow(0, 1, 2).narrow(1, 1, 2).narrow(2, 1, 1)));
  EXPECT_TRUE(reader.verify().empty());

  EXPECT_NE(error_of([&] { reader.read("model.v", {0}, {1}); }).find("no tensor model.v"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              reader.read("model.w", {5, 0}, {2, 4});
            }).find("outside the shape [6, 4]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { reader.read("model.w", {0}, {6}); }).find("outside"), std::string::npos);
}

// What write_rank_file wrote, checked with a safetensors reader written here from the format's
// definition (8-byte little-endian header length, JSON header, packed data), not ours.
TEST_F(StorageTest, RankFilesAreStandardSafetensors) {
  const Tensors t = make_tensors(0);
  const CheckpointMetadata m = save(3, t);
  struct Expected {
    std::string file, key, dtype;
    at::Tensor data;
  };
  const std::vector<Expected> expected = {
      {"__0_0.safetensors", "model.w", "F32", t.w.narrow(0, 0, 4)},
      {"__0_0.safetensors", "model.experts", "BF16", t.experts.narrow(0, 0, 2)},
      {"__0_0.safetensors", "model.bias", "F32", t.bias},
      {"__0_0.safetensors", "optimizer.state.w.step", "I64", t.step},
      {"__1_0.safetensors", "model.w", "F32", t.w.narrow(0, 4, 2)},
      {"__1_0.safetensors", "model.experts", "BF16", t.experts.narrow(0, 2, 2)},
      {"__1_0.safetensors", "model.bias", "F32", t.bias.narrow(0, 1, 0)},
  };
  for (const auto& e : expected) {
    SCOPED_TRACE(e.file + " " + e.key);
    const std::string bytes = read_text(file(3, e.file));
    ASSERT_GE(bytes.size(), 8u);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
    const nlohmann::json& entry = header.at(e.key);
    EXPECT_EQ(entry.at("dtype"), e.dtype);
    EXPECT_EQ(entry.at("shape").get<std::vector<int64_t>>(), e.data.sizes().vec());
    const uint64_t begin = entry.at("data_offsets")[0], end = entry.at("data_offsets")[1];
    const at::Tensor data = e.data.contiguous();
    ASSERT_EQ(end - begin, uint64_t(data.numel() * data.element_size()));
    const std::string stored = bytes.substr(8 + n + begin, end - begin);
    EXPECT_EQ(std::memcmp(stored.data(), data.data_ptr(), stored.size()), 0);
    // The metadata's checksum is XXH3-64 of exactly these stored bytes.
    for (const auto& chunk : m.tensors.at(e.key).chunks) {
      if (chunk.file == e.file) {
        EXPECT_EQ(chunk.xxh3_64, XXH3_64bits(stored.data(), stored.size()));
      }
    }
  }
}

TEST_F(StorageTest, EmptyChunkListWritesAValidEmptyFile) {
  fs::create_directories(root_ + "/t");
  EXPECT_TRUE(write_rank_file(root_ + "/t", 5, {}).empty());
  const std::string bytes = read_text(root_ + "/t/__5_0.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(bytes.size(), 8 + n);
  EXPECT_TRUE(nlohmann::json::parse(bytes.substr(8)).empty());
}

TEST_F(StorageTest, ResolveStepDir) {
  save(3, make_tensors(0));
  save(4, make_tensors(1));
  EXPECT_EQ(resolve_step_dir(step_dir(dir_, 3)), step_dir(dir_, 3));
  EXPECT_EQ(resolve_step_dir(dir_), step_dir(dir_, 4));
  write_text(dir_ + "/latest", "  step-00000003 \n\n");  // whitespace is trimmed
  EXPECT_EQ(resolve_step_dir(dir_), step_dir(dir_, 3));

  EXPECT_NE(error_of([&] { resolve_step_dir(root_ + "/nope"); }).find(root_ + "/nope: no such"),
            std::string::npos);
  EXPECT_NE(error_of([&] { resolve_step_dir(root_); }).find(root_ + ": not a checkpoint"),
            std::string::npos);
  write_text(dir_ + "/latest", "step-00000009\n");
  EXPECT_NE(error_of([&] {
              resolve_step_dir(dir_);
            }).find("latest: names step-00000009, which does not exist"),
            std::string::npos);
  fs::remove(file(4, ".metadata.json"));
  write_text(dir_ + "/latest", "step-00000004\n");
  EXPECT_NE(error_of([&] { resolve_step_dir(dir_); }).find("incomplete"), std::string::npos);
  write_text(dir_ + "/latest", "\n");
  EXPECT_NE(error_of([&] { resolve_step_dir(dir_); }).find(dir_ + "/latest: empty"),
            std::string::npos);
  write_text(dir_ + "/latest", "../ckpt/step-00000003");
  EXPECT_NE(error_of([&] { resolve_step_dir(dir_); }).find("not a step directory name"),
            std::string::npos);
}

TEST_F(StorageTest, PublishReplacesAnExistingStepAndLeavesNoTemporaries) {
  save(3, make_tensors(0));
  // A leftover of a killed save is cleared by the next prepare.
  write_text(step_tmp_dir(dir_, 3) + "/junk", "x");
  const Tensors second = make_tensors(2);
  save(3, second);
  EXPECT_FALSE(fs::exists(step_tmp_dir(dir_, 3)));
  EXPECT_FALSE(fs::exists(step_tmp_dir(dir_, 3) + "-old"));
  CheckpointReader reader(step_dir(dir_, 3));
  EXPECT_TRUE(bits_equal(reader.read_full("model.w"), second.w));
  EXPECT_TRUE(reader.verify().empty());
}

TEST_F(StorageTest, ListAndPrune) {
  EXPECT_TRUE(list_complete_steps(dir_).empty());  // no directory yet
  for (int64_t step = 1; step <= 4; ++step) save(step, make_tensors(step));
  fs::create_directories(dir_ + "/step-00000009");       // incomplete: no metadata
  fs::create_directories(dir_ + "/.tmp-step-00000002");  // stale
  fs::create_directories(dir_ + "/.tmp-step-00000005");  // possibly being written
  write_text(dir_ + "/latest.tmp-12345", "step-0000");   // a killed write_latest
  EXPECT_EQ(list_complete_steps(dir_), (std::vector<int64_t>{1, 2, 3, 4}));

  prune_checkpoints(dir_, 0);  // keep all
  EXPECT_EQ(list_complete_steps(dir_), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_FALSE(fs::exists(dir_ + "/.tmp-step-00000002"));
  EXPECT_TRUE(fs::exists(dir_ + "/.tmp-step-00000005"));
  EXPECT_FALSE(fs::exists(dir_ + "/latest.tmp-12345"));

  write_latest(dir_, 1);  // `latest` is never pruned
  prune_checkpoints(dir_, 2);
  EXPECT_EQ(list_complete_steps(dir_), (std::vector<int64_t>{1, 3, 4}));
  write_latest(dir_, 4);
  prune_checkpoints(dir_, 1);
  EXPECT_EQ(list_complete_steps(dir_), (std::vector<int64_t>{4}));
  EXPECT_TRUE(fs::exists(dir_ + "/step-00000009"));
}

TEST_F(StorageTest, FlippedByteIsFoundByReadAndVerify) {
  const Tensors t = make_tensors(0);
  save(3, t);
  // Flip one bit inside rank 1's model.w chunk (rows 4..5), found through the raw header.
  const std::string path = file(3, "__1_0.safetensors");
  std::string bytes = read_text(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  const uint64_t begin = nlohmann::json::parse(bytes.substr(8, n))["model.w"]["data_offsets"][0];
  bytes[8 + n + begin + 5] ^= 0x10;
  write_text(path, bytes);

  CheckpointReader reader(step_dir(dir_, 3));  // the header is intact: opens fine
  EXPECT_TRUE(bits_equal(reader.read("model.w", {0, 0}, {4, 4}), t.w.narrow(0, 0, 4)));
  const std::string expected = path + ": model.w chunk at offsets [4, 0]: checksum ";
  const std::string error = error_of([&] { reader.read("model.w", {3, 0}, {2, 4}); });
  EXPECT_EQ(error.rfind(expected, 0), 0u) << error;
  EXPECT_NE(error.find("but .metadata.json says"), std::string::npos) << error;
  EXPECT_EQ(error_of([&] { reader.verify_key("model.w"); }), error);
  const std::vector<std::string> problems = reader.verify();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0], error);
  reader.verify_key("model.experts");  // the other keys are fine
}

// A chunk of several 4 MiB blocks (10.5 MiB: three blocks, two windows on two threads) is read
// block-parallel and hashed in order: it reads back bit-exact, the single-chunk read and a
// region read agree, and a flipped byte in the last block is found.
TEST_F(StorageTest, MultiBlockChunksReadOnSeveralThreads) {
  const int threads_before = at::get_num_threads();
  at::set_num_threads(2);
  const at::Tensor big = at::randn({2752512}, at::TensorOptions().dtype(at::kFloat));  // 10.5 MiB
  prepare_step_tmp_dir(dir_, 4);
  const std::string tmp = step_tmp_dir(dir_, 4);
  const std::vector<LocalChunk> chunks = {{"model.big", big, {big.numel()}, {0}}};
  CheckpointMetadata m;
  m.step = 4;
  m.world_size = 1;
  m.tensors["model.big"] = {at::kFloat, {big.numel()}, write_rank_file(tmp, 0, chunks)};
  write_metadata(tmp, m);
  publish_step_dir(dir_, 4);
  {
    CheckpointReader reader(step_dir(dir_, 4));
    EXPECT_TRUE(bits_equal(reader.read_full("model.big"), big));
    EXPECT_TRUE(
        bits_equal(reader.read("model.big", {1000}, {2000000}), big.narrow(0, 1000, 2000000)));
  }
  const std::string path = file(4, "__0_0.safetensors");
  std::string bytes = read_text(path);
  bytes[bytes.size() - 100] ^= 0x01;  // inside the third block
  write_text(path, bytes);
  CheckpointReader reader(step_dir(dir_, 4));
  const std::string error = error_of([&] { reader.read_full("model.big"); });
  EXPECT_EQ(error.rfind(path + ": model.big chunk at offsets [0]: checksum ", 0), 0u) << error;
  at::set_num_threads(threads_before);
}

TEST_F(StorageTest, TruncatedFileFailsTheReaderNamingTheFile) {
  save(3, make_tensors(0));
  const std::string path = file(3, "__1_0.safetensors");
  const auto size = fs::file_size(path);
  fs::resize_file(path, size - 10);
  const std::string error = error_of([&] { CheckpointReader reader(step_dir(dir_, 3)); });
  EXPECT_EQ(error, path + ": file is " + std::to_string(size - 10) + " bytes, its header says " +
                       std::to_string(size) + " (truncated? data runs past the end of the file)");
}

TEST_F(StorageTest, MalformedMetadataAndMissingFiles) {
  save(3, make_tensors(0));
  const std::string meta = file(3, ".metadata.json");
  const std::string good = read_text(meta);

  // Damage behind a matching checksum (test_support::rewrite_metadata): the checks after it.
  const std::string dir = step_dir(dir_, 3);
  test_support::rewrite_metadata_text(dir, good.substr(0, good.size() / 2));
  std::string error = error_of([&] { CheckpointReader reader(step_dir(dir_, 3)); });
  EXPECT_EQ(error.rfind(meta + ": not valid JSON", 0), 0u) << error;

  nlohmann::json json = nlohmann::json::parse(good);
  json["tensors"]["model.w"]["dtype"] = "float64";
  test_support::rewrite_metadata(dir, json);
  error = error_of([&] { CheckpointReader reader(step_dir(dir_, 3)); });
  EXPECT_NE(error.find(file(3, "__0_0.safetensors") +
                       ": model.w chunk at offsets [0, 0]: dtype float32 but .metadata.json says "
                       "float64"),
            std::string::npos)
      << error;

  json = nlohmann::json::parse(good);
  json["tensors"]["model.v"] = json["tensors"]["model.w"];
  test_support::rewrite_metadata(dir, json);
  error = error_of([&] { CheckpointReader reader(step_dir(dir_, 3)); });
  EXPECT_NE(error.find("model.v chunk at offsets [0, 0]: missing from the file"), std::string::npos)
      << error;

  test_support::rewrite_metadata_text(dir, good);
  fs::remove(file(3, "__1_0.safetensors"));
  error = error_of([&] { CheckpointReader reader(step_dir(dir_, 3)); });
  EXPECT_EQ(error.rfind(file(3, "__1_0.safetensors") + ": cannot open", 0), 0u) << error;
}

// One flipped bit anywhere in .metadata.json (here: bit i % 8 of every third byte i, so that
// every bit position and every part of the file is hit, ~1 s; and every byte of a key name),
// or in its checksum file, is refused before the JSON is parsed.
TEST_F(StorageTest, MetadataChecksumCatchesEveryBitFlip) {
  save(3, make_tensors(0));
  const std::string dir = step_dir(dir_, 3);
  const std::string meta = file(3, ".metadata.json");
  const std::string good = read_text(meta);
  const size_t key = good.find("model.experts");
  ASSERT_NE(key, std::string::npos);
  for (size_t i = 0; i < good.size(); ++i) {
    if (i % 3 != 0 && (i < key || i >= key + 13)) continue;
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ (1 << (i % 8)));
    write_text(meta, bad);
    const std::string error = error_of([&] { CheckpointReader reader(dir); });
    ASSERT_EQ(error.rfind(meta + ": checksum ", 0), 0u) << "byte " << i << ": " << error;
    ASSERT_NE(error.find("but .metadata.json.xxh3_64 says"), std::string::npos) << error;
  }
  write_text(meta, good);
  CheckpointReader intact(dir);
  EXPECT_TRUE(intact.metadata_checksummed());

  const std::string sum = file(3, ".metadata.json.xxh3_64");
  const std::string good_sum = read_text(sum);
  std::string bad_sum = good_sum;
  bad_sum[5] = bad_sum[5] == '0' ? '1' : '0';  // another hex digit (a flipped bit may not be)
  write_text(sum, bad_sum);
  EXPECT_EQ(error_of([&] { CheckpointReader reader(dir); }).rfind(meta + ": checksum ", 0), 0u);
  write_text(sum, "\xb1not hex\n");
  EXPECT_EQ(error_of([&] { CheckpointReader reader(dir); }),
            sum + ": \"\\xb1not hex\" is not 16 hex digits (corrupt?)");
  fs::remove(sum);
  EXPECT_EQ(error_of([&] { CheckpointReader reader(dir); }),
            sum + ": missing (a format_version 2 checkpoint has it; was it lost in a copy?)");
}

// A version-1 step directory (written before the metadata checksum existed) has no checksum
// file and is read as before, its metadata checked for consistency only; a corrupt one that no
// longer parses is reported without any raw byte of the file.
TEST_F(StorageTest, VersionOneIsReadWithoutAChecksum) {
  save(3, make_tensors(0));
  const std::string dir = step_dir(dir_, 3);
  const std::string meta = file(3, ".metadata.json");
  nlohmann::json json = nlohmann::json::parse(read_text(meta));
  json["format_version"] = 1;
  const std::string v1 = json.dump();
  write_text(meta, v1);
  fs::remove(file(3, ".metadata.json.xxh3_64"));
  {
    CheckpointReader reader(dir);
    EXPECT_FALSE(reader.metadata_checksummed());
    EXPECT_EQ(reader.metadata().format_version, 1);
    EXPECT_TRUE(reader.verify().empty());
    EXPECT_TRUE(bits_equal(reader.read_full("model.w"), make_tensors(0).w));
  }
  // The top bit of a '1' (0x31) flipped: 0xb1, a stray UTF-8 continuation byte, which the JSON
  // parser refuses and quotes in its message.
  const size_t at = v1.find("__1_0");
  ASSERT_NE(at, std::string::npos);
  std::string bad = v1;
  bad[at + 2] = static_cast<char>(bad[at + 2] ^ 0x80);
  write_text(meta, bad);
  const std::string error = error_of([&] { CheckpointReader reader(dir); });
  EXPECT_EQ(error.rfind(meta + ": not valid JSON", 0), 0u) << error;
  EXPECT_NE(error.find("\\xb1"), std::string::npos) << error;
  for (char c : error) EXPECT_LT(static_cast<unsigned char>(c), 0x80) << error;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
