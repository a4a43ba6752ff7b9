// Deterministic mode's per-element passes over every parameter, one pass each instead of a
// dozen list-wide torch ops (each of which streams whole tensors through memory):
//
// det_adamw: AdamW with one IEEE rounding per operation, in the order and with the float32
//   constants of ElementwiseAdamW's _foreach ops (credit/train/elementwise_adamw.py), and
//   torch's own square root, so its bits equal theirs. Built with -ffp-contract=off: the compiler's vector loop and scalar
//   tail round every multiply and add alike, and sqrt and division are correctly rounded in
//   both, so an element's bits do not depend on where a shard boundary puts it.
//
// det_square_bins: the exact sum of squares of credit/parallel/exact_norm.py, binned by float32
//   exponent field: per field, the integer sums of hi*hi, hi*lo and lo*lo over the elements'
//   24-bit significands m = hi * 2^12 + lo. Integer sums do not depend on their order, so
//   threads split the elements freely.
// torch/csrc/utils/pybind.h: pybind11 with torch's tensor casters, the one thing the bindings
// need; torch/extension.h (the whole C++ frontend) takes three times as long to compile.
#include <torch/csrc/utils/pybind.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kGrain = 1 << 14;
constexpr int64_t kBlock = 16384;  // elements per square-root call: the temporaries stay in cache

void det_adamw(at::Tensor param, const at::Tensor& grad, at::Tensor exp_avg, at::Tensor exp_avg_sq,
               double decay_factor, bool decay, double beta1, double one_minus_beta1, double beta2,
               double one_minus_beta2, double bias_correction1, double bias_correction2, double eps, double lr) {
  TORCH_CHECK(param.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat &&
                  exp_avg.scalar_type() == at::kFloat && exp_avg_sq.scalar_type() == at::kFloat,
              "det_adamw takes float32 tensors");
  TORCH_CHECK(param.is_contiguous() && grad.is_contiguous() && exp_avg.is_contiguous() && exp_avg_sq.is_contiguous(),
              "det_adamw takes contiguous tensors");
  const int64_t n = param.numel();
  TORCH_CHECK(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n, "det_adamw: sizes differ");
  float* __restrict__ p = param.data_ptr<float>();
  const float* __restrict__ g = grad.data_ptr<float>();
  float* __restrict__ m = exp_avg.data_ptr<float>();
  float* __restrict__ v = exp_avg_sq.data_ptr<float>();
  // the float32 values torch's ops take for these Python scalars
  const float c_decay = static_cast<float>(decay_factor), b1 = static_cast<float>(beta1),
              c1 = static_cast<float>(one_minus_beta1), b2 = static_cast<float>(beta2),
              c2 = static_cast<float>(one_minus_beta2), bc1 = static_cast<float>(bias_correction1),
              bc2 = static_cast<float>(bias_correction2), e = static_cast<float>(eps), l = static_cast<float>(lr);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(kBlock);
    auto denom = at::from_blob(buffer.data(), {kBlock}, at::kFloat);
    for (int64_t start = begin; start < end; start += kBlock) {
      const int64_t stop = std::min(end, start + kBlock);
      float* __restrict__ d = buffer.data();
      if (decay) {
        for (int64_t i = start; i < stop; ++i) p[i] = p[i] * c_decay;
      }
      for (int64_t i = start; i < stop; ++i) {
        const float t = g[i] * c1;
        m[i] = m[i] * b1 + t;  // two roundings: -ffp-contract=off keeps them apart
        float s = g[i] * g[i];
        s = s * c2;
        v[i] = v[i] * b2 + s;
        d[i - start] = v[i] / bc2;
      }
      // torch's own square root (MKL's on x86), so the bits equal the list-wide ops': it is
      // not the IEEE-rounded one, but it gives each element the same bits at any length
      auto part = denom.narrow(0, 0, stop - start);
      at::sqrt_(part);
      for (int64_t i = start; i < stop; ++i) {
        const float di = d[i - start] + e;
        float u = m[i] / bc1;
        u = u / di;
        u = u * l;
        p[i] = p[i] - u;
      }
    }
  });
}

// Over every element of every tensor of `tensors` (one call for a model's gradients: no
// result tensor and addition per gradient).
at::Tensor det_square_bins(const std::vector<at::Tensor>& tensors) {
  for (const auto& values : tensors)
    TORCH_CHECK(values.scalar_type() == at::kFloat && values.is_contiguous(),
                "det_square_bins takes contiguous float32 tensors");
  const int threads = at::get_num_threads();
  std::vector<int64_t> partial(static_cast<size_t>(threads) * 3 * 256, 0);
  for (const auto& values : tensors) {
    const int64_t n = values.numel();
    const float* x = values.data_ptr<float>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      int64_t* bins = partial.data() + static_cast<size_t>(at::get_thread_num()) * 3 * 256;
      for (int64_t i = begin; i < end; ++i) {
        uint32_t bits;
        std::memcpy(&bits, x + i, sizeof bits);
        const uint32_t field = (bits >> 23) & 0xFFu;
        uint32_t significand = bits & 0x7FFFFFu;
        if (field > 0) significand |= 0x800000u;
        const int64_t hi = significand >> 12, lo = significand & 0xFFFu;
        bins[field] += hi * hi;
        bins[256 + field] += hi * lo;
        bins[512 + field] += lo * lo;
      }
    });
  }
  auto out = at::zeros({3, 256}, at::kLong);
  int64_t* total = out.data_ptr<int64_t>();
  for (int t = 0; t < threads; ++t)
    for (int k = 0; k < 3 * 256; ++k) total[k] += partial[static_cast<size_t>(t) * 3 * 256 + k];
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("det_adamw", &det_adamw, "ElementwiseAdamW's update in one pass (in place)");
  m.def("det_square_bins", &det_square_bins,
        "exact_norm's (3, 256) integer square sums over a list of tensors in one pass each");
}
