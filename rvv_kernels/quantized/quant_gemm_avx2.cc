// The AVX2 quantized kernels for Q8_0, Q4_0, Q4_1, Q4_K and Q6_K (the other formats run
// quant_gemm_portable.h's kernels built for AVX2), on the runtime layout with tiles of 64 columns (quant_format.h).
//
// The layout keeps a tile's 64 columns side by side for each k, so one 32-byte
// load holds one k of 32 columns, while the x86 integer dot products
// (vpmaddubsw, vpmaddwd) sum adjacent lanes. Two k are therefore paired inside
// the registers: 4-bit formats put a byte's low and high nibble (k = i and
// i + 16) next to each other (vpunpck*bw of the two nibble vectors) and multiply
// them with the pair (a[i], a[i+16]) in one vpmaddubsw; Q8_0 sign-extends the
// rows k = i and i + 1 to 16 bits, interleaves them, and uses vpmaddwd. Every
// product is summed exactly in integers (a 16-bit partial sum holds at most 8
// rows of 4-bit products: 8 * 2 * 15 * 127 < 2^15), and the scales are applied
// with the same FP32 operations in the same order as the portable twin, so the
// results are bit-identical to it (the host test compares every output).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/simd_vectors.h"
#include "rvv_kernels/quantized/quant_activations.h"
#include "rvv_kernels/quantized/quant_gemm_portable.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"
#include "rvv_kernels/quantized/quant_prefetch_x86.h"

namespace rvascend {
namespace {

constexpr size_t kTile = 64;
// Rows per call: the K-quant kernels decode each super-block once for all of them
// (one thread, 256 rows of 3584 x 1024: Q6_K 19.4 ms, Q4_K 16.1 ms).
constexpr size_t kMaxRows = 64;
// From this many rows Q4_K decodes each super-block once for the call's rows.
// A decode batch of 4 rows keeps the tile path: decoding once is faster for the
// call alone but slows the whole Qwen3.5-0.8B-shaped Q4_K_M decode step.
constexpr size_t kQ4KDecodeRows = 8;

// Each kernel takes up to two rows of activations at once (R): the weights are
// loaded and unpacked once for both (a decode batch or a prefill chunk). With
// four, a 16-column group's accumulators and broadcasts do not fit the 16
// registers, and an accumulator goes through the stack on every step.
// The activation pairs of a block are laid out once per row (PairTable) and
// broadcast from memory in the inner loop.
struct alignas(32) PairTable {
  int16_t v[32];
};

// Q8_0: the 32 activations of a block widened to int16; the int32 at 2j is the
// (k = 2j, 2j + 1) pair of a vpmaddwd lane.
inline void Q8Pairs(const int8_t* a, PairTable* t) {
  const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
  const __m256i y = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16)));
  _mm256_store_si256(reinterpret_cast<__m256i*>(t->v), x);
  _mm256_store_si256(reinterpret_cast<__m256i*>(t->v + 16), y);
}

// 4-bit formats: the bytes a[i], a[i + 16] side by side; the int16 at i is the
// (low nibble, high nibble) pair of a vpmaddubsw lane.
inline void NibblePairs(const int8_t* a, PairTable* t) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16));
  _mm_store_si128(reinterpret_cast<__m128i*>(t->v), _mm_unpacklo_epi8(lo, hi));
  _mm_store_si128(reinterpret_cast<__m128i*>(t->v + 8), _mm_unpackhi_epi8(lo, hi));
}

