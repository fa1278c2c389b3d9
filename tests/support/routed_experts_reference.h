// Inputs, a float64 reference computed token by token from the formula, and a runner for the
// forms of model/routed_experts.h (tests/unit/model/routed_experts_test.cpp and its CUDA twin).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace mixtrain::test_support {

struct ExpertInputs {
  at::Tensor hidden, selected, weights, gate, up, down, dout;
};

// T tokens, E experts (expert 2 gets no token), top-2, hidden 16, intermediate 24.
inline ExpertInputs make_expert_inputs() {
  at::manual_seed(3);
  const int64_t tokens = 13, experts = 5, hidden = 16, inter = 24;
  ExpertInputs in;
  in.hidden = at::randn({tokens, hidden}).to(at::kBFloat16);
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t a = (t * 3) % experts == 2 ? 0 : (t * 3) % experts;
    int64_t b = (t + 1) % experts == 2 ? 4 : (t + 1) % experts;
    if (b == a) b = (a + 1) % experts == 2 ? 3 : (a + 1) % experts;
    ids.insert(ids.end(), {a, b});
  }
  in.selected = at::tensor(ids, at::kLong).view({tokens, 2});
  in.weights = at::softmax(at::randn({tokens, 2}), -1).to(at::kBFloat16);
  in.gate = (at::randn({experts, inter, hidden}) * 0.25).to(at::kBFloat16);
  in.up = (at::randn({experts, inter, hidden}) * 0.25).to(at::kBFloat16);
  in.down = (at::randn({experts, hidden, inter}) * 0.2).to(at::kBFloat16);
  in.dout = at::randn({tokens, hidden}).to(at::kBFloat16);
  return in;
}

struct ExpertResult {
  std::vector<at::Tensor> values;  // out, d hidden, d weights, d gate, d up, d down
};

template <typename Form>
inline ExpertResult run_experts(Form form, const ExpertInputs& in, at::ScalarType dtype,
                                c10::Device device = c10::kCPU) {
  std::vector<at::Tensor> leaves;
  for (const auto& t : {in.hidden, in.weights, in.gate, in.up, in.down}) {
    leaves.push_back(t.to(device, dtype).detach().requires_grad_());
  }
  const at::Tensor out =
      form(leaves[0], in.selected.to(device), leaves[1], leaves[2], leaves[3], leaves[4]);
  out.backward(in.dout.to(device, dtype));
  ExpertResult r;
  r.values.push_back(out.detach().cpu());
  for (const auto& leaf : leaves) r.values.push_back(leaf.grad().cpu());
  return r;
}

// The formula token by token in float64 (autograd for the gradients).
inline at::Tensor reference_form(const at::Tensor& hidden, const at::Tensor& selected,
                                 const at::Tensor& weights, const at::Tensor& gate,
                                 const at::Tensor& up, const at::Tensor& down) {
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < hidden.size(0); ++t) {
    at::Tensor sum = at::zeros({hidden.size(1)}, hidden.options());
    for (int64_t s = 0; s < selected.size(1); ++s) {
      const int64_t e = selected[t][s].item<int64_t>();
      const at::Tensor x = hidden[t];
      const at::Tensor h = at::silu(gate[e].matmul(x)) * up[e].matmul(x);
      sum = sum + weights[t][s] * down[e].matmul(h);
    }
    rows.push_back(sum);
  }
  return at::stack(rows);
}

inline double relative(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want).abs().max().item<double>() / want.abs().max().item<double>();
}

}  // namespace mixtrain::test_support
