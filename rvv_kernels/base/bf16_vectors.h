// BF16 <-> FP32 on GCC/Clang generic vectors (vector_size), for any lane count:
// the caller names its FP32, 32-bit and 16-bit vector types of equal lanes.
// The same rounding as bf16.h's scalar FloatToBf16.
#ifndef RVV_KERNELS_BASE_BF16_VECTORS_H_
#define RVV_KERNELS_BASE_BF16_VECTORS_H_

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace rvascend {

// BF16 lanes -> FP32 (zero-extend, shift into the high half).
template <typename Vf, typename Vu, typename Vh>
inline __attribute__((always_inline)) Vf WidenBf16(Vh h) {
  const Vu u = __builtin_convertvector(h, Vu) << 16;
  Vf f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Lanes BF16 values from p -> FP32. On x86, one register's worth is one
// zero-extending load and a shift: GCC compiles the generic form to a load, two
// 128-bit extensions, a byte shift, an insert and the shift per register (the
// portable AVX2 GEMV, which the AVX2 set runs, spent six instructions on every
// eight weights before its FMA).
template <typename Vf, typename Vu, typename Vh>
inline __attribute__((always_inline)) Vf WidenBf16(const uint16_t* p) {
  [[maybe_unused]] Vf f;  // the x86 forms write it
#if defined(__AVX512F__)
  if constexpr (sizeof(Vf) == 64) {
    const __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
#endif
#if defined(__AVX2__)
  if constexpr (sizeof(Vf) == 32) {
    const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
#endif
  Vh h;
  std::memcpy(&h, p, sizeof(h));
  return WidenBf16<Vf, Vu, Vh>(h);
}

// FP32 lanes -> BF16, round to nearest even; NaN lanes become quiet NaNs.
template <typename Vf, typename Vu, typename Vh>
inline __attribute__((always_inline)) Vh NarrowBf16(Vf x) {
  Vu bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const Vu rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const Vu nan = (Vu)((bits & 0x7fffffffu) > 0x7f800000u);  // all-ones where NaN
  return __builtin_convertvector((rounded & ~nan) | (((bits >> 16) | 0x40u) & nan), Vh);
}

}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_BF16_VECTORS_H_