inline __m256i Broadcast32(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Q8_0: q[32][64] int8 against a[r][0..31] -> isum[r][g] (columns 8g .. 8g+7).
template <size_t R>
inline void DotQ8Block(const int8_t* q, const int8_t* const a[R], __m256i isum[R][8]) {
  PairTable pairs[R];
  for (size_t r = 0; r < R; ++r) Q8Pairs(a[r], &pairs[r]);
  for (size_t g = 0; g < 4; ++g) {  // 16 columns
    __m256i s[R][2];
    for (size_t r = 0; r < R; ++r) s[r][0] = s[r][1] = _mm256_setzero_si256();
    for (size_t i = 0; i < 32; i += 2) {
      const int8_t* row = q + i * kTile + 16 * g;
      const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
      const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + kTile)));
      // Per 128-bit lane: columns 0-3 | 8-11 (lo) and 4-7 | 12-15 (hi) of the 16, as (k, k+1) pairs.
      const __m256i lo = _mm256_unpacklo_epi16(w0, w1), hi = _mm256_unpackhi_epi16(w0, w1);
      for (size_t r = 0; r < R; ++r) {
        const __m256i pair = Broadcast32(pairs[r].v + i);
        s[r][0] = _mm256_add_epi32(s[r][0], _mm256_madd_epi16(lo, pair));
        s[r][1] = _mm256_add_epi32(s[r][1], _mm256_madd_epi16(hi, pair));
      }
    }
    for (size_t r = 0; r < R; ++r) {
      isum[r][2 * g] = _mm256_permute2x128_si256(s[r][0], s[r][1], 0x20);
      isum[r][2 * g + 1] = _mm256_permute2x128_si256(s[r][0], s[r][1], 0x31);
    }
  }
}

// The 16-bit partial sums of 32 columns (x: columns 0-7 | 16-23, y: 8-15 | 24-31,
// as vpunpck*bw leaves them) added to out[0..3], columns in order.
inline void AddWidened(__m256i x, __m256i y, __m256i out[4]) {
  out[0] = _mm256_add_epi32(out[0], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(x)));
  out[1] = _mm256_add_epi32(out[1], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(y)));
  out[2] = _mm256_add_epi32(out[2], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(x, 1)));
  out[3] = _mm256_add_epi32(out[3], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(y, 1)));
}

// The vpmaddubsw operands of nibble row i of qs[16][64] (low nibble k = i, high
// k = i + 16), columns 32 g .. 32 g + 31: per 128-bit lane, columns 0-7 | 16-23
// (out[0], vpunpcklbw) and 8-15 | 24-31 (out[1], vpunpckhbw) of the 32.
inline void NibbleOperands(const uint8_t* qs, size_t i, size_t g, __m256i out[2]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + i * kTile + 32 * g));
  const __m256i lo = _mm256_and_si256(b, low4);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
  out[0] = _mm256_unpacklo_epi8(lo, hi);
  out[1] = _mm256_unpackhi_epi8(lo, hi);
}

// 16 rows of nibbles (operands(i, g, out): NibbleOperands' two vectors) against
// a[r][0..31]: isum[r][g] += the integer sums of columns 8g .. 8g+7.
template <size_t R, class Operands>
inline void DotNibbleRows(const Operands& operands, const int8_t* const a[R], __m256i isum[R][8]) {
  PairTable pairs[R];
  for (size_t r = 0; r < R; ++r) NibblePairs(a[r], &pairs[r]);
  for (size_t g = 0; g < 2; ++g) {  // 32 columns
    for (size_t half = 0; half < 2; ++half) {
      __m256i s16[R][2];
      for (size_t r = 0; r < R; ++r) s16[r][0] = s16[r][1] = _mm256_setzero_si256();
      for (size_t i = 8 * half; i < 8 * half + 8; ++i) {
        __m256i w[2];
        operands(i, g, w);
        for (size_t r = 0; r < R; ++r) {
          const __m256i pair = _mm256_set1_epi16(pairs[r].v[i]);
          s16[r][0] = _mm256_add_epi16(s16[r][0], _mm256_maddubs_epi16(w[0], pair));
          s16[r][1] = _mm256_add_epi16(s16[r][1], _mm256_maddubs_epi16(w[1], pair));
        }
      }
      for (size_t r = 0; r < R; ++r) AddWidened(s16[r][0], s16[r][1], isum[r] + 4 * g);
    }
  }
}

template <size_t R>
inline void DotNibbleRows(const uint8_t* qs, const int8_t* const a[R], __m256i isum[R][8]) {
  DotNibbleRows<R>([qs](size_t i, size_t g, __m256i w[2]) { NibbleOperands(qs, i, g, w); }, a, isum);
}

