#include "mixtrain/cli/data_command.h"

#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "mixtrain/core/error.h"
#include "mixtrain/core/posix_file.h"
#include "mixtrain/data/bpe_tokenizer.h"
#include "mixtrain/data/token_shard_writer.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The staging directory: removed (with what it holds) unless released.
class Staging {
 public:
  explicit Staging(fs::path path) : path_(std::move(path)) {
    std::error_code error;
    fs::create_directory(path_, error);
    if (error) throw UserError(path_.string() + ": cannot create: " + error.message());
  }
  ~Staging() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct Split {
  int64_t documents = 0;
  std::unique_ptr<TokenShardWriter> writer;
};

std::string megabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MB", bytes / 1e6);
  return text;
}

uint32_t eos_id(const BpeTokenizer& tokenizer, std::string& name) {
  if (!name.empty()) {
    if (auto id = tokenizer.token_id(name)) return *id;
    throw ConfigError("--eos: \"" + name + "\" is neither an added token nor in the vocabulary");
  }
  for (const char* candidate : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    if (auto id = tokenizer.token_id(candidate)) {
      name = candidate;
      return *id;
    }
  }
  throw ConfigError(
      "--eos: the tokenizer has none of <|endoftext|>, <|end_of_text|>, </s>, <eos>: name the "
      "end-of-document token with --eos");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open: " + errno_text());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw DataError(path + ": read failed");
  return text.str();
}

// Calls document(bytes) for every document of `path`, and progress(bytes read so far) after each.
template <typename Document, typename Progress>
void for_each_document(const std::string& path, const std::string& field, Document&& document,
                       Progress&& progress) {
  const std::string extension = fs::path(path).extension().string();
  if (extension == ".txt") {
    const std::string text = read_file(path);
    document(text);
    progress(text.size());
    return;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open: " + errno_text());
  std::string line;
  size_t read = 0;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    read += line.size() + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    const std::string where = path + ":" + std::to_string(number);
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& error) {
      throw DataError(where + ": not valid JSON: " + error.what());
    }
    if (!row.is_object())
      throw DataError(where + ": must be a JSON object, got " + std::string(row.type_name()));
    auto it = row.find(field);
    if (it == row.end()) throw DataError(where + ": no field \"" + field + "\" (--jsonl-field)");
    if (!it->is_string()) {
      throw DataError(where + ": field \"" + field + "\" must be a string, got " +
                      std::string(it->type_name()));
    }
    document(it->get_ref<const std::string&>());
    progress(read);
  }
  if (in.bad()) throw DataError(path + ": read failed");
}

}  // namespace

CLI::App* add_data_command(CLI::App& app, DataPrepareOptions& options) {
  CLI::App* data = app.add_subcommand("data", "prepare training data");
  data->require_subcommand(1);
  CLI::App* prepare =
      data->add_subcommand("prepare", "tokenize .txt/.jsonl files into token shards");
  prepare
      ->add_option("--tokenizer", options.tokenizer, "Hugging Face tokenizer.json (byte-level BPE)")
      ->required();
  prepare
      ->add_option("--input", options.inputs, ".txt (one document) or .jsonl (one per line) files")
      ->required();
  prepare
      ->add_option("--out", options.out, "output directory (train_*.bin, val_*.bin, prepare.json)")
      ->required();
  prepare->add_option("--jsonl-field", options.jsonl_field, "the .jsonl field holding the text")
      ->capture_default_str();
  CLI::Option* fraction = prepare
                              ->add_option("--val-fraction", options.val_fraction,
                                           "held out: documents whose XXH3-64 / 2^64 < F")
                              ->check(CLI::Range(0.0, 1.0))
                              ->capture_default_str();
  prepare->add_option("--val-documents", options.val_documents, "held out: the first N documents")
      ->check(CLI::NonNegativeNumber)
      ->excludes(fraction);
  prepare->add_option("--shard-tokens", options.shard_tokens, "tokens per shard file")
      ->check(CLI::Range(int64_t{1}, int64_t{INT32_MAX}))
      ->capture_default_str();
  prepare->add_option(
      "--eos", options.eos,
      "end-of-document token (default: <|endoftext|>, <|end_of_text|>, </s>, <eos>)");
  return prepare;
}

