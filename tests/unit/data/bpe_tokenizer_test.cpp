// The C++ byte-level BPE tokenizer against Hugging Face `tokenizers`: the reference script
// (tests/python/hf_tokenizer_reference.py) trains Qwen2-, Llama-3- and GPT-2-style tokenizers on
// a generated multilingual corpus and encodes a test corpus (CJK, emoji with ZWJ sequences,
// code, whitespace runs, numbers, contractions, combining marks, added tokens inside text,
// invalid UTF-8); every id must be the same. Also: the invalid-UTF-8 contract byte for byte
// (Python's decode(errors="replace")), and one error naming the field for each unsupported
// tokenizer.json feature.
#include "mixtrain/data/bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"
#include "support/python_script.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

// Runs the reference once for the whole suite.
class BpeTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("mixtrain_bpe_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    ASSERT_TRUE(
        test_support::python_script_succeeds({"hf_tokenizer_reference.py", "make", dir_.string()}));
    cases_ = nlohmann::json::parse(read_text(dir_ / "cases.json")).at("cases");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static inline fs::path dir_;
  static inline nlohmann::json cases_;

  // Every case of tokenizer `name`: our ids == HF's.
  void expect_identical(const std::string& name) {
    BpeTokenizer tokenizer = BpeTokenizer::from_file((dir_ / (name + ".json")).string());
    int compared = 0, mismatched = 0;
    for (const auto& c : cases_) {
      if (c.at("tokenizer") != name) continue;
      const std::string text = from_hex(c.at("hex"));
      const auto expected = c.at("ids").get<std::vector<uint32_t>>();
      const std::vector<uint32_t> ours = tokenizer.encode(text);
      ++compared;
      if (ours != expected && ++mismatched <= 5) {
        ADD_FAILURE() << name << ": ids differ for text hex " << c.at("hex").get<std::string>();
      }
    }
    EXPECT_EQ(mismatched, 0) << name;
    EXPECT_GT(compared, 100) << name;
  }

  // The message of loading `spec` (fails the test when it loads).
  static std::string load_error(const nlohmann::json& spec) {
    try {
      BpeTokenizer::from_json_text(spec.dump(), "tok.json");
    } catch (const DataError& error) {
      return error.what();
    }
    ADD_FAILURE() << "loaded: " << spec.dump().substr(0, 200);
    return "";
  }
  static nlohmann::json qwen2() { return nlohmann::json::parse(read_text(dir_ / "qwen2.json")); }
};

TEST_F(BpeTokenizerTest, Qwen2StyleIsIdenticalToHfTokenizers) {
  expect_identical("qwen2");
}
TEST_F(BpeTokenizerTest, Qwen2WithStringMergesIsIdentical) {
  expect_identical("qwen2_str");
}
TEST_F(BpeTokenizerTest, Llama3StyleWithIgnoreMergesIsIdentical) {
  expect_identical("llama3");
}
TEST_F(BpeTokenizerTest, Gpt2ByteLevelRegexIsIdentical) {
  expect_identical("gpt2");
}
TEST_F(BpeTokenizerTest, IdsPastUint16AreIdentical) {
  expect_identical("big");
}
TEST_F(BpeTokenizerTest, OnigurumaRegexConstructsAndRemovedAreIdentical) {
  expect_identical("regex_features");
}
TEST_F(BpeTokenizerTest, EmptyNormalizerSequenceIsIdentical) {
  expect_identical("llama3_empty_normalizer");
}
TEST_F(BpeTokenizerTest, NfcNormalizerIsIdentical) {
  expect_identical("qwen2_nfc");
}

TEST_F(BpeTokenizerTest, InvalidUtf8IsReplacedAsPythonDoes) {
  int invalid = 0;
  for (const auto& c : cases_) {
    if (c.at("tokenizer") != "qwen2") continue;
    const std::string text = from_hex(c.at("hex"));
    const std::string decoded = from_hex(c.at("decoded_hex"));
    if (text != decoded) ++invalid;
    EXPECT_EQ(utf8_replace_invalid(text), decoded) << c.at("hex").get<std::string>();
  }
  EXPECT_GE(invalid, 30);  // the reference's INVALID list and its random byte soup
}

TEST_F(BpeTokenizerTest, VocabularyAndSpecialTokens) {
  BpeTokenizer tokenizer = BpeTokenizer::from_file((dir_ / "qwen2.json").string());
  const nlohmann::json spec = qwen2();
  uint32_t largest = 0;
  for (const auto& [token, id] : spec.at("model").at("vocab").items()) {
    largest = std::max(largest, id.get<uint32_t>());
  }
  for (const auto& token : spec.at("added_tokens")) {
    largest = std::max(largest, token.at("id").get<uint32_t>());
    EXPECT_EQ(tokenizer.token_id(token.at("content")), token.at("id").get<uint32_t>());
  }
  EXPECT_EQ(tokenizer.vocab_size(), largest + 1);
  EXPECT_EQ(tokenizer.special_tokens(),
            (std::vector<std::string>{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}));
  EXPECT_EQ(tokenizer.token_id("\xC4\xA0"), spec.at("model").at("vocab").at("\xC4\xA0"));  // "Ġ"
  EXPECT_FALSE(tokenizer.token_id("no such token").has_value());
}

