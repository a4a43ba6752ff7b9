// Layer norm over the last dimension of fp32 rows (M x D, contiguous), each row in one fixed
// order, so a row's bits depend on its D values alone (batch-invariant, thread-invariant).
// Hand-written because torch's CPU layer norm spends ~40 ns a row on its per-row setup: 5 ms
// for the 131072 rows of 4 channels that the column attention normalises in the default
// experiment, where one pass over them takes a tenth of that.
//
// A row's sums run left to right over its D values. Rows go kRows at a time, transposed into
// a [D][kRows] block so that each step of a sum is one vector operation over kRows rows
// (plain loops over the block's rows, which the compiler vectorises but may not reorder:
// -ffp-contract=off, no -ffast-math), so the AVX-512, AVX2 and scalar builds agree.
#include "cpu_layer_norm.h"

#include <cmath>
#include <vector>

namespace {

constexpr int kRows = 16;

// rows [r0, r0 + n) of src (M x D) into block[j * kRows + l]; rows past n are zero
inline void gather_block(const float* src, int64_t r0, int n, int64_t D, float* block) {
  for (int l = 0; l < kRows; ++l) {
    const float* p = src + (r0 + l) * D;
    if (l < n)
      for (int64_t j = 0; j < D; ++j) block[j * kRows + l] = p[j];
    else
      for (int64_t j = 0; j < D; ++j) block[j * kRows + l] = 0.0f;
  }
}

inline void scatter_block(const float* block, int64_t r0, int n, int64_t D, float* dst) {
  for (int l = 0; l < n; ++l) {
    float* p = dst + (r0 + l) * D;
    for (int64_t j = 0; j < D; ++j) p[j] = block[j * kRows + l];
  }
}

void check_rows(const at::Tensor& t, const at::Tensor& like, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.scalar_type() == at::kFloat &&
                  t.device().is_cpu() && t.sizes() == like.sizes(),
              "det_layer_norm cpu: ", what, " must be a contiguous fp32 CPU tensor (M, D)");
}

void check_vector(const at::Tensor& t, int64_t n, const char* what) {
  TORCH_CHECK(t.dim() == 1 && t.is_contiguous() && t.scalar_type() == at::kFloat && t.size(0) == n,
              "det_layer_norm cpu: ", what, " must be a contiguous fp32 vector of ", n, " values");
}

// blocks of kRows rows per parallel_for grain: ~16K values
int64_t grain(int64_t D) { return std::max<int64_t>(1, 16384 / (kRows * std::max<int64_t>(D, 1))); }

}  // namespace

