// The GEMM engine declared in cpu_gemm_kernel.h: packing, the register-blocked
// micro-kernel, the tile loop and the tree-top split of long K.
#include "cpu_gemm_kernel.h"

namespace credit_gemm {

namespace {

// How a tile reads one leaf of A.
enum LeafKind : uint8_t { kPacked = 0, kUnit = 1, kTable = 2 };

struct LeafPlan {
  std::vector<uint8_t> kind;      // per leaf
  std::vector<int64_t> offset;    // kUnit: col[k0]; kPacked: index into the packed leaves
  std::vector<int64_t> stride;    // col[k0 + 1] - col[k0] of an evenly spaced leaf, else 0
  std::vector<int64_t> start;     // col[k0] of an evenly spaced leaf
  std::vector<int32_t> length;    // k's of the leaf its FMA chain runs over (see plan_leaves)
  int64_t packed = 0;             // number of packed leaves
};

// One leaf of FMA chains from +0: acc[r][j] = sum_k a(r, k) * b[k][j], k ascending over the
// leaf's first `length` k's. `A` yields a(r, k) for the tile's rows.
template <typename A>
inline void leaf_fma(const A& a, const float* __restrict b, int length, vec (&acc)[MR][NV]) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[r][j] = vzero();
#pragma GCC unroll 2
  for (int k = 0; k < length; ++k) {
    vec bv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) bv[j] = vload(b + k * NR + j * VL);
    a.prepare(k);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vec av = vbcast(a(r, k));
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[r][j] = vfma(av, bv[j], acc[r][j]);
    }
  }
}

struct UnitA {  // a(r, k) = row[r][k]
  const float* row[MR];
  inline void prepare(int) const {}
  inline float operator()(int r, int k) const { return row[r][k]; }
};
struct TableA {  // a(r, k) = row[r][col[k]]
  const float* row[MR];
  const int64_t* col;
  mutable int64_t off = 0;
  inline void prepare(int k) const { off = col[k]; }
  inline float operator()(int r, int) const { return row[r][off]; }
};
struct PackedA {  // a(r, k) = p[k * MR + r]
  const float* p;
  inline void prepare(int) const {}
  inline float operator()(int r, int k) const { return p[k * MR + r]; }
};

