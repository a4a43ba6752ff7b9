// Python bindings of the CPU GEMM engine (cpu_gemm_kernel.h): det_mm for
// strided matrices, det_mm_gather for offset-table operands (padded row trees,
// implicit im2col), det_fold; and of the row tree's sums (cpu_row_sums.h).
// torch/csrc/utils/pybind.h: pybind11 with torch's tensor casters, the one thing the bindings
// need; torch/extension.h (the whole C++ frontend) takes three times as long to compile.
#include <torch/csrc/utils/pybind.h>

#include "cpu_gemm_kernel.h"
#include "cpu_group_norm.h"
#include "cpu_layer_norm.h"
#include "cpu_row_sums.h"

using namespace credit_gemm;

namespace {

std::vector<int64_t> strided(int64_t n, int64_t stride) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = i * stride;
  return t;
}

template <typename T>
void dispatch_out(const Gather<T>& a, const Gather<T>& b, at::Tensor& out, const int64_t* orow,
                  const int64_t* ocol, int64_t M, int64_t K, int64_t N, const at::Tensor& merges,
                  int64_t depth, const float* bias = nullptr, const float* row_bias = nullptr) {
  const int32_t* sched = merges.data_ptr<int32_t>();
  switch (out.scalar_type()) {
    case at::kFloat:
      return gemm<T, float>(a, b, {out.data_ptr<float>(), orow, ocol, bias, row_bias}, M, K, N,
                            sched, depth);
    case at::kBFloat16:
      return gemm<T, at::BFloat16>(a, b, {out.data_ptr<at::BFloat16>(), orow, ocol, bias, row_bias},
                                   M, K, N, sched, depth);
    case at::kHalf:
      return gemm<T, at::Half>(a, b, {out.data_ptr<at::Half>(), orow, ocol, bias, row_bias}, M, K,
                               N, sched, depth);
    default: TORCH_CHECK(false, "det_mm cpu: unsupported output dtype ", out.scalar_type());
  }
}

// Share of a tile's lanes that an m x n output fills, on the tile the engine picks for it.
double tile_fill(int64_t m, int64_t n) {
  const int64_t mr = narrow_fills_better(n) ? kNarrowMR : MR;
  const int64_t nr = narrow_fills_better(n) ? kNarrowNR : NR;
  const double rows = static_cast<double>(m) / (((m + mr - 1) / mr) * mr);
  const double cols = static_cast<double>(n) / (((n + nr - 1) / nr) * nr);
  return rows * cols;
}

// Whether (B^T A^T)'s tiles are filled enough better to pay its strided stores (measured on
// the models' N = 32 projections and weight gradients on an AVX-512 Zen 4, NR = 64:
// 1.4-2.3x faster).
bool transposed_fills_better(int64_t M, int64_t N) {
  return M >= NR && tile_fill(N, M) > 1.5 * tile_fill(M, N);
}

void check_schedule(const at::Tensor& merges, int64_t K, const char* op) {
  const int64_t nleaves = (K + kLeaf - 1) / kLeaf;
  TORCH_CHECK(merges.scalar_type() == at::kInt && merges.is_contiguous() &&
                  merges.numel() == nleaves && nleaves > 0,
              op, ": merge schedule does not match K");
}

// The K tables of a reduction over `groups` equal groups of `rows` consecutive indices each
// padded to whole leaves (pad_row_groups in _ops.py, without the padded copy): index k of the
// padded K reads index g * rows + i (stride apart), or zero (-1) past a group's rows.  The
// engine's FMA chains stop at a leaf's last real k, so the padding costs neither FMAs nor
// packing of A, and the bits are those of the zero-padded operands.
std::vector<int64_t> grouped(int64_t groups, int64_t rows, int64_t stride) {
  const int64_t padded = (rows + kLeaf - 1) / kLeaf * kLeaf;
  std::vector<int64_t> t(static_cast<size_t>(groups * padded), -1);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < rows; ++i) t[g * padded + i] = (g * rows + i) * stride;
  return t;
}

