// Portable decode-attention rows over a BF16 or an FP32 pool: plain loops the host
// compiler vectorises where it keeps the order (the value accumulation; the score dot
// products stay in d order). Every row is computed alone, so its result never depends
// on the rows beside it: the FP32 form is deterministic inference's kernel for FP32 models.
#include <algorithm>
#include <cmath>

#include "rvv_kernels/attention/attention_ukernels.h"
#include "rvv_kernels/base/bf16.h"

namespace rvascend {
namespace {

inline float ToFloat(uint16_t x) { return Bf16ToFloat(x); }
inline float ToFloat(float x) { return x; }

template <typename T>
void Row(const float* q, size_t g, size_t d, const T* k_pool, const T* v_pool, size_t slot_stride,
         const int64_t* slots, size_t n_keys, float* scratch, float* out) {
  for (size_t j = 0; j < n_keys; ++j) {
    const T* k = k_pool + static_cast<size_t>(slots[j]) * slot_stride;
    for (size_t h = 0; h < g; ++h) {
      const float* qh = q + h * d;
      float s = 0.0f;
      for (size_t i = 0; i < d; ++i) s += qh[i] * ToFloat(k[i]);
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
    const T* v = v_pool + static_cast<size_t>(slots[j]) * slot_stride;
    for (size_t h = 0; h < g; ++h) {
      const float p = scratch[h * n_keys + j];
      float* o = out + h * d;
      for (size_t i = 0; i < d; ++i) o[i] += p * ToFloat(v[i]);
    }
  }
}

}  // namespace

void bf16_attention_row__portable(const float* q, size_t g, size_t d, const uint16_t* k_pool,
                                  const uint16_t* v_pool, size_t slot_stride, const int64_t* slots,
                                  size_t n_keys, float* scratch, float* out) {
  Row(q, g, d, k_pool, v_pool, slot_stride, slots, n_keys, scratch, out);
}

void f32_attention_row__portable(const float* q, size_t g, size_t d, const float* k_pool, const float* v_pool,
                                 size_t slot_stride, const int64_t* slots, size_t n_keys, float* scratch,
                                 float* out) {
  Row(q, g, d, k_pool, v_pool, slot_stride, slots, n_keys, scratch, out);
}

}  // namespace rvascend