// One MR x NR output tile over all leaves (bp: its packed B panel [Kp][NR]),
// stored to out[r][0..NR).
void micro_tile(const float* const* rows, const int64_t* acol, const LeafPlan& plan,
                const float* packed, const float* __restrict bp, int64_t nleaves,
                const int32_t* __restrict merges, float* __restrict stack, const float* bias,
                float* const* out) {
  vec acc[MR][NV];
  int64_t top = 0;
  for (int64_t leaf = 0; leaf < nleaves; ++leaf) {
    const int64_t k0 = leaf * kLeaf;
    const float* b = bp + k0 * NR;
    switch (plan.kind[leaf]) {
      case kUnit: {
        UnitA a;
        for (int r = 0; r < MR; ++r) a.row[r] = rows[r] + plan.offset[leaf];
        leaf_fma(a, b, plan.length[leaf], acc);
        break;
      }
      case kTable: {
        TableA a;
        for (int r = 0; r < MR; ++r) a.row[r] = rows[r];
        a.col = acol + k0;
        leaf_fma(a, b, plan.length[leaf], acc);
        break;
      }
      default: {
        PackedA a{packed + plan.offset[leaf] * kLeaf * MR};
        leaf_fma(a, b, plan.length[leaf], acc);
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
        for (int j = 0; j < NV; ++j) acc[r][j] = vadd(vload(s + r * NR + j * VL), acc[r][j]);
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
  if (bias != nullptr) {  // the panel's NR bias values, added once to the finished sums
    for (int j = 0; j < NV; ++j) {
      const vec bv = vload(bias + j * VL);
      for (int r = 0; r < MR; ++r) acc[r][j] = vadd(acc[r][j], bv);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) vstore(out[r] + j * VL, acc[r][j]);
}

template <typename T>
inline float at(const Gather<T>& g, int64_t i, int64_t j) {
  const int64_t r = g.row[i], c = g.col[j];
  return (r < 0 || c < 0) ? 0.0f : static_cast<float>(g.base[r + c]);
}

inline bool rows_adjacent(const int64_t* row) {
  for (int r = 1; r < MR; ++r)
    if (row[r] != row[0] + r) return false;
  return true;
}

// Consecutive real columns of a panel whose offsets are evenly spaced.
struct ColumnRun {
  int first, length;
  int64_t offset, step;
};

inline std::vector<ColumnRun> column_runs(const int64_t* col, int64_t cols) {
  std::vector<ColumnRun> runs;
  for (int c = 0; c < cols;) {
    if (col[c] < 0) {
      ++c;
      continue;
    }
    ColumnRun run{c, 1, col[c], 1};
    if (c + 1 < cols && col[c + 1] >= 0) run.step = col[c + 1] - col[c];
    while (c + run.length < cols && col[c + run.length] >= 0 &&
           col[c + run.length] == col[c] + run.length * run.step)
      ++run.length;
    runs.push_back(run);
    c += run.length;
  }
  return runs;
}

// The spacing of B's rows [k, k + kRowBlock) when they are real and evenly spaced, else 0.
constexpr int kRowBlock = 16;
inline int64_t row_step(const int64_t* row, int64_t k, int64_t K) {
  if (k + kRowBlock > K || row[k] < 0) return 0;
  const int64_t step = row[k + 1] - row[k];
  for (int i = 2; i < kRowBlock; ++i)
    if (row[k + i] != row[k] + i * step) return 0;
  return step;
}

// Packs B's column panels [p0, p1) (K x N, NR columns each) into [Kp][NR]
// floats each at dst, zero past K and N.  (B is never read in place: rows at a
// large power-of-two stride share L1 sets.)
template <typename T>
void pack_b(const Gather<T>& b, int64_t K, int64_t N, int64_t Kp, int64_t p0, int64_t p1,
            float* dst) {
  at::parallel_for(p0, p1, 1, [&](int64_t lo, int64_t hi) {
    // When every panel of the range has NR adjacent columns (B not transposed), the panels
    // are filled row by row, so B's rows are read front to back: one stream, not one per panel.
    bool all_unit = true;
    for (int64_t p = lo; all_unit && p < hi; ++p) {
      const int64_t n0 = p * NR;
      all_unit = n0 + NR <= N && b.col[n0] >= 0;
      for (int c = 1; all_unit && c < NR; ++c) all_unit = b.col[n0 + c] == b.col[n0] + c;
    }
    if (all_unit) {
      for (int64_t k = 0; k < Kp; ++k) {
        const int64_t r = k < K ? b.row[k] : -1;
        for (int64_t p = lo; p < hi; ++p) {
          float* d = dst + (p - p0) * Kp * NR + k * NR;
          if (r < 0) {
            for (int c = 0; c < NR; ++c) d[c] = 0.0f;
            continue;
          }
          const T* src = b.base + r + b.col[p * NR];
          if constexpr (std::is_same<T, float>::value) {
#pragma GCC unroll 8
            for (int j = 0; j < NV; ++j) vstore(d + j * VL, vload(src + j * VL));
          } else {
            for (int c = 0; c < NR; ++c) d[c] = static_cast<float>(src[c]);
          }
        }
      }
      return;
    }
    for (int64_t p = lo; p < hi; ++p) {
      float* panel = dst + (p - p0) * Kp * NR;
      const int64_t n0 = p * NR, cols = std::min<int64_t>(NR, N - n0);
      bool unit = b.col[n0] >= 0;  // the panel's columns (maybe fewer than NR) adjacent
      for (int c = 1; unit && c < cols; ++c) unit = b.col[n0 + c] == b.col[n0] + c;
      // Otherwise the panel's real columns as runs of evenly spaced ones (a panel spanning
      // output rows, a strided convolution's positions, a kernel row's taps), each copied
      // by a branch-free loop; padding columns stay zero.
      const std::vector<ColumnRun> runs = unit ? std::vector<ColumnRun>{} : column_runs(b.col + n0, cols);
      const bool gaps = !unit && (cols < NR || std::any_of(b.col + n0, b.col + n0 + cols,
                                                           [](int64_t c) { return c < 0; }));
      for (int64_t k = 0; k < Kp; ++k) {
        float* d = panel + k * NR;
        const int64_t r = k < K ? b.row[k] : -1;
        const int64_t step = !unit && !gaps && k % kRowBlock == 0 ? row_step(b.row, k, K) : 0;
        if (step == 1) {
          // kRowBlock rows a float apart (dW's patches over a run of positions): column by
          // column, each column's kRowBlock values read as one run
          for (int c = 0; c < NR; ++c) {
            const T* src = b.base + r + b.col[n0 + c];
#pragma GCC unroll 16
            for (int i = 0; i < kRowBlock; ++i) d[i * NR + c] = static_cast<float>(src[i]);
          }
          k += kRowBlock - 1;
          continue;
        }
        if (step != 0) {  // evenly spaced rows (a strided convolution's positions)
          for (int c = 0; c < NR; ++c) {
            const T* src = b.base + r + b.col[n0 + c];
#pragma GCC unroll 16
            for (int i = 0; i < kRowBlock; ++i) d[i * NR + c] = static_cast<float>(src[i * step]);
          }
          k += kRowBlock - 1;
          continue;
        }
        if (r < 0) {
          for (int c = 0; c < NR; ++c) d[c] = 0.0f;
        } else if (unit && cols < NR) {  // N's last, partial panel
          const T* src = b.base + r + b.col[n0];
          for (int c = 0; c < NR; ++c) d[c] = c < cols ? static_cast<float>(src[c]) : 0.0f;
        } else if (unit) {
          const T* src = b.base + r + b.col[n0];
          if constexpr (std::is_same<T, float>::value) {
#pragma GCC unroll 8
            for (int j = 0; j < NV; ++j) vstore(d + j * VL, vload(src + j * VL));
          } else {
            for (int c = 0; c < NR; ++c) d[c] = static_cast<float>(src[c]);
          }
        } else {
          if (gaps)
            for (int c = 0; c < NR; ++c) d[c] = 0.0f;
          const T* row = b.base + r;
          for (const ColumnRun& run : runs) {
            const T* src = row + run.offset;
            float* out = d + run.first;
            if (run.step == 1) {
              for (int c = 0; c < run.length; ++c) out[c] = static_cast<float>(src[c]);
            } else {
              for (int c = 0; c < run.length; ++c) out[c] = static_cast<float>(src[c * run.step]);
            }
          }
        }
      }
    }
  });
}

// MR adjacent floats (one k of a packed A panel read from A transposed).
inline void copy_mr(const float* src, float* dst) {
#if (defined(__AVX512F__) || defined(__AVX2__)) && !defined(__CUDACC__)
  if constexpr (MR == 6) {  // 4 + 2 floats: GCC otherwise emits a memmove call or inserts
    _mm_storeu_ps(dst, _mm_loadu_ps(src));
    _mm_storel_pi(reinterpret_cast<__m64*>(dst + 4),
                  _mm_loadl_pi(_mm_setzero_ps(), reinterpret_cast<const __m64*>(src + 4)));
    return;
  }
#endif
  for (int r = 0; r < MR; ++r) dst[r] = src[r];
}

// Decides per leaf how many of its k's the FMA chain runs over and how fp32 A is read there
// (other dtypes are always packed).  A chain stops after its last k below K where A's column
// or B's row is real: the k's past it are padding on both sides, whose products are +0 and
// leave the chain's sum as it is (a chain starting from +0 is never -0: x + +0 = x, and an
// exact zero sum is +0 unless both terms are -0), so skipping them keeps every bit while
// sparing the FMAs and the packing of per-sample row padding (4x the work at 8 rows a
// sample) and of a short K (K = 4: 8x).
LeafPlan plan_leaves(const int64_t* acol, const int64_t* brow, int64_t K, int64_t nleaves,
                     bool direct) {
  LeafPlan plan;
  plan.length.assign(static_cast<size_t>(nleaves), static_cast<int32_t>(kLeaf));
  plan.kind.assign(static_cast<size_t>(nleaves), kPacked);
  plan.offset.assign(static_cast<size_t>(nleaves), 0);
  plan.stride.assign(static_cast<size_t>(nleaves), 0);
  plan.start.assign(static_cast<size_t>(nleaves), 0);
  for (int64_t leaf = 0; leaf < nleaves; ++leaf) {
    const int64_t k0 = leaf * kLeaf;
    int64_t last = std::min<int64_t>(K, k0 + kLeaf);
    while (last > k0 && acol[last - 1] < 0 && brow[last - 1] < 0) --last;
    const int64_t n = last - k0;
    plan.length[leaf] = static_cast<int32_t>(n);
    // A's columns of the chain's k's: all real (read in place, or packed from an even
    // spacing), or not (packed through the tables)
    bool whole = direct && n > 0;
    for (int64_t k = k0; whole && k < last; ++k) whole = acol[k] >= 0;
    const int64_t s = whole && n > 1 ? acol[k0 + 1] - acol[k0] : 1;
    bool strided = whole;
    for (int64_t i = 1; strided && i < n; ++i) strided = acol[k0 + i] == acol[k0] + i * s;
    plan.stride[leaf] = strided ? s : 0;
    plan.start[leaf] = strided ? acol[k0] : 0;
    // Wide strides are packed: a leaf's 32 rows at a power-of-two distance share a few L1
    // sets and would be evicted between B panels.
    if (!whole || (strided && s != 1)) {
      plan.offset[leaf] = plan.packed++;
      continue;
    }
    plan.kind[leaf] = strided ? kUnit : kTable;
    plan.offset[leaf] = strided ? acol[k0] : 0;
  }
  return plan;
}

// Rows of A per cache block: a block of A (rows x K floats) stays in L2 while
// every packed B panel sweeps over it (the B panel itself stays in L1).
constexpr int64_t kBlockBytes = 160 * 1024;
// Packed B per chunk (see gemm_pass).
constexpr int64_t kChunkBytes = 1024 * 1024;

// One pass over all leaves of K (no tree-top split).
template <typename T, typename O>
void gemm_pass(const Gather<T>& a, const Gather<T>& b, const Scatter<O>& c, int64_t M, int64_t K,
               int64_t N, const int32_t* sched, int64_t depth) {
  const int64_t nleaves = (K + kLeaf - 1) / kLeaf;
  const int64_t Kp = nleaves * kLeaf;
  const int64_t mp = (M + MR - 1) / MR, np = (N + NR - 1) / NR;
  constexpr bool kDirect = std::is_same<T, float>::value;
  const LeafPlan plan = plan_leaves(a.col, b.row, K, nleaves, kDirect);
  // Packed leaves of A, [A panel][packed leaf][k][MR]; every entry the chains read is written
  // below, so the buffer is reused between calls (fresh pages cost as much as the packing).
  thread_local std::vector<float> pa_buf;
  const size_t pa_size = static_cast<size_t>(mp * plan.packed * kLeaf * MR);
  if (pa_buf.size() < pa_size) pa_buf.resize(pa_size);
  float* const pa = pa_buf.data();
  if (plan.packed > 0) {
    at::parallel_for(0, mp, 16, [&](int64_t lo, int64_t hi) {
      // Panels whose MR rows are adjacent floats (A transposed: dW's activations).
      std::vector<uint8_t> adjacent(static_cast<size_t>(hi - lo));
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t m0 = p * MR;
        bool adj = m0 + MR <= M;
        for (int r = 1; adj && r < MR; ++r) adj = a.row[m0 + r] == a.row[m0] + r;
        adjacent[p - lo] = adj;
      }
      // Leaf-major: an evenly spaced leaf's 32 source rows stay in L1 while every panel of
      // the range copies its MR columns from them, k by k, so they are read front to back.
      for (int64_t leaf = 0; leaf < nleaves; ++leaf) {
        if (plan.kind[leaf] != kPacked) continue;
        float* const dleaf = pa + plan.offset[leaf] * kLeaf * MR;
        const int64_t panel_stride = plan.packed * kLeaf * MR;
        if (plan.stride[leaf] != 0) {  // an evenly spaced leaf of fp32 A, no padding
          const float* const base = reinterpret_cast<const float*>(a.base) + plan.start[leaf];
          const int64_t s = plan.stride[leaf];
          const int64_t length = plan.length[leaf];
          for (int64_t k = 0; k < length; ++k)
            for (int64_t p = lo; p < hi; ++p)
              if (adjacent[p - lo]) copy_mr(base + a.row[p * MR] + k * s, dleaf + p * panel_stride + k * MR);
          for (int64_t p = lo; p < hi; ++p) {
            if (adjacent[p - lo]) continue;
            float* d = dleaf + p * panel_stride;
            const float* src[MR];
            for (int r = 0; r < MR; ++r) src[r] = base + a.row[std::min<int64_t>(p * MR + r, M - 1)];
            for (int64_t k = 0; k < length; ++k)
              for (int r = 0; r < MR; ++r) d[k * MR + r] = src[r][k * s];
          }
          continue;
        }
        const int64_t length = plan.length[leaf];  // the k's its FMA chains read
        for (int64_t p = lo; p < hi; ++p) {
          float* d = dleaf + p * panel_stride;
          for (int64_t k = 0; k < length; ++k)
            for (int r = 0; r < MR; ++r) {
              const int64_t m = p * MR + r, kk = leaf * kLeaf + k;
              d[k * MR + r] = (m < M && kk < K) ? at(a, m, kk) : 0.0f;
            }
        }
      }
    });
  }
  std::vector<float> bias(static_cast<size_t>(c.bias != nullptr ? np * NR : 0), 0.0f);
  if (c.bias != nullptr) std::copy(c.bias, c.bias + N, bias.begin());  // padded to whole panels
  // Output panels whose columns are consecutive take vector stores.
  std::vector<uint8_t> unit_out(static_cast<size_t>(np), 0);
  for (int64_t p = 0; p < np; ++p) {
    bool unit = p * NR + NR <= N;
    for (int j = 1; unit && j < NR; ++j) unit = c.col[p * NR + j] == c.col[p * NR] + j;
    unit_out[p] = unit;
  }

  const int64_t block = std::max<int64_t>(1, kBlockBytes / (MR * Kp * 4));  // A panels per block
  // B is packed a chunk of panels at a time, sized to stay in L2 while every A
  // block passes under it; tiles of a chunk walk blocks of `block` A panels,
  // and inside a block, B panel by B panel.
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / (Kp * NR * 4));
  thread_local std::vector<float> scratch;  // reused: fresh pages cost as much as packing
  if (scratch.size() < static_cast<size_t>(std::min(chunk, np) * Kp * NR))
    scratch.resize(static_cast<size_t>(std::min(chunk, np) * Kp * NR));
  const float* pb = scratch.data();
  for (int64_t p0 = 0; p0 < np; p0 += chunk) {
    const int64_t p1 = std::min(np, p0 + chunk), cp = p1 - p0;
    pack_b(b, K, N, Kp, p0, p1, scratch.data());
    at::parallel_for(0, mp * cp, 4, [&](int64_t lo, int64_t hi) {
      std::vector<float> stack(static_cast<size_t>(std::max<int64_t>(depth, 1) * MR * NR));
      alignas(64) float tile[MR * NR];
      const float* rows[MR];
      float* out[MR];
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t blk = t / (block * cp), local = t - blk * block * cp;
        const int64_t size = std::min<int64_t>(block, mp - blk * block);
        const int64_t jp = p0 + local / size, ip = blk * block + local % size;
        const int64_t m0 = ip * MR, n0 = jp * NR;
        const int64_t nrows = std::min<int64_t>(MR, M - m0), ncols = std::min<int64_t>(NR, N - n0);
        if (kDirect) {  // rows past M repeat the last row; they are never stored
          for (int r = 0; r < MR; ++r)
            rows[r] = reinterpret_cast<const float*>(a.base) + a.row[std::min<int64_t>(m0 + r, M - 1)];
        }
        // Full tiles of fp32 output with consecutive columns are stored in place.
        const bool in_place = std::is_same<O, float>::value && unit_out[jp] && nrows == MR;
        for (int r = 0; r < MR; ++r)
          out[r] = in_place ? reinterpret_cast<float*>(c.base) + c.row[m0 + r] + c.col[n0]
                            : tile + r * NR;
        micro_tile(rows, a.col, plan, pa + ip * plan.packed * kLeaf * MR,
                   pb + (jp - p0) * Kp * NR, nleaves, sched, stack.data(),
                   c.bias != nullptr ? bias.data() + n0 : nullptr, out);
        if (in_place) continue;
        if (nrows == MR && c.row[m0 + MR - 1] == c.row[m0] + MR - 1 && rows_adjacent(c.row + m0)) {
          // the tile's rows are adjacent in the output (a transposed product's channels):
          // column by column, MR adjacent stores each
          O* const o = c.base + c.row[m0];
          for (int64_t j = 0; j < ncols; ++j) {
            O* d = o + c.col[n0 + j];
            for (int r = 0; r < MR; ++r) d[r] = static_cast<O>(tile[r * NR + j]);
          }
          continue;
        }
        for (int64_t r = 0; r < nrows; ++r) {
          O* orow = c.base + c.row[m0 + r];
          for (int64_t j = 0; j < ncols; ++j) orow[c.col[n0 + j]] = static_cast<O>(tile[r * NR + j]);
        }
      }
    });
  }
}

// Longest K (in leaves) one pass takes, so its B panel stays in L1/L2 (AVX-512:
// 16 leaves, 512 x 64 floats, best of 4..64 on the model's dW shapes; AVX2: 8
// leaves, 256 x 16 floats = 16 KiB, which leaves room in a 32 KiB L1 for the A
// panel: 5-13% faster dW than 16 on an EPYC at the projection shapes).  Longer K
// (dW over a batch's rows) runs T(n)'s top levels as separate passes: the left
// ceil(n/2) leaves and the right floor(n/2) are exactly the subtrees T(ceil(n/2))
// and T(floor(n/2)), summed into fp32 buffers and added once.  When the output is
// large, each split costs a pass over it, so passes grow to 32 leaves.
constexpr int64_t kBlockLeaves = NR >= 64 ? 16 : 8, kBlockLeavesLargeOutput = 32;
constexpr int64_t kLargeOutputBytes = 1 << 20;

// The subtree over leaves [leaf0, leaf0 + n) into dst (M x N, row-major fp32;
// rowmajor: the tables that address it).
// Split-pass buffers, one per recursion level (level 0: the full result), reused between
// calls: every entry is overwritten by its pass, and fresh pages cost a page fault each.
inline float* pass_buffer(int level, size_t size) {
  thread_local std::vector<std::vector<float>> pool(64);
  std::vector<float>& buf = pool[static_cast<size_t>(level)];
  if (buf.size() < size) buf.resize(size);
  return buf.data();
}

template <typename T>
void subtree(const Gather<T>& a, const Gather<T>& b, float* dst, const Scatter<float>& rowmajor,
             int64_t M, int64_t K, int64_t N, int64_t leaf0, int64_t n, int64_t block_leaves,
             int level) {
  const int64_t k0 = leaf0 * kLeaf;
  if (n <= block_leaves) {
    const Gather<T> ap{a.base, a.row, a.col + k0}, bp{b.base, b.row + k0, b.col};
    int64_t depth = 0;
    const std::vector<int32_t> sched = tree_schedule(n, &depth);
    gemm_pass<T, float>(ap, bp, Scatter<float>{dst, rowmajor.row, rowmajor.col}, M,
                        std::min<int64_t>(n * kLeaf, K - k0), N, sched.data(), depth);
    return;
  }
  const int64_t left = (n + 1) / 2;
  subtree(a, b, dst, rowmajor, M, K, N, leaf0, left, block_leaves, level + 1);
  float* const right = pass_buffer(level + 1, static_cast<size_t>(M * N));
  subtree(a, b, right, rowmajor, M, K, N, leaf0 + left, n - left, block_leaves, level + 1);
  at::parallel_for(0, M * N, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dst[i] += right[i];
  });
}

}  // namespace

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

