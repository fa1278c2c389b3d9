// Byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Qwen2, Llama-3 style), encoding
// only, giving the ids HF `tokenizers` gives for the same text
// (tests/python/hf_tokenizer_reference.py).
//
// Accepted subset (docs/data.md lists it); anything else is one DataError
// "<file>: <field>: <problem>" naming the JSON field and its value:
//   normalizer      null, NFC (data/unicode_nfc.h), or a Sequence of NFCs (none: a no-op);
//                   every other normalizer is refused
//   pre_tokenizer   ByteLevel, or Sequence of Split* then ByteLevel. Split: pattern {"Regex"} or
//                   {"String"}, behavior Isolated or Removed, invert false. ByteLevel:
//                   add_prefix_space false; use_regex true splits with GPT-2's regex first.
//   model           BPE: vocab, merges ("a b" strings or [a, b] lists), ignore_merges,
//                   unk_token/fuse_unk; dropout null, byte_fallback false, no subword
//                   prefix/suffix
//   added_tokens    special or not, matched first (longest at the leftmost position; tokens
//                   with normalized false before those with normalized true, as tokenizers'
//                   AddedVocabulary does; the normalized ones matched by their NFC
//                   content in NFC text); single_word, lstrip, rstrip false; ids as
//                   tokenizers assigns them on load (== "id" in every file it wrote)
//   ignored         post_processor (BOS/EOS templates: data prepare places EOS itself),
//                   decoder, truncation, padding: they do not change the ids of a text.
// Regexes run on PCRE2 (UTF + UCP, JIT when available), rewritten first where Oniguruma's Ruby
// syntax, which tokenizers uses, means something else (\s, \h, \v, ^, $; \w and \b refused),
// and are iterated as the Rust onig crate iterates tokenizers' matches (an empty match right
// after the previous match is skipped by one character).
//
// Input text is bytes: invalid UTF-8 is first replaced as Python's
// bytes.decode("utf-8", errors="replace") does (each maximal ill-formed subpart becomes one
// U+FFFD), so encode(bytes) == HF encode(bytes.decode("utf-8", "replace")).
//
// Not thread-safe (match buffers and the word cache are per object): one tokenizer per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mixtrain {

// `bytes` with every ill-formed UTF-8 subpart replaced by U+FFFD (Python's errors="replace").
std::string utf8_replace_invalid(std::string_view bytes);

class BpeTokenizer {
 public:
  // Reads and validates `path` (DataError naming the file and field).
  static BpeTokenizer from_file(const std::string& path);
  // `where` names the source in errors.
  static BpeTokenizer from_json_text(const std::string& text, const std::string& where);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // Appends the ids of `bytes` (any bytes: see the header comment) to `out`.
  void encode(std::string_view bytes, std::vector<uint32_t>& out);
  std::vector<uint32_t> encode(std::string_view bytes);

  // The id of a token by content: an added token, else a vocabulary entry (in the byte-level
  // alphabet, e.g. "Ġthe").
  std::optional<uint32_t> token_id(const std::string& content) const;
  // Largest id + 1 over the vocabulary and the added tokens.
  uint32_t vocab_size() const;
  // Contents of the added tokens marked special, in file order.
  std::vector<std::string> special_tokens() const;

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mixtrain
