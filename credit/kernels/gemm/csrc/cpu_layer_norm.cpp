// Layer norm over the last dimension of fp32 rows (M x D, contiguous), each row in one fixed
// order, so a row's bits depend on its D values alone (batch-invariant, thread-invariant).
// Hand-written because torch's CPU layer norm spends ~40 ns a row on its per-row setup: 5 ms
// for the 131072 rows of 4 channels that the column attention normalises in the default
// experiment, where one pass over them takes a tenth of that; and because a deterministic
// layer norm with torch's normalisation pays for two more passes (the affine and its
// gradients) and two more autograd nodes a call, where the wide-row kernels below take one
// pass each way.
//
// Narrow rows (det_layer_norm): a row's sums run left to right over its D values. Rows go kRows at a time, transposed into
// a [D][kRows] block so that each step of a sum is one vector operation over kRows rows
// (plain loops over the block's rows, which the compiler vectorises but may not reorder:
// -ffp-contract=off, no -ffast-math), so the AVX-512, AVX2 and scalar builds agree.
#include "cpu_layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_gemm_kernel.h"
#include "cpu_lanes.h"
#include "cpu_row_sums.h"

using credit_gemm::kLeaf;
using namespace credit_lanes;

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

// ---- Wide rows (more than a few values): one row at a time, along the row -----------------
// A row's sums in the lane order of cpu_lanes.h. One pass forward; backward, the input gradient and the affine gradients' leaf sums in one pass, the
// normed values recomputed from x, mean and rstd (as torch's backward does) rather than kept.
namespace {

inline void row_affine(const float* __restrict__ d, float r, const float* __restrict__ w,
                       const float* __restrict__ b, int64_t D, float* __restrict__ y) {
  for (int64_t j = 0; j < D; ++j) {
    const float h = d[j] * r, t = h * w[j];
    y[j] = t + b[j];
  }
}

// One row of the backward: h = (x - mean) * rstd and gn = g * w into h, gn; g * h and g added
// to the leaf's sums sw, sb; the lane sums of gn and of gn * h into pg, pgh (row_sum's
// order). One loop, restrict pointers and whole 16-lane blocks so that it
// vectorises; the tail block takes the same steps lane by lane.
inline void row_backward_sums(const float* __restrict__ g, const float* __restrict__ x,
                              const float* __restrict__ w, float mean, float r, int64_t D,
                              float* __restrict__ h, float* __restrict__ gn, float* __restrict__ sw,
                              float* __restrict__ sb, float* __restrict__ pg, float* __restrict__ pgh) {
  for (int l = 0; l < kLanes; ++l) pg[l] = pgh[l] = 0.0f;
  int64_t j = 0;
  for (; j + kLanes <= D; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float d = x[j + l] - mean, hv = d * r, gv = g[j + l];
      const float gw = gv * w[j + l], t = gv * hv, u = gw * hv;
      sw[j + l] = sw[j + l] + t;
      sb[j + l] = sb[j + l] + gv;
      pg[l] = pg[l] + gw;
      pgh[l] = pgh[l] + u;
      h[j + l] = hv;
      gn[j + l] = gw;
    }
  for (int l = 0; j + l < D; ++l) {
    const float d = x[j + l] - mean, hv = d * r, gv = g[j + l];
    const float gw = gv * w[j + l], t = gv * hv, u = gw * hv;
    sw[j + l] = sw[j + l] + t;
    sb[j + l] = sb[j + l] + gv;
    pg[l] = pg[l] + gw;
    pgh[l] = pgh[l] + u;
    h[j + l] = hv;
    gn[j + l] = gw;
  }
}

}  // namespace

// Per row: mean = sum(x) / D, var = sum((x - mean)^2) / D (lane order), rstd = 1 / sqrt(var +
// eps), y = ((x - mean) * rstd) * w + b (each operation rounded).  mean and rstd are what the
// backward reads, with x.
void det_layer_norm_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                         at::Tensor& y, at::Tensor& mean, at::Tensor& rstd) {
  check_rows(x, x, "x");
  check_rows(y, x, "y");
  const int64_t M = x.size(0), D = x.size(1);
  check_vector(w, D, "w");
  check_vector(b, D, "b");
  check_vector(mean, M, "mean");
  check_vector(rstd, M, "rstd");
  TORCH_CHECK(D > 0, "det_layer_norm cpu: rows must have at least one value");
  const float *xd = x.data_ptr<float>(), *wd = w.data_ptr<float>(), *bd = b.data_ptr<float>();
  float *yd = y.data_ptr<float>(), *md = mean.data_ptr<float>(), *rd = rstd.data_ptr<float>();
  const float n = static_cast<float>(D), e = static_cast<float>(eps);
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / D), [&](int64_t lo, int64_t hi) {
    std::vector<float> d(static_cast<size_t>(D));
    for (int64_t i = lo; i < hi; ++i) {
      const float* p = xd + i * D;
      const float mu = row_sum(p, D) / n;
      const float r = 1.0f / std::sqrt(row_centred_squares(p, mu, D, d.data()) / n + e);
      row_affine(d.data(), r, wd, bd, D, yd + i * D);
      md[i] = mu;
      rd[i] = r;
    }
  });
}

