// Host decode-attention row (attention_ukernels.h) in one-register generic
// vectors (base/simd_vectors.h), compiled once per x86 ISA level the
// dispatcher may pick; RVASCEND_ATTENTION_ROW names the BF16-pool function and
// RVASCEND_ATTENTION_ROW_F32 the FP32-pool one (either may be left out). Each key
// is widened once for the g heads that share it; softmax is exact in FP32 with
// the RVV kernels' exp.
#include <cstring>

#include "rvv_kernels/attention/attention_ukernels.h"
#include "rvv_kernels/base/simd_vectors.h"

#if !defined(RVASCEND_ATTENTION_ROW) && !defined(RVASCEND_ATTENTION_ROW_F32)
#error "define RVASCEND_ATTENTION_ROW (bf16_attention_row__avx2, ...) or RVASCEND_ATTENTION_ROW_F32"
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

template <typename T>
RVASCEND_SIMD_INLINE void Prefetch(const T* row, size_t d) {
  for (size_t b = 0; b < d * sizeof(T); b += 64) __builtin_prefetch(reinterpret_cast<const char*>(row) + b);
}

// n <= kLanes values of a pool row as FP32 lanes (the rest 0).
RVASCEND_SIMD_INLINE VF LoadN(const uint16_t* p, size_t n) { return simd::LoadBf16N(p, n); }
RVASCEND_SIMD_INLINE VF LoadN(const float* p, size_t n) { return simd::LoadFN(p, n); }
RVASCEND_SIMD_INLINE VF Load(const uint16_t* p) { return simd::LoadBf16(p); }
RVASCEND_SIMD_INLINE VF Load(const float* p) { return simd::LoadF(p); }

// scores[h * n_keys + j + b] = q_h . k_(j+b) for heads [h0, h0 + hn) and kb keys
// at once: each accumulator is one FMA chain, and one key's chains alone left the
// FMA units waiting on their latency (a Qwen3 decode row ran at 4.5 GMAC/s). The
// loops over heads and keys are unrolled so the accumulators stay registers.
template <size_t hn, size_t kb, typename T>
RVASCEND_SIMD_INLINE void DotKeys(const float* q, size_t h0, size_t d, const T* const* rows, size_t j,
                                  size_t n_keys, float* scores) {
  VF acc[kb][hn] = {};
  for (size_t i = 0; i < d; i += kLanes) {
    const size_t lanes = d - i < kLanes ? d - i : kLanes;
    VF qv[hn];
#pragma GCC unroll 4
    for (size_t h = 0; h < hn; ++h) qv[h] = simd::LoadFN(q + (h0 + h) * d + i, lanes);
#pragma GCC unroll 4
    for (size_t b = 0; b < kb; ++b) {
      const VF kv = LoadN(rows[b] + i, lanes);
#pragma GCC unroll 4
      for (size_t h = 0; h < hn; ++h) acc[b][h] += qv[h] * kv;
    }
  }
#pragma GCC unroll 4
  for (size_t b = 0; b < kb; ++b) {
#pragma GCC unroll 4
    for (size_t h = 0; h < hn; ++h) scores[(h0 + h) * n_keys + j + b] = simd::Sum(acc[b][h]);
  }
}

