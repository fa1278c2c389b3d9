// `mixtrain data prepare` end to end: .txt and .jsonl documents (multilingual, code, added
// tokens, invalid UTF-8) become shards whose ids are, document by document, HF `tokenizers`'
// ids followed by EOS (tests/python/hf_tokenizer_reference.py), split as documented, in uint16
// (version 1) or uint32 (version 2) shards that TokenFileDataset reads; errors leave the output
// directory as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mixtrain/data/token_file_dataset.h"
#include "support/python_script.h"
#include "tools/cli_test_util.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;
using testing::run_mixtrain;
using testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// The documents of the inputs written by write_inputs(), in input order.
std::vector<std::string> write_inputs(const TempDir& dir) {
  const std::string a =
      "Hello, world! I don't think it's THAT'LL work.\n\n今天天气很好。 東京 안녕하세요\n"
      "caf\xC3\xA9 cafe\xCC\x81 \xFF\xFE broken \xE2\x82 bytes\n";
  const std::string b =
      "def f(x):\n\treturn x ** 2   # square\n\n\n<|im_start|>user\n1234567890<|im_end|>";
  spit(dir.file("a.txt"), a);
  spit(dir.file("b.txt"), b);
  const std::vector<std::string> rows = {
      "emoji \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 family",
      "   leading and trailing spaces   ",
      "tabs\t\tand\nnewlines\r\n",
      "<think>x</think> tool call <|endoftext|>",
      "Привет, мир! ٣٤٥ ² ½",
      "é from an escape",
  };
  std::string jsonl;
  for (size_t i = 0; i < rows.size(); ++i) {
    jsonl += nlohmann::json{{"meta", i}, {"text", rows[i]}}.dump() + "\n";
    if (i == 2) jsonl += "\n";  // a blank line is skipped
  }
  spit(dir.file("c.jsonl"), jsonl);
  std::vector<std::string> docs = {a, b};
  docs.insert(docs.end(), rows.begin(), rows.end());
  return docs;
}

// HF tokenizers' ids of each document.
std::vector<std::vector<uint32_t>> reference_ids(const TempDir& dir, const std::string& tokenizer,
                                                 const std::vector<std::string>& docs) {
  nlohmann::json hexes = nlohmann::json::array();
  for (const auto& d : docs) hexes.push_back(hex(d));
  spit(dir.file("docs.json"), hexes.dump());
  EXPECT_TRUE(
      test_support::python_script_succeeds({"hf_tokenizer_reference.py", "encode", tokenizer,
                                            dir.file("docs.json"), dir.file("ids.json")}));
  return nlohmann::json::parse(slurp(dir.file("ids.json")))
      .get<std::vector<std::vector<uint32_t>>>();
}

struct Shards {
  std::vector<uint32_t> tokens;  // all files of the split, in order
  std::vector<int64_t> counts;   // per file
  std::vector<int32_t> versions;
};

// Reads `<dir>/<prefix>_*.bin` independently of TokenFileDataset (little-endian, by hand).
Shards read_shards(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix + "_", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  Shards shards;
  for (size_t i = 0; i < names.size(); ++i) {
    char expected[64];
    std::snprintf(expected, sizeof(expected), "%s_%06zu.bin", prefix.c_str(), i);
    EXPECT_EQ(names[i], expected);
    const std::string bytes = slurp(dir + "/" + names[i]);
    auto u32 = [&](size_t at) {
      uint32_t v = 0;
      for (int k = 0; k < 4; ++k)
        v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + k])) << (8 * k);
      return v;
    };
    EXPECT_EQ(u32(0), 20240520u);
    const auto version = static_cast<int32_t>(u32(4));
    const int64_t count = u32(8);
    const int width = version == 1 ? 2 : 4;
    EXPECT_EQ(static_cast<int64_t>(bytes.size()), 1024 + width * count);
    for (int64_t t = 0; t < count; ++t) {
      uint32_t v = 0;
      for (int k = 0; k < width; ++k) {
        v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[1024 + t * width + k]))
             << (8 * k);
      }
      shards.tokens.push_back(v);
    }
    shards.counts.push_back(count);
    shards.versions.push_back(version);
  }
  return shards;
}

std::vector<uint32_t> joined(const std::vector<std::vector<uint32_t>>& ids, size_t begin,
                             size_t end, uint32_t eos) {
  std::vector<uint32_t> out;
  for (size_t i = begin; i < end; ++i) {
    out.insert(out.end(), ids[i].begin(), ids[i].end());
    out.push_back(eos);
  }
  return out;
}

class DataPrepareTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizers_ = std::make_unique<TempDir>();
    ASSERT_TRUE(test_support::python_script_succeeds(
        {"hf_tokenizer_reference.py", "make", tokenizers_->path()}));
  }
  static void TearDownTestSuite() { tokenizers_.reset(); }
  static std::string tokenizer(const std::string& name) {
    return tokenizers_->file(name + ".json");
  }
  static inline std::unique_ptr<TempDir> tokenizers_;
};

TEST_F(DataPrepareTest, ShardsHoldHfIdsPlusEosPerDocumentAndTheFirstNAreHeldOut) {
  TempDir dir;
  const auto docs = write_inputs(dir);
  const auto ids = reference_ids(dir, tokenizer("qwen2"), docs);
  const std::string out = dir.file("out");
  const auto result =
      run_mixtrain("data prepare --tokenizer " + tokenizer("qwen2") + " --input " +
                   dir.file("a.txt") + " " + dir.file("b.txt") + " " + dir.file("c.jsonl") +
                   " --out " + out + " --val-documents 3 --shard-tokens 40");
  ASSERT_EQ(result.exit_code, 0) << result.output;

  const nlohmann::json summary = nlohmann::json::parse(slurp(out + "/prepare.json"));
  const uint32_t eos = summary.at("eos_id");
  EXPECT_EQ(summary.at("eos"), "<|endoftext|>");
  EXPECT_EQ(eos, 0u);  // the reference trains <|endoftext|> as its first special token
  const Shards val = read_shards(out, "val");
  const Shards train = read_shards(out, "train");
  EXPECT_EQ(val.tokens, joined(ids, 0, 3, eos));
  EXPECT_EQ(train.tokens, joined(ids, 3, docs.size(), eos));
  for (const Shards* s : {&val, &train}) {
    for (size_t i = 0; i < s->counts.size(); ++i) {
      EXPECT_EQ(s->versions[i], 1);  // a 1204-token vocabulary fits uint16
      if (i + 1 < s->counts.size()) {
        EXPECT_EQ(s->counts[i], 40);
      }
      EXPECT_LE(s->counts[i], 40);
    }
  }
  EXPECT_EQ(summary.at("val").at("documents"), 3);
  EXPECT_EQ(summary.at("train").at("documents"), static_cast<int64_t>(docs.size()) - 3);
  EXPECT_EQ(summary.at("train").at("tokens"), static_cast<int64_t>(train.tokens.size()));
  EXPECT_EQ(summary.at("train").at("files").size(), train.counts.size());
  EXPECT_EQ(summary.at("shard_version"), 1);

  const int64_t vocab = summary.at("vocab_size");
  TokenFileDataset data(out + "/train_*.bin", vocab, 0, 1);
  EXPECT_EQ(data.total_tokens(), static_cast<int64_t>(train.tokens.size()));
  const Batch batch = data.next_batch(1, 8);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(batch.input_ids[0][i].item<int64_t>(), train.tokens[i]);
  // Nothing else in the directory (the staging directory is gone).
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1 + val.counts.size() + train.counts.size());
}

