// RVV 1.0 decode-attention row (VLEN-agnostic, e32m4 throughout).
//
// Scores: per key, K is loaded and widened once (zero-extend + shift, no BF16
// extension needed) and shared by up to four query heads of the GQA group,
// each accumulating q*k in its own register group; the heads' sums are
// reduced once per key. Softmax: vector max, vector exp (rvv_math.h),
// vector sum. Values: per
// chunk of the head dimension, up to four output accumulators stay in
// registers over all keys, one widened V load feeding every head.
#include <riscv_vector.h>

#include <algorithm>

#include "rvv_kernels/attention/attention_ukernels.h"
#include "rvv_kernels/base/rvv_lmul.h"
#include "rvv_kernels/base/rvv_math.h"

namespace rvascend {
namespace {

using V = rvv::Lmul<4>;
constexpr size_t kHeadsPerPass = 4;

void Scores(const float* q, size_t heads, size_t d, const uint16_t* k_pool, size_t slot_stride,
            const int64_t* slots, size_t n_keys, float* scores) {
  const size_t vlmax = V::VlMax();
  const vfloat32m1_t zero = __riscv_vfmv_v_f_f32m1(0.0f, 1);
  for (size_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = k_pool + static_cast<size_t>(slots[j]) * slot_stride;
    // Tail-undisturbed accumulation: the zeros past a short last chunk stay
    // zeros, so the reduction over VLMAX adds nothing from the tail.
    vfloat32m4_t acc0 = V::Zero(vlmax), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (size_t i = 0; i < d;) {
      const size_t vl = V::SetVl(d - i);
      const vfloat32m4_t kv = V::LoadBf16(k + i, vl);
      acc0 = __riscv_vfmacc_vv_f32m4_tu(acc0, __riscv_vle32_v_f32m4(q + i, vl), kv, vl);
      if (heads > 1) acc1 = __riscv_vfmacc_vv_f32m4_tu(acc1, __riscv_vle32_v_f32m4(q + d + i, vl), kv, vl);
      if (heads > 2) acc2 = __riscv_vfmacc_vv_f32m4_tu(acc2, __riscv_vle32_v_f32m4(q + 2 * d + i, vl), kv, vl);
      if (heads > 3) acc3 = __riscv_vfmacc_vv_f32m4_tu(acc3, __riscv_vle32_v_f32m4(q + 3 * d + i, vl), kv, vl);
      i += vl;
    }
    scores[j] = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m4_f32m1(acc0, zero, vlmax));
    if (heads > 1) scores[n_keys + j] = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m4_f32m1(acc1, zero, vlmax));
    if (heads > 2) scores[2 * n_keys + j] = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m4_f32m1(acc2, zero, vlmax));
    if (heads > 3) scores[3 * n_keys + j] = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m4_f32m1(acc3, zero, vlmax));
  }
}

// In place: s[0:n] <- softmax(s[0:n]).
void Softmax(float* s, size_t n) {
  vfloat32m1_t m1 = __riscv_vfmv_v_f_f32m1(-__builtin_inff(), 1);
  for (size_t j = 0; j < n;) {
    const size_t vl = V::SetVl(n - j);
    m1 = __riscv_vfredmax_vs_f32m4_f32m1(__riscv_vle32_v_f32m4(s + j, vl), m1, vl);
    j += vl;
  }
  const float m = __riscv_vfmv_f_s_f32m1_f32(m1);
  vfloat32m1_t sum1 = __riscv_vfmv_v_f_f32m1(0.0f, 1);
  for (size_t j = 0; j < n;) {
    const size_t vl = V::SetVl(n - j);
    const vfloat32m4_t e = rvv::Exp(__riscv_vfsub_vf_f32m4(__riscv_vle32_v_f32m4(s + j, vl), m, vl), vl);
    __riscv_vse32_v_f32m4(s + j, e, vl);
    sum1 = __riscv_vfredusum_vs_f32m4_f32m1(e, sum1, vl);
    j += vl;
  }
  const float inv = 1.0f / __riscv_vfmv_f_s_f32m1_f32(sum1);
  for (size_t j = 0; j < n;) {
    const size_t vl = V::SetVl(n - j);
    __riscv_vse32_v_f32m4(s + j, __riscv_vfmul_vf_f32m4(__riscv_vle32_v_f32m4(s + j, vl), inv, vl), vl);
    j += vl;
  }
}

void Values(const float* p, size_t heads, size_t d, const uint16_t* v_pool, size_t slot_stride,
            const int64_t* slots, size_t n_keys, float* out) {
  for (size_t i = 0; i < d;) {
    const size_t vl = V::SetVl(d - i);
    vfloat32m4_t acc0 = V::Zero(vl), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (size_t j = 0; j < n_keys; ++j) {
      const vfloat32m4_t vv = V::LoadBf16(v_pool + static_cast<size_t>(slots[j]) * slot_stride + i, vl);
      acc0 = __riscv_vfmacc_vf_f32m4(acc0, p[j], vv, vl);
      if (heads > 1) acc1 = __riscv_vfmacc_vf_f32m4(acc1, p[n_keys + j], vv, vl);
      if (heads > 2) acc2 = __riscv_vfmacc_vf_f32m4(acc2, p[2 * n_keys + j], vv, vl);
      if (heads > 3) acc3 = __riscv_vfmacc_vf_f32m4(acc3, p[3 * n_keys + j], vv, vl);
    }
    __riscv_vse32_v_f32m4(out + i, acc0, vl);
    if (heads > 1) __riscv_vse32_v_f32m4(out + d + i, acc1, vl);
    if (heads > 2) __riscv_vse32_v_f32m4(out + 2 * d + i, acc2, vl);
    if (heads > 3) __riscv_vse32_v_f32m4(out + 3 * d + i, acc3, vl);
    i += vl;
  }
}

}  // namespace

void bf16_attention_row__rvv(const float* q, size_t g, size_t d, const uint16_t* k_pool,
                             const uint16_t* v_pool, size_t slot_stride, const int64_t* slots,
                             size_t n_keys, float* scratch, float* out) {
  for (size_t h0 = 0; h0 < g; h0 += kHeadsPerPass) {
    const size_t heads = std::min(kHeadsPerPass, g - h0);
    float* s = scratch + h0 * n_keys;
    Scores(q + h0 * d, heads, d, k_pool, slot_stride, slots, n_keys, s);
    for (size_t h = 0; h < heads; ++h) Softmax(s + h * n_keys, n_keys);
    Values(s, heads, d, v_pool, slot_stride, slots, n_keys, out + h0 * d);
  }
}

}  // namespace rvascend
