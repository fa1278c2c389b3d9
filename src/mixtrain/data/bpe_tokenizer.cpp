#include "mixtrain/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "mixtrain/core/error.h"
#include "mixtrain/core/json_reader.h"
#include "mixtrain/core/utf8.h"
#include "mixtrain/data/unicode_nfc.h"

namespace mixtrain {

// --- UTF-8 ------------------------------------------------------------------------------------

namespace {

bool valid_utf8(std::string_view bytes) {
  size_t subpart;
  for (size_t i = 0; i < bytes.size();) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_sequence_length(bytes, i, &subpart);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t utf8_char_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace

std::string utf8_replace_invalid(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t subpart;
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = utf8_sequence_length(bytes, i, &subpart);
    if (n > 0) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += subpart;
    }
  }
  return out;
}

// --- the tokenizer ----------------------------------------------------------------------------

namespace {

// One Split step: a compiled pattern and what happens to its matches.
struct SplitStep {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  bool removed = false;  // Removed: matches dropped; Isolated: matches kept as their own pieces

  SplitStep() = default;
  SplitStep(const SplitStep&) = delete;
  SplitStep& operator=(const SplitStep&) = delete;
  ~SplitStep() {
    if (match) pcre2_match_data_free(match);
    if (code) pcre2_code_free(code);
  }
};

struct AddedToken {
  std::string content;
  std::string pattern;  // what is matched: content, NFC'd for a normalized token under NFC
  uint32_t id;
  bool special;
};

// Leftmost-longest matching of a set of strings (aho-corasick's MatchKind::LeftmostLongest, as
// tokenizers' AddedVocabulary uses): at the first position where any token starts, the longest.
class AddedMatcher {
 public:
  void add(const AddedToken* token) {
    const auto first = static_cast<unsigned char>(token->pattern[0]);
    auto& list = by_first_[first];
    list.push_back(token);
    std::stable_sort(list.begin(), list.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->pattern.size() > b->pattern.size();
    });
  }
  bool empty() const {
    for (const auto& list : by_first_)
      if (!list.empty()) return false;
    return true;
  }
  // Calls piece(text, nullptr) for text between matches and piece(text, token) for each match.
  template <typename Piece>
  void split(std::string_view text, Piece&& piece) const {
    size_t start = 0;
    for (size_t i = 0; i < text.size();) {
      const AddedToken* hit = nullptr;
      for (const AddedToken* token : by_first_[static_cast<unsigned char>(text[i])]) {
        if (text.compare(i, token->pattern.size(), token->pattern) == 0) {
          hit = token;
          break;
        }
      }
      if (!hit) {
        ++i;
        continue;
      }
      if (start < i) piece(text.substr(start, i - start), nullptr);
      piece(text.substr(i, hit->pattern.size()), hit);
      i += hit->pattern.size();
      start = i;
    }
    if (start < text.size()) piece(text.substr(start), nullptr);
  }

 private:
  std::array<std::vector<const AddedToken*>, 256> by_first_;
};

// GPT-2's pre-tokenizer regex: what ByteLevel(use_regex: true) splits with (tokenizers'
// byte_level.rs).
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Byte-level BPE's alphabet (GPT-2's bytes_to_unicode): printable Latin-1 bytes stand for
// themselves, the other 68 bytes for U+0100.. in byte order.
std::array<std::string, 256> byte_alphabet() {
  std::array<bool, 256> printable{};
  for (int b = 0; b < 256; ++b)
    printable[b] = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  std::array<std::string, 256> chars;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) chars[b] = utf8_of(printable[b] ? b : next++);
  return chars;
}

constexpr size_t kCacheCapacity = 1 << 16;  // words; tokenizers keeps 10000
constexpr size_t kCacheMaxWordBytes = 256;

}  // namespace

