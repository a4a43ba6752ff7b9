// The row tree's sums over fp32 rows (cpu_row_sums.cpp): what a bias or an affine weight's
// gradient reduces, with the bits of the one-row GEMM over the padded rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

// (rows per group, leaves per group) of M rows in `groups` equal groups each padded to whole
// leaves, checked against the merge schedule's leaf count (`op` names the caller in errors).
std::pair<int64_t, int64_t> grouped_leaves(int64_t M, int64_t groups, const at::Tensor& merges,
                                           const char* op);
// The tree over n scalar leaf sums by the merge schedule (`stack`: depth floats).
float leaf_tree(const float* leaves, int64_t n, const int32_t* sched, float* stack);

void det_colsum(const at::Tensor& g, const c10::optional<at::Tensor>& x, int64_t groups,
                const at::Tensor& merges, int64_t depth, at::Tensor& out);
void det_channel_sums(const at::Tensor& g, const c10::optional<at::Tensor>& x,
                      const at::Tensor& merges, int64_t depth, at::Tensor& out);
void det_affine_grads(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w, int64_t groups,
                      const at::Tensor& merges, int64_t depth, at::Tensor& gx, at::Tensor& gw,
                      at::Tensor& gb);
void det_affine(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor& y);
