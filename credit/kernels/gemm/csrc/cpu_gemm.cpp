// Deterministic, batch-invariant GEMM for CPUs: C = A @ B, fp32 accumulation.
//
// Every output element is computed by the same arithmetic, wherever it sits:
//   * K is cut into leaves of kLeaf elements; a leaf is a sequential chain of
//     fused multiply-adds starting from +0 (k ascending);
//   * leaves are combined by the tree described in credit/kernels/gemm/_tree.py,
//     evaluated with a stack driven by the `merges` schedule passed in.
// Rows and columns are packed into zero-padded MR x Kp / Kp x NR panels so the
// same micro-kernel handles edge tiles; threads split the output tiles, never
// K.  The result therefore does not depend on M, on N, on the thread count, or
// on which SIMD path was compiled (all paths use single-rounding FMA).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kLeaf = 32;  // must match LEAF in _tree.py

#if defined(__AVX512F__)
using vec = __m512;
constexpr int VL = 16, MR = 6, NV = 4;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vbcast(float x) { return _mm512_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
constexpr const char* kIsa = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int VL = 8, MR = 6, NV = 2;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vbcast(float x) { return _mm256_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
constexpr const char* kIsa = "avx2";
#else
using vec = float;
constexpr int VL = 1, MR = 4, NV = 4;
inline vec vzero() { return 0.0f; }
inline vec vload(const float* p) { return *p; }
inline void vstore(float* p, vec v) { *p = v; }
inline vec vbcast(float x) { return x; }
inline vec vfma(vec a, vec b, vec c) { return std::fma(a, b, c); }
inline vec vadd(vec a, vec b) { return a + b; }
constexpr const char* kIsa = "scalar";
#endif

constexpr int NR = VL * NV;

// One MR x NR output tile over all leaves.  ap: [Kp][MR], bp: [Kp][NR],
// stack: [depth][MR][NR] scratch, out: [MR][NR].
void micro_tile(const float* __restrict ap, const float* __restrict bp, int64_t nleaves,
                const int32_t* __restrict merges, float* __restrict stack,
                float* __restrict out) {
  vec acc[MR][NV];
  int64_t top = 0;
  for (int64_t leaf = 0; leaf < nleaves; ++leaf) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[r][j] = vzero();
    const float* a = ap + leaf * kLeaf * MR;
    const float* b = bp + leaf * kLeaf * NR;
    for (int k = 0; k < kLeaf; ++k) {
      vec bv[NV];
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) bv[j] = vload(b + k * NR + j * VL);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const vec av = vbcast(a[k * MR + r]);
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) acc[r][j] = vfma(av, bv[j], acc[r][j]);
      }
    }
    // Tree merges: the stack top is the left operand, the new leaf/subtree
    // sum the right one (IEEE addition is commutative, so only the pairing
    // matters for the bits).
    for (int32_t m = merges[leaf]; m > 0; --m) {
      --top;
      const float* s = stack + top * MR * NR;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j)
          acc[r][j] = vadd(vload(s + r * NR + j * VL), acc[r][j]);
    }
    if (leaf + 1 < nleaves) {
      float* s = stack + top * MR * NR;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) vstore(s + r * NR + j * VL, acc[r][j]);
      ++top;
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) vstore(out + r * NR + j * VL, acc[r][j]);
}

// Pack rows [p*MR, p*MR+MR) of A (M x K, any strides) into [Kp][MR] floats.
template <typename T>
void pack_a(const T* a, int64_t M, int64_t K, int64_t sm, int64_t sk, int64_t Kp,
            int64_t p, float* dst) {
  const int64_t m0 = p * MR;
  for (int64_t k = 0; k < Kp; ++k) {
    for (int r = 0; r < MR; ++r) {
      const int64_t m = m0 + r;
      dst[k * MR + r] = (m < M && k < K) ? static_cast<float>(a[m * sm + k * sk]) : 0.0f;
    }
  }
}

// Pack columns [p*NR, p*NR+NR) of B (K x N, any strides) into [Kp][NR] floats.
template <typename T>
void pack_b(const T* b, int64_t K, int64_t N, int64_t sk, int64_t sn, int64_t Kp,
            int64_t p, float* dst) {
  const int64_t n0 = p * NR;
  for (int64_t k = 0; k < Kp; ++k) {
    for (int c = 0; c < NR; ++c) {
      const int64_t n = n0 + c;
      dst[k * NR + c] = (n < N && k < K) ? static_cast<float>(b[k * sk + n * sn]) : 0.0f;
    }
  }
}

