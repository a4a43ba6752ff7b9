// The row tree's sums over fp32 rows, at memory speed (cpu_row_sums.h): the column sums a
// bias or affine weight gradient needs, an affine's three gradients in one pass, and the
// affine itself.
#include "cpu_row_sums.h"

#include "cpu_gemm_kernel.h"

using namespace credit_gemm;

// Rows per group and leaves per group of M rows in `groups` equal groups, each padded to whole
// leaves, checked against the merge schedule's leaf count.
std::pair<int64_t, int64_t> grouped_leaves(int64_t M, int64_t groups, const at::Tensor& merges,
                                           const char* op) {
  TORCH_CHECK(groups >= 1 && M % groups == 0, op, ": ", groups, " groups do not divide ", M, " rows");
  const int64_t rows = M / groups, per_group = (rows + kLeaf - 1) / kLeaf;
  TORCH_CHECK(merges.scalar_type() == at::kInt && merges.is_contiguous() &&
                  merges.numel() == groups * per_group && per_group > 0,
              op, ": merge schedule does not match the row count");
  return {rows, per_group};
}

// The tree over n scalar leaf sums by the merge schedule: the stack top is the left operand.
float leaf_tree(const float* leaves, int64_t n, const int32_t* sched, float* stack) {
  int64_t top = 0;
  float acc = 0.0f;
  for (int64_t leaf = 0; leaf < n; ++leaf) {
    acc = leaves[leaf];
    for (int32_t m = sched[leaf]; m > 0; --m) acc = stack[--top] + acc;
    if (leaf + 1 < n) stack[top++] = acc;
  }
  return acc;
}

namespace {

// det_affine_grads for rows narrower than a vector (N < VL): the same per-column arithmetic
// (each leaf's rows added to +0 in order, then the leaf tree), one scalar lane per column;
// the vector path would copy every row through its zero-padded edge buffers (3 ms for the
// 131072 rows of 4 channels a column attention normalises, against 0.3 here).
void narrow_affine_grads(const float* gd, const float* xd, const float* wd, int64_t N, int64_t rows,
                         int64_t per_group, int64_t nleaves, const int32_t* sched, int64_t depth,
                         float* gxd, float* gwd, float* gbd) {
  std::vector<float> stack(static_cast<size_t>(std::max<int64_t>(depth, 1) * 2 * N));
  std::vector<float> acc_w(static_cast<size_t>(N)), acc_b(static_cast<size_t>(N));
  int64_t top = 0;
  for (int64_t leaf = 0; leaf < nleaves; ++leaf) {
    std::fill(acc_w.begin(), acc_w.end(), 0.0f);
    std::fill(acc_b.begin(), acc_b.end(), 0.0f);
    const int64_t group = leaf / per_group, first = (leaf % per_group) * kLeaf;
    const int64_t last = std::min<int64_t>(first + kLeaf, rows);
    for (int64_t k = first; k < last; ++k) {
      const int64_t off = (group * rows + k) * N;
      const float *p = gd + off, *q = xd + off;
      float* o = gxd + off;
      for (int64_t c = 0; c < N; ++c) {
        const float product = p[c] * q[c];
        acc_w[c] = acc_w[c] + product;
        acc_b[c] = acc_b[c] + p[c];
        o[c] = p[c] * wd[c];
      }
    }
    for (int32_t m = sched[leaf]; m > 0; --m) {
      --top;
      const float* s = stack.data() + top * 2 * N;
      for (int64_t c = 0; c < N; ++c) {
        acc_w[c] = s[c] + acc_w[c];
        acc_b[c] = s[N + c] + acc_b[c];
      }
    }
    if (leaf + 1 < nleaves) {
      float* s = stack.data() + top * 2 * N;
      std::copy(acc_w.begin(), acc_w.end(), s);
      std::copy(acc_b.begin(), acc_b.end(), s + N);
      ++top;
    }
  }
  std::copy(acc_w.begin(), acc_w.end(), gwd);
  std::copy(acc_b.begin(), acc_b.end(), gbd);
}

}  // namespace

