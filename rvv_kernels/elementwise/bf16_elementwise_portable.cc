// Portable row kernels: the scalar statement of each contract in
// elementwise_ukernels.h (and the host path).
#include <cmath>
#include <cstring>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/elementwise/elementwise_ukernels.h"

namespace rvascend {
namespace {

float R(float x) { return Bf16ToFloat(FloatToBf16(x)); }

// out[i] = bf16(w[i] * bf16(h[i] * rinv)), or zero-centred bf16(h[i] * rinv * (1 + w[i]))
// over h (BF16 values held in FP32).
void NormRow(const float* h, const uint16_t* weight, size_t d, float eps, bool zero_centred, uint16_t* out) {
  float sq = 0.0f;
  for (size_t i = 0; i < d; ++i) sq += h[i] * h[i];
  const float rinv = 1.0f / std::sqrt(sq / static_cast<float>(d) + eps);
  if (zero_centred) {
    for (size_t i = 0; i < d; ++i) out[i] = FloatToBf16(h[i] * rinv * (1.0f + Bf16ToFloat(weight[i])));
    return;
  }
  for (size_t i = 0; i < d; ++i) out[i] = FloatToBf16(Bf16ToFloat(weight[i]) * R(h[i] * rinv));
}

void RmsNorm(const uint16_t* x, const uint16_t* residual, const uint16_t* weight, size_t d, float eps,
             bool zero_centred, uint16_t* out, uint16_t* residual_out) {
  float h[4096];
  float* buf = d <= 4096 ? h : new float[d];
  for (size_t i = 0; i < d; ++i) {
    buf[i] = residual ? R(Bf16ToFloat(x[i]) + Bf16ToFloat(residual[i])) : Bf16ToFloat(x[i]);
    if (residual) residual_out[i] = FloatToBf16(buf[i]);
  }
  NormRow(buf, weight, d, eps, zero_centred, out);
  if (buf != h) delete[] buf;
}

void SiluMul(const uint16_t* gate_up, size_t d, uint16_t* out) {
  for (size_t i = 0; i < d; ++i) {
    const float g = Bf16ToFloat(gate_up[i]);
    out[i] = FloatToBf16(R(g / (1.0f + std::exp(-g))) * Bf16ToFloat(gate_up[d + i]));
  }
}

void Rope(const uint16_t* x, const RopeHeads& p, const uint16_t* cos, const uint16_t* sin, uint16_t* out) {
  const size_t d = p.d, r = p.rotary_dim, half = r / 2;
  float v[1024];
  uint16_t normed[1024];
  for (size_t h = 0; h < p.heads; ++h) {
    const uint16_t* row = x + h * p.stride;
    if (p.norm_weight) {
      for (size_t i = 0; i < d; ++i) v[i] = Bf16ToFloat(row[i]);
      NormRow(v, p.norm_weight, d, p.eps, p.zero_centred, normed);
      row = normed;
    }
    for (size_t i = 0; i < d; ++i) v[i] = Bf16ToFloat(row[i]);
    for (size_t i = 0; i < r; ++i) {
      const float rot = i < half ? -v[i + half] : v[i - half];
      out[h * d + i] = FloatToBf16(R(v[i] * Bf16ToFloat(cos[i])) + R(rot * Bf16ToFloat(sin[i])));
    }
    std::memcpy(out + h * d + r, row + r, (d - r) * sizeof(uint16_t));
  }
}

void SigmoidMul(const uint16_t* x, const uint16_t* gate, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = FloatToBf16(Bf16ToFloat(x[i]) * R(1.0f / (1.0f + std::exp(-Bf16ToFloat(gate[i])))));
  }
}

int64_t Argmax(const uint16_t* row, size_t n) {
  int64_t best = 0;
  float value = Bf16ToFloat(row[0]);
  for (size_t i = 0; i < n; ++i) {
    const float f = Bf16ToFloat(row[i]);
    if (f != f) return -1;
    if (f > value) {
      value = f;
      best = static_cast<int64_t>(i);
    }
  }
  return best;
}

}  // namespace

const ElementwiseKernels kElementwisePortable = {"portable", RmsNorm, SiluMul, Rope, SigmoidMul, Argmax};

}  // namespace rvascend
