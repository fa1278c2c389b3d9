// llm.c token shards (version 1: uint16, version 2: uint32 tokens): good files are read window
// by window exactly as written; every kind of malformed file is a DataError that names the file.
#include "mixtrain/data/token_file_dataset.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

struct ShardSpec {
  int32_t magic = 20240520;
  int32_t version = 1;
  int64_t declared_count = -1;   // -1: tokens.size()
  std::vector<uint32_t> tokens;  // written as uint16 for version 1, uint32 otherwise
  int64_t drop_bytes = 0;        // cut from the end (truncated file)
  int64_t extra_bytes = 0;       // appended after the tokens
};

// Writes the header and tokens byte by byte in little-endian order.
void write_shard(const std::string& path, const ShardSpec& spec) {
  std::vector<unsigned char> bytes(1024, 0);
  auto put32 = [&](size_t at, int32_t v) {
    const auto u = static_cast<uint32_t>(v);
    for (int k = 0; k < 4; ++k) bytes[at + k] = static_cast<unsigned char>(u >> (8 * k));
  };
  put32(0, spec.magic);
  put32(4, spec.version);
  put32(8,
        static_cast<int32_t>(spec.declared_count >= 0 ? spec.declared_count
                                                      : static_cast<int64_t>(spec.tokens.size())));
  const int width = spec.version == 1 ? 2 : 4;
  for (uint32_t t : spec.tokens) {
    for (int k = 0; k < width; ++k) bytes.push_back(static_cast<unsigned char>(t >> (8 * k)));
  }
  bytes.resize(bytes.size() - static_cast<size_t>(spec.drop_bytes));
  bytes.insert(bytes.end(), static_cast<size_t>(spec.extra_bytes), 0);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

ShardSpec shard_of(std::vector<uint32_t> tokens, int32_t version = 1) {
  ShardSpec s;
  s.tokens = std::move(tokens);
  s.version = version;
  return s;
}

std::vector<uint32_t> ramp(int64_t n, int64_t start, int64_t modulo) {
  std::vector<uint32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<uint32_t>((start + i) % modulo));
  return t;
}

class TokenFileDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mixtrain_tokens_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // The DataError message for opening `file` (fails the test if none is thrown).
  std::string error_for(const std::string& file, int64_t vocab = 512) {
    try {
      TokenFileDataset data(file, vocab, 0, 1);
    } catch (const DataError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no DataError for " << file;
    return "";
  }

  fs::path dir_;
};

// Row r of the batch must be tokens[start + r * seq_len, ... + seq_len] (inputs: first
// seq_len of them, labels: last seq_len).
void expect_rows(const Batch& batch, const std::vector<uint32_t>& tokens,
                 const std::vector<int64_t>& starts, int64_t seq_len) {
  ASSERT_EQ(batch.input_ids.size(0), static_cast<int64_t>(starts.size()));
  for (size_t r = 0; r < starts.size(); ++r) {
    for (int64_t i = 0; i < seq_len; ++i) {
      EXPECT_EQ(batch.input_ids[r][i].item<int64_t>(), tokens[starts[r] + i]) << "row " << r;
      EXPECT_EQ(batch.labels[r][i].item<int64_t>(), tokens[starts[r] + i + 1]) << "row " << r;
    }
  }
}

TEST_F(TokenFileDatasetTest, GoodFileWindowsEqualTheTokensWritten) {
  const auto tokens = ramp(100, 0, 512);
  write_shard(path("good.bin"), shard_of(tokens));
  TokenFileDataset data(path("good.bin"), 512, 0, 1);
  EXPECT_EQ(data.total_tokens(), 100);
  // seq_len 8: windows start every 8 tokens; (100 - 1) / 8 = 12 windows per epoch.
  expect_rows(data.next_batch(3, 8), tokens, {0, 8, 16}, 8);
  expect_rows(data.next_batch(3, 8), tokens, {24, 32, 40}, 8);
  expect_rows(data.next_batch(3, 8), tokens, {48, 56, 64}, 8);
  // Windows 9, 10, 11 (the last starts at 88 and ends at token 96), then window 12 wraps to 0.
  expect_rows(data.next_batch(4, 8), tokens, {72, 80, 88, 0}, 8);
  EXPECT_EQ(data.position(), 13);
}

