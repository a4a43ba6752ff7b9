// Python binding for cuda_gemm.cu.  Deliberately free of CUDA headers so it
// can be syntax-checked on machines without the CUDA toolkit's torch build.
// pybind11 with torch's tensor casters, not the whole C++ frontend of torch/extension.h
#include <torch/csrc/utils/pybind.h>

#include <cstdint>

const char* credit_det_mm_cuda_launch(int in_code, int out_code, const void* a, const void* b,
                                      void* c, const int32_t* merges, int64_t M, int64_t N,
                                      int64_t K, int64_t n_leaves, int64_t sam, int64_t sak,
                                      int64_t sbk, int64_t sbn, int64_t stream);

namespace {

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kBFloat16: return 1;
    case at::kHalf: return 2;
    default: TORCH_CHECK(false, "det_mm cuda: unsupported dtype ", t);
  }
}

// Fills `out` (M x N, contiguous) with A @ B on the given CUDA stream.  The
// caller has validated shapes/devices and made a's device current.
void det_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& merges, at::Tensor& out,
            int64_t stream) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && merges.is_cuda() && out.is_cuda(),
              "det_mm cuda: all tensors must be CUDA tensors");
  TORCH_CHECK(a.device() == b.device() && a.device() == out.device() &&
                  a.device() == merges.device(),
              "det_mm cuda: tensors on different devices");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
              "det_mm cuda: bad shapes ", a.sizes(), " @ ", b.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "det_mm cuda: dtype mismatch");
  TORCH_CHECK(out.is_contiguous() && out.size(0) == a.size(0) && out.size(1) == b.size(1),
              "det_mm cuda: bad output tensor");
  const int64_t n_leaves = (a.size(1) + 31) / 32;
  TORCH_CHECK(merges.scalar_type() == at::kInt && merges.is_contiguous() &&
                  merges.numel() == n_leaves && n_leaves > 0,
              "det_mm cuda: merge schedule does not match K");
  const char* err = credit_det_mm_cuda_launch(
      dtype_code(a.scalar_type()), dtype_code(out.scalar_type()), a.data_ptr(), b.data_ptr(),
      out.data_ptr(), merges.data_ptr<int32_t>(), a.size(0), b.size(1), a.size(1), n_leaves,
      a.stride(0), a.stride(1), b.stride(0), b.stride(1), stream);
  TORCH_CHECK(err == nullptr, "det_mm cuda: kernel launch failed: ", err ? err : "");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("det_mm", &det_mm, "deterministic fp32-accumulating GEMM on CUDA (fills out)");
}
