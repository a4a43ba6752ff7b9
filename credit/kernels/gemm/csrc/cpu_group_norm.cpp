// Group norm of fp32 NCHW tensors (B, C, P = H*W, contiguous) with its per-channel affine, in
// one pass each way. Hand-written for the same reason as the layer norm's kernels
// (cpu_layer_norm.cpp): deterministic mode otherwise runs torch's normalisation, then the
// affine, then the affine's gradients, as separate passes and autograd nodes.
//
// A sample's group is one contiguous run of C / G planes of P values; its sums run in the
// lane order of cpu_lanes.h, plane by plane, so the statistics, the output and the input gradient of a sample
// depend on its own values alone. The affine gradients of a channel are each sample's sum over
// its positions (lane order) of g * h and of g, h the normed values recomputed from x, mean
// and rstd, then the tree over the samples: a sample's part depends on it alone, and a batch
// split into power-of-two parts whose gradients are added by the same tree gives the same bits.
#include "cpu_group_norm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_lanes.h"
#include "cpu_row_sums.h"

using namespace credit_lanes;

namespace {

struct Shape {
  int64_t B, C, P, G, per_group;  // per_group: channels of a group
};

Shape check(const at::Tensor& x, const at::Tensor& w, int64_t groups, const char* what) {
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "det_group_norm cpu: ", what, " must be a contiguous fp32 CPU tensor (B, C, P)");
  const int64_t C = x.size(1);
  TORCH_CHECK(groups >= 1 && C % groups == 0, "det_group_norm cpu: ", groups, " groups do not divide ",
              C, " channels");
  TORCH_CHECK(w.dim() == 1 && w.is_contiguous() && w.scalar_type() == at::kFloat && w.size(0) == C,
              "det_group_norm cpu: the weight must be a contiguous fp32 vector of ", C, " values");
  return {x.size(0), C, x.size(2), groups, C / groups};
}

void check_like(const at::Tensor& t, const at::Tensor& like, const char* what) {
  TORCH_CHECK(t.is_contiguous() && t.scalar_type() == at::kFloat && t.sizes() == like.sizes(),
              "det_group_norm cpu: ", what, " must be a contiguous fp32 tensor of shape ", like.sizes());
}

// One channel plane of the backward: h = (x - mean) * rstd and gn = g * w into h, gn; the lane
// sums of g * h and of g (this plane's, from +0) into pw, pb, and of gn and gn * h into pg,
// pgh, which run on over the group's planes in order. Restrict pointers and whole 16-lane
// blocks so that it vectorises; the tail takes the same steps lane by lane.
inline void plane_backward(const float* __restrict__ g, const float* __restrict__ x, float w, float mean,
                           float r, int64_t P, float* __restrict__ h, float* __restrict__ gn,
                           float* __restrict__ pw, float* __restrict__ pb, float* __restrict__ pg,
                           float* __restrict__ pgh) {
  int64_t j = 0;
  for (; j + kLanes <= P; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float gv = g[j + l], d = x[j + l] - mean, hv = d * r;
      const float t = gv * hv, gw = gv * w, u = gw * hv;
      h[j + l] = hv;
      gn[j + l] = gw;
      pw[l] = pw[l] + t;
      pb[l] = pb[l] + gv;
      pg[l] = pg[l] + gw;
      pgh[l] = pgh[l] + u;
    }
  for (int l = 0; j + l < P; ++l) {
    const float gv = g[j + l], d = x[j + l] - mean, hv = d * r;
    const float t = gv * hv, gw = gv * w, u = gw * hv;
    h[j + l] = hv;
    gn[j + l] = gw;
    pw[l] = pw[l] + t;
    pb[l] = pb[l] + gv;
    pg[l] = pg[l] + gw;
    pgh[l] = pgh[l] + u;
  }
}

}  // namespace