// Column sums of fp32 g (M x N, unit column stride) with the row tree: the
// arithmetic of ones(1, M') @ g' through det_mm, where g' holds g's rows as
// `groups` equal groups, each zero-padded to whole leaves (pad_row_groups in
// _ops.py): a leaf adds its rows to +0 in order (fma(1, x, s) rounds exactly
// like s + x), and its padding rows, +0 each, are skipped (they leave a sum that
// started from +0 as it is).  At memory speed instead of a 1-row GEMM, and
// without the padded copy: each row is read once, all its columns together.
// With `x` (g's shape), the rows summed are g * x, each product rounded once as
// torch's multiply rounds it (an affine weight's gradient, without its temporary).
void det_colsum(const at::Tensor& g, const c10::optional<at::Tensor>& x, int64_t groups,
                const at::Tensor& merges, int64_t depth, at::Tensor& out) {
  TORCH_CHECK(g.dim() == 2 && g.device().is_cpu() && g.scalar_type() == at::kFloat &&
                  (g.size(1) <= 1 || g.stride(1) == 1),
              "det_colsum cpu: g must be a 2-D fp32 CPU tensor with unit column stride");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kFloat && out.dim() == 1 &&
                  out.size(0) == g.size(1),
              "det_colsum cpu: bad output tensor");
  const int64_t M = g.size(0), N = g.size(1), sm = g.stride(0);
  if (x.has_value())
    TORCH_CHECK(x->sizes() == g.sizes() && x->scalar_type() == at::kFloat && x->device().is_cpu() &&
                    (N <= 1 || x->stride(1) == 1),
                "det_colsum cpu: x must be an fp32 CPU tensor of g's shape, unit column stride");
  const float* xd = x.has_value() ? x->data_ptr<float>() : nullptr;
  const int64_t xm = x.has_value() ? x->stride(0) : 0;
  // plain variables, not a structured binding: the lambdas below capture them (C++17)
  const std::pair<int64_t, int64_t> shape = grouped_leaves(M, groups, merges, "det_colsum cpu");
  const int64_t rows = shape.first, per_group = shape.second;
  const int64_t nleaves = groups * per_group;
  const float* gd = g.data_ptr<float>();
  const int32_t* sched = merges.data_ptr<int32_t>();
  float* od = out.data_ptr<float>();
  const int64_t chunks = (N + VL - 1) / VL;
  at::parallel_for(0, chunks, 8, [&](int64_t lo, int64_t hi) {
    const int64_t width = hi - lo;  // chunks of VL columns this thread sums
    std::vector<float> stack(static_cast<size_t>(std::max<int64_t>(depth, 1) * width * VL));
    std::vector<vec> acc(static_cast<size_t>(width));
    alignas(64) float edge[VL];
    const int64_t n_lo = lo * VL, tail = std::min<int64_t>(VL, N - (hi - 1) * VL);
    int64_t top = 0;
    for (int64_t leaf = 0; leaf < nleaves; ++leaf) {
      for (int64_t c = 0; c < width; ++c) acc[c] = vzero();
      const int64_t group = leaf / per_group, first = (leaf % per_group) * kLeaf;
      const int64_t last = std::min<int64_t>(first + kLeaf, rows);
      for (int64_t k = first; k < last; ++k) {
        const float* p = gd + (group * rows + k) * sm + n_lo;
        const float* px = xd == nullptr ? nullptr : xd + (group * rows + k) * xm + n_lo;
        for (int64_t c = 0; c + 1 < width; ++c) {
          const vec v = vload(p + c * VL);
          acc[c] = vadd(acc[c], px == nullptr ? v : vmul(v, vload(px + c * VL)));
        }
        const int64_t c = width - 1;  // the last chunk may be partial
        if (tail == VL) {
          const vec v = vload(p + c * VL);
          acc[c] = vadd(acc[c], px == nullptr ? v : vmul(v, vload(px + c * VL)));
        } else {
          for (int i = 0; i < VL; ++i)
            edge[i] = i >= tail ? 0.0f : px == nullptr ? p[c * VL + i] : p[c * VL + i] * px[c * VL + i];
          acc[c] = vadd(acc[c], vload(edge));
        }
      }
      for (int32_t m = sched[leaf]; m > 0; --m) {
        --top;
        for (int64_t c = 0; c < width; ++c)
          acc[c] = vadd(vload(stack.data() + (top * width + c) * VL), acc[c]);
      }
      if (leaf + 1 < nleaves) {
        for (int64_t c = 0; c < width; ++c) vstore(stack.data() + (top * width + c) * VL, acc[c]);
        ++top;
      }
    }
    for (int64_t c = 0; c < width; ++c) {
      vstore(edge, acc[c]);
      const int64_t n0 = (lo + c) * VL, cols = std::min<int64_t>(VL, N - n0);
      for (int i = 0; i < cols; ++i) od[n0 + i] = edge[i];
    }
  });
}

