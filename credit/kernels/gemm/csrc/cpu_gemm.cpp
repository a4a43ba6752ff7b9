// Deterministic, batch-invariant GEMM for CPUs: C = A @ B, fp32 accumulation.
//
// Every output element is computed by the same arithmetic, wherever it sits:
//   * K is cut into leaves of kLeaf elements; a leaf is a sequential chain of
//     fused multiply-adds starting from +0 (k ascending);
//   * leaves are combined by the tree described in credit/kernels/gemm/_tree.py,
//     evaluated with a stack driven by the `merges` schedule passed in.
// B is packed into zero-padded Kp x NR panels; fp32 A is read in place (rows
// past M repeat the last row and are never stored, a partial last K leaf is
// packed with zeros), other dtypes are packed; threads split the output tiles, never
// K.  The result therefore does not depend on M, on N, on the thread count, or
// on which SIMD path was compiled (all paths use single-rounding FMA).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <type_traits>
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

// Where a tile's A values come from: a(r, k) = row[r][k * sk] for the first
// `direct_leaves` leaves (rows of the caller's fp32 matrix, or a packed panel),
// then tail[k' * MR + r] for one zero-padded partial leaf, if any.
struct APanel {
  const float* row[MR];
  int64_t sk;
  int64_t direct_leaves;
  const float* tail;  // [kLeaf][MR] or nullptr
};

// One leaf of FMA chains from +0: acc[r][j] += a(r, k) * b[k][j] for k ascending.
template <bool UNIT_K>
inline void leaf_fma(const APanel& ap, int64_t k0, const float* __restrict b, vec (&acc)[MR][NV]) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[r][j] = vzero();
  const float* a[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) a[r] = ap.row[r] + k0 * (UNIT_K ? 1 : ap.sk);
#pragma GCC unroll 2
  for (int k = 0; k < kLeaf; ++k) {
    vec bv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) bv[j] = vload(b + k * NR + j * VL);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vec av = vbcast(a[r][UNIT_K ? k : k * ap.sk]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[r][j] = vfma(av, bv[j], acc[r][j]);
    }
  }
}

inline void leaf_fma_packed(const float* __restrict a, const float* __restrict b,
                            vec (&acc)[MR][NV]) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[r][j] = vzero();
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
}

