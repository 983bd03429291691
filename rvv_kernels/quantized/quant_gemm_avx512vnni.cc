// AVX-512 VNNI kernels for Q8_0 and Q4_0 on the runtime layout (tiles of 64
// columns, quant_format.h); the other formats keep the AVX2 kernels.
//
// vpdpbusd multiplies four unsigned bytes by four signed bytes and adds the
// four products to an int32 lane, so a lane must hold four k of one column
// while the layout stores one k of 64 columns per 64 bytes: four rows of the
// tile are transposed in registers (two rounds of in-lane unpacks), which
// leaves the columns of each 128-bit lane in four groups of four
// (Transpose4). The activations are signed; the weights are made unsigned:
// Q4_0's nibbles are 0..15 already (the 8 is taken off as 8 x the block's
// activation sum, as in the other sets), Q8_0's bytes are flipped to q + 128
// and 128 x the activation sum is taken off. Both corrections are exact, and
// the scales are applied with the portable twin's FP32 operations in its
// order, so the results are bit-identical to it (the host test compares).
#include <immintrin.h>

#include <cstring>

#include "rvv_kernels/quantized/quant_kernel_sets.h"

namespace rvascend {
namespace {

constexpr size_t kTile = 64;

// Rows k..k+3 of 64 columns -> out[g]: dwords of the four k of columns
// 16 L + 4 g + (0..3) in 128-bit lane L.
inline void Transpose4(__m512i r0, __m512i r1, __m512i r2, __m512i r3, __m512i out[4]) {
  const __m512i a = _mm512_unpacklo_epi8(r0, r1), b = _mm512_unpackhi_epi8(r0, r1);
  const __m512i c = _mm512_unpacklo_epi8(r2, r3), d = _mm512_unpackhi_epi8(r2, r3);
  out[0] = _mm512_unpacklo_epi16(a, c);
  out[1] = _mm512_unpackhi_epi16(a, c);
  out[2] = _mm512_unpacklo_epi16(b, d);
  out[3] = _mm512_unpackhi_epi16(b, d);
}

inline __m512i Load(const uint8_t* p) { return _mm512_loadu_si512(p); }

inline __m512i Dword(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The 64 f16 scales at p in Transpose4's column order: s[g] for group g.
inline void Scales(const uint8_t* p, __m512 s[4]) {
  const __m512i x = Load(p), y = Load(p + 64);  // qwords n = columns 4n .. 4n+3
  const __m512i g01 = _mm512_permutex2var_epi64(x, _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13), y);
  const __m512i g23 = _mm512_permutex2var_epi64(x, _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15), y);
  s[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(g01));
  s[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(g01, 1));
  s[2] = _mm512_cvtph_ps(_mm512_castsi512_si256(g23));
  s[3] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(g23, 1));
}

