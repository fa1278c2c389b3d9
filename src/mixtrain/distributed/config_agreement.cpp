#include "mixtrain/distributed/config_agreement.h"

#include <ATen/ATen.h>
#include <xxhash.h>

#include <cstring>
#include <sstream>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream stream(text);
  std::string line;
  while (std::getline(stream, line)) lines.push_back(line);
  return lines;
}

// "line N: rank 0 has '...', rank R has '...'" for the first line where the texts differ.
std::string first_difference(const std::string& a, const std::string& b, int rank_b) {
  const std::vector<std::string> lines_a = split_lines(a);
  const std::vector<std::string> lines_b = split_lines(b);
  const size_t n = std::max(lines_a.size(), lines_b.size());
  for (size_t i = 0; i < n; ++i) {
    const std::string line_a = i < lines_a.size() ? "'" + lines_a[i] + "'" : "(end of text)";
    const std::string line_b = i < lines_b.size() ? "'" + lines_b[i] + "'" : "(end of text)";
    if (line_a != line_b) {
      return "first difference at line " + std::to_string(i + 1) + ": rank 0 has " + line_a +
             ", rank " + std::to_string(rank_b) + " has " + line_b;
    }
  }
  return "the texts differ only in line endings";
}

}  // namespace

void check_config_agreement(const DeviceMesh& mesh, const std::string& resolved_config_text) {
  Collectives& world = *mesh.world;
  if (world.size() == 1) return;
  const uint64_t hash = XXH3_64bits(resolved_config_text.data(), resolved_config_text.size());
  at::Tensor local = at::empty({1}, at::kLong);
  std::memcpy(local.data_ptr<int64_t>(), &hash, sizeof(hash));
  const at::Tensor hashes = world.all_gather(local);
  const int64_t* all = hashes.data_ptr<int64_t>();
  std::vector<int> differing;
  for (int r = 1; r < world.size(); ++r) {
    if (all[r] != all[0]) differing.push_back(r);
  }
  if (differing.empty()) return;

  // Every rank saw the same hashes, so every rank takes part in gathering the texts.
  const std::vector<std::string> texts = all_gather_strings(world, resolved_config_text);
  auto text_of = [&](int r) { return texts[r]; };
  std::string ranks;
  for (int r : differing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  throw UserError("config agreement: the resolved config of rank" +
                  std::string(differing.size() > 1 ? "s " : " ") + ranks +
                  " differs from rank 0's (every rank must run the same config); " +
                  first_difference(text_of(0), text_of(differing.front()), differing.front()));
}

}  // namespace mixtrain
