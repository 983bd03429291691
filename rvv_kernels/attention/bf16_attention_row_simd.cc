// Host decode-attention row (attention_ukernels.h) in one-register generic
// vectors (base/simd_vectors.h), compiled once per x86 ISA level the
// dispatcher may pick; RVASCEND_ATTENTION_ROW names the function. Each key is
// widened once for the g heads that share it; softmax is exact in FP32 with
// the RVV kernels' exp.
#include <cstring>

#include "rvv_kernels/attention/attention_ukernels.h"
#include "rvv_kernels/base/simd_vectors.h"

#ifndef RVASCEND_ATTENTION_ROW
#error "define RVASCEND_ATTENTION_ROW (bf16_attention_row__avx2, ...)"
#endif

namespace rvascend {
namespace {

using simd::kLanes;
using simd::VF;

// Heads of a group whose accumulators stay in registers; larger groups go in rounds.
constexpr size_t kHeadsAtOnce = 4;

// Slots are scattered over the pool, which the hardware prefetcher cannot
// follow: each row is requested this many keys ahead (a 4k-key decode row ran
// at DRAM latency, 150 ns per row, without it).
constexpr size_t kPrefetchKeys = 8;

RVASCEND_SIMD_INLINE void Prefetch(const uint16_t* row, size_t d) {
  for (size_t b = 0; b < d * sizeof(uint16_t); b += 64) __builtin_prefetch(reinterpret_cast<const char*>(row) + b);
}

// scores[h * n_keys + j] = q_h . k_j for heads [h0, h0 + hn).
template <size_t hn>
void Scores(const float* q, size_t h0, size_t d, const uint16_t* k_pool, size_t slot_stride,
            const int64_t* slots, size_t n_keys, float* scores) {
  for (size_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = k_pool + static_cast<size_t>(slots[j]) * slot_stride;
    if (j + kPrefetchKeys < n_keys) Prefetch(k_pool + static_cast<size_t>(slots[j + kPrefetchKeys]) * slot_stride, d);
    VF acc[hn] = {};
    for (size_t i = 0; i < d; i += kLanes) {
      const size_t lanes = d - i < kLanes ? d - i : kLanes;
      const VF kv = simd::LoadBf16N(k + i, lanes);
      for (size_t h = 0; h < hn; ++h) acc[h] += simd::LoadFN(q + (h0 + h) * d + i, lanes) * kv;
    }
    for (size_t h = 0; h < hn; ++h) scores[(h0 + h) * n_keys + j] = simd::Sum(acc[h]);
  }
}

// s <- softmax(s) over n values.
void Softmax(float* s, size_t n) {
  const size_t body = n / kLanes * kLanes;
  VF m = simd::Splat(-__builtin_inff());
  for (size_t j = 0; j < body; j += kLanes) m = simd::Max(m, simd::LoadF(s + j));
  float top = simd::MaxOf(m);
  for (size_t j = body; j < n; ++j) top = s[j] > top ? s[j] : top;
  VF sum{};
  for (size_t j = 0; j < body; j += kLanes) {
    const VF e = simd::Exp(simd::LoadF(s + j) - top);
    simd::StoreF(s + j, e);
    sum += e;
  }
  float total = simd::Sum(sum);
  for (size_t j = body; j < n; ++j) {
    VF x{};
    x[0] = s[j] - top;
    s[j] = simd::Exp(x)[0];
    total += s[j];
  }
  const float inv = 1.0f / total;
  for (size_t j = 0; j < body; j += kLanes) simd::StoreF(s + j, simd::LoadF(s + j) * inv);
  for (size_t j = body; j < n; ++j) s[j] *= inv;
}

// out_h = sum_j p[h][j] v_j for heads [h0, h0 + hn). Keys in blocks of
// kKeyBlock, each block's V rows (kKeyBlock x d BF16, in L1) read once per
// chunk of d with the accumulators in registers: chunk-outer loops over all
// keys reread scattered rows d / kLanes times (2x slower at 4k keys), and
// key-outer loops load and store the accumulators for every key.
constexpr size_t kKeyBlock = 32;

template <size_t hn>
void Values(const float* p, size_t h0, size_t d, const uint16_t* v_pool, size_t slot_stride,
            const int64_t* slots, size_t n_keys, float* out) {
  for (size_t h = 0; h < hn; ++h) std::memset(out + (h0 + h) * d, 0, d * sizeof(float));
  for (size_t j0 = 0; j0 < n_keys; j0 += kKeyBlock) {
    const size_t j1 = j0 + kKeyBlock < n_keys ? j0 + kKeyBlock : n_keys;
    for (size_t j = j1; j < j1 + kKeyBlock && j < n_keys; ++j) {
      Prefetch(v_pool + static_cast<size_t>(slots[j]) * slot_stride, d);
    }
    for (size_t i = 0; i < d; i += kLanes) {
      const size_t lanes = d - i < kLanes ? d - i : kLanes;
      VF acc[hn];
      for (size_t h = 0; h < hn; ++h) acc[h] = simd::LoadFN(out + (h0 + h) * d + i, lanes);
      for (size_t j = j0; j < j1; ++j) {
        const VF vv = simd::LoadBf16N(v_pool + static_cast<size_t>(slots[j]) * slot_stride + i, lanes);
        for (size_t h = 0; h < hn; ++h) acc[h] += p[(h0 + h) * n_keys + j] * vv;
      }
      for (size_t h = 0; h < hn; ++h) simd::StoreFN(out + (h0 + h) * d + i, acc[h], lanes);
    }
  }
}

}  // namespace

void RVASCEND_ATTENTION_ROW(const float* q, size_t g, size_t d, const uint16_t* k_pool, const uint16_t* v_pool,
                            size_t slot_stride, const int64_t* slots, size_t n_keys, float* scratch, float* out) {
  static_assert(kHeadsAtOnce == 4, "the switches below name each round size");
  for (size_t h0 = 0; h0 < g; h0 += kHeadsAtOnce) {
    switch (g - h0) {
      case 1: Scores<1>(q, h0, d, k_pool, slot_stride, slots, n_keys, scratch); break;
      case 2: Scores<2>(q, h0, d, k_pool, slot_stride, slots, n_keys, scratch); break;
      case 3: Scores<3>(q, h0, d, k_pool, slot_stride, slots, n_keys, scratch); break;
      default: Scores<4>(q, h0, d, k_pool, slot_stride, slots, n_keys, scratch); break;
    }
  }
  for (size_t h = 0; h < g; ++h) Softmax(scratch + h * n_keys, n_keys);
  for (size_t h0 = 0; h0 < g; h0 += kHeadsAtOnce) {
    switch (g - h0) {
      case 1: Values<1>(scratch, h0, d, v_pool, slot_stride, slots, n_keys, out); break;
      case 2: Values<2>(scratch, h0, d, v_pool, slot_stride, slots, n_keys, out); break;
      case 3: Values<3>(scratch, h0, d, v_pool, slot_stride, slots, n_keys, out); break;
      default: Values<4>(scratch, h0, d, v_pool, slot_stride, slots, n_keys, out); break;
    }
  }
}

}  // namespace rvascend
