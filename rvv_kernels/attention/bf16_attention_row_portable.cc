// Portable decode-attention row: plain loops the host compiler vectorises.
#include <algorithm>
#include <cmath>

#include "rvv_kernels/attention/attention_ukernels.h"
#include "rvv_kernels/base/bf16.h"

namespace rvascend {

void bf16_attention_row__portable(const float* q, size_t g, size_t d, const uint16_t* k_pool,
                                  const uint16_t* v_pool, size_t slot_stride, const int64_t* slots,
                                  size_t n_keys, float* scratch, float* out) {
  for (size_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = k_pool + static_cast<size_t>(slots[j]) * slot_stride;
    for (size_t h = 0; h < g; ++h) {
      const float* qh = q + h * d;
      float s = 0.0f;
      for (size_t i = 0; i < d; ++i) s += qh[i] * Bf16ToFloat(k[i]);
      scratch[h * n_keys + j] = s;
    }
  }
  for (size_t h = 0; h < g; ++h) {
    float* s = scratch + h * n_keys;
    const float m = *std::max_element(s, s + n_keys);
    float sum = 0.0f;
    for (size_t j = 0; j < n_keys; ++j) sum += (s[j] = std::exp(s[j] - m));
    const float inv = 1.0f / sum;
    for (size_t j = 0; j < n_keys; ++j) s[j] *= inv;
    std::fill(out + h * d, out + (h + 1) * d, 0.0f);
  }
  for (size_t j = 0; j < n_keys; ++j) {
    const uint16_t* v = v_pool + static_cast<size_t>(slots[j]) * slot_stride;
    for (size_t h = 0; h < g; ++h) {
      const float p = scratch[h * n_keys + j];
      float* o = out + h * d;
      for (size_t i = 0; i < d; ++i) o[i] += p * Bf16ToFloat(v[i]);
    }
  }
}

}  // namespace rvascend