TEST_F(DataPrepareTest, Uint32ShardsAndAHashSplitThatIsAPartitionAndDeterministic) {
  TempDir dir;
  const auto docs = write_inputs(dir);
  const auto ids = reference_ids(dir, tokenizer("big"), docs);
  auto prepare = [&](const std::string& out) {
    const auto result =
        run_mixtrain("data prepare --tokenizer " + tokenizer("big") + " --input " +
                     dir.file("a.txt") + " " + dir.file("b.txt") + " " + dir.file("c.jsonl") +
                     " --out " + out + " --eos '<|big_eos|>' --val-fraction 0.5");
    EXPECT_EQ(result.exit_code, 0) << result.output;
  };
  prepare(dir.file("one"));
  prepare(dir.file("two"));
  const nlohmann::json summary = nlohmann::json::parse(slurp(dir.file("one/prepare.json")));
  const uint32_t eos = summary.at("eos_id");
  EXPECT_GT(eos, 65535u);
  EXPECT_EQ(summary.at("shard_version"), 2);
  const Shards val = read_shards(dir.file("one"), "val");
  const Shards train = read_shards(dir.file("one"), "train");
  for (int32_t v : val.versions) EXPECT_EQ(v, 2);
  for (int32_t v : train.versions) EXPECT_EQ(v, 2);
  // Every document, in order, is in exactly one of the two streams.
  size_t at_val = 0, at_train = 0, held_out = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    const auto doc = joined(ids, d, d + 1, eos);
    auto matches = [&](const std::vector<uint32_t>& stream, size_t at) {
      return at + doc.size() <= stream.size() &&
             std::equal(doc.begin(), doc.end(), stream.begin() + static_cast<int64_t>(at));
    };
    if (matches(val.tokens, at_val)) {
      at_val += doc.size();
      ++held_out;
    } else {
      ASSERT_TRUE(matches(train.tokens, at_train)) << "document " << d;
      at_train += doc.size();
    }
  }
  EXPECT_EQ(at_val, val.tokens.size());
  EXPECT_EQ(at_train, train.tokens.size());
  EXPECT_EQ(summary.at("val").at("documents"), held_out);
  EXPECT_GT(held_out, 0u);
  EXPECT_LT(held_out, docs.size());
  for (const std::string& name : summary.at("train").at("files").get<std::vector<std::string>>()) {
    EXPECT_EQ(slurp(dir.file("one/" + name)), slurp(dir.file("two/" + name))) << name;
  }
  TokenFileDataset data(dir.file("one/val_*.bin"), summary.at("vocab_size").get<int64_t>(), 0, 1);
  EXPECT_EQ(data.total_tokens(), static_cast<int64_t>(val.tokens.size()));
}

TEST_F(DataPrepareTest, ErrorsLeaveTheOutputDirectoryAsItWas) {
  TempDir dir;
  write_inputs(dir);
  const std::string out = dir.file("out");
  fs::create_directories(out);
  auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
    return names;
  };
  // A bad row after good documents: nothing is published.
  spit(dir.file("bad.jsonl"), "{\"text\": \"fine\"}\n{\"text\": \"also fine\"}\n{\"body\": 1}\n");
  auto result = run_mixtrain("data prepare --tokenizer " + tokenizer("qwen2") + " --input " +
                             dir.file("a.txt") + " " + dir.file("bad.jsonl") + " --out " + out);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find(dir.file("bad.jsonl") + ":3: no field \"text\""), std::string::npos)
      << result.output;
  EXPECT_TRUE(entries().empty());

  // An unsupported tokenizer: the error names the field.
  nlohmann::json spec = nlohmann::json::parse(slurp(tokenizer("qwen2")));
  spec["normalizer"] = {{"type", "NFKC"}};
  spit(dir.file("nfkc.json"), spec.dump());
  result = run_mixtrain("data prepare --tokenizer " + dir.file("nfkc.json") + " --input " +
                        dir.file("a.txt") + " --out " + out);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("nfkc.json: normalizer: type \"NFKC\" is not supported"),
            std::string::npos)
      << result.output;
  EXPECT_TRUE(entries().empty());

  // Shards of an earlier run are never mixed with new ones.
  spit(out + "/train_000000.bin", "old");
  result = run_mixtrain("data prepare --tokenizer " + tokenizer("qwen2") + " --input " +
                        dir.file("a.txt") + " --out " + out);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("already holds train_000000.bin"), std::string::npos)
      << result.output;
  EXPECT_EQ(slurp(out + "/train_000000.bin"), "old");
  EXPECT_EQ(entries().size(), 1u);

  // A typo names the command; flags: an unknown input kind, an unknown EOS, both split options.
  result = run_mixtrain("data prepar --tokenizer x");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("unknown command 'data prepar' (did you mean 'data prepare'?)"),
            std::string::npos)
      << result.output;
  spit(dir.file("notes.md"), "x");
  result = run_mixtrain("data prepare --tokenizer " + tokenizer("qwen2") + " --input " +
                        dir.file("notes.md") + " --out " + dir.file("o2"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("unknown kind (.txt or .jsonl)"), std::string::npos)
      << result.output;
  result = run_mixtrain("data prepare --tokenizer " + tokenizer("qwen2") + " --input " +
                        dir.file("a.txt") + " --out " + dir.file("o2") + " --eos '<nope>'");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--eos: \"<nope>\""), std::string::npos) << result.output;
  result = run_mixtrain("data prepare --tokenizer " + tokenizer("qwen2") + " --input " +
                        dir.file("a.txt") + " --out " + dir.file("o2") +
                        " --val-fraction 0.1 --val-documents 2");
  EXPECT_EQ(result.exit_code, 2) << result.output;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
