// One query row's attention scores over BF16 K rows, as the RVV decode row kernel
// computes them: each score one dot product (even and odd dimensions split, FMAs over
// chunks, one reduction). The prefill block kernel computes its scores with the same
// functions, so a row's scores, and with them its output, do not depend on whether it
// runs alone (decoding) or in a block (a prompt, a chunk, a verify step).
#ifndef RVV_KERNELS_ATTENTION_RVV_ROW_SCORES_H_
#define RVV_KERNELS_ATTENTION_RVV_ROW_SCORES_H_

#include <riscv_vector.h>

#include <cstddef>
#include <cstdint>

#include "rvv_kernels/base/rvv_lmul.h"

namespace rvascend {
namespace rvv {

// One head's scores for odd head dimensions (K rows not word-aligned): one
// BF16 element per lane.
template <int kLmul>
inline void ScoresByElement(const float* q, size_t d, const uint16_t* const* rows, size_t n_keys, float* scores) {
  using V = rvv::Lmul<kLmul>;
  using F = typename V::F;
  const size_t vlmax = V::VlMax();
  const vfloat32m1_t zero = __riscv_vfmv_v_f_f32m1(0.0f, 1);
  for (size_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = rows[j];
    // Tail-undisturbed accumulation: the zeros past a short last chunk stay
    // zeros, so the reduction over VLMAX adds nothing from the tail.
    F acc = V::Zero(vlmax);
    for (size_t i = 0; i < d;) {
      const size_t vl = V::SetVl(d - i);
      acc = V::FmaccVvTu(acc, V::Load(q + i, vl), V::LoadBf16(k + i, vl), vl);
      i += vl;
    }
    scores[j] = __riscv_vfmv_f_s_f32m1_f32(V::SumTo(acc, zero, vlmax));
  }
}

// One head's scores when its half = d / 2 words are kChunks whole chunks of
// vl: q stays in registers for all keys (at VLEN 256, 128 dimensions are two
// chunks: per key two loads, four ALU ops, four FMAs and one reduction).
template <int kLmul, int kChunks>
inline void ScoresInRegisters(const float* qe, const float* qo, size_t vl, const uint16_t* const* rows, size_t n_keys,
                       float* scores) {
  using V = rvv::Lmul<kLmul>;
  using F = typename V::F;
  static_assert(kChunks == 1 || kChunks == 2, "one or two chunks of q fit the registers");
  const vfloat32m1_t zero = __riscv_vfmv_v_f_f32m1(0.0f, 1);
  const F qe0 = V::Load(qe, vl), qo0 = V::Load(qo, vl);
  const F qe1 = kChunks == 2 ? V::Load(qe + vl, vl) : qe0;
  const F qo1 = kChunks == 2 ? V::Load(qo + vl, vl) : qo0;
  for (size_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = rows[j];
    F lo, hi;
    V::LoadBf16Pair(k, vl, lo, hi);
    F acc = V::FmaccVv(V::Mul(qe0, lo, vl), qo0, hi, vl);
    if (kChunks == 2) {
      V::LoadBf16Pair(k + 2 * vl, vl, lo, hi);
      acc = V::FmaccVv(V::FmaccVv(acc, qe1, lo, vl), qo1, hi, vl);
    }
    scores[j] = __riscv_vfmv_f_s_f32m1_f32(V::SumTo(acc, zero, vl));
  }
}

// Any even d: chunks of vl0 words, a short last chunk tail-undisturbed (the
// reduction over the first vl0 lanes sees every lane).
template <int kLmul>
inline void ScoresChunked(const float* qe, const float* qo, size_t half, const uint16_t* const* rows, size_t n_keys,
                   float* scores) {
  using V = rvv::Lmul<kLmul>;
  using F = typename V::F;
  const size_t vl0 = V::SetVl(half);
  const vfloat32m1_t zero = __riscv_vfmv_v_f_f32m1(0.0f, 1);
  for (size_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = rows[j];
    F acc = V::Zero(vl0);
    for (size_t i = 0; i < half;) {
      const size_t vl = V::SetVl(half - i);
      F lo, hi;
      V::LoadBf16Pair(k + 2 * i, vl, lo, hi);
      acc = V::FmaccVvTu(V::FmaccVvTu(acc, V::Load(qe + i, vl), lo, vl), V::Load(qo + i, vl), hi, vl);
      i += vl;
    }
    scores[j] = __riscv_vfmv_f_s_f32m1_f32(V::SumTo(acc, zero, vl0));
  }
}

// qe/qo: one head's even / odd dimensions (half = d / 2 of each); rows[j]:
// key j's K row.
inline void Scores(const float* qe, const float* qo, size_t half, const uint16_t* const* rows, size_t n_keys,
            float* scores) {
  using V = rvv::Lmul<4>;
  const size_t vl = V::SetVl(half);
  if (half == vl) {
    ScoresInRegisters<4, 1>(qe, qo, vl, rows, n_keys, scores);
  } else if (half == 2 * vl) {
    ScoresInRegisters<4, 2>(qe, qo, vl, rows, n_keys, scores);
  } else {
    ScoresChunked<4>(qe, qo, half, rows, n_keys, scores);
  }
}

// One head's q (d values) -> its even and its odd dimensions.
inline void SplitEvenOdd(const float* q, size_t d, float* qe, float* qo) {
  using V = rvv::Lmul<4>;
  const size_t half = d / 2;
  for (size_t i = 0; i < half;) {
    const size_t vl = V::SetVl(half - i);
    V::Store(qe + i, V::LoadStrided(q + 2 * i, 8, vl), vl);
    V::Store(qo + i, V::LoadStrided(q + 2 * i + 1, 8, vl), vl);
    i += vl;
  }
}

// One query row's scores for one head (q: d FP32 values, scaled) over n_keys K rows;
// split: room for d floats.
inline void RowScores(const float* q, size_t d, const uint16_t* const* k_rows, size_t n_keys, float* split,
                      float* scores) {
  if (d % 2 == 0) {
    SplitEvenOdd(q, d, split, split + d / 2);
    Scores(split, split + d / 2, d / 2, k_rows, n_keys, scores);
  } else {
    ScoresByElement<4>(q, d, k_rows, n_keys, scores);
  }
}

}  // namespace rvv
}  // namespace rvascend

#endif  // RVV_KERNELS_ATTENTION_RVV_ROW_SCORES_H_