int data_prepare_command(const DataPrepareOptions& options) {
  BpeTokenizer tokenizer = BpeTokenizer::from_file(options.tokenizer);
  std::string eos_name = options.eos;
  const uint32_t eos = eos_id(tokenizer, eos_name);

  int64_t input_bytes = 0;
  for (const std::string& input : options.inputs) {
    const std::string extension = fs::path(input).extension().string();
    if (extension != ".txt" && extension != ".jsonl") {
      throw ConfigError("--input: " + input + ": unknown kind (.txt or .jsonl)");
    }
    struct stat st {};
    if (stat(input.c_str(), &st) != 0) throw DataError(input + ": cannot read: " + errno_text());
    input_bytes += st.st_size;
  }

  const fs::path out(options.out);
  std::error_code error;
  fs::create_directories(out, error);
  if (error)
    throw UserError(options.out + ": cannot create the output directory: " + error.message());
  for (const auto& entry : fs::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    const bool shard = (name.rfind("train_", 0) == 0 || name.rfind("val_", 0) == 0) &&
                       entry.path().extension() == ".bin";
    if (shard || name == "prepare.json") {
      throw UserError(options.out + ": already holds " + name +
                      " (of an earlier run): remove it or choose another --out");
    }
  }
  Staging staging(out / (".prepare-tmp-" + std::to_string(::getpid())));

  Split train, val;
  const uint32_t vocab = tokenizer.vocab_size();
  train.writer = std::make_unique<TokenShardWriter>(staging.path().string(), "train",
                                                    options.shard_tokens, vocab);
  val.writer = std::make_unique<TokenShardWriter>(staging.path().string(), "val",
                                                  options.shard_tokens, vocab);

  const auto started = Clock::now();
  auto last_report = started;
  int64_t documents = 0, done_bytes = 0;
  std::vector<uint32_t> ids;
  for (const std::string& input : options.inputs) {
    for_each_document(
        input, options.jsonl_field,
        [&](const std::string& text) {
          bool held_out;
          if (options.val_documents >= 0) {
            held_out = documents < options.val_documents;
          } else {
            const uint64_t hash = XXH3_64bits(text.data(), text.size());
            held_out = static_cast<double>(hash) / 18446744073709551616.0 < options.val_fraction;
          }
          ++documents;
          ids.clear();
          tokenizer.encode(text, ids);
          ids.push_back(eos);
          Split& split = held_out ? val : train;
          ++split.documents;
          split.writer->append(ids.data(), ids.size());
        },
        [&](size_t read_in_file) {
          const auto now = Clock::now();
          if (now - last_report < std::chrono::seconds(5)) return;
          last_report = now;
          const double seconds = std::chrono::duration<double>(now - started).count();
          const double bytes = static_cast<double>(done_bytes + static_cast<int64_t>(read_in_file));
          std::cerr << "data prepare: " << megabytes(bytes) << " of "
                    << megabytes(static_cast<double>(input_bytes)) << ", "
                    << train.writer->tokens() + val.writer->tokens() << " tokens, "
                    << megabytes(bytes / seconds) << "/s" << std::endl;
        });
    struct stat st {};
    if (stat(input.c_str(), &st) == 0) done_bytes += st.st_size;
  }
  const std::vector<std::string> train_files = train.writer->finish();
  const std::vector<std::string> val_files = val.writer->finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();

  nlohmann::json summary;
  summary["tokenizer"] = fs::absolute(options.tokenizer).string();
  summary["eos"] = eos_name;
  summary["eos_id"] = eos;
  summary["vocab_size"] = vocab;
  summary["shard_version"] = train.writer->version();
  summary["token_dtype"] = train.writer->version() == 1 ? "uint16" : "uint32";
  summary["inputs"] = options.inputs;
  summary["jsonl_field"] = options.jsonl_field;
  if (options.val_documents >= 0) {
    summary["held_out"] = {{"val_documents", options.val_documents}};
  } else {
    summary["held_out"] = {{"val_fraction", options.val_fraction}};
  }
  summary["shard_tokens"] = options.shard_tokens;
  auto split_json = [](const Split& split, const std::vector<std::string>& files) {
    return nlohmann::json{
        {"documents", split.documents}, {"tokens", split.writer->tokens()}, {"files", files}};
  };
  summary["train"] = split_json(train, train_files);
  summary["val"] = split_json(val, val_files);

  // Into place: the shards, then prepare.json (its presence says the set is complete).
  for (const auto* files : {&train_files, &val_files}) {
    for (const std::string& name : *files) {
      fs::rename(staging.path() / name, out / name, error);
      if (error)
        throw UserError((out / name).string() + ": cannot rename into place: " + error.message());
    }
  }
  AtomicFile json((out / "prepare.json").string(),
                  AtomicFile::pid_tmp_path((out / "prepare.json").string()));
  json.write(summary.dump(2) + "\n");
  json.publish(true);

  std::cout << "data prepare: " << documents << " documents, "
            << megabytes(static_cast<double>(input_bytes)) << " in " << seconds << " s ("
            << megabytes(static_cast<double>(input_bytes) / seconds)
            << "/s); train: " << train.documents << " documents, " << train.writer->tokens()
            << " tokens, " << train_files.size() << " files; val: " << val.documents
            << " documents, " << val.writer->tokens() << " tokens, " << val_files.size()
            << " files; " << options.out << "/prepare.json" << std::endl;
  if (val.documents == 0 &&
      (options.val_documents > 0 || (options.val_documents < 0 && options.val_fraction > 0))) {
    std::cerr << "data prepare: warning: no document was held out (no val_*.bin): raise "
                 "--val-fraction or use --val-documents N"
              << std::endl;
  }
  return 0;
}

}  // namespace mixtrain
