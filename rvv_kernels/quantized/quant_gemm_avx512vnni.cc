// AVX-512 VNNI kernels for every kept format on the runtime layout
// (tiles of 64 columns, quant_format.h).
//
// vpdpbusd multiplies four unsigned bytes by four signed bytes and adds the
// four products to an int32 lane, so a lane must hold four k of one column
// while the layout stores one k of 64 columns per 64 bytes: four rows of the
// tile are transposed in registers (two rounds of in-lane unpacks), which
// leaves the columns of each 128-bit lane in four groups of four
// (Transpose4). The activations are signed; the weights are made unsigned:
// Q4_0's, Q4_1's and Q4_K's nibbles are 0..15 already (Q4_0's 8 is taken off as
// 8 x the block's activation sum, as in the other sets; Q4_1's min adds m x that
// sum after the scaled dot, as the portable twin does), Q6_K's quants 0..63 (32 x
// the sub-block's sum taken off), Q8_0's bytes are flipped to q + 128 and 128 x
// the activation sum is taken off. These corrections are exact, and
// the scales are applied with the portable twin's FP32 operations in its
// order, so the results are bit-identical to it (the host test compares).
//
// A call with many rows (a prompt) expands the tile once into those unsigned
// bytes in Transpose4's order (Expand) and runs every row against the expanded
// copy: the unpacking and transposing, about as many instructions as the dot
// products of four rows, are then done once per tile instead of once per four
// rows. The integer sums are the same, so are the results.
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "rvv_kernels/quantized/quant_gemm_portable.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"
#include "rvv_kernels/quantized/quant_prefetch_x86.h"

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

template <size_t R, size_t NG>
inline void Zero(__m512 (&v)[R][NG]) {
  for (auto& row : v) {
    for (auto& x : row) x = _mm512_setzero_ps();
  }
}

template <size_t R, size_t NG>
inline void Zero(__m512i (&v)[R][NG]) {
  for (auto& row : v) {
    for (auto& x : row) x = _mm512_setzero_si512();
  }
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

// isum[r][g] += the dot of w[g] (four k in Transpose4's order, NG of its groups)
// with x[r][k .. k+3].
template <size_t R, size_t NG = 4>
inline void DotGroup(const __m512i* w, const int8_t* const x[R], size_t k, __m512i isum[R][NG]) {
  for (size_t r = 0; r < R; ++r) {
    const __m512i av = Dword(x[r] + k);
    for (size_t g = 0; g < NG; ++g) isum[r][g] = _mm512_dpbusd_epi32(isum[r][g], w[g], av);
  }
}

// Q8_0 quant rows k .. k+3 of a block (row = q + k * 64), made unsigned (q + 128).
inline void Q8Group(const uint8_t* row, __m512i w[4]) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  Transpose4(_mm512_xor_si512(Load(row), flip), _mm512_xor_si512(Load(row + kTile), flip),
             _mm512_xor_si512(Load(row + 2 * kTile), flip), _mm512_xor_si512(Load(row + 3 * kTile), flip), w);
}

// Nibble byte rows i .. i+3 of a 32-value block (row = qs + i * 64; the low nibble
// holds k = i, the high one k = i + 16): lo for k = i .. i+3, hi for k = i+16 .. i+19.
inline void NibbleGroups(const uint8_t* row, __m512i lo[4], __m512i hi[4]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i bytes[4];
  for (size_t j = 0; j < 4; ++j) bytes[j] = Load(row + j * kTile);
  Transpose4(_mm512_and_si512(bytes[0], low4), _mm512_and_si512(bytes[1], low4), _mm512_and_si512(bytes[2], low4),
             _mm512_and_si512(bytes[3], low4), lo);
  Transpose4(_mm512_and_si512(_mm512_srli_epi16(bytes[0], 4), low4),
             _mm512_and_si512(_mm512_srli_epi16(bytes[1], 4), low4),
             _mm512_and_si512(_mm512_srli_epi16(bytes[2], 4), low4),
             _mm512_and_si512(_mm512_srli_epi16(bytes[3], 4), low4), hi);
}

// Q6_K's quants (0..63) of pair p, rows k = 32p + kind * 8 + i0 .. +3: kind 0 and 2
// from ql row 16p + i (low, high nibble), 1 and 3 from ql row 16p + 8 + i; their
// high bits are qh row 8p + i's bit pairs 0, 1, 2, 3 (quant_format.h).
inline void Q6Group(const uint8_t* ql, const uint8_t* qh, size_t p, size_t kind, size_t i0, __m512i w[4]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  __m512i rows[4];
  for (size_t j = 0; j < 4; ++j) {
    const size_t i = i0 + j;
    const __m512i l = Load(ql + (16 * p + (kind & 1) * 8 + i) * kTile);
    const __m512i h = Load(qh + (8 * p + i) * kTile);
    const __m512i low = kind < 2 ? l : _mm512_srli_epi16(l, 4);
    // The pair of high bits moved to bits 4-5.
    const __m512i high = kind == 0 ? _mm512_slli_epi16(h, 4)
                         : kind == 1 ? _mm512_slli_epi16(h, 2)
                         : kind == 2 ? h
                                     : _mm512_srli_epi16(h, 2);
    rows[j] = _mm512_or_si512(_mm512_and_si512(low, low4), _mm512_and_si512(high, bits45));
  }
  Transpose4(rows[0], rows[1], rows[2], rows[3], w);
}

