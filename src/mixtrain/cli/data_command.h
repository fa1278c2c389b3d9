// `mixtrain data prepare` (docs/cli.md): text in, token shards out.
//
//   mixtrain data prepare --tokenizer tokenizer.json --input FILE... --out DIR
//       [--jsonl-field text] [--val-fraction F | --val-documents N] [--shard-tokens N]
//       [--eos TOKEN]
//
// Documents: a .txt file is one document (its bytes, invalid UTF-8 replaced as
// data/bpe_tokenizer.h says); a .jsonl file holds one per non-blank line, the string at
// --jsonl-field. Each document's ids are followed by the EOS id. Held-out split: with
// --val-documents N the first N documents of the input order; else (--val-fraction, default
// 0.01) a document is held out when XXH3-64 of its bytes / 2^64 < F, so the split does not depend
// on file order and duplicates share a side. Output: DIR/train_NNNNNN.bin, DIR/val_NNNNNN.bin
// (data/token_shard_writer.h) and DIR/prepare.json, staged in DIR/.prepare-tmp-<pid> and
// renamed into place at the end (prepare.json last): an error leaves DIR as it was. DIR must
// not already hold shards or prepare.json. Progress on stderr every few seconds.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain {

struct DataPrepareOptions {
  std::string tokenizer;
  std::vector<std::string> inputs;
  std::string out;
  std::string jsonl_field = "text";
  double val_fraction = 0.01;
  int64_t val_documents = -1;  // >= 0: the first N documents are held out (not the fraction)
  int64_t shard_tokens = 100'000'000;
  std::string eos;  // empty: the tokenizer's <|endoftext|>, <|end_of_text|>, </s> or <eos>
};

// Adds `data prepare` to `app`; returns the `prepare` subcommand (parsed() when it was given).
CLI::App* add_data_command(CLI::App& app, DataPrepareOptions& options);

int data_prepare_command(const DataPrepareOptions& options);

}  // namespace mixtrain
