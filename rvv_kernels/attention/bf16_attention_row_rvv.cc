// RVV 1.0 decode-attention row (VLEN-agnostic).
//
// Scores (e32m4): a K row is loaded as 32-bit words, each two BF16 values;
// one shift and one mask turn a word vector into the FP32 values of the even
// and of the odd dimensions (no zero-extend, half the loads), and q is read
// split the same way (strided loads, once per pass). Two query heads of the
// GQA group share each loaded K row, each accumulating q*k in its own
// register group; the heads' sums are reduced once per key. At VLEN 256 a
// head of 128 dimensions is one chunk: per key one load, two ALU ops, four
// FMAs and two reductions (odd head dimensions, whose rows are not word
// aligned, load one element per lane instead). Softmax (e32m4): vector max, vector exp
// (rvv_math.h), vector sum. Values (e32m8): per chunk of the head dimension,
// two output accumulators stay in registers over all keys, one widened V load
// feeding both heads.
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
// Even heads up to this many dimensions split q on the stack.
constexpr size_t kMaxSplitDim = 512;

// Odd head dimensions (K rows not word-aligned): one BF16 element per lane.
template <int kLmul>
void ScoresByElement(const float* q, size_t heads, size_t d, const uint16_t* k_pool, size_t slot_stride,
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

// qe/qo: each head's even / odd dimensions (half = d / 2 of each, heads
// `half` apart in qe and in qo).
template <int kLmul>
void Scores(const float* qe, const float* qo, size_t heads, size_t half, const uint16_t* k_pool,
            size_t slot_stride, const int64_t* slots, size_t n_keys, float* scores) {
  using V = rvv::Lmul<kLmul>;
  using F = typename V::F;
  const size_t vl0 = V::SetVl(half);
  const vfloat32m1_t zero = __riscv_vfmv_v_f_f32m1(0.0f, 1);
  for (size_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = k_pool + static_cast<size_t>(slots[j]) * slot_stride;
    F lo, hi;
    V::LoadBf16Pair(k, vl0, lo, hi);
    F acc0 = V::FmaccVv(V::Mul(V::Load(qe, vl0), lo, vl0), V::Load(qo, vl0), hi, vl0);
    F acc1 = acc0;
    if (heads > 1) acc1 = V::FmaccVv(V::Mul(V::Load(qe + half, vl0), lo, vl0), V::Load(qo + half, vl0), hi, vl0);
    // Heads longer than one chunk: the later (no longer) chunks accumulate
    // tail-undisturbed, so the reduction over the first chunk's lanes sees them all.
    for (size_t i = vl0; i < half;) {
      const size_t vl = V::SetVl(half - i);
      V::LoadBf16Pair(k + 2 * i, vl, lo, hi);
      acc0 = V::FmaccVvTu(V::FmaccVvTu(acc0, V::Load(qe + i, vl), lo, vl), V::Load(qo + i, vl), hi, vl);
      if (heads > 1) {
        acc1 = V::FmaccVvTu(V::FmaccVvTu(acc1, V::Load(qe + half + i, vl), lo, vl), V::Load(qo + half + i, vl), hi,
                            vl);
      }
      i += vl;
    }
    scores[j] = __riscv_vfmv_f_s_f32m1_f32(V::SumTo(acc0, zero, vl0));
    if (heads > 1) scores[n_keys + j] = __riscv_vfmv_f_s_f32m1_f32(V::SumTo(acc1, zero, vl0));
  }
}

// q (heads rows of d) -> its even and odd dimensions, `half` apart per head.
void SplitEvenOdd(const float* q, size_t heads, size_t d, float* qe, float* qo) {
  using V = rvv::Lmul<4>;
  const size_t half = d / 2;
  for (size_t h = 0; h < heads; ++h) {
    for (size_t i = 0; i < half;) {
      const size_t vl = V::SetVl(half - i);
      V::Store(qe + h * half + i, V::LoadStrided(q + h * d + 2 * i, 8, vl), vl);
      V::Store(qo + h * half + i, V::LoadStrided(q + h * d + 2 * i + 1, 8, vl), vl);
      i += vl;
    }
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
    if (d % 2 == 0 && d <= kMaxSplitDim) {
      // K rows are d / 2 whole (aligned) words.
      float split[kHeadsPerPass * kMaxSplitDim];
      float* qe = split;
      float* qo = split + kHeadsPerPass * (d / 2);
      SplitEvenOdd(q + h0 * d, heads, d, qe, qo);
      Scores<4>(qe, qo, heads, d / 2, k_pool, slot_stride, slots, n_keys, s);
    } else {
      ScoresByElement<4>(q + h0 * d, heads, d, k_pool, slot_stride, slots, n_keys, s);
    }
    for (size_t h = 0; h < heads; ++h) Softmax(s + h * n_keys, n_keys);
    Values<8>(s, heads, d, v_pool, slot_stride, slots, n_keys, out + h0 * d);
  }
}

}  // namespace rvascend