// 16 rows of nibble bytes qs[16][64] (low nibble k = i, high k = i + 16) against
// x[r][0..31], added to isum[r][g] (Transpose4's column order).
template <size_t R>
inline void NibbleDot(const uint8_t* qs, const int8_t* const x[R], __m512i isum[R][4]) {
  for (size_t i = 0; i < 16; i += 4) {
    __m512i lo[4], hi[4];
    NibbleGroups(qs + i * kTile, lo, hi);
    for (size_t r = 0; r < R; ++r) {
      const __m512i al = Dword(x[r] + i), ah = Dword(x[r] + 16 + i);
      for (size_t g = 0; g < 4; ++g) {
        isum[r][g] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(isum[r][g], lo[g], al), hi[g], ah);
      }
    }
  }
}

// The expanded tile (Expand): k-group j (k = 4j .. 4j+3) is the 256 bytes at 256 j,
// its Transpose4 group g the 64 at 256 j + 64 g; e points at the first k of the
// run. Groups G0 .. G0+NG-1 of L values of k.
template <size_t R, size_t L, size_t G0, size_t NG>
inline void ExpandedDot(const uint8_t* e, const int8_t* const x[R], __m512i isum[R][NG]) {
  for (size_t i = 0; i < L; i += 4) {
    __m512i w[NG];
    for (size_t g = 0; g < NG; ++g) w[g] = _mm512_load_si512(e + i * kTile + (G0 + g) * kTile);
    DotGroup<R, NG>(w, x, i, isum);
  }
}

inline void StoreGroup(const __m512i w[4], uint8_t* e) {
  for (size_t g = 0; g < 4; ++g) _mm512_store_si512(e + g * kTile, w[g]);
}

// The nibbles of a 32-value block (qs[16][64]) into the expanded tile at e (its first k).
inline void ExpandNibbles(const uint8_t* qs, uint8_t* e) {
  for (size_t i = 0; i < 16; i += 4) {
    __m512i lo[4], hi[4];
    NibbleGroups(qs + i * kTile, lo, hi);
    StoreGroup(lo, e + i * kTile);
    StoreGroup(hi, e + (16 + i) * kTile);
  }
}

// The 64 bytes at p in Transpose4's order, group g: dwords g, 4 + g, 8 + g, 12 + g
// (dword n holds columns 4n .. 4n+3), to be widened to int32.
inline __m128i Group(const uint8_t* p, size_t g) {
  const __m512i pick = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(g, 4 + g, 8 + g, 12 + g, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), Load(p));
  return _mm512_castsi512_si128(pick);
}

inline __m512i Bytes32(const uint8_t* p, size_t g) { return _mm512_cvtepu8_epi32(Group(p, g)); }

// acc (groups G0 .. G0+NG-1 in Transpose4's order) -> their columns of out[0..63].
template <size_t G0, size_t NG>
inline void StoreColumns(const __m512 acc[NG], float* out) {
  for (size_t g = 0; g < NG; ++g) {
    for (size_t lane = 0; lane < 4; ++lane) {
      _mm_storeu_ps(out + 16 * lane + 4 * (G0 + g), _mm512_extractf32x4_ps(acc[g], lane));
    }
  }
}

// Each kernel below is a struct: Rows<R, kExpanded, G0, NG> runs R rows of
// activations against Transpose4 groups G0 .. G0+NG-1 of one tile (all four
// unless expanded: unpacking makes all four at once), reading the quants from
// the tile or, with kExpanded, from the tile expanded by Expand (e); the scales
// always come from the tile.

// Q8_0, Q4_0 or Q4_1.
template <QuantFormat F>
struct Block32Kernel {
  static constexpr bool kQ8 = F == QuantFormat::kQ8_0;
  static constexpr bool kQ41 = F == QuantFormat::kQ4_1;
  static constexpr size_t kBlockBytes = (kQ8 ? 34 : kQ41 ? 20 : 18) * kTile;
  static constexpr size_t kQuantsAt = (kQ41 ? 4 : 2) * kTile;  // after the scales (and Q4_1's mins)
  static constexpr int kOffset = kQ8 ? 128 : kQ41 ? 0 : 8;   // x the activations' sum

