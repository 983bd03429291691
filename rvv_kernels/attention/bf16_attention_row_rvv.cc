// RVV 1.0 decode-attention row (VLEN-agnostic).
//
// Scores (e32m4), one query head at a time: a K row is loaded as 32-bit
// words, each two BF16 values; one shift and one mask turn a word vector into
// the FP32 values of the even and of the odd dimensions (no zero-extend, half
// the loads), and q is split the same way once per call. When the head fits
// one or two register groups (128 dimensions at VLEN 256: two), q stays in
// registers over all keys: per key two loads, four ALU ops, four FMAs and one
// reduction. Sharing each K row between the GQA group's heads instead needs
// more registers than there are and spills on every key. Odd head dimensions,
// whose rows are not word aligned, load one element per lane. Softmax (e32m4):
// vector max, vector exp (rvv_math.h), vector sum. Values (e32m8): per chunk
// of the head dimension, two output accumulators stay in registers over all
// keys, one widened V load feeding two heads.
#include <riscv_vector.h>

#include <algorithm>
#include <vector>

#include "rvv_kernels/attention/attention_ukernels.h"
#include "rvv_kernels/attention/rvv_row_scores.h"
#include "rvv_kernels/attention/rvv_softmax.h"
#include "rvv_kernels/base/rvv_lmul.h"

namespace rvascend {
namespace {

// Two query heads per pass over the values, sharing each widened V row.
constexpr size_t kHeadsPerPass = 2;

// rows[j]: key j's V row.
template <int kLmul>
void Values(const float* p, size_t heads, size_t d, const uint16_t* const* rows, size_t n_keys, float* out) {
  using V = rvv::Lmul<kLmul>;
  using F = typename V::F;
  for (size_t i = 0; i < d;) {
    const size_t vl = V::SetVl(d - i);
    F acc0 = V::Zero(vl), acc1 = acc0;
    for (size_t j = 0; j < n_keys; ++j) {
      const F vv = V::LoadBf16(rows[j] + i, vl);
      acc0 = V::Fmacc(acc0, p[j], vv, vl);
      if (heads > 1) acc1 = V::Fmacc(acc1, p[n_keys + j], vv, vl);
    }
    V::Store(out + i, acc0, vl);
    if (heads > 1) V::Store(out + d + i, acc1, vl);
    i += vl;
  }
}

// Per-thread buffers of the row kernel, grown once.
struct RowScratch {
  std::vector<const uint16_t*> k_rows, v_rows;
  std::vector<float> q_split;
  static RowScratch& ThisThread() {
    thread_local RowScratch s;
    return s;
  }
};

}  // namespace

void bf16_attention_row__rvv(const float* q, size_t g, size_t d, const uint16_t* k_pool,
                             const uint16_t* v_pool, size_t slot_stride, const int64_t* slots,
                             size_t n_keys, float* scratch, float* out) {
  // Row addresses once per call, shared by the scores and every chunk of the values.
  RowScratch& rs = RowScratch::ThisThread();
  rs.k_rows.resize(n_keys);
  rs.v_rows.resize(n_keys);
  const uint16_t** k_rows = rs.k_rows.data();
  const uint16_t** v_rows = rs.v_rows.data();
  for (size_t j = 0; j < n_keys; ++j) {
    const size_t offset = static_cast<size_t>(slots[j]) * slot_stride;
    k_rows[j] = k_pool + offset;
    v_rows[j] = v_pool + offset;
  }
  // K rows of an even head dimension are d / 2 whole (aligned) words; q is
  // split the same way, each head once per call (rvv_row_scores.h).
  rs.q_split.resize(d);
  for (size_t h0 = 0; h0 < g; h0 += kHeadsPerPass) {
    const size_t heads = std::min(kHeadsPerPass, g - h0);
    float* s = scratch + h0 * n_keys;
    for (size_t h = 0; h < heads; ++h) {
      rvv::RowScores(q + (h0 + h) * d, d, k_rows, n_keys, rs.q_split.data(), s + h * n_keys);
      rvv::Softmax(s + h * n_keys, n_keys);
    }
    Values<8>(s, heads, d, v_rows, n_keys, out + h0 * d);
  }
}

}  // namespace rvascend
