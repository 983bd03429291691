#include "rvv_kernels/quantized/quant_activations.h"

#include <cmath>
#include <limits>
#include <vector>

#include "rvv_kernels/base/bf16.h"

namespace rvascend {
namespace {

int8_t RoundToInt8(float v) {
  const float r = std::nearbyint(v);  // the default rounding mode: to nearest, ties to even
  return static_cast<int8_t>(r > 127.0f ? 127 : (r < -127.0f ? -127 : r));
}

// One block of n values: its int8 quants and scale.
float QuantizeBlock(const float* x, size_t n, bool k_quant, int8_t* q) {
  float amax = 0.0f, max = 0.0f;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    finite &= std::isfinite(x[i]);
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (!finite) {
    for (size_t i = 0; i < n; ++i) q[i] = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (amax == 0.0f) {
    for (size_t i = 0; i < n; ++i) q[i] = 0;
    return 0.0f;
  }
  if (k_quant) {
    const float iscale = -127.0f / max;
    for (size_t i = 0; i < n; ++i) q[i] = RoundToInt8(iscale * x[i]);
    return 1.0f / iscale;
  }
  const float d = amax / 127.0f;
  const float id = 1.0f / d;
  for (size_t i = 0; i < n; ++i) q[i] = RoundToInt8(x[i] * id);
  return d;
}

}  // namespace

void QuantizeRowF32(const float* x, size_t k, size_t block, int8_t* q, float* d, int32_t* sum32) {
  for (size_t b = 0; b < k / block; ++b) d[b] = QuantizeBlock(x + b * block, block, block == 256, q + b * block);
  for (size_t b = 0; b < k / 32; ++b) {
    int32_t s = 0;
    for (size_t i = 0; i < 32; ++i) s += q[32 * b + i];
    sum32[b] = s;
  }
}

void QuantizeRowPortable(const uint16_t* x, size_t k, size_t block, int8_t* q, float* d, int32_t* sum32) {
  std::vector<float> values(k);
  for (size_t i = 0; i < k; ++i) values[i] = Bf16ToFloat(x[i]);
  QuantizeRowF32(values.data(), k, block, q, d, sum32);
}

QuantizedActivations::QuantizedActivations(const uint16_t* rows, size_t m, size_t k, size_t stride, size_t block,
                                           QuantizeRowFn quantize)
    : q_(m * k), d_(m * (k / block)), sum32_(m * (k / 32)) {
  for (size_t r = 0; r < m; ++r) {
    quantize(rows + r * stride, k, block, q_.data() + r * k, d_.data() + r * (k / block),
             sum32_.data() + r * (k / 32));
  }
  SetView(m, k, block);
}

QuantizedActivations::QuantizedActivations(const float* rows, size_t m, size_t k, size_t stride, size_t block)
    : q_(m * k), d_(m * (k / block)), sum32_(m * (k / 32)) {
  for (size_t r = 0; r < m; ++r) {
    QuantizeRowF32(rows + r * stride, k, block, q_.data() + r * k, d_.data() + r * (k / block),
                   sum32_.data() + r * (k / 32));
  }
  SetView(m, k, block);
}

void QuantizedActivations::SetView(size_t m, size_t k, size_t block) {
  // q8_K activations (the K-quants'): the sums per 16 that the x86 Q6_K kernels take
  // off, once per call instead of once per tile. q8_0 activations need none.
  sum16_.resize(block == 256 ? m * (k / 16) : 0);
  for (size_t i = 0; i < sum16_.size(); ++i) {
    int32_t s = 0;
    for (size_t j = 0; j < 16; ++j) s += q_[16 * i + j];
    sum16_[i] = s;
  }
  view_.m = m;
  view_.k = k;
  view_.block = block;
  view_.q = q_.data();
  view_.d = d_.data();
  view_.sum32 = sum32_.data();
  view_.sum16 = sum16_.empty() ? nullptr : sum16_.data();
}

}  // namespace rvascend