inline __m256 Halves(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline void Store(const __m256 acc[8], float* c) {
  for (size_t g = 0; g < 8; ++g) _mm256_storeu_ps(c + 8 * g, acc[g]);
}

template <QuantFormat F, size_t R>
void Gemm32Rows(const QuantActs& a, size_t row0, const uint8_t* tile, float* c, size_t c_stride) {
  const size_t blocks = a.k / 32;
  const size_t block_bytes = FormatInfo(F).tile_block_bytes * kTile;
  __m256 acc[R][8];
  for (size_t r = 0; r < R; ++r) {
    for (auto& v : acc[r]) v = _mm256_setzero_ps();
  }
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = tile + b * block_bytes;
    const int8_t* q[R];
    for (size_t r = 0; r < R; ++r) q[r] = a.q + (row0 + r) * a.k + 32 * b;
    __m256i isum[R][8];
    if constexpr (F == QuantFormat::kQ8_0) {
      DotQ8Block<R>(reinterpret_cast<const int8_t*>(blk + 2 * kTile), q, isum);
    } else {
      for (size_t r = 0; r < R; ++r) {
        for (auto& v : isum[r]) v = _mm256_setzero_si256();
      }
      DotNibbleRows<R>(blk + (F == QuantFormat::kQ4_1 ? 4 : 2) * kTile, q, isum);
    }
    for (size_t r = 0; r < R; ++r) {
      const float ad = a.d[(row0 + r) * blocks + b];
      const int32_t asum = a.sum32[(row0 + r) * blocks + b];
      const __m256 s = _mm256_set1_ps(ad);
      for (size_t g = 0; g < 8; ++g) {
        __m256i v = isum[r][g];
        if constexpr (F == QuantFormat::kQ4_0) v = _mm256_sub_epi32(v, _mm256_set1_epi32(8 * asum));
        acc[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(Halves(blk + 16 * g), s), acc[r][g]);
        if constexpr (F == QuantFormat::kQ4_1) {
          acc[r][g] = _mm256_fmadd_ps(Halves(blk + 2 * kTile + 16 * g), _mm256_set1_ps(ad * static_cast<float>(asum)),
                                      acc[r][g]);
        }
      }
    }
  }
  for (size_t r = 0; r < R; ++r) Store(acc[r], c + r * c_stride);
}

// R rows' super-block s against the tile's super-block at blk, added to acc:
// operands(sub, i, g, out) gives NibbleOperands' vectors of sub-block sub, decoded
// there and then or read from the super-block decoded once for the call's rows.
template <size_t R, bool kPrefetch, class Operands>
inline void Q4KSuper(const QuantActs& a, size_t row0, size_t s, const uint8_t* blk, const Operands& operands,
                     __m256 acc[R][8]) {
  const uint8_t* sc = blk + 4 * kTile;
  const uint8_t* mn = blk + 12 * kTile;
  __m256i total[R][8], msum[R][8];
  for (size_t r = 0; r < R; ++r) {
    for (size_t g = 0; g < 8; ++g) total[r][g] = msum[r][g] = _mm256_setzero_si256();
  }
  for (size_t sub = 0; sub < 8; ++sub) {
    if (kPrefetch) PrefetchEighth(blk + 148 * kTile, 148 * kTile, sub);  // Q4_K reads its fields as separate streams too
    const int8_t* q[R];
    for (size_t r = 0; r < R; ++r) q[r] = a.q + (row0 + r) * a.k + 256 * s + 32 * sub;
    __m256i isum[R][8];
    for (size_t r = 0; r < R; ++r) {
      for (auto& v : isum[r]) v = _mm256_setzero_si256();
    }
    DotNibbleRows<R>([&](size_t i, size_t g, __m256i w[2]) { operands(sub, i, g, w); }, q, isum);
    for (size_t g = 0; g < 8; ++g) {
      const __m256i scale = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + sub * kTile + 8 * g)));
      const __m256i mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn + sub * kTile + 8 * g)));
      for (size_t r = 0; r < R; ++r) {
        const __m256i as = _mm256_set1_epi32(a.sum32[(row0 + r) * (a.k / 32) + 8 * s + sub]);
        total[r][g] = _mm256_add_epi32(total[r][g], _mm256_mullo_epi32(scale, isum[r][g]));
        msum[r][g] = _mm256_add_epi32(msum[r][g], _mm256_mullo_epi32(mins, as));
      }
    }
  }
  for (size_t r = 0; r < R; ++r) {
    const float ad = a.d[(row0 + r) * (a.k / 256) + s];
    const __m256 d = _mm256_set1_ps(ad), neg_d = _mm256_set1_ps(-ad);
    for (size_t g = 0; g < 8; ++g) {
      acc[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[r][g]), _mm256_mul_ps(Halves(blk + 16 * g), d), acc[r][g]);
      acc[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[r][g]), _mm256_mul_ps(Halves(blk + 2 * kTile + 16 * g), neg_d),
                                  acc[r][g]);
    }
  }
}