// Fills `out` (M x N, contiguous) with A @ B (+ bias, fp32, added to the fp32
// sums before the one rounding).  With k_groups > 1, K is reduced as k_groups equal groups,
// each padded to whole leaves (a weight gradient over samples' rows).  Shapes, dtypes and
// devices are validated in Python; the checks here guard the raw pointer arithmetic.
void det_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& merges, int64_t depth,
            at::Tensor& out, const c10::optional<at::Tensor>& bias, int64_t k_groups) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
              "det_mm cpu: bad shapes ", a.sizes(), " @ ", b.sizes());
  TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu() && out.device().is_cpu(),
              "det_mm cpu: tensors must be on the CPU");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "det_mm cpu: dtype mismatch");
  TORCH_CHECK(out.is_contiguous() && out.size(0) == a.size(0) && out.size(1) == b.size(1),
              "det_mm cpu: bad output tensor");
  const int64_t M = a.size(0), N = b.size(1);
  TORCH_CHECK(k_groups >= 1 && a.size(1) % k_groups == 0, "det_mm cpu: ", k_groups,
              " groups do not divide K = ", a.size(1));
  const int64_t rows = a.size(1) / k_groups;
  const bool pad = k_groups > 1 && rows % kLeaf != 0;
  const auto acol = pad ? grouped(k_groups, rows, a.stride(1)) : strided(a.size(1), a.stride(1));
  const auto brow = pad ? grouped(k_groups, rows, b.stride(0)) : strided(a.size(1), b.stride(0));
  const int64_t K = static_cast<int64_t>(acol.size());
  check_schedule(merges, K, "det_mm cpu");
  const auto arow = strided(M, a.stride(0)), bcol = strided(N, b.stride(1));
  const auto orow = strided(M, N), ocol = strided(N, 1);
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->dim() == 1 &&
                    bias->size(0) == N && bias->device().is_cpu(),
                "det_mm cpu: bias must be a contiguous fp32 CPU vector of N values");
  const float* bias_ptr = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  // A narrow N fills few of a tile's NR columns; C^T = B^T A^T has the same products and
  // the same K tree per element (a * b == b * a exactly), so the same bits, on tiles the
  // wide M fills.  A bias is then added to the finished fp32 sums after the GEMM: the one
  // addition the kernel would make before its fp32 store.
  const bool swap = transposed_fills_better(M, N) && (bias_ptr == nullptr || out.scalar_type() == at::kFloat);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (swap) {
      const Gather<T> ga{b.data_ptr<T>(), bcol.data(), brow.data()};
      const Gather<T> gb{a.data_ptr<T>(), acol.data(), arow.data()};
      const auto trow = strided(N, 1), tcol = strided(M, N);
      dispatch_out<T>(ga, gb, out, trow.data(), tcol.data(), N, K, M, merges, depth, nullptr);
      if (bias_ptr != nullptr) {
        float* o = out.data_ptr<float>();
        at::parallel_for(0, M, 64, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i)
            for (int64_t j = 0; j < N; ++j) o[i * N + j] += bias_ptr[j];
        });
      }
      return;
    }
    const Gather<T> ga{a.data_ptr<T>(), arow.data(), acol.data()};
    const Gather<T> gb{b.data_ptr<T>(), brow.data(), bcol.data()};
    dispatch_out<T>(ga, gb, out, orow.data(), ocol.data(), M, K, N, merges, depth, bias_ptr);
  };
  switch (a.scalar_type()) {
    case at::kFloat: return run(float{});
    case at::kBFloat16: return run(at::BFloat16{});
    case at::kHalf: return run(at::Half{});
    default: TORCH_CHECK(false, "det_mm cpu: unsupported input dtype ", a.scalar_type());
  }
}

// The largest offset a table pair can address, checked against the base's size.
void check_tables(const at::Tensor& base, const at::Tensor& row, const at::Tensor& col,
                  bool allow_negative, const char* what) {
  TORCH_CHECK(base.device().is_cpu() && base.is_contiguous(), "det_mm_gather cpu: ", what,
              " base must be a contiguous CPU tensor");
  for (const at::Tensor* t : {&row, &col})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->dim() == 1 &&
                    t->is_contiguous(),
                "det_mm_gather cpu: ", what, " tables must be 1-D contiguous int64 CPU tensors");
  if (row.numel() == 0 || col.numel() == 0) return;
  // raw loops: the tables are small, and an ATen reduction per table costs more per call
  auto range = [](const at::Tensor& t) {
    const int64_t* d = t.data_ptr<int64_t>();
    const auto [lo, hi] = std::minmax_element(d, d + t.numel());
    return std::pair<int64_t, int64_t>{*lo, *hi};
  };
  const auto [rmin, rmax] = range(row);
  const auto [cmin, cmax] = range(col);
  TORCH_CHECK(allow_negative ? (rmin >= -1 && cmin >= -1) : (rmin >= 0 && cmin >= 0),
              "det_mm_gather cpu: ", what, " table entry out of range");
  TORCH_CHECK(rmax + cmax < base.numel(),
              "det_mm_gather cpu: ", what, " tables address past the end of its base");
}

