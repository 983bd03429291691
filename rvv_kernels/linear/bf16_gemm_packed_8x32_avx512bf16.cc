// x86-64 host kernels with AVX512-BF16: vdpbf16ps multiplies BF16 pairs and
// accumulates in FP32, twice the multiply-adds per instruction of widening to
// FP32 first. The packed layout keeps 32 columns of one k contiguous, so two
// k rows are interleaved in registers (one permute per 16 columns) to form
// the (k, k+1) pairs vdpbf16ps consumes. Like the hardware instruction, this
// path treats BF16 subnormals as zero; results otherwise follow the contract
// (FP32 accumulation, one rounding to BF16, nearest even).
#include <immintrin.h>

#include <cstring>

#include "rvv_kernels/linear/bf16_packed_ukernels.h"
#include "rvv_kernels/linear/packed_layout.h"

namespace rvascend {
namespace {

// Lane pairs (row k col j, row k+1 col j) for j = 0..15 and j = 16..31.
inline void Interleave(__m512i r0, __m512i r1, __m512i* lo, __m512i* hi) {
  const __m512i idx_lo = _mm512_set_epi16(
      47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
      39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i idx_hi = _mm512_set_epi16(
      63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
      55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
  *lo = _mm512_permutex2var_epi16(r0, idx_lo, r1);
  *hi = _mm512_permutex2var_epi16(r0, idx_hi, r1);
}

// (a[kk], a[kk+1]) broadcast to every 32-bit lane; for the last, odd k the
// partner is zero (and so is the weight row it multiplies).
template <bool kLast>
inline __m512i PairOf(const uint16_t* a, size_t kk) {
  uint32_t pair;
  if (kLast) {
    pair = a[kk];
  } else {
    std::memcpy(&pair, a + kk, sizeof(pair));
  }
  return _mm512_set1_epi32(static_cast<int>(pair));
}

template <bool kLast>
inline void LoadRows(const uint16_t* w, size_t kk, __m512i* lo, __m512i* hi) {
  const __m512i r0 = _mm512_loadu_si512(w + kk * kPackedBlockN);
  const __m512i r1 = kLast ? _mm512_setzero_si512() : _mm512_loadu_si512(w + (kk + 1) * kPackedBlockN);
  Interleave(r0, r1, lo, hi);
}

inline __m512 Dot(__m512 acc, __m512i w, __m512i a) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(w), reinterpret_cast<__m512bh&>(a));
}

// Round to nearest even with NaNs kept quiet, then store the first n lanes.
inline void Store(uint16_t* dst, __m512 acc, size_t n) {
  const __m512i bits = _mm512_castps_si512(acc);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(acc, acc, _CMP_UNORD_Q);
  rounded = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  const __m256i narrow = _mm512_cvtepi32_epi16(rounded);
  const __mmask16 keep = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
  _mm256_mask_storeu_epi16(dst, keep, narrow);
}

inline void StoreBlock(uint16_t* dst, __m512 lo, __m512 hi, size_t nc) {
  Store(dst, lo, nc < 16 ? nc : 16);
  if (nc > 16) Store(dst + 16, hi, nc - 16);
}

template <int kRows>
void Tile(size_t nc, size_t k, const uint16_t* a, size_t a_stride, const uint16_t* w, uint16_t* c,
          size_t c_stride) {
  __m512 lo[kRows], hi[kRows];
  for (int r = 0; r < kRows; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  // (No lambda here: GCC then keeps the accumulator arrays in memory.)
  size_t kk = 0;
  for (; kk + 2 <= k; kk += 2) {
    __m512i wlo, whi;
    LoadRows<false>(w, kk, &wlo, &whi);
    for (int r = 0; r < kRows; ++r) {
      const __m512i ap = PairOf<false>(a + r * a_stride, kk);
      lo[r] = Dot(lo[r], wlo, ap);
      hi[r] = Dot(hi[r], whi, ap);
    }
  }
  if (kk < k) {
    __m512i wlo, whi;
    LoadRows<true>(w, kk, &wlo, &whi);
    for (int r = 0; r < kRows; ++r) {
      const __m512i ap = PairOf<true>(a + r * a_stride, kk);
      lo[r] = Dot(lo[r], wlo, ap);
      hi[r] = Dot(hi[r], whi, ap);
    }
  }
  for (int r = 0; r < kRows; ++r) StoreBlock(c + r * c_stride, lo[r], hi[r], nc);
}

}  // namespace

void bf16_gemv_packed_ukernel_1x64__avx512bf16(size_t /*m*/, size_t nc, size_t k, const void* a,
                                                size_t /*a_stride*/, const uint16_t* w, uint16_t* c,
                                                size_t /*c_stride*/) {
  const uint16_t* ab = static_cast<const uint16_t*>(a);
  if (nc <= kPackedBlockN) {
    Tile<1>(nc, k, ab, 0, w, c, 0);
    return;
  }
  const uint16_t* w1 = w + k * kPackedBlockN;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
  size_t kk = 0;
  for (; kk + 2 <= k; kk += 2) {
    const __m512i ap = PairOf<false>(ab, kk);
    __m512i lo, hi;
    LoadRows<false>(w, kk, &lo, &hi);
    a0 = Dot(a0, lo, ap);
    a1 = Dot(a1, hi, ap);
    LoadRows<false>(w1, kk, &lo, &hi);
    b0 = Dot(b0, lo, ap);
    b1 = Dot(b1, hi, ap);
  }
  if (kk < k) {
    const __m512i ap = PairOf<true>(ab, kk);
    __m512i lo, hi;
    LoadRows<true>(w, kk, &lo, &hi);
    a0 = Dot(a0, lo, ap);
    a1 = Dot(a1, hi, ap);
    LoadRows<true>(w1, kk, &lo, &hi);
    b0 = Dot(b0, lo, ap);
    b1 = Dot(b1, hi, ap);
  }
  StoreBlock(c, a0, a1, kPackedBlockN);
  StoreBlock(c + kPackedBlockN, b0, b1, nc - kPackedBlockN);
}

void bf16_gemm_packed_ukernel_8x32__avx512bf16(size_t m, size_t nc, size_t k, const void* a,
                                                size_t a_stride, const uint16_t* w, uint16_t* c,
                                                size_t c_stride) {
  const uint16_t* ab = static_cast<const uint16_t*>(a);
  switch (m) {
    case 1: Tile<1>(nc, k, ab, a_stride, w, c, c_stride); break;
    case 2: Tile<2>(nc, k, ab, a_stride, w, c, c_stride); break;
    case 3: Tile<3>(nc, k, ab, a_stride, w, c, c_stride); break;
    case 4: Tile<4>(nc, k, ab, a_stride, w, c, c_stride); break;
    case 5: Tile<5>(nc, k, ab, a_stride, w, c, c_stride); break;
    case 6: Tile<6>(nc, k, ab, a_stride, w, c, c_stride); break;
    case 7: Tile<7>(nc, k, ab, a_stride, w, c, c_stride); break;
    default: Tile<8>(nc, k, ab, a_stride, w, c, c_stride); break;
  }
}

}  // namespace rvascend