template <size_t hn, typename T>
void Scores(const float* q, size_t h0, size_t d, const T* k_pool, size_t slot_stride,
            const int64_t* slots, size_t n_keys, float* scores) {
  constexpr size_t kb = hn <= 2 ? 4 : 2;  // at most eight accumulators
  const auto row = [&](size_t j) { return k_pool + static_cast<size_t>(slots[j]) * slot_stride; };
  size_t j = 0;
  for (; j + kb <= n_keys; j += kb) {
    const T* rows[kb];
    for (size_t b = 0; b < kb; ++b) {
      rows[b] = row(j + b);
      if (j + b + kPrefetchKeys < n_keys) Prefetch(row(j + b + kPrefetchKeys), d);
    }
    DotKeys<hn, kb>(q, h0, d, rows, j, n_keys, scores);
  }
  for (; j < n_keys; ++j) {
    const T* rows[1] = {row(j)};
    DotKeys<hn, 1>(q, h0, d, rows, j, n_keys, scores);
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

// out[h][i, i + c kLanes) += sum over keys [j0, j1) of p[h][j] v_j for c chunks at
// once: as for the scores, several FMA chains per key instead of one per head.
template <size_t hn, size_t c, typename T>
RVASCEND_SIMD_INLINE void ValueChunks(const float* p, size_t h0, size_t d, size_t i, const T* v_pool,
                                      size_t slot_stride, const int64_t* slots, size_t j0, size_t j1,
                                      size_t n_keys, float* out) {
  VF acc[hn][c];
#pragma GCC unroll 4
  for (size_t h = 0; h < hn; ++h) {
#pragma GCC unroll 4
    for (size_t u = 0; u < c; ++u) acc[h][u] = simd::LoadF(out + (h0 + h) * d + i + u * kLanes);
  }
  for (size_t j = j0; j < j1; ++j) {
    const T* v = v_pool + static_cast<size_t>(slots[j]) * slot_stride + i;
    VF vv[c];
#pragma GCC unroll 4
    for (size_t u = 0; u < c; ++u) vv[u] = Load(v + u * kLanes);
#pragma GCC unroll 4
    for (size_t h = 0; h < hn; ++h) {
      const float ph = p[(h0 + h) * n_keys + j];
#pragma GCC unroll 4
      for (size_t u = 0; u < c; ++u) acc[h][u] += ph * vv[u];
    }
  }
#pragma GCC unroll 4
  for (size_t h = 0; h < hn; ++h) {
#pragma GCC unroll 4
    for (size_t u = 0; u < c; ++u) simd::StoreF(out + (h0 + h) * d + i + u * kLanes, acc[h][u]);
  }
}

template <size_t hn, typename T>
void Values(const float* p, size_t h0, size_t d, const T* v_pool, size_t slot_stride,
            const int64_t* slots, size_t n_keys, float* out) {
  constexpr size_t c = hn <= 2 ? 4 : 2;  // at most eight accumulators, four value vectors
  for (size_t h = 0; h < hn; ++h) std::memset(out + (h0 + h) * d, 0, d * sizeof(float));
  for (size_t j0 = 0; j0 < n_keys; j0 += kKeyBlock) {
    const size_t j1 = j0 + kKeyBlock < n_keys ? j0 + kKeyBlock : n_keys;
    for (size_t j = j1; j < j1 + kKeyBlock && j < n_keys; ++j) {
      Prefetch(v_pool + static_cast<size_t>(slots[j]) * slot_stride, d);
    }
    size_t i = 0;
    for (; i + c * kLanes <= d; i += c * kLanes) {
      ValueChunks<hn, c>(p, h0, d, i, v_pool, slot_stride, slots, j0, j1, n_keys, out);
    }
    for (; i < d; i += kLanes) {  // the rest of the head, a vector (or its tail) at a time
      const size_t lanes = d - i < kLanes ? d - i : kLanes;
      VF acc[hn];
#pragma GCC unroll 4
      for (size_t h = 0; h < hn; ++h) acc[h] = simd::LoadFN(out + (h0 + h) * d + i, lanes);
      for (size_t j = j0; j < j1; ++j) {
        const VF vv = LoadN(v_pool + static_cast<size_t>(slots[j]) * slot_stride + i, lanes);
#pragma GCC unroll 4
        for (size_t h = 0; h < hn; ++h) acc[h] += p[(h0 + h) * n_keys + j] * vv;
      }
#pragma GCC unroll 4
      for (size_t h = 0; h < hn; ++h) simd::StoreFN(out + (h0 + h) * d + i, acc[h], lanes);
    }
  }
}

template <typename T>
void Row(const float* q, size_t g, size_t d, const T* k_pool, const T* v_pool, size_t slot_stride,
         const int64_t* slots, size_t n_keys, float* scratch, float* out) {
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

}  // namespace

#if defined(RVASCEND_ATTENTION_ROW)
void RVASCEND_ATTENTION_ROW(const float* q, size_t g, size_t d, const uint16_t* k_pool, const uint16_t* v_pool,
                            size_t slot_stride, const int64_t* slots, size_t n_keys, float* scratch, float* out) {
  Row(q, g, d, k_pool, v_pool, slot_stride, slots, n_keys, scratch, out);
}
#endif

#if defined(RVASCEND_ATTENTION_ROW_F32)
void RVASCEND_ATTENTION_ROW_F32(const float* q, size_t g, size_t d, const float* k_pool, const float* v_pool,
                                size_t slot_stride, const int64_t* slots, size_t n_keys, float* scratch,
                                float* out) {
  Row(q, g, d, k_pool, v_pool, slot_stride, slots, n_keys, scratch, out);
}
#endif

}  // namespace rvascend
