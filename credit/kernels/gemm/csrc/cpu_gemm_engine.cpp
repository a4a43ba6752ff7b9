// The GEMM engine declared in cpu_gemm_kernel.h: the leaf plan and the tree schedule here,
// the tile-shaped kernel in cpu_gemm_tile.inc, compiled for two tile shapes.
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

template <typename T>
inline float at(const Gather<T>& g, int64_t i, int64_t j) {
  const int64_t r = g.row[i], c = g.col[j];
  return (r < 0 || c < 0) ? 0.0f : static_cast<float>(g.base[r + c]);
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


// Split-pass buffers, one per recursion level (level 0: the full result), reused between
// calls: every entry is overwritten by its pass, and fresh pages cost a page fault each.
inline float* pass_buffer(int level, size_t size) {
  thread_local std::vector<std::vector<float>> pool(64);
  std::vector<float>& buf = pool[static_cast<size_t>(level)];
  if (buf.size() < size) buf.resize(size);
  return buf.data();
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


// The tile-shaped engines: the default (wide) tile, and a narrow one of half its columns and
// twice its rows (the same number of accumulators) for outputs whose last panel the wide
// tile would leave at least half empty (N = 32 on AVX-512: the 32-channel stages).
namespace wide {
constexpr int MR = credit_gemm::MR, NV = credit_gemm::NV;
#include "cpu_gemm_tile.inc"
}  // namespace wide
namespace narrow {
constexpr int MR = kNarrowMR, NV = kNarrowNV;
#include "cpu_gemm_tile.inc"
}  // namespace narrow

template <typename T, typename O>
void gemm(const Gather<T>& a, const Gather<T>& b, const Scatter<O>& c, int64_t M, int64_t K,
          int64_t N, const int32_t* sched, int64_t depth) {
  if (narrow_fills_better(N)) return narrow::run<T, O>(a, b, c, M, K, N, sched, depth);
  wide::run<T, O>(a, b, c, M, K, N, sched, depth);
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
