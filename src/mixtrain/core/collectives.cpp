#include "mixtrain/core/collectives.h"

#include <ATen/ATen.h>

#include <cstring>
#include <stdexcept>

namespace mixtrain {
namespace {

class LocalCollectives final : public Collectives {
 public:
  explicit LocalCollectives(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  void all_reduce_sum(at::Tensor&) override {}
  at::Tensor all_gather(const at::Tensor& local) override { return local.clone(); }
  at::Tensor reduce_scatter_sum(const at::Tensor& full) override { return full.clone(); }
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts) override {
    if (send_counts.size() != 1 || recv_counts.size() != 1 || send_counts[0] != recv_counts[0] ||
        send_counts[0] != input.size(0)) {
      throw std::invalid_argument(name_ + ": all_to_all on one rank must send every row to itself");
    }
    return input.clone();
  }
  void broadcast(at::Tensor&, int root) override {
    if (root != 0) throw std::invalid_argument(name_ + ": broadcast root out of range");
  }
  void barrier() override {}

 private:
  std::string name_;
};

}  // namespace

std::unique_ptr<Collectives> make_local_collectives(const std::string& name) {
  return std::make_unique<LocalCollectives>(name);
}

std::vector<std::string> all_gather_strings(Collectives& group, const std::string& text) {
  if (group.size() == 1) return {text};
  const at::Tensor lengths =
      group.all_gather(at::full({1}, static_cast<int64_t>(text.size()), at::kLong));
  const int64_t* length = lengths.data_ptr<int64_t>();
  int64_t longest = 1;
  for (int r = 0; r < group.size(); ++r) longest = std::max(longest, length[r]);
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::memcpy(padded.data_ptr<uint8_t>(), text.data(), text.size());
  const at::Tensor gathered = group.all_gather(padded);
  std::vector<std::string> texts;
  for (int r = 0; r < group.size(); ++r) {
    const auto* bytes = reinterpret_cast<const char*>(gathered.data_ptr<uint8_t>()) + r * longest;
    texts.emplace_back(bytes, static_cast<size_t>(length[r]));
  }
  return texts;
}

}  // namespace mixtrain