// One MR x NR output tile over all leaves.  bp: packed B panel [Kp][NR],
// stack: [depth][MR][NR] scratch; the result is stored to out (row stride ldo).
template <bool UNIT_K>
void micro_tile(const APanel& ap, const float* __restrict bp, int64_t nleaves,
                const int32_t* __restrict merges, float* __restrict stack,
                float* __restrict out, int64_t ldo) {
  vec acc[MR][NV];
  int64_t top = 0;
  for (int64_t leaf = 0; leaf < nleaves; ++leaf) {
    const float* b = bp + leaf * kLeaf * NR;
    if (leaf < ap.direct_leaves)
      leaf_fma<UNIT_K>(ap, leaf * kLeaf, b, acc);
    else
      leaf_fma_packed(ap.tail + (leaf - ap.direct_leaves) * kLeaf * MR, b, acc);
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
    for (int j = 0; j < NV; ++j) vstore(out + r * ldo + j * VL, acc[r][j]);
}

// Pack rows [m0, m0+MR) x columns [k0, k0+Kn) of A (any strides, zero past M
// and K) into [Kn / kLeaf * kLeaf][MR] floats.
template <typename T>
void pack_a(const T* a, int64_t M, int64_t K, int64_t sm, int64_t sk, int64_t m0, int64_t k0,
            int64_t Kn, float* dst) {
  for (int r = 0; r < MR; ++r) {
    const int64_t m = m0 + r;
    for (int64_t k = 0; k < Kn; ++k)
      dst[k * MR + r] = (m < M && k0 + k < K) ? static_cast<float>(a[m * sm + (k0 + k) * sk]) : 0.0f;
  }
}

// Pack columns [n0, n0+NR) of B (K x N, any strides) into [Kp][NR] floats,
// zero past K and N.
template <typename T>
void pack_b(const T* b, int64_t K, int64_t N, int64_t sk, int64_t sn, int64_t Kp, int64_t n0,
            float* dst) {
  const int64_t cols = std::min<int64_t>(NR, N - n0);
  if (sn == 1 && cols == NR) {
    for (int64_t k = 0; k < K; ++k)
      for (int c = 0; c < NR; ++c) dst[k * NR + c] = static_cast<float>(b[k * sk + n0 + c]);
  } else {
    for (int c = 0; c < NR; ++c) {
      if (c >= cols) {
        for (int64_t k = 0; k < K; ++k) dst[k * NR + c] = 0.0f;
        continue;
      }
      const T* col = b + (n0 + c) * sn;
      for (int64_t k = 0; k < K; ++k) dst[k * NR + c] = static_cast<float>(col[k * sk]);
    }
  }
  for (int64_t k = K; k < Kp; ++k)
    for (int c = 0; c < NR; ++c) dst[k * NR + c] = 0.0f;
}

// Rows of A per cache block: a block of A (rows x K floats) stays in L2 while
// every packed B panel sweeps over it (the B panel itself stays in L1).
constexpr int64_t kBlockBytes = 160 * 1024;

// Operands of one GEMM: A (M x K) and B (K x N) with arbitrary strides.
template <typename T>
struct Operands {
  const T* a;
  int64_t sam, sak;
  const T* b;
  int64_t sbk, sbn;
  int64_t M, K, N;
};

// C (M x N, row-major, fills od) = A @ B in one pass with the given schedule:
// tiles of MR x NR, each over all its leaves.
template <typename T, typename O>
void gemm_block(const Operands<T>& op, const int32_t* sched, int64_t depth, O* od) {
  const int64_t M = op.M, K = op.K, N = op.N;
  const int64_t nleaves = (K + kLeaf - 1) / kLeaf;
  const int64_t Kp = nleaves * kLeaf;
  const int64_t mp = (M + MR - 1) / MR, np = (N + NR - 1) / NR;
  const T* ad = op.a;
  const T* bd = op.b;
  const int64_t sam = op.sam, sak = op.sak;
  const int64_t sbk = op.sbk, sbn = op.sbn;

  std::vector<float> pb(static_cast<size_t>(np * Kp * NR));
  at::parallel_for(0, np, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) pack_b(bd, K, N, sbk, sbn, Kp, p * NR, pb.data() + p * Kp * NR);
  });

  // fp32 A is read in place for its whole leaves; only a partial last leaf is
  // packed (zero-padded).  Other input dtypes are packed whole (converted).
  constexpr bool kDirect = std::is_same<T, float>::value;
  const int64_t direct_leaves = kDirect ? K / kLeaf : 0;
  const int64_t packed_k0 = direct_leaves * kLeaf, packed_k = Kp - packed_k0;
  std::vector<float> pa(static_cast<size_t>(packed_k > 0 ? mp * packed_k * MR : 0));
  if (packed_k > 0) {
    at::parallel_for(0, mp, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p)
        pack_a(ad, M, K, sam, sak, p * MR, packed_k0, packed_k, pa.data() + p * packed_k * MR);
    });
  }
  const bool unit_k = kDirect && sak == 1;
  auto panel = [&](int64_t ip) {
    APanel ap;
    ap.direct_leaves = direct_leaves;
    ap.tail = packed_k > 0 ? pa.data() + ip * packed_k * MR : nullptr;
    if (kDirect) {
      ap.sk = sak;
      for (int r = 0; r < MR; ++r) {  // rows past M read the last row; never stored
        const int64_t m = std::min<int64_t>(ip * MR + r, M - 1);
        ap.row[r] = reinterpret_cast<const float*>(ad) + m * sam;
      }
    } else {
      ap.sk = MR;
      for (int r = 0; r < MR; ++r) ap.row[r] = ap.tail + r;
    }
    return ap;
  };

  const int64_t block = std::max<int64_t>(1, kBlockBytes / (MR * Kp * 4));  // A panels per block
  // Tile t walks blocks of `block` A panels; inside a block, B panel by B panel.
  at::parallel_for(0, mp * np, 4, [&](int64_t lo, int64_t hi) {
    std::vector<float> stack(static_cast<size_t>(std::max<int64_t>(depth, 1) * MR * NR));
    alignas(64) float tile[MR * NR];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t blk = t / (block * np), local = t - blk * block * np;
      const int64_t size = std::min<int64_t>(block, mp - blk * block);
      const int64_t jp = local / size, ip = blk * block + local % size;
      const APanel ap = panel(ip);
      const int64_t m0 = ip * MR, n0 = jp * NR;
      const int64_t rows = std::min<int64_t>(MR, M - m0), cols = std::min<int64_t>(NR, N - n0);
      const float* bpan = pb.data() + jp * Kp * NR;
      if (std::is_same<O, float>::value && rows == MR && cols == NR) {
        float* dst = reinterpret_cast<float*>(od) + m0 * N + n0;
        if (unit_k) micro_tile<true>(ap, bpan, nleaves, sched, stack.data(), dst, N);
        else micro_tile<false>(ap, bpan, nleaves, sched, stack.data(), dst, N);
        continue;
      }
      if (unit_k) micro_tile<true>(ap, bpan, nleaves, sched, stack.data(), tile, NR);
      else micro_tile<false>(ap, bpan, nleaves, sched, stack.data(), tile, NR);
      for (int64_t r = 0; r < rows; ++r) {
        O* orow = od + (m0 + r) * N + n0;
        for (int64_t c = 0; c < cols; ++c) orow[c] = static_cast<O>(tile[r * NR + c]);
      }
    }
  });
}

