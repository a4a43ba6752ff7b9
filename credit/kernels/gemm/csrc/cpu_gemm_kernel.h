// Deterministic, batch-invariant GEMM engine for CPUs: C = A @ B, fp32 accumulation.
//
// Every output element is computed by the same arithmetic, wherever it sits:
//   * K is cut into leaves of kLeaf elements; a leaf is a sequential chain of
//     fused multiply-adds starting from +0 (k ascending), zero past K;
//   * leaves are combined by the tree described in credit/kernels/gemm/_tree.py,
//     evaluated with a stack driven by its `merges` schedule.
// Threads split the output tiles, never K, so the result does not depend on M,
// on N, on the thread count, or on which SIMD path was compiled (all paths use
// single-rounding FMA).
//
// Operands are gathers: element (i, j) of a logical matrix is
// base[row[i] + col[j]] (a negative row or column entry reads as zero), so one
// engine serves strided matrices, per-sample padded row trees and implicit
// im2col convolutions without copying the operand into a matrix first.  B is
// packed into zero-padded Kp x NR panels; fp32 A is read in place where a
// leaf's 32 column offsets are consecutive, through one table load per k where
// they are irregular, and packed where they are evenly spaced wider apart or
// the leaf holds padding.
#pragma once

// The engine's sources need only tensors and at::parallel_for: the full extension header
// (autograd, nn, pybind11) would add about a minute of compiling per source.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace credit_gemm {

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
inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
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
inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
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
inline vec vmul(vec a, vec b) { return a * b; }
constexpr const char* kIsa = "scalar";
#endif

constexpr int NR = VL * NV;

// The narrow tile (cpu_gemm_engine.cpp): half the columns and 8 rows (best of 6, 8, 10, 12 on
// an AVX-512 Zen 4: 12 rows spill accumulators).  Taken when all of N fits one narrow panel
// (N = 32 on AVX-512, the 32-channel stages): on wider N with a half-filled last panel (96,
// 160, 288 columns) the wide tile's empty lanes cost less than the narrow tile's extra passes.
constexpr int kNarrowMR = 8, kNarrowNV = NV / 2, kNarrowNR = VL * kNarrowNV;
inline bool narrow_fills_better(int64_t n) { return n <= kNarrowNR && kNarrowNV > 0; }

// A logical matrix read through offset tables: (i, j) -> base[row[i] + col[j]];
// a negative entry in either table reads as zero.
template <typename T>
struct Gather {
  const T* base;
  const int64_t* row;
  const int64_t* col;
};

// Where results go: (i, j) -> base[row[i] + col[j]] (entries >= 0, distinct).
// bias (fp32, per column j, or nullptr) and row_bias (fp32, per row i, or nullptr) are added
// to the fp32 sum before the one rounding to O.
template <typename O>
struct Scatter {
  O* base;
  const int64_t* row;
  const int64_t* col;
  const float* bias = nullptr;
  const float* row_bias = nullptr;
};

// The merge schedule of T(n) (see _tree.py): merges[i] additions after leaf i.
std::vector<int32_t> tree_schedule(int64_t n, int64_t* depth);

// C = A (M x K) @ B (K x N) with the fixed K tree of schedule `sched` (of
// ceil(K / kLeaf) leaves, stack depth `depth`).  Defined for T, O in
// {float, BFloat16, Half} in cpu_gemm_engine.cpp.
template <typename T, typename O>
void gemm(const Gather<T>& a, const Gather<T>& b, const Scatter<O>& c, int64_t M, int64_t K,
          int64_t N, const int32_t* sched, int64_t depth);

}  // namespace credit_gemm