// Per row: mean = sum(x) / D, var = sum((x - mean)^2) / D, rstd = 1 / sqrt(var + eps),
// normed = (x - mean) * rstd, y = normed * w + b (the product rounded, then the sum, as
// `det_affine`). `normed` and `rstd` are what the backward reads.
void det_layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                    at::Tensor& y, at::Tensor& normed, at::Tensor& rstd) {
  check_rows(x, x, "x");
  check_rows(y, x, "y");
  check_rows(normed, x, "normed");
  const int64_t M = x.size(0), D = x.size(1);
  check_vector(w, D, "w");
  check_vector(b, D, "b");
  check_vector(rstd, M, "rstd");
  TORCH_CHECK(D > 0, "det_layer_norm cpu: rows must have at least one value");
  const float *xd = x.data_ptr<float>(), *wd = w.data_ptr<float>(), *bd = b.data_ptr<float>();
  float *yd = y.data_ptr<float>(), *nd = normed.data_ptr<float>(), *rd = rstd.data_ptr<float>();
  const float n = static_cast<float>(D), e = static_cast<float>(eps);
  const int64_t blocks = (M + kRows - 1) / kRows;
  at::parallel_for(0, blocks, grain(D), [&](int64_t lo, int64_t hi) {
    std::vector<float> xb(static_cast<size_t>(D * kRows)), hb(xb.size()), yb(xb.size());
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t r0 = blk * kRows;
      const int rows = static_cast<int>(std::min<int64_t>(kRows, M - r0));
      gather_block(xd, r0, rows, D, xb.data());
      float mean[kRows], var[kRows], r[kRows];
      for (int l = 0; l < kRows; ++l) mean[l] = 0.0f;
      for (int64_t j = 0; j < D; ++j)
        for (int l = 0; l < kRows; ++l) mean[l] = mean[l] + xb[j * kRows + l];
      for (int l = 0; l < kRows; ++l) {
        mean[l] = mean[l] / n;
        var[l] = 0.0f;
      }
      for (int64_t j = 0; j < D; ++j)
        for (int l = 0; l < kRows; ++l) {
          const float d = xb[j * kRows + l] - mean[l];
          var[l] = var[l] + d * d;
        }
      for (int l = 0; l < kRows; ++l) r[l] = 1.0f / std::sqrt(var[l] / n + e);
      for (int64_t j = 0; j < D; ++j)
        for (int l = 0; l < kRows; ++l) {
          const float h = (xb[j * kRows + l] - mean[l]) * r[l];
          const float t = h * wd[j];
          hb[j * kRows + l] = h;
          yb[j * kRows + l] = t + bd[j];
        }
      scatter_block(hb.data(), r0, rows, D, nd);
      scatter_block(yb.data(), r0, rows, D, yd);
      for (int l = 0; l < rows; ++l) rd[r0 + l] = r[l];
    }
  });
}

// The input gradient from the normed values' gradient gn (g * w), in place:
// dx = rstd * ((gn - sum(gn) / D) - normed * (sum(gn * normed) / D)).
void det_layer_norm_input_grad(at::Tensor& g_normed, const at::Tensor& normed,
                               const at::Tensor& rstd) {
  check_rows(g_normed, g_normed, "g_normed");
  check_rows(normed, g_normed, "normed");
  const int64_t M = g_normed.size(0), D = g_normed.size(1);
  check_vector(rstd, M, "rstd");
  float* gd = g_normed.data_ptr<float>();
  const float *nd = normed.data_ptr<float>(), *rd = rstd.data_ptr<float>();
  const float n = static_cast<float>(D);
  const int64_t blocks = (M + kRows - 1) / kRows;
  at::parallel_for(0, blocks, grain(D), [&](int64_t lo, int64_t hi) {
    std::vector<float> gb(static_cast<size_t>(D * kRows)), hb(gb.size());
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t r0 = blk * kRows;
      const int rows = static_cast<int>(std::min<int64_t>(kRows, M - r0));
      gather_block(gd, r0, rows, D, gb.data());
      gather_block(nd, r0, rows, D, hb.data());
      float mean_g[kRows], mean_gh[kRows], r[kRows];
      for (int l = 0; l < kRows; ++l) {
        mean_g[l] = 0.0f;
        mean_gh[l] = 0.0f;
        r[l] = l < rows ? rd[r0 + l] : 0.0f;
      }
      for (int64_t j = 0; j < D; ++j)
        for (int l = 0; l < kRows; ++l) {
          const float g = gb[j * kRows + l], product = g * hb[j * kRows + l];
          mean_g[l] = mean_g[l] + g;
          mean_gh[l] = mean_gh[l] + product;
        }
      for (int l = 0; l < kRows; ++l) {
        mean_g[l] = mean_g[l] / n;
        mean_gh[l] = mean_gh[l] / n;
      }
      for (int64_t j = 0; j < D; ++j)
        for (int l = 0; l < kRows; ++l) {
          const float centred = gb[j * kRows + l] - mean_g[l], along = hb[j * kRows + l] * mean_gh[l];
          gb[j * kRows + l] = r[l] * (centred - along);
        }
      scatter_block(gb.data(), r0, rows, D, gd);
    }
  });
}
