// Helpers for command-line tests: run the built `mixtrain` binary, capture its output and
// exit code, and make throw-away directories.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/child_process.h"

namespace mixtrain::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// `arguments` are shell words (quoting works as in a shell); the shell execs the binary, so
// the guarded child is mixtrain itself (killed with the test, support/child_process.h).
// `environment`: "NAME=value ..." words added to the binary's environment (env execs it).
inline CommandResult run_mixtrain(const std::string& arguments,
                                  const std::string& environment = "") {
  ChildOptions options;
  options.capture_output = true;
  const std::string command = (environment.empty() ? "" : "env " + environment + " ") +
                              std::string(MIXTRAIN_BINARY) + " " + arguments;
  ChildProcess child({"/bin/sh", "-c", "exec " + command}, options);
  CommandResult result;
  result.output = child.read_output();
  result.exit_code = exit_code_of(child.wait());
  return result;
}

// The rows of a metrics.jsonl file (throws on a line that is not JSON).
inline std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// A metrics.jsonl row without its timings (tokens_per_s, elapsed_s): what two runs of the same
// training must agree on.
inline nlohmann::json without_timing(nlohmann::json row) {
  row.erase("tokens_per_s");
  row.erase("elapsed_s");
  return row;
}

inline std::string source_path(const std::string& relative) {
  return std::string(MIXTRAIN_SOURCE_DIR) + "/" + relative;
}

// A whole file as a string ("" when it cannot be read).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A valid llm.c shard (256 int32 header: magic 20240520, version 1, count; uint16 tokens).
inline void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
}

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "mixtrain-test-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace mixtrain::testing
