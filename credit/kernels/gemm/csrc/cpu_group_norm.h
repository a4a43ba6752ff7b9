// Group norm of fp32 NCHW tensors with its per-channel affine (cpu_group_norm.cpp).
#pragma once

#include <ATen/core/Tensor.h>

void det_group_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, int64_t groups,
                    double eps, at::Tensor& y, at::Tensor& mean, at::Tensor& rstd);
void det_group_norm_grads(const at::Tensor& g, const at::Tensor& x, const at::Tensor& mean,
                          const at::Tensor& rstd, const at::Tensor& w, int64_t groups,
                          const at::Tensor& merges, int64_t depth, at::Tensor& gx, at::Tensor& gw,
                          at::Tensor& gb);
