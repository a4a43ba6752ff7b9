// Layer norm over the last dimension of fp32 rows in a fixed order per row (cpu_layer_norm.cpp).
#pragma once

#include <ATen/core/Tensor.h>

void det_layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                    at::Tensor& y, at::Tensor& normed, at::Tensor& rstd);
void det_layer_norm_input_grad(at::Tensor& g_normed, const at::Tensor& normed,
                               const at::Tensor& rstd);
void det_layer_norm_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                         at::Tensor& y, at::Tensor& mean, at::Tensor& rstd);
void det_layer_norm_rows_grads(const at::Tensor& g, const at::Tensor& x, const at::Tensor& mean,
                               const at::Tensor& rstd, const at::Tensor& w, int64_t groups,
                               const at::Tensor& merges, int64_t depth, at::Tensor& gx,
                               at::Tensor& gw, at::Tensor& gb);