struct BpeTokenizer::Impl {
  std::string where;
  std::vector<std::unique_ptr<SplitStep>> splits;
  std::unordered_map<std::string, uint32_t> vocab;
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges;
  std::array<std::string, 256> byte_char;
  std::array<int64_t, 256> byte_id{};  // -1: the byte's character is not in the vocabulary
  bool nfc = false;                    // normalizer: NFC
  bool ignore_merges = false;
  std::optional<uint32_t> unk;
  bool fuse_unk = false;
  std::vector<std::unique_ptr<AddedToken>> added;
  AddedMatcher raw_added;         // normalized: false
  AddedMatcher normalized_added;  // normalized: true
  uint32_t vocab_size = 0;
  std::unordered_map<std::string, std::vector<uint32_t>> cache;
  // Scratch of bpe().
  struct Symbol {
    uint32_t id;
    int32_t prev, next;
    bool live;
  };
  std::vector<Symbol> symbols;

  void load(const nlohmann::json& root);
  void load_pre_tokenizer(const JsonFieldReader& r, const nlohmann::json& root);
  void add_split(const JsonFieldReader& r, const std::string& field, const std::string& pattern,
                 bool literal, bool removed);
  void load_model(const JsonFieldReader& r, const nlohmann::json& model);
  void load_added(const JsonFieldReader& r, const nlohmann::json& root);

  void pre_tokenize(std::string_view piece, size_t step, std::vector<uint32_t>& out);
  void encode_word(std::string_view word, std::vector<uint32_t>& out);
  void bpe(std::string_view word, std::vector<uint32_t>& out);
};

// --- loading ----------------------------------------------------------------------------------

void BpeTokenizer::Impl::load(const nlohmann::json& root) {
  const JsonFieldReader r(where);
  if (!root.is_object())
    r.fail("(top level)", "must be an object, got " + std::string(root.type_name()));
  // null, NFC, or a Sequence of NFCs (none: a no-op some files carry).
  if (const nlohmann::json* normalizer = r.optional_member(root, "normalizer");
      normalizer && !normalizer->is_null()) {
    std::vector<std::pair<std::string, const nlohmann::json*>> steps;
    if (normalizer->is_object() && normalizer->value("type", "") == "Sequence") {
      const nlohmann::json& list = r.list(
          r.member(*normalizer, "normalizers", "normalizer.normalizers"), "normalizer.normalizers");
      for (size_t i = 0; i < list.size(); ++i) {
        steps.emplace_back("normalizer.normalizers[" + std::to_string(i) + "]", &list[i]);
      }
    } else {
      steps.emplace_back("normalizer", normalizer);
    }
    for (const auto& [field, step] : steps) {
      if (step->is_object() && step->value("type", "") == "NFC") {
        nfc = true;
        continue;
      }
      const std::string type =
          step->is_object() && step->contains("type") ? step->at("type").dump() : step->dump();
      r.fail(field, "type " + type +
                        " is not supported (NFC, a Sequence of NFC, or null: mixtrain has no "
                        "other Unicode normalization)");
    }
  }
  load_pre_tokenizer(r, root);
  load_model(r, r.object(root, "model", "model"));
  load_added(r, root);
}