// Per-channel sums of fp32 NCHW g (B, C, P = H*W, contiguous) with the row tree of its
// channels-last rows: det_colsum(g.permute(0, 2, 3, 1).reshape(B*P, C), groups = B)'s bits
// (each sample's P positions in leaves of kLeaf, the padding skipped, the leaves of all
// samples in one tree), read in place instead of through a channels-last copy.  A channel's
// leaves of one sample are kLeaf apart, so their chains run interleaved: k outer, leaf
// inner, every chain still adding its positions in ascending order from +0.  With `x`
// (g's shape), the values summed are g * x, each product rounded once.
void det_channel_sums(const at::Tensor& g, const c10::optional<at::Tensor>& x,
                      const at::Tensor& merges, int64_t depth, at::Tensor& out) {
  TORCH_CHECK(g.dim() == 3 && g.is_contiguous() && g.device().is_cpu() &&
                  g.scalar_type() == at::kFloat,
              "det_channel_sums cpu: g must be a contiguous fp32 CPU tensor (B, C, P)");
  if (x.has_value())
    TORCH_CHECK(x->sizes() == g.sizes() && x->is_contiguous() && x->scalar_type() == at::kFloat &&
                    x->device().is_cpu(),
                "det_channel_sums cpu: x must be a contiguous fp32 CPU tensor of g's shape");
  const int64_t B = g.size(0), C = g.size(1), P = g.size(2);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kFloat && out.dim() == 1 &&
                  out.size(0) == C,
              "det_channel_sums cpu: bad output tensor");
  const int64_t per_sample = (P + kLeaf - 1) / kLeaf, nleaves = B * per_sample;
  TORCH_CHECK(merges.scalar_type() == at::kInt && merges.is_contiguous() &&
                  merges.numel() == nleaves && nleaves > 0,
              "det_channel_sums cpu: merge schedule does not match the leaf count");
  const float* gd = g.data_ptr<float>();
  const float* xd = x.has_value() ? x->data_ptr<float>() : nullptr;
  const int32_t* sched = merges.data_ptr<int32_t>();
  float* od = out.data_ptr<float>();
  at::parallel_for(0, C, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> leaves(static_cast<size_t>(nleaves));
    std::vector<float> stack(static_cast<size_t>(std::max<int64_t>(depth, 1)));
    for (int64_t c = lo; c < hi; ++c) {
      for (int64_t b = 0; b < B; ++b) {
        const float* p = gd + (b * C + c) * P;
        const float* q = xd == nullptr ? nullptr : xd + (b * C + c) * P;
        float* s = leaves.data() + b * per_sample;
        for (int64_t l = 0; l < per_sample; ++l) s[l] = 0.0f;
        for (int64_t k = 0; k < kLeaf; ++k) {
          const int64_t full = k < P % kLeaf || P % kLeaf == 0 ? per_sample : per_sample - 1;
          if (q == nullptr) {
            for (int64_t l = 0; l < full; ++l) s[l] = s[l] + p[l * kLeaf + k];
          } else {
            for (int64_t l = 0; l < full; ++l) s[l] = s[l] + p[l * kLeaf + k] * q[l * kLeaf + k];
          }
        }
      }
      od[c] = leaf_tree(leaves.data(), nleaves, sched, stack.data());
    }
  });
}


