// A fixed summation order over fp32 values, the same on any SIMD width: kLanes chains, chain
// l adding values l, l + kLanes, ... of a row from +0 in order (a run of several rows: each
// row's values in turn, the chains continuing), then a halving tree over the chains (l + h
// into l for h = 8, 4, 2, 1). The chains are one 16-wide vector,
// two 8-wide or sixteen scalars; the loops are plain so the compiler vectorises them without
// reordering (-ffp-contract=off, no -ffast-math). Used by the layer and group norms, with the
// input-gradient step they share.
#pragma once

#include <cstdint>

namespace credit_lanes {

constexpr int kLanes = 16;

inline float lane_tree(float* part) {
  for (int h = kLanes / 2; h >= 1; h /= 2)
    for (int l = 0; l < h; ++l) part[l] = part[l] + part[l + h];
  return part[0];
}

// v[0..D) added to the chains `part` (value j to chain j % kLanes, in order): a run of
// several pieces (a group's channel planes) continues the same chains piece by piece
inline void add_lanes(const float* __restrict__ v, int64_t D, float* __restrict__ part) {
  int64_t j = 0;
  for (; j + kLanes <= D; j += kLanes)
    for (int l = 0; l < kLanes; ++l) part[l] = part[l] + v[j + l];
  for (int l = 0; j + l < D; ++l) part[l] = part[l] + v[j + l];
}

// d = v - mean into d, and d * d (each product rounded) added to the chains `part`
inline void add_centred_squares(const float* __restrict__ v, float mean, int64_t D, float* __restrict__ d,
                                float* __restrict__ part) {
  int64_t j = 0;
  for (; j + kLanes <= D; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float c = v[j + l] - mean, t = c * c;
      d[j + l] = c;
      part[l] = part[l] + t;
    }
  for (int l = 0; j + l < D; ++l) {
    const float c = v[j + l] - mean, t = c * c;
    d[j + l] = c;
    part[l] = part[l] + t;
  }
}

// sum of v[0..D) in the lane order above
inline float row_sum(const float* v, int64_t D) {
  alignas(64) float part[kLanes] = {};
  add_lanes(v, D, part);
  return lane_tree(part);
}

// d = v - mean into d, and the sum of d * d in the lane order above
inline float row_centred_squares(const float* v, float mean, int64_t D, float* d) {
  alignas(64) float part[kLanes] = {};
  add_centred_squares(v, mean, D, d, part);
  return lane_tree(part);
}

// A norm's input gradient from its normed values h, their gradient gn = g * w and the two
// sums' means: out = r * ((gn - mean_g) - h * mean_gh), each operation rounded.
inline void normed_input_grad(const float* __restrict__ h, const float* __restrict__ gn, float r,
                              float mean_g, float mean_gh, int64_t n, float* __restrict__ out) {
  for (int64_t k = 0; k < n; ++k) {
    const float centred = gn[k] - mean_g, along = h[k] * mean_gh;
    out[k] = r * (centred - along);
  }
}

}  // namespace credit_lanes