// The merge schedule of T(n) (see _tree.py): merges[i] additions after leaf i.
std::vector<int32_t> tree_schedule(int64_t n, int64_t* depth) {
  std::vector<int32_t> merges(static_cast<size_t>(n), 0);
  std::vector<std::pair<int64_t, int64_t>> todo{{0, n}};
  while (!todo.empty()) {
    const auto [lo, cnt] = todo.back();
    todo.pop_back();
    if (cnt == 1) continue;
    const int64_t left = (cnt + 1) / 2;
    merges[lo + cnt - 1] += 1;
    todo.push_back({lo + left, cnt - left});
    todo.push_back({lo, left});
  }
  int64_t live = 0;
  *depth = 0;
  for (int32_t m : merges) {
    *depth = std::max(*depth, ++live);
    live -= m;
  }
  return merges;
}

// Longest K (in leaves) one gemm_block pass takes, so its B panel (512 x NR
// floats) stays in L1/L2 (best of 4..64 on the model's shapes).  Longer K (dW
// over a batch's rows) runs T(n)'s top levels as separate passes: the left ceil(n/2) leaves and the right
// floor(n/2) are exactly the subtrees T(ceil(n/2)) and T(floor(n/2)), summed
// into fp32 buffers and added once.
constexpr int64_t kBlockLeaves = 16;

template <typename T>
void subtree(const Operands<T>& op, int64_t leaf0, int64_t n, float* dst) {
  const int64_t k0 = leaf0 * kLeaf;
  if (n <= kBlockLeaves) {
    Operands<T> part = op;
    part.a = op.a + k0 * op.sak;
    part.b = op.b + k0 * op.sbk;
    part.K = std::min<int64_t>(n * kLeaf, op.K - k0);
    int64_t depth = 0;
    const std::vector<int32_t> sched = tree_schedule(n, &depth);
    gemm_block<T, float>(part, sched.data(), depth, dst);
    return;
  }
  const int64_t left = (n + 1) / 2;
  subtree(op, leaf0, left, dst);
  std::vector<float> right(static_cast<size_t>(op.M * op.N));
  subtree(op, leaf0 + left, n - left, right.data());
  const int64_t total = op.M * op.N;
  at::parallel_for(0, total, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dst[i] += right[i];
  });
}