  static void Expand(const uint8_t* tile, size_t k, uint8_t* e) {
    for (size_t b = 0; b < k / 32; ++b) {
      const uint8_t* q = tile + b * kBlockBytes + kQuantsAt;
      uint8_t* eb = e + 32 * b * kTile;
      if constexpr (kQ8) {
        for (size_t i = 0; i < 32; i += 4) {
          __m512i w[4];
          Q8Group(q + i * kTile, w);
          StoreGroup(w, eb + i * kTile);
        }
      } else {
        ExpandNibbles(q, eb);
      }
    }
  }

  template <size_t R, bool kExpanded, size_t G0 = 0, size_t NG = 4>
  static void Rows(const QuantActs& a, size_t row0, const uint8_t* tile, const uint8_t* e, float* c,
                   size_t c_stride) {
    const size_t blocks = a.k / 32;
    __m512 acc[R][NG];
    Zero(acc);
    for (size_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = tile + b * kBlockBytes;
      const uint8_t* q = blk + kQuantsAt;
      const int8_t* x[R];
      for (size_t r = 0; r < R; ++r) x[r] = a.q + (row0 + r) * a.k + 32 * b;
      __m512i isum[R][NG];
      Zero(isum);
      if constexpr (kExpanded) {
        ExpandedDot<R, 32, G0, NG>(e + 32 * b * kTile, x, isum);
      } else if constexpr (kQ8) {
        for (size_t i = 0; i < 32; i += 4) {
          __m512i w[4];
          Q8Group(q + i * kTile, w);
          DotGroup<R>(w, x, i, isum);
        }
      } else {
        NibbleDot<R>(q, x, isum);
      }
      __m512 scale[4], mins[4];
      Scales(blk, scale);
      if constexpr (kQ41) Scales(blk + 2 * kTile, mins);
      for (size_t r = 0; r < R; ++r) {
        const float ad = a.d[(row0 + r) * blocks + b];
        const int32_t asum = a.sum32[(row0 + r) * blocks + b];
        const __m512i offset = _mm512_set1_epi32(kOffset * asum);
        const __m512 s = _mm512_set1_ps(ad);
        for (size_t g = 0; g < NG; ++g) {
          const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[r][g], offset));
          acc[r][g] = _mm512_fmadd_ps(v, _mm512_mul_ps(scale[G0 + g], s), acc[r][g]);
          if constexpr (kQ41) {
            acc[r][g] = _mm512_fmadd_ps(mins[G0 + g], _mm512_set1_ps(ad * static_cast<float>(asum)), acc[r][g]);
          }
        }
      }
    }
    for (size_t r = 0; r < R; ++r) StoreColumns<G0, NG>(acc[r], c + r * c_stride);
  }
};

// Q4_K: per sub-block of 32 the nibble dot, times the column's 6-bit scale; the
// mins' term sum_j mn_j * (the activations' sum over sub-block j) after the
// super-block. The FP32 steps are the AVX2 and portable kernels'.
struct Q4KKernel {
  static constexpr size_t kSuperBytes = 148 * kTile;

  static void Expand(const uint8_t* tile, size_t k, uint8_t* e) {
    for (size_t s = 0; s < k / 256; ++s) {
      for (size_t sub = 0; sub < 8; ++sub) {
        ExpandNibbles(tile + s * kSuperBytes + 20 * kTile + 16 * sub * kTile, e + (256 * s + 32 * sub) * kTile);
      }
    }
  }

