// NorMuon (Li et al., "NorMuon: Making Muon more efficient and scalable", arXiv 2510.05491,
// Algorithm 1 and the authors' normuon.py): a neuron-wise second moment of Muon's orthogonalized
// update. For O of shape [..., m, n] (leading dims: independent matrices; the m rows are the
// parameter's rows as stored, dim -2: output neurons of a [out, in] weight) and its state v of
// shape [..., m] (float32):
//   v     <- beta2 * v + (1 - beta2) * mean_j(O_ij^2)     (torch's lerp_, weight 1 - beta2)
//   Ohat   = O / (sqrt(v) + eps)                          (row i by sqrt(v_i) + eps)
//   result = Ohat * ||O||_F / (||Ohat||_F + eps)           (per matrix: O's Frobenius norm kept)
// The last line is the paper code's norm-preserving rescale: the update keeps O's Frobenius
// norm, so Muon's own scale (adjust_lr_fn) applies after it as without NorMuon. (Algorithm 1
// writes it as RMS 0.2 via lr * 0.2 sqrt(mn) / ||Ohat||_F; with match_rms_adamw that is ours
// up to ||O||_F vs sqrt(min(m, n)), which Newton-Schulz only approximates.)
// Everything runs in float32 (O is widened first). Each matrix's row means and norms are reduced
// on its own 2-D slice, so a matrix gives the same bits alone (a distributed owner) or batched.
#pragma once

#include <ATen/core/Tensor.h>

namespace mixtrain {

// Updates v in place (float32, contiguous, O's leading shape without the last dim) and returns
// the rescaled update, float32, O's shape. Throws c10::Error on a shape or dtype mismatch.
at::Tensor normuon_normalize(const at::Tensor& orthogonalized, at::Tensor& v, double beta2,
                             double epsilon);

// Cautious weight decay (Chen et al., arXiv 2510.12402, Algorithm 1): the decay of
// x <- x - lr * (u + wd * I(u * x >= 0) * x) applies where update direction and parameter agree
// in sign or either is zero. Returns that mask (bool, p's shape) for the direction `update`
// (any positive multiple of u), from the exact signs (a product could underflow to -0).
at::Tensor cautious_decay_mask(const at::Tensor& update, const at::Tensor& param);

}  // namespace mixtrain