// The backward of det_layer_norm_rows: per row, h = (x - mean) * rstd, gn = g * w,
// dx = rstd * ((gn - sum(gn) / D) - h * (sum(gn * h) / D)); and the affine gradients
// gw = sum over rows of g * h, gb = sum of g by the row tree (rows in `groups` padded to whole
// leaves, each leaf's rows added to +0 in order, the leaves merged by `merges`): det_affine_grads'
// bits for g and h.  Leaves run in parallel, each into its own slot; the tree merges the slots.
void det_layer_norm_rows_grads(const at::Tensor& g, const at::Tensor& x, const at::Tensor& mean,
                               const at::Tensor& rstd, const at::Tensor& w, int64_t groups,
                               const at::Tensor& merges, int64_t depth, at::Tensor& gx,
                               at::Tensor& gw, at::Tensor& gb) {
  check_rows(g, g, "g");
  check_rows(x, g, "x");
  check_rows(gx, g, "gx");
  const int64_t M = g.size(0), D = g.size(1);
  check_vector(mean, M, "mean");
  check_vector(rstd, M, "rstd");
  check_vector(w, D, "w");
  check_vector(gw, D, "gw");
  check_vector(gb, D, "gb");
  const std::pair<int64_t, int64_t> shape = grouped_leaves(M, groups, merges, "det_layer_norm cpu");
  const int64_t rows = shape.first, per_group = shape.second, nleaves = groups * per_group;
  const float *gd = g.data_ptr<float>(), *xd = x.data_ptr<float>(), *wd = w.data_ptr<float>();
  const float *md = mean.data_ptr<float>(), *rd = rstd.data_ptr<float>();
  float *gxd = gx.data_ptr<float>(), *gwd = gw.data_ptr<float>(), *gbd = gb.data_ptr<float>();
  const int32_t* sched = merges.data_ptr<int32_t>();
  const float n = static_cast<float>(D);
  std::vector<float> slots(static_cast<size_t>(nleaves * 2 * D));  // per leaf: sums of g * h, of g
  at::parallel_for(0, nleaves, std::max<int64_t>(1, 16384 / (kLeaf * D)), [&](int64_t lo, int64_t hi) {
    std::vector<float> h(static_cast<size_t>(D)), gn(static_cast<size_t>(D));
    for (int64_t leaf = lo; leaf < hi; ++leaf) {
      float* sw = slots.data() + leaf * 2 * D;
      float* sb = sw + D;
      for (int64_t j = 0; j < D; ++j) sw[j] = sb[j] = 0.0f;
      const int64_t group = leaf / per_group, first = (leaf % per_group) * kLeaf;
      const int64_t last = std::min<int64_t>(first + kLeaf, rows);
      for (int64_t k = first; k < last; ++k) {
        const int64_t i = group * rows + k;
        alignas(64) float pg[kLanes], pgh[kLanes];
        row_backward_sums(gd + i * D, xd + i * D, wd, md[i], rd[i], D, h.data(), gn.data(), sw, sb, pg, pgh);
        const float mean_g = lane_tree(pg) / n, mean_gh = lane_tree(pgh) / n;
        normed_input_grad(h.data(), gn.data(), rd[i], mean_g, mean_gh, D, gxd + i * D);
      }
    }
  });
  // the leaf tree, all columns together: the stack top is the left operand
  std::vector<float> stack(static_cast<size_t>(std::max<int64_t>(depth, 1) * 2 * D));
  std::vector<float> acc(static_cast<size_t>(2 * D));
  int64_t top = 0;
  for (int64_t leaf = 0; leaf < nleaves; ++leaf) {
    std::copy(slots.begin() + leaf * 2 * D, slots.begin() + (leaf + 1) * 2 * D, acc.begin());
    for (int32_t m = sched[leaf]; m > 0; --m) {
      const float* s = stack.data() + --top * 2 * D;
      for (int64_t j = 0; j < 2 * D; ++j) acc[j] = s[j] + acc[j];
    }
    if (leaf + 1 < nleaves) std::copy(acc.begin(), acc.end(), stack.begin() + top++ * 2 * D);
  }
  std::copy(acc.begin(), acc.begin() + D, gwd);
  std::copy(acc.begin() + D, acc.end(), gbd);
}
