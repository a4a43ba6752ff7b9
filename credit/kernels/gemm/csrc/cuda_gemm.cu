// Deterministic, batch-invariant GEMM for NVIDIA GPUs (sm80+): C = A @ B.
//
// Torch-free on purpose: it compiles with plain nvcc; cuda_binding.cpp wraps it.
// Per output element the arithmetic is the documented contract, exactly as the
// cpu backend does it: for each 32-element K leaf a sequential chain of
// single-rounding FMAs from +0 (k ascending), leaves combined by the fixed
// tree (merge schedule from _tree.py).  One thread block owns a BM x BN tile
// for all of K (no split-K); each thread keeps a TM x TN register tile and its
// tree stack in (cached) local memory.  Tile sizes are compile-time constants.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace credit_det_gemm {

constexpr int kLeaf = 32;  // must match LEAF in _tree.py
constexpr int BM = 64, BN = 64, TM = 4, TN = 4;
constexpr int TX = BN / TN, TY = BM / TM, THREADS = TX * TY;  // 16 x 16
constexpr int kMaxDepth = 40;  // > log2(max leaves) + 1 for any int64 K in memory

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void put(float* p, float v) { *p = v; }
__device__ __forceinline__ void put(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void put(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T, typename O>
__global__ void __launch_bounds__(THREADS)
det_mm_kernel(const T* __restrict__ a, const T* __restrict__ b, O* __restrict__ c,
              const int32_t* __restrict__ merges, int64_t M, int64_t N, int64_t K,
              int64_t n_leaves, int64_t sam, int64_t sak, int64_t sbk, int64_t sbn) {
  __shared__ float As[kLeaf][BM + 1];  // +1: fewer bank conflicts on the transposed store
  __shared__ float Bs[kLeaf][BN];
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;

  float acc[TM][TN];
  float stk[kMaxDepth][TM][TN];
  int top = 0;
  for (int64_t leaf = 0; leaf < n_leaves; ++leaf) {
    const int64_t k0 = leaf * kLeaf;
    for (int e = threadIdx.x; e < BM * kLeaf; e += THREADS) {
      const int mm = e / kLeaf, kk = e % kLeaf;
      const int64_t gm = m0 + mm, gk = k0 + kk;
      As[kk][mm] = (gm < M && gk < K) ? to_f(a[gm * sam + gk * sak]) : 0.0f;
    }
    for (int e = threadIdx.x; e < kLeaf * BN; e += THREADS) {
      const int kk = e / BN, nn = e % BN;
      const int64_t gk = k0 + kk, gn = n0 + nn;
      Bs[kk][nn] = (gk < K && gn < N) ? to_f(b[gk * sbk + gn * sbn]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
#pragma unroll 8
    for (int k = 0; k < kLeaf; ++k) {
      float av[TM], bv[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = As[k][ty + TY * i];
#pragma unroll
      for (int j = 0; j < TN; ++j) bv[j] = Bs[k][tx + TX * j];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();  // the next leaf overwrites As/Bs
    for (int m = merges[leaf]; m > 0; --m) {
      --top;
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = __fadd_rn(stk[top][i][j], acc[i][j]);
    }
    if (leaf + 1 < n_leaves) {
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) stk[top][i][j] = acc[i][j];
      ++top;
    }
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t gm = m0 + ty + TY * i;
    if (gm >= M) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int64_t gn = n0 + tx + TX * j;
      if (gn < N) put(c + gm * N + gn, acc[i][j]);
    }
  }
}

template <typename T, typename O>
const char* launch_typed(const void* a, const void* b, void* c, const int32_t* merges,
                         int64_t M, int64_t N, int64_t K, int64_t n_leaves, int64_t sam,
                         int64_t sak, int64_t sbk, int64_t sbn, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((M + BM - 1) / BM), static_cast<unsigned>((N + BN - 1) / BN));
  det_mm_kernel<T, O><<<grid, THREADS, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<O*>(c), merges, M, N, K,
      n_leaves, sam, sak, sbk, sbn);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <typename T>
const char* launch_out(int out_code, const void* a, const void* b, void* c,
                       const int32_t* merges, int64_t M, int64_t N, int64_t K, int64_t n_leaves,
                       int64_t sam, int64_t sak, int64_t sbk, int64_t sbn, cudaStream_t s) {
  switch (out_code) {
    case 0: return launch_typed<T, float>(a, b, c, merges, M, N, K, n_leaves, sam, sak, sbk, sbn, s);
    case 1: return launch_typed<T, __nv_bfloat16>(a, b, c, merges, M, N, K, n_leaves, sam, sak, sbk, sbn, s);
    case 2: return launch_typed<T, __half>(a, b, c, merges, M, N, K, n_leaves, sam, sak, sbk, sbn, s);
    default: return "det_mm cuda: unsupported output dtype code";
  }
}

}  // namespace credit_det_gemm

// dtype codes: 0 = float32, 1 = bfloat16, 2 = float16.  Returns nullptr on
// success, else a static error string.  `c` is contiguous M x N.
const char* credit_det_mm_cuda_launch(int in_code, int out_code, const void* a, const void* b,
                                      void* c, const int32_t* merges, int64_t M, int64_t N,
                                      int64_t K, int64_t n_leaves, int64_t sam, int64_t sak,
                                      int64_t sbk, int64_t sbn, int64_t stream) {
  using namespace credit_det_gemm;
  if ((M + BM - 1) / BM > 2147483647LL || (N + BN - 1) / BN > 65535LL)
    return "det_mm cuda: matrix too large for the launch grid";
  if (n_leaves >= (1LL << (kMaxDepth - 1))) return "det_mm cuda: K too large for the tree stack";
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  switch (in_code) {
    case 0: return launch_out<float>(out_code, a, b, c, merges, M, N, K, n_leaves, sam, sak, sbk, sbn, s);
    case 1: return launch_out<__nv_bfloat16>(out_code, a, b, c, merges, M, N, K, n_leaves, sam, sak, sbk, sbn, s);
    case 2: return launch_out<__half>(out_code, a, b, c, merges, M, N, K, n_leaves, sam, sak, sbk, sbn, s);
    default: return "det_mm cuda: unsupported input dtype code";
  }
}