template <size_t R>
void GemmQ4KRows(const QuantActs& a, size_t row0, const uint8_t* tile, float* c, size_t c_stride) {
  __m256 acc[R][8];
  for (size_t r = 0; r < R; ++r) {
    for (auto& v : acc[r]) v = _mm256_setzero_ps();
  }
  for (size_t s = 0; s < a.k / 256; ++s) {
    const uint8_t* blk = tile + s * 148 * kTile;
    Q4KSuper<R, true>(a, row0, s, blk, [blk](size_t sub, size_t i, size_t g, __m256i w[2]) {
      NibbleOperands(blk + 20 * kTile + 16 * sub * kTile, i, g, w);
    }, acc);
  }
  for (size_t r = 0; r < R; ++r) Store(acc[r], c + r * c_stride);
}

// A QuantUkernel over any number of rows: Rows<2> for each pair, Rows<1> for the last.
template <template <size_t> class Rows>
void ByRows(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t, float* c, size_t c_stride) {
  size_t r = 0;
  for (; r + 2 <= m; r += 2) Rows<2>::Run(a, row0 + r, tile, c + r * c_stride, c_stride);
  if (r < m) Rows<1>::Run(a, row0 + r, tile, c + r * c_stride, c_stride);
}

template <QuantFormat F>
struct Gemm32 {
  template <size_t R>
  struct Rows {
    static void Run(const QuantActs& a, size_t row0, const uint8_t* tile, float* c, size_t c_stride) {
      Gemm32Rows<F, R>(a, row0, tile, c, c_stride);
    }
  };
};

template <size_t R>
struct Q4KRows {
  static void Run(const QuantActs& a, size_t row0, const uint8_t* tile, float* c, size_t c_stride) {
    GemmQ4KRows<R>(a, row0, tile, c, c_stride);
  }
};

inline __m256i BytePair(int8_t lo, int8_t hi) {  // two int8 as the byte pair of a vpmaddubsw lane
  return _mm256_set1_epi16(static_cast<int16_t>(static_cast<uint8_t>(lo) |
                                                (static_cast<uint16_t>(static_cast<uint8_t>(hi)) << 8)));
}