namespace {

// tokenizers compiles Split regexes with Oniguruma's default (Ruby) syntax. Rewritten for
// PCRE2 where the two differ on constructs a pre-tokenizer uses (checked against tokenizers by
// bpe_tokenizer_test): \s is Unicode White_Space (PCRE2's also has U+180E), \h a hex digit,
// \v the VT character; ^ and $ are line anchors (PCRE2_MULTILINE, newline LF, at compile).
// Refused rather than guessed: \w \W \b \B (Oniguruma's word class is not PCRE2's),
// negated \S \H inside a class, and class set operations (&&).
std::string onig_to_pcre2(const std::string& pattern, const JsonFieldReader& r,
                          const std::string& field) {
  // White_Space: Z, \t \n \v \f \r and NEL (PCRE2's \p{Xps} has U+180E too).
  const std::string space = "\\p{Z}\\x{09}-\\x{0d}\\x{85}";
  const std::string hex = "0-9a-fA-F";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char d = pattern[++i];
      const bool negated = d == 'S' || d == 'H';
      if (d == 's' || d == 'S' || d == 'h' || d == 'H') {
        if (in_class && negated) {
          r.fail(field, std::string("\\") + d + " inside a character class is not supported");
        }
        const std::string& set = (d == 's' || d == 'S') ? space : hex;
        out += in_class ? set : (negated ? "[^" : "[") + set + "]";
      } else if (d == 'v') {
        out += "\\x{0b}";
      } else if (d == 'w' || d == 'W' || d == 'b' || d == 'B') {
        r.fail(field, std::string("\\") + d +
                          " is not supported (Oniguruma's word characters are not PCRE2's)");
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    if (in_class && c == '&' && i + 1 < pattern.size() && pattern[i + 1] == '&') {
      r.fail(field, "character class set operations (&&) are not supported");
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // a literal ]
      continue;
    }
    if (in_class && c == '[') r.fail(field, "nested character classes are not supported");
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

void BpeTokenizer::Impl::add_split(const JsonFieldReader& r, const std::string& field,
                                   const std::string& source, bool literal, bool removed) {
  auto step = std::make_unique<SplitStep>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::string pattern = literal ? source : onig_to_pcre2(source, r, field);
  // UCP is not allowed with LITERAL.
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  if (!context) throw std::bad_alloc();
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  step->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                             &error, &offset, context);
  pcre2_compile_context_free(context);
  if (!step->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    r.fail(field, "PCRE2 cannot compile it at offset " + std::to_string(offset) + ": " +
                      reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(step->code, PCRE2_JIT_COMPLETE);  // the interpreter when JIT is unavailable
  step->match = pcre2_match_data_create_from_pattern(step->code, nullptr);
  if (!step->match) throw std::bad_alloc();
  step->removed = removed;
  splits.push_back(std::move(step));
}

void BpeTokenizer::Impl::load_pre_tokenizer(const JsonFieldReader& r, const nlohmann::json& root) {
  const nlohmann::json* pre = r.optional_member(root, "pre_tokenizer");
  if (!pre || pre->is_null()) {
    r.fail("pre_tokenizer", "null: byte-level BPE needs a ByteLevel pre-tokenizer");
  }
  if (!pre->is_object()) r.fail("pre_tokenizer", "must be an object, got " + pre->dump());
  std::vector<std::pair<std::string, const nlohmann::json*>> steps;
  const std::string type =
      r.string(r.member(*pre, "type", "pre_tokenizer.type"), "pre_tokenizer.type");
  if (type == "Sequence") {
    const nlohmann::json& list =
        r.list(r.member(*pre, "pretokenizers", "pre_tokenizer.pretokenizers"),
               "pre_tokenizer.pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      steps.emplace_back("pre_tokenizer.pretokenizers[" + std::to_string(i) + "]", &list[i]);
    }
  } else {
    steps.emplace_back("pre_tokenizer", pre);
  }
  bool byte_level = false;
  for (const auto& [field, step] : steps) {
    if (!step->is_object()) r.fail(field, "must be an object, got " + step->dump());
    const std::string step_type =
        r.string(r.member(*step, "type", field + ".type"), field + ".type");
    if (byte_level)
      r.fail(field + ".type",
             step_type + " after ByteLevel is not supported (ByteLevel must be the last step)");
    if (step_type == "Split") {
      const nlohmann::json& pattern = r.object(*step, "pattern", field + ".pattern");
      const bool regex = pattern.contains("Regex");
      if (!regex && !pattern.contains("String")) {
        r.fail(field + ".pattern",
               "must be {\"Regex\": ...} or {\"String\": ...}, got " + pattern.dump());
      }
      const std::string text = r.string(pattern.at(regex ? "Regex" : "String"),
                                        field + ".pattern." + (regex ? "Regex" : "String"));
      const std::string behavior =
          r.string(r.member(*step, "behavior", field + ".behavior"), field + ".behavior");
      if (behavior != "Isolated" && behavior != "Removed") {
        r.fail(field + ".behavior", "\"" + behavior + "\" is not supported (Isolated or Removed)");
      }
      if (const nlohmann::json* invert = r.optional_member(*step, "invert");
          invert && r.boolean(*invert, field + ".invert")) {
        r.fail(field + ".invert", "true is not supported");
      }
      add_split(r, field + ".pattern", text, !regex, behavior == "Removed");
    } else if (step_type == "ByteLevel") {
      if (const nlohmann::json* prefix = r.optional_member(*step, "add_prefix_space");
          prefix && r.boolean(*prefix, field + ".add_prefix_space")) {
        r.fail(field + ".add_prefix_space", "true is not supported");
      }
      const nlohmann::json* use_regex = r.optional_member(*step, "use_regex");
      // tokenizers' default is true.
      if (!use_regex || r.boolean(*use_regex, field + ".use_regex")) {
        add_split(r, field + ".use_regex", kGpt2Regex, false, false);
      }
      byte_level = true;
    } else {
      r.fail(field + ".type",
             "\"" + step_type + "\" is not supported (Split, ByteLevel, Sequence)");
    }
  }
  if (!byte_level)
    r.fail("pre_tokenizer", "has no ByteLevel step: only byte-level BPE is supported");
}

void BpeTokenizer::Impl::load_model(const JsonFieldReader& r, const nlohmann::json& model) {
  const std::string type = r.string(r.member(model, "type", "model.type"), "model.type");
  if (type != "BPE") r.fail("model.type", "\"" + type + "\" is not supported (BPE)");
  auto absent_or = [&](const char* name, auto&& ok, const std::string& expected) {
    const nlohmann::json* v = r.optional_member(model, name);
    if (v && !v->is_null() && !ok(*v)) {
      r.fail(std::string("model.") + name, v->dump() + " is not supported (" + expected + ")");
    }
  };
  absent_or(
      "dropout", [](const nlohmann::json&) { return false; }, "null");
  absent_or(
      "byte_fallback", [](const nlohmann::json& v) { return v == false; }, "false");
  absent_or(
      "continuing_subword_prefix", [](const nlohmann::json& v) { return v == ""; }, "null");
  absent_or(
      "end_of_word_suffix", [](const nlohmann::json& v) { return v == ""; }, "null");
  if (const nlohmann::json* v = r.optional_member(model, "ignore_merges"); v && !v->is_null()) {
    ignore_merges = r.boolean(*v, "model.ignore_merges");
  }
  if (const nlohmann::json* v = r.optional_member(model, "fuse_unk"); v && !v->is_null()) {
    fuse_unk = r.boolean(*v, "model.fuse_unk");
  }

  const nlohmann::json& vocab_json = r.object(model, "vocab", "model.vocab");
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items()) {
    const int64_t value = r.integer(id, "model.vocab." + token, 0);
    if (value > UINT32_MAX - 1)
      r.fail("model.vocab." + token, "id " + std::to_string(value) + " does not fit in 32 bits");
    vocab[token] = static_cast<uint32_t>(value);
    vocab_size = std::max(vocab_size, static_cast<uint32_t>(value) + 1);
  }
  if (const nlohmann::json* v = r.optional_member(model, "unk_token"); v && !v->is_null()) {
    const std::string token = r.string(*v, "model.unk_token");
    auto it = vocab.find(token);
    if (it == vocab.end()) r.fail("model.unk_token", "\"" + token + "\" is not in model.vocab");
    unk = it->second;
  }

  byte_char = byte_alphabet();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(byte_char[b]);
    byte_id[b] = it == vocab.end() ? -1 : static_cast<int64_t>(it->second);
  }

  const nlohmann::json& list = r.list(r.member(model, "merges", "model.merges"), "model.merges");
  merges.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string field = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (list[i].is_string()) {  // "a b": exactly one space, as tokenizers reads it
      const std::string s = list[i].get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        r.fail(field, "\"" + s + "\" is not two tokens separated by one space");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (list[i].is_array() && list[i].size() == 2 && list[i][0].is_string() &&
               list[i][1].is_string()) {
      a = list[i][0].get<std::string>();
      b = list[i][1].get<std::string>();
    } else {
      r.fail(field, "must be \"a b\" or [\"a\", \"b\"], got " + list[i].dump());
    }
    auto id_of = [&](const std::string& token) {
      auto it = vocab.find(token);
      if (it == vocab.end()) r.fail(field, "token \"" + token + "\" is not in model.vocab");
      return it->second;
    };
    const uint32_t left = id_of(a), right = id_of(b), merged = id_of(a + b);
    // A repeated pair keeps its last rank (tokenizers collects the list into a map).
    merges[(static_cast<uint64_t>(left) << 32) | right] = {static_cast<uint32_t>(i), merged};
  }
}

void BpeTokenizer::Impl::load_added(const JsonFieldReader& r, const nlohmann::json& root) {
  const nlohmann::json* list = r.optional_member(root, "added_tokens");
  if (!list || list->is_null()) return;
  r.list(*list, "added_tokens");
  std::optional<uint32_t> max_added;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    const nlohmann::json& entry = (*list)[i];
    if (!entry.is_object()) r.fail(field, "must be an object, got " + entry.dump());
    auto token = std::make_unique<AddedToken>();
    token->content = r.string(r.member(entry, "content", field + ".content"), field + ".content");
    if (token->content.empty()) r.fail(field + ".content", "is empty");
    r.integer(r.member(entry, "id", field + ".id"), field + ".id", 0);
    // The id tokenizers gives the token when it loads the file (its AddedVocabulary::
    // add_tokens), whatever "id" says: the vocabulary's id when the content is in it, else the
    // next id after the vocabulary's entry count and the added tokens before it. Files that
    // tokenizers wrote agree with "id"; one that does not gets tokenizers' ids, and a warning
    // from tokenizers, none here.
    bool repeated = false;
    for (const auto& before : added) repeated = repeated || before->content == token->content;
    if (repeated) continue;  // tokenizers ignores a token it already has
    if (auto it = vocab.find(token->content); it != vocab.end()) {
      token->id = it->second;
    } else {
      const auto entries = static_cast<uint32_t>(vocab.size());
      token->id = max_added && (*max_added >= entries || entries == 0) ? *max_added + 1 : entries;
    }
    max_added = std::max(max_added.value_or(0), token->id);
    auto flag = [&](const char* name, bool fallback) {
      const nlohmann::json* v = r.optional_member(entry, name);
      return v ? r.boolean(*v, field + "." + name) : fallback;
    };
    for (const char* name : {"single_word", "lstrip", "rstrip"}) {
      if (flag(name, false)) r.fail(field + "." + name, "true is not supported");
    }
    token->special = flag("special", false);
    const bool normalized = flag("normalized", !token->special);  // tokenizers' default
    // tokenizers matches a normalized token by its normalized content.
    token->pattern = normalized && nfc ? unicode_nfc(token->content) : token->content;
    (normalized ? normalized_added : raw_added).add(token.get());
    vocab_size = std::max(vocab_size, token->id + 1);
    added.push_back(std::move(token));
  }
}

// --- encoding ---------------------------------------------------------------------------------

void BpeTokenizer::Impl::pre_tokenize(std::string_view piece, size_t step,
                                      std::vector<uint32_t>& out) {
  if (piece.empty()) return;
  if (step == splits.size()) {
    encode_word(piece, out);
    return;
  }
  const SplitStep& split = *splits[step];
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(split.match);
  // The onig crate's find_iter, which tokenizers iterates: search from the end of the last
  // match; an empty match where the last one ended moves the search on by one character.
  size_t search = 0, previous = 0;
  bool matched_before = false;
  while (search <= piece.size()) {
    const int rc = pcre2_match(split.code, subject, piece.size(), search, PCRE2_NO_UTF_CHECK,
                               split.match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw DataError(where +
                      ": pre-tokenizer regex failed: " + reinterpret_cast<const char*>(message));
    }
    const size_t start = ovector[0], end = ovector[1];
    if (start == end && matched_before && previous == end) {
      search +=
          search < piece.size() ? utf8_char_length(static_cast<unsigned char>(piece[search])) : 1;
      continue;
    }
    if (previous < start) pre_tokenize(piece.substr(previous, start - previous), step + 1, out);
    if (!split.removed) pre_tokenize(piece.substr(start, end - start), step + 1, out);
    search = previous = end;
    matched_before = true;
  }
  if (previous < piece.size()) pre_tokenize(piece.substr(previous), step + 1, out);
}

void BpeTokenizer::Impl::encode_word(std::string_view word, std::vector<uint32_t>& out) {
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    auto it = cache.find(key);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  bool whole = false;
  if (ignore_merges) {  // a word that is a token is that token, whatever the merges say
    std::string chars;
    for (char c : word) chars += byte_char[static_cast<unsigned char>(c)];
    auto it = vocab.find(chars);
    if (it != vocab.end()) {
      out.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) bpe(word, out);
  if (cacheable && cache.size() < kCacheCapacity) {
    cache.emplace(std::move(key), std::vector<uint32_t>(out.begin() + first, out.end()));
  }
}

// tokenizers' Word::merge_all without dropout: a min-heap of (rank, position) of mergeable
// adjacent pairs; an entry whose pair has changed since it was pushed is skipped.
void BpeTokenizer::Impl::bpe(std::string_view word, std::vector<uint32_t>& out) {
  symbols.clear();
  // One symbol per byte (its byte-level character); missing characters become unk (runs fused
  // with fuse_unk) or vanish without one, as in tokenizers' merge_word.
  bool pending_unk = false;
  auto push = [&](uint32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  };
  for (char c : word) {
    const int64_t id = byte_id[static_cast<unsigned char>(c)];
    if (id >= 0) {
      if (pending_unk) push(*unk);
      pending_unk = false;
      push(static_cast<uint32_t>(id));
    } else if (unk) {
      if (pending_unk && !fuse_unk) push(*unk);
      pending_unk = true;
    }
  }
  if (pending_unk) push(*unk);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Merge {
    uint32_t rank;
    int32_t pos;
    uint32_t merged;
    bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Merge, std::vector<Merge>, std::greater<Merge>> queue;
  auto lookup = [&](uint32_t a, uint32_t b) {
    auto it = merges.find((static_cast<uint64_t>(a) << 32) | b);
    return it == merges.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* m = lookup(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->first, static_cast<int32_t>(i), m->second});
    }
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.live || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const auto* current = lookup(left.id, right.id);
    if (!current || current->second != top.merged) continue;  // stale entry
    left.id = top.merged;
    right.live = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const auto* m = lookup(symbols[left.prev].id, left.id)) {
        queue.push({m->first, left.prev, m->second});
      }
    }
    if (left.next >= 0) {
      if (const auto* m = lookup(left.id, symbols[left.next].id)) {
        queue.push({m->first, top.pos, m->second});
      }
    }
  }
  for (const Symbol& s : symbols)
    if (s.live) out.push_back(s.id);
}