  template <size_t R, bool kExpanded, size_t G0 = 0, size_t NG = 4>
  static void Rows(const QuantActs& a, size_t row0, const uint8_t* tile, const uint8_t* e, float* c,
                   size_t c_stride) {
    const size_t supers = a.k / 256;
    __m512 acc[R][NG];
    Zero(acc);
    for (size_t s = 0; s < supers; ++s) {
      const uint8_t* blk = tile + s * kSuperBytes;
      const uint8_t* sc = blk + 4 * kTile;
      const uint8_t* mn = blk + 12 * kTile;
      __m512i total[R][NG];
      Zero(total);
      for (size_t sub = 0; sub < 8; ++sub) {
        const int8_t* x[R];
        for (size_t r = 0; r < R; ++r) x[r] = a.q + (row0 + r) * a.k + 256 * s + 32 * sub;
        __m512i isum[R][NG];
        Zero(isum);
        if constexpr (kExpanded) {
          ExpandedDot<R, 32, G0, NG>(e + (256 * s + 32 * sub) * kTile, x, isum);
        } else {
          PrefetchEighth(blk + kSuperBytes, kSuperBytes, sub);
          NibbleDot<R>(blk + 20 * kTile + 16 * sub * kTile, x, isum);
        }
        for (size_t g = 0; g < NG; ++g) {
          const __m512i scale = Bytes32(sc + sub * kTile, G0 + g);
          for (size_t r = 0; r < R; ++r) {
            total[r][g] = _mm512_add_epi32(total[r][g], _mm512_mullo_epi32(scale, isum[r][g]));
          }
        }
      }
      __m512 d[4], dmin[4];
      Scales(blk, d);
      Scales(blk + 2 * kTile, dmin);
      const int32_t* asum[R];
      for (size_t r = 0; r < R; ++r) asum[r] = a.sum32 + (row0 + r) * (a.k / 32) + 8 * s;
      for (size_t g = 0; g < NG; ++g) {
        __m512i msum[R];  // the mins' term, each group's mins widened once for every row
        for (size_t r = 0; r < R; ++r) msum[r] = _mm512_setzero_si512();
        for (size_t sub = 0; sub < 8; ++sub) {
          const __m512i mins = Bytes32(mn + sub * kTile, G0 + g);
          for (size_t r = 0; r < R; ++r) {
            msum[r] = _mm512_add_epi32(msum[r], _mm512_mullo_epi32(mins, _mm512_set1_epi32(asum[r][sub])));
          }
        }
        for (size_t r = 0; r < R; ++r) {
          const float ad = a.d[(row0 + r) * supers + s];
          acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[r][g]),
                                      _mm512_mul_ps(d[G0 + g], _mm512_set1_ps(ad)), acc[r][g]);
          acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum[r]), _mm512_mul_ps(dmin[G0 + g], _mm512_set1_ps(-ad)),
                                      acc[r][g]);
        }
      }
    }
    for (size_t r = 0; r < R; ++r) StoreColumns<G0, NG>(acc[r], c + r * c_stride);
  }
};

// Q6_K: a pair p of 16-value sub-blocks (k = 32p + 0..15 and 32p + 16..31) at a
// time. The 6-bit quants are used unsigned (0..63) and 32 x the activations' sum
// of each sub-block is taken off, exactly.
struct Q6KKernel {
  static constexpr size_t kSuperBytes = 210 * kTile;

  static void Expand(const uint8_t* tile, size_t k, uint8_t* e) {
    for (size_t s = 0; s < k / 256; ++s) {
      const uint8_t* blk = tile + s * kSuperBytes;
      for (size_t p = 0; p < 8; ++p) {
        for (size_t kind = 0; kind < 4; ++kind) {
          for (size_t i0 = 0; i0 < 8; i0 += 4) {
            __m512i w[4];
            Q6Group(blk + 18 * kTile, blk + 146 * kTile, p, kind, i0, w);
            StoreGroup(w, e + (256 * s + 32 * p + kind * 8 + i0) * kTile);
          }
        }
      }
    }
  }

  template <size_t R, bool kExpanded, size_t G0 = 0, size_t NG = 4>
  static void Rows(const QuantActs& a, size_t row0, const uint8_t* tile, const uint8_t* e, float* c,
                   size_t c_stride) {
    const size_t supers = a.k / 256;
    __m512 acc[R][NG];
    Zero(acc);
    for (size_t s = 0; s < supers; ++s) {
      const uint8_t* blk = tile + s * kSuperBytes;
      const uint8_t* sc = blk + 2 * kTile;
      __m512i total[R][NG];
      Zero(total);
      for (size_t p = 0; p < 8; ++p) {
        if constexpr (!kExpanded) PrefetchEighth(blk + kSuperBytes, kSuperBytes, p);
        const int8_t* x[R];
        for (size_t r = 0; r < R; ++r) x[r] = a.q + (row0 + r) * a.k + 256 * s + 32 * p;
        // Sub-block 2p + half (k = 32p + 16 half + 0..15) at a time, folded into the totals
        // before the next one starts: one set of sums live, not two (R = 4 spilled).
        for (size_t half = 0; half < 2; ++half) {
          __m512i sums[R][NG];
          Zero(sums);
          if constexpr (kExpanded) {
            const int8_t* xh[R];
            for (size_t r = 0; r < R; ++r) xh[r] = x[r] + 16 * half;
            ExpandedDot<R, 16, G0, NG>(e + (256 * s + 32 * p + 16 * half) * kTile, xh, sums);
          } else {
            // Rows k = kind * 8 + i0 .. +3, one group of four at a time keeps the sums in registers.
            for (size_t kind = 2 * half; kind < 2 * half + 2; ++kind) {
              for (size_t i0 = 0; i0 < 8; i0 += 4) {
                __m512i w[4];
                Q6Group(blk + 18 * kTile, blk + 146 * kTile, p, kind, i0, w);
                DotGroup<R>(w, x, kind * 8 + i0, sums);
              }
            }
          }
          __m512i off[R];
          for (size_t r = 0; r < R; ++r) {
            off[r] = _mm512_set1_epi32(32 * a.sum16[(row0 + r) * (a.k / 16) + 16 * s + 2 * p + half]);
          }
          for (size_t g = 0; g < NG; ++g) {  // each group's scales widened once for every row
            const __m512i scale = _mm512_cvtepi8_epi32(Group(sc + (2 * p + half) * kTile, G0 + g));
            for (size_t r = 0; r < R; ++r) {
              total[r][g] =
                  _mm512_add_epi32(total[r][g], _mm512_mullo_epi32(scale, _mm512_sub_epi32(sums[r][g], off[r])));
            }
          }
        }
      }
      __m512 d[4];
      Scales(blk, d);
      for (size_t r = 0; r < R; ++r) {
        const __m512 ad = _mm512_set1_ps(a.d[(row0 + r) * supers + s]);
        for (size_t g = 0; g < NG; ++g) {
          acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[r][g]), _mm512_mul_ps(d[G0 + g], ad), acc[r][g]);
        }
      }
    }
    for (size_t r = 0; r < R; ++r) StoreColumns<G0, NG>(acc[r], c + r * c_stride);
  }
};