// Q6_K: the 6-bit quants are used unsigned (0..63) in vpmaddubsw against the
// activations, and 32 times the activations' sum of each 16-value sub-block is
// taken off: sum (q - 32) a = sum q a - 32 sum a, exactly. Rows i and i + 8 of a
// pair of sub-blocks share their high-bits row (quant_format.h), so they are the
// two k of each vpmaddubsw pair. A pair of products is at most 2 * 63 * 127, so a
// 16-bit lane holds two before it is widened.
//
// The vpmaddubsw operands of rows i and i + 8 of pair p, columns 32 g .. 32 g + 31:
// out[0], out[1] the low sub-block's (k = 32p + i, + 8) as vpunpcklbw and vpunpckhbw
// leave them, out[2], out[3] the high sub-block's (k = 32p + 16 + i, + 8).
inline void Q6KOperands(const uint8_t* ql, const uint8_t* qh, size_t p, size_t i, size_t g, __m256i out[4]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  const auto load = [&](const uint8_t* at) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32 * g)); };
  const __m256i l0 = load(ql + (16 * p + i) * kTile), l8 = load(ql + (16 * p + i + 8) * kTile);
  const __m256i h = load(qh + (8 * p + i) * kTile);
  // Row i takes bits 0-1 (low nibble) and 4-5 (high) of h, row i + 8 bits 2-3 and 6-7.
  const __m256i lo0 = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45));
  const __m256i lo8 = _mm256_or_si256(_mm256_and_si256(l8, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45));
  const __m256i hi0 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(h, bits45));
  const __m256i hi8 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l8, 4), low4),
                                      _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45));
  out[0] = _mm256_unpacklo_epi8(lo0, lo8);
  out[1] = _mm256_unpackhi_epi8(lo0, lo8);
  out[2] = _mm256_unpacklo_epi8(hi0, hi8);
  out[3] = _mm256_unpackhi_epi8(hi0, hi8);
}

// One row's super-block s against the tile's super-block at blk, added to c[0..63]:
// operands(p, i, g, out) gives Q6KOperands' four vectors, decoded there and then
// (one row) or read from the super-block decoded once for the call's rows.
template <bool kPrefetch, class Operands>
inline void Q6KSuperRow(const QuantActs& a, size_t row, size_t s, const uint8_t* blk, const Operands& operands,
                        float* c) {
  const int8_t* qa = a.q + row * a.k + 256 * s;
  const int32_t* sums = a.sum16 + row * (a.k / 16) + 16 * s;
  const auto* sc = reinterpret_cast<const int8_t*>(blk + 2 * kTile);
  __m256i total[8];
  for (auto& v : total) v = _mm256_setzero_si256();
  for (size_t p = 0; p < 8; ++p) {
    if (kPrefetch) PrefetchEighth(blk + 210 * kTile, 210 * kTile, p);
    const int8_t* a_lo = qa + 32 * p;  // sub-block 2p: k = 32p + i
    const int8_t* a_hi = a_lo + 16;    // sub-block 2p + 1: k = 32p + 16 + i
    __m256i sub_lo[8], sub_hi[8];
    for (size_t g = 0; g < 8; ++g) {
      sub_lo[g] = _mm256_set1_epi32(-32 * sums[2 * p]);
      sub_hi[g] = _mm256_set1_epi32(-32 * sums[2 * p + 1]);
    }
    for (size_t i0 = 0; i0 < 8; i0 += 2) {
      __m256i s_lo[4], s_hi[4];
      for (size_t g = 0; g < 4; ++g) s_lo[g] = s_hi[g] = _mm256_setzero_si256();
      for (size_t i = i0; i < i0 + 2; ++i) {
        const __m256i pair_lo = BytePair(a_lo[i], a_lo[i + 8]), pair_hi = BytePair(a_hi[i], a_hi[i + 8]);
        for (size_t g = 0; g < 2; ++g) {
          __m256i w[4];
          operands(p, i, g, w);
          s_lo[2 * g] = _mm256_add_epi16(s_lo[2 * g], _mm256_maddubs_epi16(w[0], pair_lo));
          s_lo[2 * g + 1] = _mm256_add_epi16(s_lo[2 * g + 1], _mm256_maddubs_epi16(w[1], pair_lo));
          s_hi[2 * g] = _mm256_add_epi16(s_hi[2 * g], _mm256_maddubs_epi16(w[2], pair_hi));
          s_hi[2 * g + 1] = _mm256_add_epi16(s_hi[2 * g + 1], _mm256_maddubs_epi16(w[3], pair_hi));
        }
      }
      for (size_t g = 0; g < 2; ++g) {
        AddWidened(s_lo[2 * g], s_lo[2 * g + 1], sub_lo + 4 * g);
        AddWidened(s_hi[2 * g], s_hi[2 * g + 1], sub_hi + 4 * g);
      }
    }
    for (size_t g = 0; g < 8; ++g) {
      const auto scale = [&](size_t j) {
        return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + j * kTile + 8 * g)));
      };
      total[g] = _mm256_add_epi32(total[g], _mm256_add_epi32(_mm256_mullo_epi32(scale(2 * p), sub_lo[g]),
                                                             _mm256_mullo_epi32(scale(2 * p + 1), sub_hi[g])));
    }
  }
  const __m256 d = _mm256_set1_ps(a.d[row * (a.k / 256) + s]);
  for (size_t g = 0; g < 8; ++g) {
    const __m256 acc = _mm256_loadu_ps(c + 8 * g);
    _mm256_storeu_ps(c + 8 * g, _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[g]), _mm256_mul_ps(Halves(blk + 16 * g), d), acc));
  }
}