TEST_F(BpeTokenizerTest, UnsupportedFieldsAreOneErrorNamingTheField) {
  struct Case {
    std::string pointer;  // JSON pointer to set
    nlohmann::json value;
    std::string expected;  // in the message
  };
  const std::vector<Case> cases = {
      {"/normalizer", {{"type", "NFKC"}}, "tok.json: normalizer: type \"NFKC\" is not supported"},
      {"/normalizer",
       {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}},
       "tok.json: normalizer.normalizers[1]: type \"Lowercase\" is not supported"},
      {"/pre_tokenizer/pretokenizers/0/behavior", "MergedWithPrevious",
       "pre_tokenizer.pretokenizers[0].behavior: \"MergedWithPrevious\" is not supported"},
      {"/pre_tokenizer/pretokenizers/0/invert", true,
       "pre_tokenizer.pretokenizers[0].invert: true is not supported"},
      {"/pre_tokenizer/pretokenizers/0/pattern",
       {{"Regex", "(unclosed"}},
       "pre_tokenizer.pretokenizers[0].pattern: PCRE2 cannot compile it"},
      {"/pre_tokenizer/pretokenizers/0/pattern",
       {{"Regex", "\\w+"}},
       "pre_tokenizer.pretokenizers[0].pattern: \\w is not supported"},
      {"/pre_tokenizer/pretokenizers/0/pattern",
       {{"Regex", "[^\\S]"}},
       "pre_tokenizer.pretokenizers[0].pattern: \\S inside a character class"},
      {"/pre_tokenizer/pretokenizers/1/add_prefix_space", true,
       "pre_tokenizer.pretokenizers[1].add_prefix_space: true is not supported"},
      {"/pre_tokenizer/pretokenizers/0/type", "Whitespace",
       "pre_tokenizer.pretokenizers[0].type: \"Whitespace\" is not supported"},
      {"/pre_tokenizer", nullptr, "pre_tokenizer: null: byte-level BPE needs"},
      {"/model/type", "WordPiece", "model.type: \"WordPiece\" is not supported"},
      {"/model/dropout", 0.1, "model.dropout: 0.1 is not supported"},
      {"/model/byte_fallback", true, "model.byte_fallback: true is not supported"},
      {"/model/continuing_subword_prefix", "##", "model.continuing_subword_prefix: \"##\""},
      {"/model/merges/0", "a b c", "model.merges[0]: \"a b c\" is not two tokens"},
      {"/model/merges/1", nlohmann::json::array({"zzz", "q"}),
       "model.merges[1]: token \"zzz\" is not in model.vocab"},
      {"/model/unk_token", "<unk>", "model.unk_token: \"<unk>\" is not in model.vocab"},
      {"/added_tokens/0/lstrip", true, "added_tokens[0].lstrip: true is not supported"},
      {"/added_tokens/1/single_word", true, "added_tokens[1].single_word: true is not supported"},
  };
  for (const Case& c : cases) {
    nlohmann::json spec = qwen2();
    spec[nlohmann::json::json_pointer(c.pointer)] = c.value;
    const std::string message = load_error(spec);
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << c.pointer << ": got \"" << message << "\"";
  }
  // A ByteLevel that is not last, and none at all.
  nlohmann::json spec = qwen2();
  auto& steps = spec["pre_tokenizer"]["pretokenizers"];
  std::swap(steps[0], steps[1]);
  EXPECT_NE(load_error(spec).find("pre_tokenizer.pretokenizers[1].type: Split after ByteLevel"),
            std::string::npos);
  steps.erase(0);
  EXPECT_NE(load_error(spec).find("pre_tokenizer: has no ByteLevel step"), std::string::npos);
  EXPECT_NE(load_error(nlohmann::json::array()).find("must be an object"), std::string::npos);
  try {
    BpeTokenizer::from_json_text("{not json", "tok.json");
    ADD_FAILURE() << "parsed";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("tok.json: not valid JSON"), std::string::npos);
  }
}

// Hand-checked semantics independent of the reference: Removed drops the matches, a String
// pattern is literal, a byte missing from the vocabulary becomes unk (runs fused with
// fuse_unk) and vanishes without one, as tokenizers' BPE does.
TEST(BpeTokenizerSmall, SplitBehaviourUnkAndFuseUnk) {
  auto spec = [](const std::string& split, bool unk, bool fuse) {
    nlohmann::json j = {
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"String", split}}}, {"behavior", "Removed"}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
        {"model",
         {{"type", "BPE"},
          {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"<unk>", 3}, {".", 4}}},
          {"merges", {"a b"}},
          {"fuse_unk", fuse}}}};
    if (unk) j["model"]["unk_token"] = "<unk>";
    return BpeTokenizer::from_json_text(j.dump(), "small.json");
  };
  // "." is a literal separator (a regex "." would remove everything); "xy" and "z" have no
  // byte in the vocabulary.
  EXPECT_EQ(spec(".", false, false).encode("ab.ba.xyab"), (std::vector<uint32_t>{2, 1, 0, 2}));
  EXPECT_EQ(spec(".", true, false).encode("ab.xyab.z"), (std::vector<uint32_t>{2, 3, 3, 2, 3}));
  EXPECT_EQ(spec(".", true, true).encode("ab.xyab.z"), (std::vector<uint32_t>{2, 3, 2, 3}));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