// The formats added after the first five (Q5_0, Q5_1, IQ4_NL, Q5_K, IQ4_XS, Q3_K, Q2_K).
// Their values are made unsigned bytes as the others' are: 5-bit codes 0..31, IQ4's
// table values + 128, Q3_K's q + 4 (0..7), Q2_K's 0..3; each offset times the
// activations' sum of its block (Q5_0 16 per 32, IQ4 128 per 32, Q3_K 4 per 16) is
// taken off in int32, exactly. A "unit" is what one plane row spans (quant_format.h):
// a 32-block, a 32-value sub-block (Q5_K, IQ4_XS) or a pair of 16-value sub-blocks
// (Q3_K, Q2_K); MakeGroups gives values i .. i+3 and 16 + i .. 16 + i+3 of a unit
// (i % 4 == 0), for every column, in Transpose4's order.
template <QuantFormat F>
struct AddedFormat {
  static constexpr bool kBlock32 = IsBlock32(F), kSub16 = HasSub16(F);
  static constexpr bool kFifth = F == QuantFormat::kQ5_0 || F == QuantFormat::kQ5_1 || F == QuantFormat::kQ5_K;
  static constexpr bool kTable = F == QuantFormat::kIQ4_NL || F == QuantFormat::kIQ4_XS;
  static constexpr size_t kRecord = kTileBlockBytes[static_cast<int>(F)] * kTile;

  // The planes of unit u, in tile widths from the block record (quant_format.h).
  static constexpr size_t Values(size_t u) {
    switch (F) {
      case QuantFormat::kQ5_0: case QuantFormat::kIQ4_NL: return 2;
      case QuantFormat::kQ5_1: return 4;
      case QuantFormat::kQ5_K: return 20 + 16 * u;
      case QuantFormat::kIQ4_XS: return 10 + 16 * u;
      case QuantFormat::kQ3_K: return 18 + 8 * u;
      default: return 20 + 8 * u;  // Q2_K
    }
  }
  static constexpr size_t Bits(size_t u) {
    switch (F) {
      case QuantFormat::kQ5_0: return 18;
      case QuantFormat::kQ5_1: return 20;
      case QuantFormat::kQ5_K: return 148 + 4 * u;
      default: return 82 + 4 * u;  // Q3_K
    }
  }