// One row decodes each super-block as it goes. Several rows (a decode batch, a
// prompt; up to kMaxRows per call) decode it once into 16 KB of operands and each
// row reads them: the decoding is most of a row's work.
void GemmQ6KAvx2(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c,
                 size_t c_stride) {
  const size_t supers = a.k / 256;
  for (size_t r = 0; r < m; ++r) std::fill(c + r * c_stride, c + r * c_stride + kTile, 0.0f);
  alignas(32) __m256i decoded[8][8][2][4];  // [p][i][g]: Q6KOperands
  for (size_t s = 0; s < supers; ++s) {
    const uint8_t* blk = tile + s * 210 * kTile;
    const uint8_t* ql = blk + 18 * kTile;
    const uint8_t* qh = blk + 146 * kTile;
    if (m == 1) {
      Q6KSuperRow<true>(a, row0, s, blk, [&](size_t p, size_t i, size_t g, __m256i w[4]) {
        Q6KOperands(ql, qh, p, i, g, w);
      }, c);
      continue;
    }
    for (size_t p = 0; p < 8; ++p) {
      PrefetchEighth(blk + 210 * kTile, 210 * kTile, p);
      for (size_t i = 0; i < 8; ++i) {
        for (size_t g = 0; g < 2; ++g) Q6KOperands(ql, qh, p, i, g, decoded[p][i][g]);
      }
    }
    for (size_t r = 0; r < m; ++r) {
      Q6KSuperRow<false>(a, row0 + r, s, blk, [&](size_t p, size_t i, size_t g, __m256i w[4]) {
        for (size_t v = 0; v < 4; ++v) w[v] = decoded[p][i][g][v];
      }, c + r * c_stride);
    }
  }
  (void)t;
}

// Q4_K with several rows: each super-block is decoded once into 16 KB of operands
// and every pair of rows reads them, their accumulators kept in c between
// super-blocks (the same FP32 operations in the same order, so the same results).
void GemmQ4KAvx2(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c,
                 size_t c_stride) {
  if (m < kQ4KDecodeRows) return ByRows<Q4KRows>(m, a, row0, tile, t, c, c_stride);
  for (size_t r = 0; r < m; ++r) std::fill(c + r * c_stride, c + r * c_stride + kTile, 0.0f);
  alignas(32) __m256i decoded[8][16][2][2];  // [sub][i][g]: NibbleOperands
  const auto rows = [&](auto kRows, size_t r, const uint8_t* blk, size_t s) {
    constexpr size_t R = decltype(kRows)::value;
    __m256 acc[R][8];
    for (size_t j = 0; j < R; ++j) {
      for (size_t g = 0; g < 8; ++g) acc[j][g] = _mm256_loadu_ps(c + (r + j) * c_stride + 8 * g);
    }
    Q4KSuper<R, false>(a, row0 + r, s, blk, [&](size_t sub, size_t i, size_t g, __m256i w[2]) {
      w[0] = decoded[sub][i][g][0];
      w[1] = decoded[sub][i][g][1];
    }, acc);
    for (size_t j = 0; j < R; ++j) Store(acc[j], c + (r + j) * c_stride);
  };
  for (size_t s = 0; s < a.k / 256; ++s) {
    const uint8_t* blk = tile + s * 148 * kTile;
    for (size_t sub = 0; sub < 8; ++sub) {
      PrefetchEighth(blk + 148 * kTile, 148 * kTile, sub);
      for (size_t i = 0; i < 16; ++i) {
        for (size_t g = 0; g < 2; ++g) NibbleOperands(blk + 20 * kTile + 16 * sub * kTile, i, g, decoded[sub][i][g]);
      }
    }
    size_t r = 0;
    for (; r + 2 <= m; r += 2) rows(std::integral_constant<size_t, 2>(), r, blk, s);
    if (r < m) rows(std::integral_constant<size_t, 1>(), r, blk, s);
  }
}