// out_base[orow[i] + ocol[j]] = sum_k a_base[arow[i] + acol[k]] * b_base[brow[k] + bcol[j]]
// with the fixed K tree; a -1 entry in acol, brow or bcol reads as zero.  `bias` (fp32, one
// value per output row when bias_on_rows, else per column) is added to the fp32 sums before
// the one rounding to out's dtype.
void det_mm_gather(const at::Tensor& a, const at::Tensor& arow, const at::Tensor& acol,
                   const at::Tensor& b, const at::Tensor& brow, const at::Tensor& bcol,
                   at::Tensor& out, const at::Tensor& orow, const at::Tensor& ocol,
                   const at::Tensor& merges, int64_t depth, const c10::optional<at::Tensor>& bias,
                   bool bias_on_rows) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "det_mm_gather cpu: dtype mismatch");
  TORCH_CHECK(acol.numel() == brow.numel() && arow.numel() == orow.numel() &&
                  bcol.numel() == ocol.numel(),
              "det_mm_gather cpu: table lengths do not form (M, K) @ (K, N) -> (M, N)");
  check_tables(a, arow, acol, true, "a");
  TORCH_CHECK(arow.numel() == 0 || *std::min_element(arow.data_ptr<int64_t>(),
                                                      arow.data_ptr<int64_t>() + arow.numel()) >= 0,
              "det_mm_gather cpu: a's row table must be non-negative");
  check_tables(b, brow, bcol, true, "b");
  check_tables(out, orow, ocol, false, "out");
  const int64_t M = arow.numel(), K = acol.numel(), N = bcol.numel();
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->dim() == 1 &&
                    bias->size(0) == (bias_on_rows ? M : N) && bias->device().is_cpu(),
                "det_mm_gather cpu: bias must be a contiguous fp32 CPU vector of one value per ",
                bias_on_rows ? "row" : "column");
  const float* bias_ptr = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  if (M == 0 || N == 0) return;
  check_schedule(merges, K, "det_mm_gather cpu");
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const Gather<T> ga{a.data_ptr<T>(), arow.data_ptr<int64_t>(), acol.data_ptr<int64_t>()};
    const Gather<T> gb{b.data_ptr<T>(), brow.data_ptr<int64_t>(), bcol.data_ptr<int64_t>()};
    dispatch_out<T>(ga, gb, out, orow.data_ptr<int64_t>(), ocol.data_ptr<int64_t>(), M, K, N,
                    merges, depth, bias_on_rows ? nullptr : bias_ptr, bias_on_rows ? bias_ptr : nullptr);
  };
  switch (a.scalar_type()) {
    case at::kFloat: return run(float{});
    case at::kBFloat16: return run(at::BFloat16{});
    case at::kHalf: return run(at::Half{});
    default: TORCH_CHECK(false, "det_mm_gather cpu: unsupported input dtype ", a.scalar_type());
  }
}