  // Values i .. i+3 (lo) and 16 + i .. 16 + i+3 (hi) of unit u, from one load of each row.
  static void MakeGroups(const uint8_t* blk, size_t u, size_t i, __m512i lo[4], __m512i hi[4]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512i rl[4], rh[4];
    for (size_t j = 0; j < 4; ++j) {
      __m512i l, h;
      if constexpr (kSub16) {  // two bits a value: row (i + j) % 8, bits 2 (i / 8) and 2 (2 + i / 8)
        const __m512i c = Load(blk + (Values(u) + (i + j) % 8) * kTile), three = _mm512_set1_epi8(3);
        const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(2 * (i / 8)));
        l = _mm512_and_si512(_mm512_srl_epi16(c, shift), three);
        h = _mm512_and_si512(_mm512_srl_epi16(_mm512_srli_epi16(c, 4), shift), three);
      } else {
        const __m512i b = Load(blk + (Values(u) + i + j) * kTile);
        l = _mm512_and_si512(b, low4);
        h = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
        if constexpr (kTable) {  // kIq4NlValues + 128, as bytes
          const __m512i table = _mm512_broadcast_i32x4(
              _mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, -127, -115, -103, -90, -75, -59, -39, -15));
          l = _mm512_shuffle_epi8(table, l);
          h = _mm512_shuffle_epi8(table, h);
        }
      }
      if constexpr (kFifth || F == QuantFormat::kQ3_K) {  // one bit a value: row j, bits i / 4 and 4 + i / 4
        const __m512i bits = Load(blk + (Bits(u) + j) * kTile);
        const __m512i one = _mm512_set1_epi8(kFifth ? 0x10 : 0x04);
        l = _mm512_or_si512(l, _mm512_maskz_mov_epi8(
                                   _mm512_test_epi8_mask(bits, _mm512_set1_epi8(static_cast<char>(1 << (i / 4)))), one));
        h = _mm512_or_si512(h, _mm512_maskz_mov_epi8(
                                   _mm512_test_epi8_mask(bits, _mm512_set1_epi8(static_cast<char>(16 << (i / 4)))), one));
      }
      rl[j] = l;
      rh[j] = h;
    }
    Transpose4(rl[0], rl[1], rl[2], rl[3], lo);
    Transpose4(rh[0], rh[1], rh[2], rh[3], hi);
  }

  static constexpr size_t kUnits = kBlock32 ? 1 : 8;
  static constexpr size_t kBlockK = kBlock32 ? 32 : 256;

  static void Expand(const uint8_t* tile, size_t k, uint8_t* e) {
    for (size_t b = 0; b < k / kBlockK; ++b) {
      for (size_t u = 0; u < kUnits; ++u) {
        for (size_t i = 0; i < 16; i += 4) {
          __m512i lo[4], hi[4];
          MakeGroups(tile + b * kRecord, u, i, lo, hi);
          StoreGroup(lo, e + (kBlockK * b + 32 * u + i) * kTile);
          StoreGroup(hi, e + (kBlockK * b + 32 * u + 16 + i) * kTile);
        }
      }
    }
  }

  // Unit u's 32 values against x[r][0..31]: values 0..15 into lo, 16..31 into hi (the
  // same accumulators where the unit has one scale).
  template <size_t R, bool kExpanded, size_t G0, size_t NG>
  static void Dot32(const uint8_t* blk, const uint8_t* e, size_t u, const int8_t* const x[R], __m512i lo[R][NG],
                    __m512i hi[R][NG]) {
    const int8_t* xh[R];
    for (size_t r = 0; r < R; ++r) xh[r] = x[r] + 16;
    if constexpr (kExpanded) {
      ExpandedDot<R, 16, G0, NG>(e, x, lo);
      ExpandedDot<R, 16, G0, NG>(e + 16 * kTile, xh, hi);
    } else {
      for (size_t i = 0; i < 16; i += 4) {
        __m512i wl[4], wh[4];
        MakeGroups(blk, u, i, wl, wh);
        DotGroup<R, NG>(wl + G0, x, i, lo);
        DotGroup<R, NG>(wh + G0, xh, i, hi);
      }
    }
  }

  template <size_t R, bool kExpanded, size_t G0 = 0, size_t NG = 4>
  static void Rows(const QuantActs& a, size_t row0, const uint8_t* tile, const uint8_t* e, float* c,
                   size_t c_stride) {
    constexpr bool kMins = F == QuantFormat::kQ5_1 || F == QuantFormat::kQ5_K || F == QuantFormat::kQ2_K;
    constexpr int32_t kOffset = F == QuantFormat::kQ5_0 ? 16 : kTable ? 128 : F == QuantFormat::kQ3_K ? 4 : 0;
    const size_t blocks = a.k / kBlockK;
    __m512 acc[R][NG];
    Zero(acc);
    for (size_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = tile + b * kRecord;
      const uint8_t* eb = e + kBlockK * b * kTile;
      if constexpr (!kExpanded) PrefetchEighth(blk + kRecord, kRecord, 0);
      __m512i total[R][NG], msum[R][NG];
      Zero(total);
      Zero(msum);
      for (size_t u = 0; u < kUnits; ++u) {
        const size_t k0 = kBlockK * b + 32 * u;
        const int8_t* x[R];
        for (size_t r = 0; r < R; ++r) x[r] = a.q + (row0 + r) * a.k + k0;
        if constexpr (kSub16) {
          __m512i both[2][R][NG];  // sub-blocks 2u and 2u + 1
          Zero(both[0]);
          Zero(both[1]);
          Dot32<R, kExpanded, G0, NG>(blk, eb + 32 * u * kTile, u, x, both[0], both[1]);
          for (size_t half = 0; half < 2; ++half) {
            auto& sums = both[half];
            const size_t sub = 16 * b + 2 * u + half;
            for (size_t g = 0; g < NG; ++g) {
              const __m128i bytes = Group(blk + ((F == QuantFormat::kQ3_K ? 2 : 4) + 2 * u + half) * kTile, G0 + g);
              if constexpr (F == QuantFormat::kQ3_K) {
                const __m512i scale = _mm512_cvtepi8_epi32(bytes);
                for (size_t r = 0; r < R; ++r) {
                  const __m512i off = _mm512_set1_epi32(kOffset * a.sum16[(row0 + r) * (a.k / 16) + sub]);
                  total[r][g] = _mm512_add_epi32(total[r][g], _mm512_mullo_epi32(scale, _mm512_sub_epi32(sums[r][g], off)));
                }
              } else {  // Q2_K: scale in the low nibble, min in the high one
                const __m512i scm = _mm512_cvtepu8_epi32(bytes);
                const __m512i scale = _mm512_and_si512(scm, _mm512_set1_epi32(0xF)), mins = _mm512_srli_epi32(scm, 4);
                for (size_t r = 0; r < R; ++r) {
                  total[r][g] = _mm512_add_epi32(total[r][g], _mm512_mullo_epi32(scale, sums[r][g]));
                  msum[r][g] = _mm512_add_epi32(
                      msum[r][g], _mm512_mullo_epi32(mins, _mm512_set1_epi32(a.sum16[(row0 + r) * (a.k / 16) + sub])));
                }
              }
            }
          }
        } else {
          __m512i isum[R][NG];
          Zero(isum);
          Dot32<R, kExpanded, G0, NG>(blk, eb + 32 * u * kTile, u, x, isum, isum);
          const size_t sub = (kBlockK / 32) * b + u;
          for (size_t r = 0; r < R; ++r) {
            const __m512i off = _mm512_set1_epi32(kOffset * a.sum32[(row0 + r) * (a.k / 32) + sub]);
            for (size_t g = 0; g < NG; ++g) isum[r][g] = _mm512_sub_epi32(isum[r][g], off);
          }
          if constexpr (kBlock32) {
            for (size_t r = 0; r < R; ++r) {
              for (size_t g = 0; g < NG; ++g) total[r][g] = isum[r][g];
            }
          } else {
            for (size_t g = 0; g < NG; ++g) {
              const __m128i bytes = Group(blk + ((F == QuantFormat::kQ5_K ? 4 : 2) + u) * kTile, G0 + g);
              const __m512i scale = F == QuantFormat::kQ5_K ? _mm512_cvtepu8_epi32(bytes) : _mm512_cvtepi8_epi32(bytes);
              [[maybe_unused]] const __m512i mins = _mm512_cvtepu8_epi32(Group(blk + (12 + u) * kTile, G0 + g));
              for (size_t r = 0; r < R; ++r) {
                total[r][g] = _mm512_add_epi32(total[r][g], _mm512_mullo_epi32(scale, isum[r][g]));
                if constexpr (kMins) {
                  msum[r][g] = _mm512_add_epi32(
                      msum[r][g], _mm512_mullo_epi32(mins, _mm512_set1_epi32(a.sum32[(row0 + r) * (a.k / 32) + sub])));
                }
              }
            }
          }
        }
      }
      __m512 d[4], second[4];
      Scales(blk, d);
      if constexpr (kMins) Scales(blk + 2 * kTile, second);  // Q5_1's m; Q5_K's and Q2_K's dmin
      for (size_t r = 0; r < R; ++r) {
        const float ad = a.d[(row0 + r) * blocks + b];
        for (size_t g = 0; g < NG; ++g) {
          acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[r][g]), _mm512_mul_ps(d[G0 + g], _mm512_set1_ps(ad)),
                                      acc[r][g]);
          if constexpr (F == QuantFormat::kQ5_1) {
            const float asum = static_cast<float>(a.sum32[(row0 + r) * blocks + b]);
            acc[r][g] = _mm512_fmadd_ps(second[G0 + g], _mm512_set1_ps(ad * asum), acc[r][g]);
          } else if constexpr (kMins) {
            acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum[r][g]), _mm512_mul_ps(second[G0 + g], _mm512_set1_ps(-ad)),
                                        acc[r][g]);
          }
        }
      }
    }
    for (size_t r = 0; r < R; ++r) StoreColumns<G0, NG>(acc[r], c + r * c_stride);
  }
};