// --- BpeTokenizer -----------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer BpeTokenizer::from_json_text(const std::string& text, const std::string& where) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw DataError(where + ": not valid JSON: " + error.what());
  }
  auto impl = std::make_unique<Impl>();
  impl->where = where;
  impl->load(root);
  return BpeTokenizer(std::move(impl));
}

BpeTokenizer BpeTokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open the tokenizer file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw DataError(path + ": cannot read the tokenizer file");
  return from_json_text(text.str(), path);
}

void BpeTokenizer::encode(std::string_view bytes, std::vector<uint32_t>& out) {
  std::string replaced;
  std::string_view text = bytes;
  if (!valid_utf8(bytes)) {
    replaced = utf8_replace_invalid(bytes);
    text = replaced;
  }
  Impl& impl = *impl_;
  // Non-normalized added tokens first, on the raw text; then each piece left is normalized
  // and the normalized tokens are matched in it (tokenizers' extract_and_normalize).
  impl.raw_added.split(text, [&](std::string_view piece, const AddedToken* token) {
    if (token) {
      out.push_back(token->id);
      return;
    }
    std::string normalized;
    if (impl.nfc) {
      normalized = unicode_nfc(piece);
      piece = normalized;
    }
    impl.normalized_added.split(piece, [&](std::string_view rest, const AddedToken* inner) {
      if (inner) {
        out.push_back(inner->id);
      } else {
        impl.pre_tokenize(rest, 0, out);
      }
    });
  });
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view bytes) {
  std::vector<uint32_t> ids;
  encode(bytes, ids);
  return ids;
}

std::optional<uint32_t> BpeTokenizer::token_id(const std::string& content) const {
  for (const auto& token : impl_->added)
    if (token->content == content) return token->id;
  auto it = impl_->vocab.find(content);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

uint32_t BpeTokenizer::vocab_size() const {
  return impl_->vocab_size;
}

std::vector<std::string> BpeTokenizer::special_tokens() const {
  std::vector<std::string> names;
  for (const auto& token : impl_->added)
    if (token->special) names.push_back(token->content);
  return names;
}

}  // namespace mixtrain
