// RVV 1.0 decode-attention row (VLEN-agnostic). Scores at e32m4 over the head
// dimension (at m8 two accumulators, a q chunk and the widened K row do not
// fit the registers with the widening temporaries, and the compiler spilled
// them on every key), values at e32m8.
//
// Scores: per key, K is loaded and widened once (zero-extend + shift, no BF16
// extension needed) and shared by two query heads of the GQA group, each
// accumulating q*k in its own register group; the heads' sums are reduced
// once per key. Softmax (e32m4): vector max, vector exp (rvv_math.h), vector
// sum. Values: per chunk of the head dimension, two output accumulators stay
// in registers over all keys, one widened V load feeding both heads.
#include <riscv_vector.h>

#include <algorithm>

#include "rvv_kernels/attention/attention_ukernels.h"
#include "rvv_kernels/base/rvv_lmul.h"
#include "rvv_kernels/base/rvv_math.h"

namespace rvascend {
namespace {

using V = rvv::Lmul<4>;  // softmax
// Two query heads per pass over the keys, sharing each widened K/V row.
constexpr size_t kHeadsPerPass = 2;

template <int kLmul>
void Scores(const float* q, size_t heads, size_t d, const uint16_t* k_pool, size_t slot_stride,
            const int64_t* slots, size_t n_keys, float* scores) {
  using V = rvv::Lmul<kLmul>;
  using F = typename V::F;
  const size_t vlmax = V::VlMax();
  const vfloat32m1_t zero = __riscv_vfmv_v_f_f32m1(0.0f, 1);
  for (size_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = k_pool + static_cast<size_t>(slots[j]) * slot_stride;
    // Tail-undisturbed accumulation: the zeros past a short last chunk stay
    // zeros, so the reduction over VLMAX adds nothing from the tail.
    F acc0 = V::Zero(vlmax), acc1 = acc0;
    for (size_t i = 0; i < d;) {
      const size_t vl = V::SetVl(d - i);
      const F kv = V::LoadBf16(k + i, vl);
      acc0 = V::FmaccVvTu(acc0, V::Load(q + i, vl), kv, vl);
      if (heads > 1) acc1 = V::FmaccVvTu(acc1, V::Load(q + d + i, vl), kv, vl);
      i += vl;
    }
    scores[j] = __riscv_vfmv_f_s_f32m1_f32(V::SumTo(acc0, zero, vlmax));
    if (heads > 1) scores[n_keys + j] = __riscv_vfmv_f_s_f32m1_f32(V::SumTo(acc1, zero, vlmax));
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

template <int kLmul>
void Values(const float* p, size_t heads, size_t d, const uint16_t* v_pool, size_t slot_stride,
            const int64_t* slots, size_t n_keys, float* out) {
  using V = rvv::Lmul<kLmul>;
  using F = typename V::F;
  for (size_t i = 0; i < d;) {
    const size_t vl = V::SetVl(d - i);
    F acc0 = V::Zero(vl), acc1 = acc0;
    for (size_t j = 0; j < n_keys; ++j) {
      const F vv = V::LoadBf16(v_pool + static_cast<size_t>(slots[j]) * slot_stride + i, vl);
      acc0 = V::Fmacc(acc0, p[j], vv, vl);
      if (heads > 1) acc1 = V::Fmacc(acc1, p[n_keys + j], vv, vl);
    }
    V::Store(out + i, acc0, vl);
    if (heads > 1) V::Store(out + d + i, acc1, vl);
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
    Scores<4>(q + h0 * d, heads, d, k_pool, slot_stride, slots, n_keys, s);
    for (size_t h = 0; h < heads; ++h) Softmax(s + h * n_keys, n_keys);
    Values<8>(s, heads, d, v_pool, slot_stride, slots, n_keys, out + h0 * d);
  }
}

}  // namespace rvascend
