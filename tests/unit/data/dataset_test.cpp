// make_dataset dispatch and the data-parallel split: ranks read disjoint windows whose union,
// batch for batch, is what a single rank with the whole batch reads.
#include "mixtrain/data/dataset.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

DataConfig config(const std::string& kind, const std::string& path = "") {
  DataConfig c;
  c.kind = kind;
  c.path = path;
  return c;
}

// An llm.c shard holding tokens 0, 1, ..., n - 1 (all distinct).
std::string write_ramp_shard(int64_t n) {
  const fs::path file =
      fs::temp_directory_path() / ("mixtrain_dataset_test_" + std::to_string(::getpid()) + ".bin");
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(n);
  std::vector<uint16_t> tokens;
  for (int64_t i = 0; i < n; ++i) tokens.push_back(static_cast<uint16_t>(i));
  std::ofstream out(file, std::ios::binary);  // this test runs on little-endian hosts only
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(2 * n));
  return file.string();
}

TEST(DatasetTest, FactoryDispatchesOnKind) {
  auto synthetic = make_dataset(config("synthetic"), 512, 1, 0, 1);
  EXPECT_NE(synthetic->describe().find("synthetic"), std::string::npos);
  const std::string file = write_ramp_shard(100);
  auto tokens = make_dataset(config("tokens", file), 512, 1, 0, 1);
  EXPECT_NE(tokens->describe().find("llm.c token shards"), std::string::npos);
  EXPECT_EQ(tokens->next_batch(1, 4).input_ids[0][1].item<int64_t>(), 1);
  fs::remove(file);
}

TEST(DatasetTest, BadKindOrMissingPathIsAConfigError) {
  try {
    make_dataset(config("text"), 512, 1, 0, 1);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.kind"), std::string::npos);
    EXPECT_EQ(e.key(), "data.kind");  // for the CLI to spell as the user did
    EXPECT_EQ(e.problem(), "'text' is not one of synthetic, tokens");
  }
  try {
    make_dataset(config("tokens"), 512, 1, 0, 1);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.path"), std::string::npos);
    EXPECT_EQ(e.key(), "data.path");
  }
}

// A pattern matching no file is known only when the files are looked for: a DataError (exit
// code 1) about data.path, the key apart from the problem.
TEST(DatasetTest, TokenFilesThatCannotBeOpenedAreErrorsOnDataPath) {
  DataConfig tokens = config("tokens");
  tokens.path = (fs::temp_directory_path() / "mixtrain_no_such_shard_*.bin").string();
  try {
    make_dataset(tokens, 512, 1, 0, 1);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(e.exit_code(), 1);
    EXPECT_EQ(e.key(), "data.path");
    EXPECT_EQ(e.problem(), "token files '" + tokens.path + "': the pattern matches no file");
    EXPECT_EQ(std::string(e.what()), "data.path: " + e.problem());
  }
}

TEST(DatasetTest, BadRankIsAProgrammingError) {
  EXPECT_THROW(make_dataset(config("synthetic"), 512, 1, 2, 2), std::invalid_argument);
  EXPECT_THROW(make_dataset(config("synthetic"), 512, 1, 0, 0), std::invalid_argument);
}

// Rank r of d, micro batch b, gets rows r, r + d, ... of the single-rank batch of b * d.
void expect_interleaved(TokenDataset& single, TokenDataset& rank0, TokenDataset& rank1) {
  for (int step = 0; step < 3; ++step) {
    const Batch all = single.next_batch(8, 12);
    const Batch r0 = rank0.next_batch(4, 12);
    const Batch r1 = rank1.next_batch(4, 12);
    const auto even = at::arange(0, 8, 2, at::kLong);
    const auto odd = at::arange(1, 8, 2, at::kLong);
    EXPECT_TRUE(at::equal(r0.input_ids, all.input_ids.index_select(0, even)));
    EXPECT_TRUE(at::equal(r1.input_ids, all.input_ids.index_select(0, odd)));
    EXPECT_TRUE(at::equal(r1.labels, all.labels.index_select(0, odd)));
  }
  EXPECT_EQ(rank0.position(), single.position());  // windows consumed by all ranks
  EXPECT_EQ(rank1.position(), single.position());
}

TEST(DatasetTest, SyntheticRanksSplitTheSingleRankStream) {
  auto single = make_dataset(config("synthetic"), 512, 77, 0, 1);
  auto rank0 = make_dataset(config("synthetic"), 512, 77, 0, 2);
  auto rank1 = make_dataset(config("synthetic"), 512, 77, 1, 2);
  expect_interleaved(*single, *rank0, *rank1);
}

TEST(DatasetTest, TokenRanksReadDisjointWindows) {
  const std::string file = write_ramp_shard(2000);  // token value = its index in the file
  auto single = make_dataset(config("tokens", file), 4096, 1, 0, 1);
  auto rank0 = make_dataset(config("tokens", file), 4096, 1, 0, 2);
  auto rank1 = make_dataset(config("tokens", file), 4096, 1, 1, 2);
  expect_interleaved(*single, *rank0, *rank1);
  // Disjoint: no input token position is read by both ranks.
  rank0->seek(0);
  rank1->seek(0);
  std::set<int64_t> seen;
  for (auto* rank : {rank0.get(), rank1.get()}) {
    const Batch batch = rank->next_batch(4, 12);
    const auto ids = batch.input_ids.flatten();
    for (int64_t i = 0; i < ids.numel(); ++i) {
      EXPECT_TRUE(seen.insert(ids[i].item<int64_t>()).second) << "token read twice";
    }
  }
  EXPECT_EQ(seen.size(), 8u * 12u);
  fs::remove(file);
}

TEST(DatasetTest, PositionMustDivideAmongRanks) {
  auto rank0 = make_dataset(config("synthetic"), 512, 1, 0, 2);
  EXPECT_NO_THROW(rank0->seek(6));
  EXPECT_THROW(rank0->seek(3), DataError);
  EXPECT_THROW(rank0->seek(-2), DataError);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