template <typename T, typename O>
void run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& merges, int64_t depth,
         at::Tensor& out) {
  const Operands<T> op{a.data_ptr<T>(), a.stride(0), a.stride(1), b.data_ptr<T>(),
                       b.stride(0),     b.stride(1), a.size(0),   a.size(1),
                       b.size(1)};
  const int64_t nleaves = (op.K + kLeaf - 1) / kLeaf;
  O* od = out.data_ptr<O>();
  if (nleaves <= kBlockLeaves) return gemm_block<T, O>(op, merges.data_ptr<int32_t>(), depth, od);
  if constexpr (std::is_same<O, float>::value) return subtree(op, 0, nleaves, od);
  std::vector<float> full(static_cast<size_t>(op.M * op.N));
  subtree(op, 0, nleaves, full.data());
  for (int64_t i = 0; i < op.M * op.N; ++i) od[i] = static_cast<O>(full[i]);
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

// Column sums of fp32 g (M x N, unit column stride) with the row tree: the
// arithmetic of ones(1, M) @ g through det_mm (a leaf adds its 32 rows to +0
// in order, rows past M add +0; fma(1, x, s) rounds exactly like s + x), at
// memory speed instead of a 1-row GEMM.
void det_colsum(const at::Tensor& g, const at::Tensor& merges, int64_t depth, at::Tensor& out) {
  TORCH_CHECK(g.dim() == 2 && g.device().is_cpu() && g.scalar_type() == at::kFloat &&
                  (g.size(1) <= 1 || g.stride(1) == 1),
              "det_colsum cpu: g must be a 2-D fp32 CPU tensor with unit column stride");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kFloat && out.dim() == 1 &&
                  out.size(0) == g.size(1),
              "det_colsum cpu: bad output tensor");
  const int64_t M = g.size(0), N = g.size(1), sm = g.stride(0);
  const int64_t nleaves = (M + kLeaf - 1) / kLeaf;
  TORCH_CHECK(merges.scalar_type() == at::kInt && merges.is_contiguous() &&
                  merges.numel() == nleaves && nleaves > 0,
              "det_colsum cpu: merge schedule does not match the row count");
  const float* gd = g.data_ptr<float>();
  const int32_t* sched = merges.data_ptr<int32_t>();
  float* od = out.data_ptr<float>();
  const int64_t chunks = (N + VL - 1) / VL;
  at::parallel_for(0, chunks, 8, [&](int64_t lo, int64_t hi) {
    std::vector<float> stack(static_cast<size_t>(std::max<int64_t>(depth, 1) * VL));
    alignas(64) float edge[VL];
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t n0 = c * VL, cols = std::min<int64_t>(VL, N - n0);
      auto row = [&](int64_t m) -> vec {
        if (m >= M) return vzero();
        const float* p = gd + m * sm + n0;
        if (cols == VL) return vload(p);
        for (int i = 0; i < VL; ++i) edge[i] = i < cols ? p[i] : 0.0f;
        return vload(edge);
      };
      int64_t top = 0;
      vec acc = vzero();
      for (int64_t leaf = 0; leaf < nleaves; ++leaf) {
        acc = vzero();
        for (int64_t k = leaf * kLeaf; k < (leaf + 1) * kLeaf; ++k) acc = vadd(acc, row(k));
        for (int32_t m = sched[leaf]; m > 0; --m) {
          --top;
          acc = vadd(vload(stack.data() + top * VL), acc);
        }
        if (leaf + 1 < nleaves) vstore(stack.data() + (top++) * VL, acc);
      }
      vstore(edge, acc);
      for (int i = 0; i < cols; ++i) od[n0 + i] = edge[i];
    }
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("det_mm", &det_mm, "deterministic fp32-accumulating GEMM (fills out)");
  m.def("det_colsum", &det_colsum, "column sums with the row tree (fills out)");
  m.attr("isa") = kIsa;
  m.attr("leaf") = kLeaf;
  m.attr("mr") = MR;
  m.attr("nr") = NR;
}