// fold (col2im) of fp32 columns (B, C*kh*kw, Ho*Wo) into zeroed images (B, C, H, W),
// adding each pixel's patch contributions in torch's col2im order ((c, i, j)
// ascending, from +0), so the bits are F.fold's; the loops are arranged so the
// inner one runs over a contiguous range of output columns (vectorisable).
void det_fold(const at::Tensor& cols, at::Tensor& out, int64_t kh, int64_t kw, int64_t ph,
              int64_t pw, int64_t sh, int64_t sw, int64_t dh, int64_t dw) {
  TORCH_CHECK(cols.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat &&
                  cols.is_contiguous() && out.is_contiguous() && cols.dim() == 3 &&
                  out.dim() == 4 && cols.device().is_cpu() && out.device().is_cpu(),
              "det_fold cpu: contiguous fp32 CPU tensors (B, CKK, L) and (B, C, H, W) expected");
  const int64_t B = out.size(0), C = out.size(1), H = out.size(2), W = out.size(3);
  const int64_t ho = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1;
  const int64_t wo = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  TORCH_CHECK(cols.size(0) == B && cols.size(1) == C * kh * kw && cols.size(2) == ho * wo,
              "det_fold cpu: columns do not match the image and kernel geometry");
  const float* src = cols.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, B * C, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t bc = lo; bc < hi; ++bc) {
      float* img = dst + bc * H * W;
      std::fill_n(img, H * W, 0.0f);
      for (int64_t i = 0; i < kh; ++i)
        for (int64_t j = 0; j < kw; ++j) {
          const float* col = src + (bc * kh * kw + i * kw + j) * ho * wo;
          const int64_t x0 = j * dw - pw;  // image column of output column 0
          // output columns whose image column x0 + w * sw lies in [0, W)
          const int64_t w_lo = x0 >= 0 ? 0 : (-x0 + sw - 1) / sw;
          const int64_t w_hi = std::min<int64_t>(wo, x0 >= W ? 0 : (W - 1 - x0) / sw + 1);
          for (int64_t h = 0; h < ho; ++h) {
            const int64_t y = h * sh - ph + i * dh;
            if (y < 0 || y >= H) continue;
            float* row = img + y * W;
            const float* c = col + h * wo;
            if (sw == 1) {
              for (int64_t w = w_lo; w < w_hi; ++w) row[x0 + w] += c[w];
            } else {
              for (int64_t w = w_lo; w < w_hi; ++w) row[x0 + w * sw] += c[w];
            }
          }
        }
    }
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("det_mm", &det_mm, "deterministic fp32-accumulating GEMM (fills out)", py::arg("a"),
        py::arg("b"), py::arg("merges"), py::arg("depth"), py::arg("out"),
        py::arg("bias") = py::none(), py::arg("k_groups") = 1);
  m.def("det_mm_gather", &det_mm_gather, "the GEMM over offset-table operands (fills out)",
        py::arg("a"), py::arg("arow"), py::arg("acol"), py::arg("b"), py::arg("brow"),
        py::arg("bcol"), py::arg("out"), py::arg("orow"), py::arg("ocol"), py::arg("merges"),
        py::arg("depth"), py::arg("bias") = py::none(), py::arg("bias_on_rows") = false);
  m.def("det_colsum", &det_colsum, "column sums with the row tree (fills out)");
  m.def("det_channel_sums", &det_channel_sums, "NCHW per-channel sums with the row tree (fills out)");
  m.def("det_affine_grads", &det_affine_grads,
        "a channels-last affine's input, weight and bias gradients in one pass (fills outs)");
  m.def("det_affine", &det_affine, "x * w + b over channels-last rows, two roundings (fills y)");
  m.def("det_layer_norm", &det_layer_norm,
        "layer norm over fp32 rows in a fixed order per row (fills y, normed, rstd)");
  m.def("det_layer_norm_input_grad", &det_layer_norm_input_grad,
        "layer norm's input gradient from the normed values' gradient, in place");
  m.def("det_layer_norm_rows", &det_layer_norm_rows,
        "layer norm over wide fp32 rows, each in a fixed lane order (fills y, mean, rstd)");
  m.def("det_layer_norm_rows_grads", &det_layer_norm_rows_grads,
        "det_layer_norm_rows' input and affine gradients in one pass (fills gx, gw, gb)");
  m.def("det_group_norm", &det_group_norm,
        "group norm of fp32 NCHW planes with its affine, each group in a fixed order (fills y, mean, rstd)");
  m.def("det_group_norm_grads", &det_group_norm_grads,
        "det_group_norm's input and affine gradients in one pass (fills gx, gw, gb)");
  m.def("det_fold", &det_fold, "F.fold's bits for fp32 columns (fills out)");
  m.attr("isa") = kIsa;
  m.attr("leaf") = kLeaf;
  m.attr("mr") = MR;
  m.attr("nr") = NR;
  m.attr("narrow_nr") = kNarrowNR;
}