// The activation quantization of quant_activations.h, vectorized: the same products
// and the same rounding (vroundps to nearest even is nearbyint under the default
// mode), so the same bytes as QuantizeRowPortable. It runs on the calling thread
// while the pool's other threads wait, so its time is all of theirs.
void QuantizeRowAvx2(const uint16_t* x, size_t k, size_t block, int8_t* q, float* d, int32_t* sum32) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  for (size_t b = 0; b < k / block; ++b) {
    const uint16_t* xb = x + b * block;
    int8_t* qb = q + b * block;
    __m256 vmax = _mm256_setzero_ps();
    __m256 finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (size_t i = 0; i < block; i += 8) {
      const __m256 a = _mm256_and_ps(simd::LoadBf16(xb + i), abs_mask);
      finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, inf, _CMP_LT_OQ));  // false for NaN and infinity
      vmax = _mm256_max_ps(vmax, a);
    }
    const float amax = simd::MaxOf(static_cast<simd::VF>(vmax));
    const bool all_finite = _mm256_movemask_ps(finite) == 0xff;
    float scale = 0.0f;  // what x is multiplied by
    if (!all_finite || amax == 0.0f) {
      std::memset(qb, 0, block);
      d[b] = all_finite ? 0.0f : NAN;
    } else if (block == 256) {
      // q8_K: the signed value of largest magnitude, its first occurrence.
      size_t at = 0;
      while (std::fabs(Bf16ToFloat(xb[at])) != amax) ++at;
      scale = -127.0f / Bf16ToFloat(xb[at]);
      d[b] = 1.0f / scale;
    } else {
      d[b] = amax / 127.0f;
      scale = 1.0f / d[b];
    }
    if (scale == 0.0f) continue;
    const __m256 s = _mm256_set1_ps(scale), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (size_t i = 0; i < block; i += 32) {
      __m256i n[4];
      for (size_t j = 0; j < 4; ++j) {
        const __m256 v = _mm256_round_ps(_mm256_mul_ps(simd::LoadBf16(xb + i + 8 * j), s),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        n[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
      }
      // Saturating packs interleave the 128-bit lanes; the permute puts the 32 bytes in order.
      const __m256i p16a = _mm256_packs_epi32(n[0], n[1]), p16b = _mm256_packs_epi32(n[2], n[3]);
      const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + i), p8);
    }
  }
  for (size_t b = 0; b < k / 32; ++b) {
    // Sum of 32 int8: widen to 16 bits with vpmaddubsw against ones, then to 32.
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * b));
    const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), v);
    const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    sum32[b] = _mm_cvtsi128_si32(t);
  }
}

void StoreBf16Avx2(const float* c, size_t n, uint16_t* out) {
  for (size_t j = 0; j < n; j += simd::kLanes) {
    const size_t lanes = std::min(simd::kLanes, n - j);
    simd::StoreBf16N(out + j, simd::LoadFN(c + j, lanes), lanes);
  }
}

}  // namespace

constexpr QuantKernelSet kAvx2QuantKernels = WithPortableUkernels(
    {"avx2", kTile, false, kMaxRows,
     {ByRows<Gemm32<QuantFormat::kQ8_0>::Rows>, ByRows<Gemm32<QuantFormat::kQ4_0>::Rows>,
      ByRows<Gemm32<QuantFormat::kQ4_1>::Rows>, GemmQ4KAvx2, GemmQ6KAvx2},
     QuantizeRowAvx2, StoreBf16Avx2});

}  // namespace rvascend