// From this many rows a call expands its tile first. Expanding writes and reads
// back K x 64 bytes per tile; one thread, 3584 x 1024 weights from memory, the
// expanded path against the tile's: 1.4-1.8x slower at 8 rows, 1.0-1.5x at 16,
// even at 32 (Q6_K from 16 on); 256 rows: Q6_K 1.5x, Q4_K 1.1-1.3x faster.
constexpr size_t kExpandRows = 32;
// Rows per call (the set's max_rows): a prompt of up to this many rows expands
// each tile once (256 and 64 were within the noise of each other).
constexpr size_t kMaxRows = 256;

// R rows against the tile or, expanded, against its groups 0-1 and then 2-3:
// the accumulators, totals and sums of four rows for two groups fit the 32
// registers, for four they spilled (one thread, 256 rows, K = 1024 and 3584:
// Q6_K 7.0-7.6 ms against 7.9-8.3, Q4_K 7.5-7.9 against 7.8-9.0; Q4_0 and
// Q8_0 within the noise either way).
template <class K, size_t R, bool kExpanded>
void RowGroup(const QuantActs& a, size_t row0, const uint8_t* tile, const uint8_t* e, float* c, size_t c_stride) {
  if constexpr (kExpanded) {
    K::template Rows<R, true, 0, 2>(a, row0, tile, e, c, c_stride);
    K::template Rows<R, true, 2, 2>(a, row0, tile, e, c, c_stride);
  } else {
    K::template Rows<R, false>(a, row0, tile, nullptr, c, c_stride);
  }
}