// Evaluation's access: one epoch's window count and windows by index, never wrapping.
TEST_F(TokenFileDatasetTest, WindowsByIndexWithinOneEpoch) {
  const auto tokens = ramp(100, 0, 512);
  write_shard(path("good.bin"), shard_of(tokens));
  TokenFileDataset data(path("good.bin"), 512, 0, 1);
  EXPECT_EQ(data.epoch_windows(8), 12);  // (100 - 1) / 8
  EXPECT_EQ(data.epoch_windows(33), 3);  // (100 - 1) / 33
  expect_rows(data.windows_batch({11, 0, 5}, 8), tokens, {88, 0, 40}, 8);
  EXPECT_EQ(data.position(), 0);  // the training cursor does not move
  EXPECT_THROW(data.windows_batch({12}, 8), std::out_of_range);
  EXPECT_THROW(data.windows_batch({-1}, 8), std::out_of_range);
  EXPECT_THROW(data.epoch_windows(100), DataError);  // no window of 101 tokens
}

TEST_F(TokenFileDatasetTest, SeekReproducesTheStream) {
  const auto tokens = ramp(200, 3, 512);
  write_shard(path("good.bin"), shard_of(tokens));
  TokenFileDataset data(path("good.bin"), 512, 0, 1);
  data.next_batch(2, 16);
  const int64_t mark = data.position();
  const Batch next = data.next_batch(2, 16);
  TokenFileDataset resumed(path("good.bin"), 512, 0, 1);
  resumed.seek(mark);
  EXPECT_TRUE(at::equal(resumed.next_batch(2, 16).input_ids, next.input_ids));
}

TEST_F(TokenFileDatasetTest, GlobReadsFilesInSortedOrderWithoutStraddling) {
  const auto first = ramp(21, 0, 512);                  // seq_len 4: (21 - 1) / 4 = 5 windows
  const auto second = ramp(14, 100, 512);               // (14 - 1) / 4 = 3 windows, token 13 unused
  write_shard(path("shard_01.bin"), shard_of(second));  // written first, read second
  write_shard(path("shard_00.bin"), shard_of(first));
  TokenFileDataset data(path("shard_*.bin"), 512, 0, 1);
  ASSERT_EQ(data.files().size(), 2u);
  EXPECT_EQ(data.files()[0], path("shard_00.bin"));
  EXPECT_EQ(data.files()[1], path("shard_01.bin"));
  expect_rows(data.next_batch(5, 4), first, {0, 4, 8, 12, 16}, 4);
  expect_rows(data.next_batch(3, 4), second, {0, 4, 8}, 4);
  expect_rows(data.next_batch(1, 4), first, {0}, 4);  // next epoch
}

