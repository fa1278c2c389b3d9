// Tokenizing throughput of `mixtrain data prepare` against Hugging Face `tokenizers` on the same
// corpus and tokenizer, one thread each, in the same run.
//
// A plain program. The reference script (tests/python/hf_tokenizer_reference.py, run by
// MIXTRAIN_PYTHON) trains the test's Qwen2-style byte-level BPE (Qwen2's pre-tokenizer regex,
// 1200 tokens) and writes two generated .jsonl corpora of about --megabytes MB each (default
// 10), one document per line: "fragments" (the test's multilingual fragments: English, CJK,
// Cyrillic, Arabic, Devanagari, emoji, code; words repeat, so a word cache hits, as on real
// text's frequent words) and "novel" (words of random syllables and random CJK ideographs,
// nearly all distinct: the cache mostly misses and BPE merges run). Then, per corpus, R rounds
// (default 3), alternately (the order flips every round, so that a drift in the machine's load
// falls on both):
//   ours: `mixtrain data prepare --tokenizer T --input corpus.jsonl --out DIR --val-fraction 0`
//         (OMP_NUM_THREADS=1; the command is single-threaded). Its own figure: input MB / the
//         seconds from the first document read to the last shard written (JSON parsing of every
//         line and the shard writes included; the tokenizer load and process start not), and
//         the wall time of the whole process;
//   HF:   `hf_tokenizer_reference.py bench T corpus.jsonl`: Tokenizer.encode_batch and
//         Tokenizer.encode_batch_fast (no offsets) of all the documents (already parsed, in
//         memory) with RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false; the best of 3 calls
//         of each.
// Printed: each round's MB/s, the best of each side and their ratio, and a check that both
// produced the same number of tokens (ours minus one EOS per document).
//
// Usage: bench_data_prepare [MIXTRAIN_BINARY] [--megabytes N] [--rounds R] [--python PY]
//                           [--work-dir DIR] [--keep]
// Exit code 0 when every run was measured and the token counts agree, 1 otherwise.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "bench_support.h"

using namespace mixtrain::bench;

namespace {

struct Options {
  std::string binary = MIXTRAIN_BINARY;
  std::string python = MIXTRAIN_PYTHON;
  std::string reference =
      std::string(MIXTRAIN_SOURCE_DIR) + "/tests/python/hf_tokenizer_reference.py";
  int megabytes = 10;
  int rounds = 3;
  std::string work_base;
  bool keep = false;
};

// Runs args to completion with its output in `log`; fail()s with the log's end unless it exits 0.
double run(const std::vector<std::string>& args, const std::string& log,
           const std::vector<std::pair<std::string, std::string>>& env = {}) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = spawn_logged(args, log, 1, env);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) fail("waitpid failed");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fail(args[0] + " " + args[1] + " failed; the end of " + log + ":\n" + tail_of_file(log, 15));
  }
  return seconds;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  program_name() = "bench_data_prepare";
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--megabytes") {
      o.megabytes = std::stoi(option_value(argc, argv, i));
    } else if (arg == "--rounds") {
      o.rounds = std::stoi(option_value(argc, argv, i));
    } else if (arg == "--python") {
      o.python = option_value(argc, argv, i);
    } else if (arg == "--work-dir") {
      o.work_base = option_value(argc, argv, i);
    } else if (arg == "--keep") {
      o.keep = true;
    } else if (!arg.empty() && arg[0] != '-') {
      o.binary = arg;
    } else {
      fail("unknown option " + arg);
    }
  }
  require_executable(o.binary);
  const std::string work = make_work_dir(o.work_base, "bench-data-prepare");
  const std::string tokenizer = work + "/tok/qwen2.json";
  run({o.python, o.reference, "make", work + "/tok"}, work + "/make.log");
  std::printf("bench_data_prepare: %s, tokenizer %s (1200 tokens), %d MB per corpus\n",
              cpu_model().c_str(), tokenizer.c_str(), o.megabytes);
  // "data prepare: D documents, X MB in S s (R MB/s); train: D documents, T tokens, ..."
  const std::regex summary(
      R"(data prepare: (\d+) documents, [0-9.]+ MB in [0-9.e+-]+ s \(([0-9.]+) MB/s\); train: \d+ documents, (\d+) tokens)");
  bool all_equal = true;
  for (const std::string kind : {"fragments", "novel"}) {
    const std::string corpus = work + "/" + kind + ".jsonl";
    run({o.python, o.reference, "corpus", std::to_string(o.megabytes * 1000000), corpus, kind},
        work + "/corpus.log");
    std::printf("corpus %s:\n", kind.c_str());
    double best_ours = 0, best_hf = 0, best_hf_fast = 0;
    long long ours_tokens = -1, hf_tokens = -1;
    for (int round = 0; round < o.rounds; ++round) {
      for (int side = 0; side < 2; ++side) {
        const bool ours = (side == 0) == (round % 2 == 0);
        const std::string tag = kind + std::to_string(round);
        if (ours) {
          const std::string out = work + "/out-" + tag;
          const std::string log = work + "/ours-" + tag + ".log";
          const double wall = run({o.binary, "data", "prepare", "--tokenizer", tokenizer, "--input",
                                   corpus, "--out", out, "--val-fraction", "0"},
                                  log);
          std::smatch m;
          const std::string text = read_all(log);
          if (!std::regex_search(text, m, summary)) fail("no summary line in " + log);
          const double rate = std::stod(m[2]);
          ours_tokens = std::stoll(m[3]) - std::stoll(m[1]);  // without each document's EOS
          best_ours = std::max(best_ours, rate);
          std::printf("  round %d ours: %.2f MB/s (process wall %.2f s)\n", round + 1, rate, wall);
          std::filesystem::remove_all(out);
        } else {
          const std::string log = work + "/hf-" + tag + ".log";
          run({o.python, o.reference, "bench", tokenizer, corpus}, log,
              {{"RAYON_NUM_THREADS", "1"}, {"TOKENIZERS_PARALLELISM", "false"}});
          const std::string text = read_all(log);
          const size_t brace = text.rfind('{');
          if (brace == std::string::npos) fail("no JSON in " + log);
          const nlohmann::json j = nlohmann::json::parse(text.substr(brace));
          const double rate = j.at("mb_per_s"), fast = j.at("fast_mb_per_s");
          hf_tokens = j.at("tokens");
          if (j.at("fast_tokens") != hf_tokens) fail("encode_batch_fast gave another token count");
          best_hf = std::max(best_hf, rate);
          best_hf_fast = std::max(best_hf_fast, fast);
          std::printf(
              "  round %d HF tokenizers: encode_batch %.2f MB/s, encode_batch_fast %.2f MB/s\n",
              round + 1, rate, fast);
        }
      }
    }
    std::printf(
        "  best of %d: ours %.2f MB/s; HF tokenizers encode_batch %.2f MB/s (ours / HF x%.2f), "
        "encode_batch_fast %.2f MB/s (x%.2f)\n",
        o.rounds, best_ours, best_hf, best_ours / best_hf, best_hf_fast, best_ours / best_hf_fast);
    std::printf("  tokens (without EOS): ours %lld, HF %lld: %s\n", ours_tokens, hf_tokens,
                ours_tokens == hf_tokens ? "equal" : "DIFFERENT");
    all_equal = all_equal && ours_tokens == hf_tokens;
  }
  keep_or_remove(work, o.keep, "bench_data_prepare: work directory kept: ");
  return all_equal ? 0 : 1;
}