// Per sample and group: mean and var (lane order, plane by plane), rstd = 1 / sqrt(var +
// eps), y = ((x - mean) * rstd) * w[c] + b[c], each operation rounded.
void det_group_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, int64_t groups,
                    double eps, at::Tensor& y, at::Tensor& mean, at::Tensor& rstd) {
  const Shape s = check(x, w, groups, "x");
  check_like(b, w, "the bias");
  check_like(y, x, "y");
  TORCH_CHECK(mean.numel() == s.B * s.G && rstd.numel() == s.B * s.G && mean.is_contiguous() &&
                  rstd.is_contiguous(),
              "det_group_norm cpu: mean and rstd must hold one value per sample and group");
  const int64_t run = s.per_group * s.P;
  TORCH_CHECK(run > 0, "det_group_norm cpu: a group must have at least one value");
  const float *xd = x.data_ptr<float>(), *wd = w.data_ptr<float>(), *bd = b.data_ptr<float>();
  float *yd = y.data_ptr<float>(), *md = mean.data_ptr<float>(), *rd = rstd.data_ptr<float>();
  const float n = static_cast<float>(run), e = static_cast<float>(eps);
  at::parallel_for(0, s.B * s.G, std::max<int64_t>(1, 16384 / run), [&](int64_t lo, int64_t hi) {
    std::vector<float> d(static_cast<size_t>(run));
    for (int64_t item = lo; item < hi; ++item) {  // item = sample * G + group
      const float* p = xd + item * run;
      alignas(64) float part[kLanes] = {}, squares[kLanes] = {};
      for (int64_t c = 0; c < s.per_group; ++c) add_lanes(p + c * s.P, s.P, part);
      const float mu = lane_tree(part) / n;
      for (int64_t c = 0; c < s.per_group; ++c)
        add_centred_squares(p + c * s.P, mu, s.P, d.data() + c * s.P, squares);
      const float r = 1.0f / std::sqrt(lane_tree(squares) / n + e);
      const int64_t c0 = (item % s.G) * s.per_group;
      for (int64_t c = 0; c < s.per_group; ++c) {
        const float scale = wd[c0 + c], shift = bd[c0 + c];
        const float* dc = d.data() + c * s.P;
        float* o = yd + item * run + c * s.P;
        for (int64_t j = 0; j < s.P; ++j) {
          const float h = dc[j] * r, t = h * scale;
          o[j] = t + shift;
        }
      }
      md[item] = mu;
      rd[item] = r;
    }
  });
}

// The backward: per sample and group, h = (x - mean) * rstd, gn = g * w[c], and
// dx = rstd * ((gn - sum(gn) / n) - h * (sum(gn * h) / n)), those sums plane by plane as the
// forward's; the
// weight and bias gradients per channel: each sample's sum over its P positions of g * h and
// of g (lane order), then the tree over the samples (`merges`, one leaf a sample).
void det_group_norm_grads(const at::Tensor& g, const at::Tensor& x, const at::Tensor& mean,
                          const at::Tensor& rstd, const at::Tensor& w, int64_t groups,
                          const at::Tensor& merges, int64_t depth, at::Tensor& gx, at::Tensor& gw,
                          at::Tensor& gb) {
  const Shape s = check(x, w, groups, "x");
  check_like(g, x, "g");
  check_like(gx, x, "gx");
  check_like(gw, w, "gw");
  check_like(gb, w, "gb");
  TORCH_CHECK(mean.numel() == s.B * s.G && rstd.numel() == s.B * s.G,
              "det_group_norm cpu: mean and rstd must hold one value per sample and group");
  const int64_t run = s.per_group * s.P;
  TORCH_CHECK(merges.scalar_type() == at::kInt && merges.is_contiguous() && merges.numel() == s.B,
              "det_group_norm cpu: the merge schedule must have one leaf per sample");
  const float *gd = g.data_ptr<float>(), *xd = x.data_ptr<float>(), *wd = w.data_ptr<float>();
  const float *md = mean.data_ptr<float>(), *rd = rstd.data_ptr<float>();
  float *gxd = gx.data_ptr<float>(), *gwd = gw.data_ptr<float>(), *gbd = gb.data_ptr<float>();
  const float n = static_cast<float>(run);
  // per channel, one sum per sample (of g * h, of g), merged over the samples below
  std::vector<float> slots_w(static_cast<size_t>(s.C * s.B)), slots_b(slots_w.size());
  at::parallel_for(0, s.B * s.G, std::max<int64_t>(1, 16384 / run), [&](int64_t lo, int64_t hi) {
    std::vector<float> h(static_cast<size_t>(run)), gn(static_cast<size_t>(run));
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t sample = item / s.G, c0 = (item % s.G) * s.per_group;
      const float *p = gd + item * run, *q = xd + item * run;
      const float mu = md[item], r = rd[item];
      alignas(64) float pg[kLanes] = {}, pgh[kLanes] = {};
      for (int64_t c = 0; c < s.per_group; ++c) {
        alignas(64) float pw[kLanes] = {}, pb[kLanes] = {};
        const int64_t off = c * s.P;
        plane_backward(p + off, q + off, wd[c0 + c], mu, r, s.P, h.data() + off, gn.data() + off, pw, pb, pg, pgh);
        slots_w[(c0 + c) * s.B + sample] = lane_tree(pw);
        slots_b[(c0 + c) * s.B + sample] = lane_tree(pb);
      }
      const float mean_g = lane_tree(pg) / n, mean_gh = lane_tree(pgh) / n;
      normed_input_grad(h.data(), gn.data(), r, mean_g, mean_gh, run, gxd + item * run);
    }
  });
  at::parallel_for(0, s.C, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> stack(static_cast<size_t>(std::max<int64_t>(depth, 1)));
    for (int64_t c = lo; c < hi; ++c) {
      gwd[c] = leaf_tree(slots_w.data() + c * s.B, s.B, merges.data_ptr<int32_t>(), stack.data());
      gbd[c] = leaf_tree(slots_b.data() + c * s.B, s.B, merges.data_ptr<int32_t>(), stack.data());
    }
  });
}