// An affine y = x * w + b over channels-last rows (g, x: M x N fp32, contiguous; w: N): in one
// pass over g, gx = g * w (one rounding, torch's multiply), and the row-tree sums of g * x and
// of g as det_colsum computes them (rows in `groups` padded to whole leaves, leaves from +0,
// the padding skipped), with the bits of those three separate passes.
void det_affine_grads(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w, int64_t groups,
                      const at::Tensor& merges, int64_t depth, at::Tensor& gx, at::Tensor& gw,
                      at::Tensor& gb) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&g, &x, &gx})
    TORCH_CHECK(t->dim() == 2 && t->is_contiguous() && t->scalar_type() == at::kFloat &&
                    t->device().is_cpu() && t->sizes() == g.sizes(),
                "det_affine_grads cpu: g, x and gx must be contiguous fp32 CPU tensors (M, N)");
  const int64_t M = g.size(0), N = g.size(1);
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&w, &gw, &gb})
    TORCH_CHECK(t->dim() == 1 && t->is_contiguous() && t->scalar_type() == at::kFloat &&
                    t->size(0) == N,
                "det_affine_grads cpu: w, gw and gb must be contiguous fp32 vectors of N values");
  // plain variables, not a structured binding: the lambdas below capture them (C++17)
  const std::pair<int64_t, int64_t> shape = grouped_leaves(M, groups, merges, "det_affine_grads cpu");
  const int64_t rows = shape.first, per_group = shape.second;
  const int64_t nleaves = groups * per_group;
  const float *gd = g.data_ptr<float>(), *xd = x.data_ptr<float>(), *wd = w.data_ptr<float>();
  float *gxd = gx.data_ptr<float>(), *gwd = gw.data_ptr<float>(), *gbd = gb.data_ptr<float>();
  const int32_t* sched = merges.data_ptr<int32_t>();
  if (N < VL) {  // narrow rows (a layer norm over a few channels): scalar lanes, no edge copies
    narrow_affine_grads(gd, xd, wd, N, rows, per_group, nleaves, sched, depth, gxd, gwd, gbd);
    return;
  }
  const int64_t chunks = (N + VL - 1) / VL;
  at::parallel_for(0, chunks, 8, [&](int64_t lo, int64_t hi) {
    const int64_t width = hi - lo, n_lo = lo * VL;
    const int64_t cols = std::min<int64_t>(N, hi * VL) - n_lo;  // this thread's columns
    // per column, two sums (of g * x, of g) as VL-wide lanes; a partial last chunk is
    // padded with zero lanes through `edge` buffers
    std::vector<float> stack(static_cast<size_t>(std::max<int64_t>(depth, 1) * 2 * width * VL));
    std::vector<vec> acc_w(static_cast<size_t>(width)), acc_b(static_cast<size_t>(width));
    alignas(64) float eg[VL], ex[VL], ew[VL];
    std::vector<vec> wv(static_cast<size_t>(width));
    for (int64_t c = 0; c < width; ++c) {
      for (int i = 0; i < VL; ++i) ew[i] = c * VL + i < cols ? wd[n_lo + c * VL + i] : 0.0f;
      wv[c] = vload(ew);
    }
    const int64_t full = cols / VL;  // whole VL chunks; then a partial one if cols % VL
    int64_t top = 0;
    for (int64_t leaf = 0; leaf < nleaves; ++leaf) {
      for (int64_t c = 0; c < width; ++c) acc_w[c] = acc_b[c] = vzero();
      const int64_t group = leaf / per_group, first = (leaf % per_group) * kLeaf;
      const int64_t last = std::min<int64_t>(first + kLeaf, rows);
      for (int64_t k = first; k < last; ++k) {
        const int64_t off = (group * rows + k) * N + n_lo;
        const float *p = gd + off, *q = xd + off;
        float* o = gxd + off;
        for (int64_t c = 0; c < full; ++c) {
          const vec gv = vload(p + c * VL), xv = vload(q + c * VL);
          acc_w[c] = vadd(acc_w[c], vmul(gv, xv));
          acc_b[c] = vadd(acc_b[c], gv);
          vstore(o + c * VL, vmul(gv, wv[c]));
        }
        if (full < width) {
          const int64_t c = full, tail = cols - full * VL;
          for (int i = 0; i < VL; ++i) {
            eg[i] = i < tail ? p[c * VL + i] : 0.0f;
            ex[i] = i < tail ? q[c * VL + i] : 0.0f;
          }
          const vec gv = vload(eg), xv = vload(ex);
          acc_w[c] = vadd(acc_w[c], vmul(gv, xv));
          acc_b[c] = vadd(acc_b[c], gv);
          vstore(eg, vmul(gv, wv[c]));
          for (int i = 0; i < tail; ++i) o[c * VL + i] = eg[i];
        }
      }
      for (int32_t m = sched[leaf]; m > 0; --m) {
        --top;
        const float* s = stack.data() + top * 2 * width * VL;
        for (int64_t c = 0; c < width; ++c) {
          acc_w[c] = vadd(vload(s + c * VL), acc_w[c]);
          acc_b[c] = vadd(vload(s + (width + c) * VL), acc_b[c]);
        }
      }
      if (leaf + 1 < nleaves) {
        float* s = stack.data() + top * 2 * width * VL;
        for (int64_t c = 0; c < width; ++c) {
          vstore(s + c * VL, acc_w[c]);
          vstore(s + (width + c) * VL, acc_b[c]);
        }
        ++top;
      }
    }
    for (int64_t c = 0; c < width; ++c) {
      const int64_t n0 = n_lo + c * VL, n = std::min<int64_t>(VL, N - n0);
      vstore(eg, acc_w[c]);
      vstore(ex, acc_b[c]);
      for (int i = 0; i < n; ++i) {
        gwd[n0 + i] = eg[i];
        gbd[n0 + i] = ex[i];
      }
    }
  });
}

