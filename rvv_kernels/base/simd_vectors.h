// FP32 vectors of one register for the host's vector ISA (16 lanes with
// AVX-512, 8 otherwise) in GCC/Clang generic vectors, and the operations the
// host kernels share: BF16 loads and stores, a fixed-order horizontal sum, exp,
// and the BF16 rounding of each lane. A file including this is compiled once
// per ISA level the dispatcher may pick (-mavx2 -mfma, -mavx512f ...).
//
// Why one register: wider generic vectors are split by the compiler into
// several registers, and loops holding a dozen of them spill (measured on the
// gated-delta-rule rows: slower than the SSE2 build).
#ifndef RVV_KERNELS_BASE_SIMD_VECTORS_H_
#define RVV_KERNELS_BASE_SIMD_VECTORS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "rvv_kernels/base/bf16_vectors.h"

namespace rvascend {
namespace simd {

#define RVASCEND_SIMD_INLINE inline __attribute__((always_inline))

#if defined(__AVX512F__)
constexpr size_t kLanes = 16;
#else
constexpr size_t kLanes = 8;
#endif
typedef float VF __attribute__((vector_size(4 * kLanes)));
typedef int32_t VI __attribute__((vector_size(4 * kLanes)));
typedef uint32_t VU __attribute__((vector_size(4 * kLanes)));
typedef uint16_t VH __attribute__((vector_size(2 * kLanes)));

RVASCEND_SIMD_INLINE VF Splat(float x) { return VF{} + x; }

// a * b + c, one rounding where the build has FMA. Spelled out because GCC's default
// -ffp-contract=fast fuses `a * b + c * d` either way round, and not always the same way
// in two instantiations of one template: a kernel whose result must not depend on which
// code path ran it (the delta rule's state after a token, alone or within a run of tokens)
// writes its fused products with this.
RVASCEND_SIMD_INLINE VF MulAdd(VF a, VF b, VF c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

RVASCEND_SIMD_INLINE VF LoadF(const float* p) {
  VF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

RVASCEND_SIMD_INLINE void StoreF(float* p, VF v) { std::memcpy(p, &v, sizeof(v)); }

RVASCEND_SIMD_INLINE VF LoadBf16(const uint16_t* p) { return WidenBf16<VF, VU, VH>(p); }

// The first n <= kLanes values of p (a whole vector, or the tail of a row), the
// other lanes `fill` (BF16 bits).
RVASCEND_SIMD_INLINE VF LoadBf16N(const uint16_t* p, size_t n, uint16_t fill = 0) {
  if (n == kLanes) return LoadBf16(p);
  uint16_t lanes[kLanes];
  for (size_t i = 0; i < kLanes; ++i) lanes[i] = i < n ? p[i] : fill;
  return WidenBf16<VF, VU, VH>(lanes);
}

// The first n <= kLanes FP32 values of p, the other lanes 0.
RVASCEND_SIMD_INLINE VF LoadFN(const float* p, size_t n) {
  if (n == kLanes) return LoadF(p);
  VF v{};
  for (size_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}

RVASCEND_SIMD_INLINE void StoreFN(float* p, VF v, size_t n) {
  if (n == kLanes) return StoreF(p, v);
  for (size_t i = 0; i < n; ++i) p[i] = v[i];
}

// Round to nearest even, quiet NaNs (bf16.h's FloatToBf16 on every lane).
RVASCEND_SIMD_INLINE void StoreBf16(uint16_t* p, VF v) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  // NarrowBf16's lanes with AVX2: every lane already fits 16 bits (no finite or
  // infinite value carries out of the add), so the generic form's truncating mask
  // is not needed before the saturating pack, and NaN lanes take one blend.
  __m256i bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const __m256i high = _mm256_srli_epi32(bits, 16);
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)))),
      16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i h = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
#else
  const VH h = NarrowBf16<VF, VU, VH>(v);
  std::memcpy(p, &h, sizeof(h));
#endif
}

// Each lane rounded to BF16 and widened back (torch's intermediate roundings).
RVASCEND_SIMD_INLINE VF RoundBf16(VF x) {
  VU bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const VU rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  const VU nan = (VU)(x != x);
  const VU out = (rounded & ~nan) | (bits & nan);
  VF f;
  std::memcpy(&f, &out, sizeof(f));
  return f;
}

// The first n <= kLanes lanes, rounded to BF16.
RVASCEND_SIMD_INLINE void StoreBf16N(uint16_t* p, VF v, size_t n) {
  if (n == kLanes) return StoreBf16(p, v);
  const VH h = NarrowBf16<VF, VU, VH>(v);
  for (size_t i = 0; i < n; ++i) p[i] = h[i];
}

typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));

// Halving tree in registers: a fixed order, so a result does not depend on the call.
RVASCEND_SIMD_INLINE float Sum(VF v) {
#if defined(__AVX512F__)
  const V8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  const V8 a = v;
#endif
  const V4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

RVASCEND_SIMD_INLINE VF Max(VF a, VF b) { return a > b ? a : b; }
RVASCEND_SIMD_INLINE VF Min(VF a, VF b) { return a < b ? a : b; }

RVASCEND_SIMD_INLINE float MaxOf(VF v) {
  float m = v[0];
  for (size_t i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// exp(x) to about 2 FP32 ulp, the algorithm of rvv_math.h's Exp: x = n*ln2 + r
// (Cody-Waite, ln2 in two parts), e^r by its degree-6 Taylor polynomial, 2^n
// into the exponent in two factors. x is clamped to [-87, 88].
RVASCEND_SIMD_INLINE VF Exp(VF x) {
  x = Min(Max(x, Splat(-87.0f)), Splat(88.0f));
  const VF t = x * 1.44269504088896341f;
  // Round to nearest even (as vfcvt.x.f): adding 1.5 * 2^23 leaves no fraction bits for |t| < 2^22.
  const VF nf = (t + 12582912.0f) - 12582912.0f;
  const VI n = __builtin_convertvector(nf, VI);
  VF r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  VF p = Splat(1.0f / 720);
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const VI half = n >> 1;
  const VI ea = (half + 127) << 23, eb = ((n - half) + 127) << 23;
  VF a, b;
  std::memcpy(&a, &ea, sizeof(a));
  std::memcpy(&b, &eb, sizeof(b));
  return p * a * b;
}

}  // namespace simd
}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_SIMD_VECTORS_H_