TEST_F(TokenFileDatasetTest, TruncatedFileNamesTheFile) {
  ShardSpec truncated = shard_of(ramp(50, 0, 512));
  truncated.drop_bytes = 3;
  write_shard(path("truncated.bin"), truncated);
  const std::string message = error_for(path("truncated.bin"));
  EXPECT_NE(message.find(path("truncated.bin")), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST_F(TokenFileDatasetTest, TruncatedHeaderNamesTheFile) {
  std::ofstream(path("short.bin"), std::ios::binary) << "tiny";
  const std::string message = error_for(path("short.bin"));
  EXPECT_NE(message.find(path("short.bin")), std::string::npos) << message;
  EXPECT_NE(message.find("header"), std::string::npos) << message;
}

TEST_F(TokenFileDatasetTest, TrailingBytesNameTheFile) {
  ShardSpec trailing = shard_of(ramp(50, 0, 512));
  trailing.extra_bytes = 2;
  write_shard(path("trailing.bin"), trailing);
  const std::string message = error_for(path("trailing.bin"));
  EXPECT_NE(message.find(path("trailing.bin")), std::string::npos) << message;
  EXPECT_NE(message.find("2 trailing bytes"), std::string::npos) << message;
}

TEST_F(TokenFileDatasetTest, BadMagicNamesTheFile) {
  ShardSpec bad = shard_of(ramp(10, 0, 512));
  bad.magic = 20240801;
  write_shard(path("magic.bin"), bad);
  const std::string message = error_for(path("magic.bin"));
  EXPECT_NE(message.find(path("magic.bin")), std::string::npos) << message;
  EXPECT_NE(message.find("bad magic 20240801"), std::string::npos) << message;
}

TEST_F(TokenFileDatasetTest, BadVersionNamesTheFile) {
  ShardSpec bad = shard_of(ramp(10, 0, 512));
  bad.version = 3;
  write_shard(path("version.bin"), bad);
  const std::string message = error_for(path("version.bin"));
  EXPECT_NE(message.find(path("version.bin")), std::string::npos) << message;
  EXPECT_NE(message.find("version 3"), std::string::npos) << message;
}

// Version 2: uint32 tokens past uint16's range, read exactly; mixed with version 1 in a glob.
TEST_F(TokenFileDatasetTest, Version2TokensPastUint16AreReadExactly) {
  const auto wide = ramp(50, 65530, 200000);  // 65530 .. 65579: both sides of 65536
  write_shard(path("m_00.bin"), shard_of(wide, 2));
  const auto narrow = ramp(30, 7, 512);
  write_shard(path("m_01.bin"), shard_of(narrow, 1));
  TokenFileDataset data(path("m_*.bin"), 70000, 0, 1);
  EXPECT_EQ(data.total_tokens(), 80);
  // seq_len 7: (50 - 1) / 7 = 7 windows in the first file, (30 - 1) / 7 = 4 in the second.
  expect_rows(data.next_batch(7, 7), wide, {0, 7, 14, 21, 28, 35, 42}, 7);
  expect_rows(data.next_batch(4, 7), narrow, {0, 7, 14, 21}, 7);
  // A version-2 token >= vocab_size, and a version-2 file cut mid-token.
  std::string message = error_for(path("m_00.bin"), 65560);
  EXPECT_NE(message.find("token 65560 at index 30"), std::string::npos) << message;
  ShardSpec cut = shard_of(wide, 2);
  cut.drop_bytes = 2;
  write_shard(path("cut.bin"), cut);
  message = error_for(path("cut.bin"), 70000);
  EXPECT_NE(message.find("declares 50 tokens (1224 bytes) but the file has 1222"),
            std::string::npos)
      << message;
}

TEST_F(TokenFileDatasetTest, OutOfVocabTokenNamesFileAndIndex) {
  auto tokens = ramp(30, 0, 512);
  tokens[17] = 600;
  write_shard(path("oov.bin"), shard_of(tokens));
  const std::string message = error_for(path("oov.bin"), 512);
  EXPECT_NE(message.find(path("oov.bin")), std::string::npos) << message;
  EXPECT_NE(message.find("token 600 at index 17"), std::string::npos) << message;
  EXPECT_NO_THROW(TokenFileDataset(path("oov.bin"), 601, 0, 1));  // fits a larger vocabulary
}

TEST_F(TokenFileDatasetTest, BadFileInAGlobIsFoundAtOpen) {
  write_shard(path("s_00.bin"), shard_of(ramp(30, 0, 512)));
  ShardSpec bad = shard_of(ramp(30, 0, 512));
  bad.version = 3;
  write_shard(path("s_01.bin"), bad);
  const std::string message = error_for(path("s_*.bin"));
  EXPECT_NE(message.find(path("s_01.bin")), std::string::npos) << message;
}

TEST_F(TokenFileDatasetTest, EmptyGlobAndMissingFileNameThePath) {
  std::string message = error_for(path("nothing_*.bin"));
  EXPECT_NE(message.find(path("nothing_*.bin")), std::string::npos) << message;
  message = error_for(path("missing.bin"));
  EXPECT_NE(message.find(path("missing.bin")), std::string::npos) << message;
}

TEST_F(TokenFileDatasetTest, FilesShorterThanOneWindowAreAnError) {
  write_shard(path("small.bin"), shard_of(ramp(8, 0, 512)));
  TokenFileDataset data(path("small.bin"), 512, 0, 1);
  EXPECT_THROW(data.next_batch(1, 8), DataError);  // needs 9 tokens
  EXPECT_NO_THROW(data.next_batch(1, 7));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