template <typename T, typename O>
void run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& merges, int64_t depth,
         at::Tensor& out) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  const int64_t nleaves = (K + kLeaf - 1) / kLeaf;
  const int64_t Kp = nleaves * kLeaf;
  const int64_t mp = (M + MR - 1) / MR, np = (N + NR - 1) / NR;

  std::vector<float> pa(static_cast<size_t>(mp * Kp * MR));
  std::vector<float> pb(static_cast<size_t>(np * Kp * NR));
  const T* ad = a.data_ptr<T>();
  const T* bd = b.data_ptr<T>();
  const int64_t sam = a.stride(0), sak = a.stride(1);
  const int64_t sbk = b.stride(0), sbn = b.stride(1);
  at::parallel_for(0, mp, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) pack_a(ad, M, K, sam, sak, Kp, p, pa.data() + p * Kp * MR);
  });
  at::parallel_for(0, np, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) pack_b(bd, K, N, sbk, sbn, Kp, p, pb.data() + p * Kp * NR);
  });

  const int32_t* sched = merges.data_ptr<int32_t>();
  O* od = out.data_ptr<O>();
  // Tiles are ordered column-panel-major so a thread's consecutive tiles
  // reuse the same packed B panel from cache.
  at::parallel_for(0, mp * np, 4, [&](int64_t lo, int64_t hi) {
    std::vector<float> stack(static_cast<size_t>(std::max<int64_t>(depth, 1) * MR * NR));
    alignas(64) float tile[MR * NR];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t jp = t / mp, ip = t % mp;
      micro_tile(pa.data() + ip * Kp * MR, pb.data() + jp * Kp * NR, nleaves, sched,
                 stack.data(), tile);
      const int64_t m0 = ip * MR, n0 = jp * NR;
      const int64_t rows = std::min<int64_t>(MR, M - m0), cols = std::min<int64_t>(NR, N - n0);
      for (int64_t r = 0; r < rows; ++r) {
        O* orow = od + (m0 + r) * N + n0;
        for (int64_t c = 0; c < cols; ++c) orow[c] = static_cast<O>(tile[r * NR + c]);
      }
    }
  });
}

template <typename T>
void dispatch_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& merges,
                  int64_t depth, at::Tensor& out) {
  switch (out.scalar_type()) {
    case at::kFloat: return run<T, float>(a, b, merges, depth, out);
    case at::kBFloat16: return run<T, at::BFloat16>(a, b, merges, depth, out);
    case at::kHalf: return run<T, at::Half>(a, b, merges, depth, out);
    default: TORCH_CHECK(false, "det_mm cpu: unsupported output dtype ", out.scalar_type());
  }
}

// Fills `out` (M x N, contiguous) with A @ B.  Shapes, dtypes and devices are
// validated in Python; the checks here guard the raw pointer arithmetic.
void det_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& merges, int64_t depth,
            at::Tensor& out) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
              "det_mm cpu: bad shapes ", a.sizes(), " @ ", b.sizes());
  TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu() && out.device().is_cpu(),
              "det_mm cpu: tensors must be on the CPU");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "det_mm cpu: dtype mismatch");
  TORCH_CHECK(out.is_contiguous() && out.size(0) == a.size(0) && out.size(1) == b.size(1),
              "det_mm cpu: bad output tensor");
  const int64_t nleaves = (a.size(1) + kLeaf - 1) / kLeaf;
  TORCH_CHECK(merges.scalar_type() == at::kInt && merges.is_contiguous() &&
                  merges.numel() == nleaves && nleaves > 0,
              "det_mm cpu: merge schedule does not match K");
  switch (a.scalar_type()) {
    case at::kFloat: return dispatch_out<float>(a, b, merges, depth, out);
    case at::kBFloat16: return dispatch_out<at::BFloat16>(a, b, merges, depth, out);
    case at::kHalf: return dispatch_out<at::Half>(a, b, merges, depth, out);
    default: TORCH_CHECK(false, "det_mm cpu: unsupported input dtype ", a.scalar_type());
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("det_mm", &det_mm, "deterministic fp32-accumulating GEMM (fills out)");
  m.attr("isa") = kIsa;
  m.attr("leaf") = kLeaf;
  m.attr("mr") = MR;
  m.attr("nr") = NR;
}