// y = x * w + b over channels-last rows (x, y: M x N fp32, contiguous; w, b: N): the
// product rounded, then the sum rounded, as torch's `x * w + b` rounds them, in one pass
// (torch broadcasts a short last dimension slowly: 1.1 ms for 8192 x 32 here, 0.05 in one loop).
void det_affine(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor& y) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&x, &y})
    TORCH_CHECK(t->dim() == 2 && t->is_contiguous() && t->scalar_type() == at::kFloat &&
                    t->device().is_cpu() && t->sizes() == x.sizes(),
                "det_affine cpu: x and y must be contiguous fp32 CPU tensors (M, N)");
  const int64_t M = x.size(0), N = x.size(1);
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&w, &b})
    TORCH_CHECK(t->dim() == 1 && t->is_contiguous() && t->scalar_type() == at::kFloat &&
                    t->size(0) == N,
                "det_affine cpu: w and b must be contiguous fp32 vectors of N values");
  const float *xd = x.data_ptr<float>(), *wd = w.data_ptr<float>(), *bd = b.data_ptr<float>();
  float* yd = y.data_ptr<float>();
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float* p = xd + i * N;
      float* o = yd + i * N;
      for (int64_t j = 0; j < N; ++j) {
        const float t = p[j] * wd[j];
        o[j] = t + bd[j];
      }
    }
  });
}