// Four rows at a time, then two, then one.
template <class K, bool kExpanded>
void RowsInFours(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, const uint8_t* e, float* c,
                 size_t c_stride) {
  size_t r = 0;
  for (; r + 4 <= m; r += 4) RowGroup<K, 4, kExpanded>(a, row0 + r, tile, e, c + r * c_stride, c_stride);
  for (; r + 2 <= m; r += 2) RowGroup<K, 2, kExpanded>(a, row0 + r, tile, e, c + r * c_stride, c_stride);
  if (r < m) RowGroup<K, 1, kExpanded>(a, row0 + r, tile, e, c + r * c_stride, c_stride);
}

// A QuantUkernel over any number of rows.
template <class K>
void ByRows(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t, float* c, size_t c_stride) {
  if (m < kExpandRows) return RowsInFours<K, false>(m, a, row0, tile, nullptr, c, c_stride);
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  // One per thread, grown to the largest K seen: K x 64 bytes (a 3584-deep tile: 224 KiB, in L2).
  thread_local std::unique_ptr<uint8_t, Free> expanded;
  thread_local size_t capacity = 0;
  if (capacity < a.k * kTile) {
    expanded.reset(static_cast<uint8_t*>(std::aligned_alloc(64, a.k * kTile)));
    if (!expanded) throw std::bad_alloc();
    capacity = a.k * kTile;
  }
  K::Expand(tile, a.k, expanded.get());
  RowsInFours<K, true>(m, a, row0, tile, expanded.get(), c, c_stride);
}

// Q4_1 at one row runs the AVX2 kernel: 1536 x 576 from memory on one Zen 4 thread it
// takes 0.020 ms there against 0.037 for this set's (from two rows this set's wins:
// 0.019 against 0.026 at 2, 0.028 against 0.065 at 4). Both give the portable twin's
// bits, so a row's result does not depend on which one ran.
void Q41ByRows(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c, size_t c_stride) {
  if (m == 1) return kAvx2QuantKernels.ukernel[static_cast<int>(QuantFormat::kQ4_1)](m, a, row0, tile, t, c, c_stride);
  ByRows<Block32Kernel<QuantFormat::kQ4_1>>(m, a, row0, tile, t, c, c_stride);
}

}  // namespace

const QuantKernelSet& Avx512VnniQuantKernels() {
  static const QuantKernelSet set = [] {
    QuantKernelSet s = kAvx2QuantKernels;
    s.name = "avx512vnni";
    constexpr QuantFormat kQ8 = QuantFormat::kQ8_0, kQ4 = QuantFormat::kQ4_0, kQ41 = QuantFormat::kQ4_1;
    s.max_rows = kMaxRows;
    for (QuantUkernel& u : s.ukernel) u = nullptr;  // the AVX2 set's portable copies are built for AVX2
    s.ukernel[static_cast<int>(kQ8)] = ByRows<Block32Kernel<kQ8>>;
    s.ukernel[static_cast<int>(kQ4)] = ByRows<Block32Kernel<kQ4>>;
    s.ukernel[static_cast<int>(kQ41)] = Q41ByRows;
    s.ukernel[static_cast<int>(QuantFormat::kQ4_K)] = ByRows<Q4KKernel>;
    s.ukernel[static_cast<int>(QuantFormat::kQ6_K)] = ByRows<Q6KKernel>;
    s.ukernel[static_cast<int>(QuantFormat::kQ5_0)] = ByRows<AddedFormat<QuantFormat::kQ5_0>>;
    s.ukernel[static_cast<int>(QuantFormat::kQ5_1)] = ByRows<AddedFormat<QuantFormat::kQ5_1>>;
    s.ukernel[static_cast<int>(QuantFormat::kIQ4_NL)] = ByRows<AddedFormat<QuantFormat::kIQ4_NL>>;
    s.ukernel[static_cast<int>(QuantFormat::kQ5_K)] = ByRows<AddedFormat<QuantFormat::kQ5_K>>;
    s.ukernel[static_cast<int>(QuantFormat::kIQ4_XS)] = ByRows<AddedFormat<QuantFormat::kIQ4_XS>>;
    s.ukernel[static_cast<int>(QuantFormat::kQ3_K)] = ByRows<AddedFormat<QuantFormat::kQ3_K>>;
    s.ukernel[static_cast<int>(QuantFormat::kQ2_K)] = ByRows<AddedFormat<QuantFormat::kQ2_K>>;
    return WithPortableUkernels(s);
  }();
  return set;
}

}  // namespace rvascend