// R rows of activations against one tile; F is Q8_0 or Q4_0.
template <QuantFormat F, size_t R>
void GemmRows(const QuantActs& a, size_t row0, const uint8_t* tile, float* c, size_t c_stride) {
  constexpr bool kQ8 = F == QuantFormat::kQ8_0;
  const size_t blocks = a.k / 32;
  const size_t block_bytes = (kQ8 ? 34 : 18) * kTile;
  const __m512i low4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R][4];
  for (size_t r = 0; r < R; ++r) {
    for (auto& v : acc[r]) v = _mm512_setzero_ps();
  }
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = tile + b * block_bytes;
    const uint8_t* q = blk + 2 * kTile;
    const int8_t* x[R];
    for (size_t r = 0; r < R; ++r) x[r] = a.q + (row0 + r) * a.k + 32 * b;
    __m512i isum[R][4];
    for (size_t r = 0; r < R; ++r) {
      for (auto& v : isum[r]) v = _mm512_setzero_si512();
    }
    if constexpr (kQ8) {
      for (size_t i = 0; i < 32; i += 4) {
        const uint8_t* row = q + i * kTile;
        __m512i w[4];
        Transpose4(_mm512_xor_si512(Load(row), flip), _mm512_xor_si512(Load(row + kTile), flip),
                   _mm512_xor_si512(Load(row + 2 * kTile), flip), _mm512_xor_si512(Load(row + 3 * kTile), flip), w);
        for (size_t r = 0; r < R; ++r) {
          const __m512i av = Dword(x[r] + i);
          for (size_t g = 0; g < 4; ++g) isum[r][g] = _mm512_dpbusd_epi32(isum[r][g], w[g], av);
        }
      }
    } else {
      for (size_t i = 0; i < 16; i += 4) {  // byte (i, column): k = i in the low nibble, i + 16 in the high
        const uint8_t* row = q + i * kTile;
        __m512i bytes[4], lo[4], hi[4];
        for (size_t j = 0; j < 4; ++j) bytes[j] = Load(row + j * kTile);
        Transpose4(_mm512_and_si512(bytes[0], low4), _mm512_and_si512(bytes[1], low4),
                   _mm512_and_si512(bytes[2], low4), _mm512_and_si512(bytes[3], low4), lo);
        Transpose4(_mm512_and_si512(_mm512_srli_epi16(bytes[0], 4), low4),
                   _mm512_and_si512(_mm512_srli_epi16(bytes[1], 4), low4),
                   _mm512_and_si512(_mm512_srli_epi16(bytes[2], 4), low4),
                   _mm512_and_si512(_mm512_srli_epi16(bytes[3], 4), low4), hi);
        for (size_t r = 0; r < R; ++r) {
          const __m512i al = Dword(x[r] + i), ah = Dword(x[r] + 16 + i);
          for (size_t g = 0; g < 4; ++g) {
            isum[r][g] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(isum[r][g], lo[g], al), hi[g], ah);
          }
        }
      }
    }
    __m512 scale[4];
    Scales(blk, scale);
    for (size_t r = 0; r < R; ++r) {
      const float ad = a.d[(row0 + r) * blocks + b];
      const __m512i offset = _mm512_set1_epi32((kQ8 ? 128 : 8) * a.sum32[(row0 + r) * blocks + b]);
      const __m512 s = _mm512_set1_ps(ad);
      for (size_t g = 0; g < 4; ++g) {
        const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[r][g], offset));
        acc[r][g] = _mm512_fmadd_ps(v, _mm512_mul_ps(scale[g], s), acc[r][g]);
      }
    }
  }
  for (size_t r = 0; r < R; ++r) {
    float* out = c + r * c_stride;
    for (size_t g = 0; g < 4; ++g) {
      _mm_storeu_ps(out + 4 * g, _mm512_extractf32x4_ps(acc[r][g], 0));
      _mm_storeu_ps(out + 16 + 4 * g, _mm512_extractf32x4_ps(acc[r][g], 1));
      _mm_storeu_ps(out + 32 + 4 * g, _mm512_extractf32x4_ps(acc[r][g], 2));
      _mm_storeu_ps(out + 48 + 4 * g, _mm512_extractf32x4_ps(acc[r][g], 3));
    }
  }
}

template <QuantFormat F>
void Gemm(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t, float* c, size_t c_stride) {
  size_t r = 0;
  for (; r + 4 <= m; r += 4) GemmRows<F, 4>(a, row0 + r, tile, c + r * c_stride, c_stride);
  for (; r + 2 <= m; r += 2) GemmRows<F, 2>(a, row0 + r, tile, c + r * c_stride, c_stride);
  if (r < m) GemmRows<F, 1>(a, row0 + r, tile, c + r * c_stride, c_stride);
}

}  // namespace

const QuantKernelSet& Avx512VnniQuantKernels() {
  static const QuantKernelSet set = [] {
    QuantKernelSet s = kAvx2QuantKernels;
    s.name = "avx512vnni";
    s.ukernel[static_cast<int>(QuantFormat::kQ8_0)] = Gemm<QuantFormat::kQ8_0>;
    s.ukernel[static_cast<int>(QuantFormat::kQ4_0)] = Gemm<QuantFormat::kQ4_0>;
    return s;
  }();
  return set;
}

}  // namespace rvascend