template <typename T, typename O>
void gemm(const Gather<T>& a, const Gather<T>& b, const Scatter<O>& c, int64_t M, int64_t K,
          int64_t N, const int32_t* sched, int64_t depth) {
  const int64_t nleaves = (K + kLeaf - 1) / kLeaf;
  const int64_t block_leaves = M * N * 4 > kLargeOutputBytes ? kBlockLeavesLargeOutput : kBlockLeaves;
  if (nleaves <= block_leaves) return gemm_pass<T, O>(a, b, c, M, K, N, sched, depth);
  // Split passes add into a row-major fp32 buffer; the result is stored (and
  // rounded to O) once at the end.
  std::vector<int64_t> trow(static_cast<size_t>(M)), tcol(static_cast<size_t>(N));
  for (int64_t i = 0; i < M; ++i) trow[i] = i * N;
  for (int64_t j = 0; j < N; ++j) tcol[j] = j;
  float* const full = pass_buffer(0, static_cast<size_t>(M * N));
  subtree(a, b, full, Scatter<float>{nullptr, trow.data(), tcol.data()}, M, K, N, 0, nleaves,
          block_leaves, 0);
  bool unit = true;
  for (int64_t j = 1; unit && j < N; ++j) unit = c.col[j] == c.col[0] + j;
  at::parallel_for(0, M, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float* src = full + i * N;
      if (c.bias != nullptr)
        for (int64_t j = 0; j < N; ++j) src[j] += c.bias[j];
      O* orow = c.base + c.row[i];
      if (unit) {
        O* o = orow + c.col[0];
        for (int64_t j = 0; j < N; ++j) o[j] = static_cast<O>(src[j]);
      } else {
        for (int64_t j = 0; j < N; ++j) orow[c.col[j]] = static_cast<O>(src[j]);
      }
    }
  });
}

#define CREDIT_GEMM_INSTANTIATE(T, O)                                                           \
  template void gemm<T, O>(const Gather<T>&, const Gather<T>&, const Scatter<O>&, int64_t, \
                           int64_t, int64_t, const int32_t*, int64_t);
#define CREDIT_GEMM_INSTANTIATE_OUT(T) \
  CREDIT_GEMM_INSTANTIATE(T, float)    \
  CREDIT_GEMM_INSTANTIATE(T, at::BFloat16) CREDIT_GEMM_INSTANTIATE(T, at::Half)
CREDIT_GEMM_INSTANTIATE_OUT(float)
CREDIT_GEMM_INSTANTIATE_OUT(at::BFloat16)
CREDIT_GEMM_INSTANTIATE_OUT(at::Half)

}  // namespace credit_gemm
