// Portable vector path: the same packed-layout microkernels written with GCC/clang
// vector extensions, so the host runs every op at real speed. Built once per
// host ISA level (RVASCEND_PORTABLE_SUFFIX names the variant); on riscv64 the
// baseline build is the scalar-ISA fallback that GCC 12 can compile.
#include <cstring>

#include "rvv_kernels/bf16_packed_ukernels.h"
#include "rvv_kernels/packed_layout.h"
#include "rvv_kernels/unroll.h"

#ifndef RVASCEND_PORTABLE_SUFFIX
#error "define RVASCEND_PORTABLE_SUFFIX (portable, portable_avx2, portable_avx512)"
#endif
#define RVASCEND_CONCAT_(a, b) a##b
#define RVASCEND_CONCAT(a, b) RVASCEND_CONCAT_(a, b)
#define RVASCEND_UKERNEL(prefix) RVASCEND_CONCAT(prefix, RVASCEND_PORTABLE_SUFFIX)

namespace rvascend {
namespace {

typedef float F16 __attribute__((vector_size(64)));
typedef uint32_t U16x32 __attribute__((vector_size(64)));
typedef uint16_t H16 __attribute__((vector_size(32)));

// 16 BF16 values -> 16 FP32 lanes (zero-extend, shift into the high half).
inline F16 Widen(const uint16_t* p) {
  H16 h;
  std::memcpy(&h, p, sizeof(h));
  const U16x32 u = __builtin_convertvector(h, U16x32) << 16;
  F16 f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even; NaN lanes become quiet NaNs.
inline void Store(uint16_t* dst, F16 acc, size_t n) {
  U16x32 bits;
  std::memcpy(&bits, &acc, sizeof(bits));
  const U16x32 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const U16x32 nan = (bits & 0x7fffffffu) > 0x7f800000u;  // all-ones where NaN
  const U16x32 out = (rounded & ~nan) | (((bits >> 16) | 0x40u) & nan);
  const H16 narrow = __builtin_convertvector(out, H16);
  if (n == 16) {
    std::memcpy(dst, &narrow, sizeof(narrow));
  } else {
    uint16_t tmp[16];
    std::memcpy(tmp, &narrow, sizeof(narrow));
    std::memcpy(dst, tmp, n * sizeof(uint16_t));
  }
}

inline void StoreBlock(uint16_t* dst, F16 lo, F16 hi, size_t nc) {
  Store(dst, lo, nc < 16 ? nc : 16);
  if (nc > 16) Store(dst + 16, hi, nc - 16);
}

template <int kRows>
void Tile(size_t nc, size_t k, const float* a, size_t a_stride, const uint16_t* w, uint16_t* c,
          size_t c_stride) {
  F16 lo[kRows], hi[kRows];
  for (int r = 0; r < kRows; ++r) lo[r] = hi[r] = F16{};
  RVASCEND_UNROLL(2)
  for (size_t kk = 0; kk < k; ++kk) {
    const F16 w0 = Widen(w + kk * kPackedBlockN);
    const F16 w1 = Widen(w + kk * kPackedBlockN + 16);
    for (int r = 0; r < kRows; ++r) {
      const float av = a[r * a_stride + kk];
      lo[r] += av * w0;
      hi[r] += av * w1;
    }
  }
  for (int r = 0; r < kRows; ++r) StoreBlock(c + r * c_stride, lo[r], hi[r], nc);
}

// Two blocks per activation load for the memory-bound M = 1 case.
void GemvPair(size_t nc, size_t k, const float* a, const uint16_t* w, uint16_t* c) {
  const uint16_t* w1 = w + k * kPackedBlockN;
  F16 a0 = F16{}, a1 = F16{}, b0 = F16{}, b1 = F16{};
  RVASCEND_UNROLL(2)
  for (size_t kk = 0; kk < k; ++kk) {
    const float av = a[kk];
    a0 += av * Widen(w + kk * kPackedBlockN);
    a1 += av * Widen(w + kk * kPackedBlockN + 16);
    b0 += av * Widen(w1 + kk * kPackedBlockN);
    b1 += av * Widen(w1 + kk * kPackedBlockN + 16);
  }
  StoreBlock(c, a0, a1, nc < kPackedBlockN ? nc : kPackedBlockN);
  StoreBlock(c + kPackedBlockN, b0, b1, nc - kPackedBlockN);
}

}  // namespace

void RVASCEND_UKERNEL(bf16_gemv_packed_ukernel_1x64__)(size_t /*m*/, size_t nc, size_t k,
                                                        const void* a, size_t /*a_stride*/,
                                                        const uint16_t* w, uint16_t* c,
                                                        size_t /*c_stride*/) {
  const float* af = static_cast<const float*>(a);
  if (nc > kPackedBlockN) {
    GemvPair(nc, k, af, w, c);
  } else {
    Tile<1>(nc, k, af, 0, w, c, 0);
  }
}

void RVASCEND_UKERNEL(bf16_gemm_packed_ukernel_4x32__)(size_t m, size_t nc, size_t k,
                                                        const void* a, size_t a_stride,
                                                        const uint16_t* w, uint16_t* c,
                                                        size_t c_stride) {
  const float* af = static_cast<const float*>(a);
  switch (m) {
    case 1: Tile<1>(nc, k, af, a_stride, w, c, c_stride); break;
    case 2: Tile<2>(nc, k, af, a_stride, w, c, c_stride); break;
    case 3: Tile<3>(nc, k, af, a_stride, w, c, c_stride); break;
    default: Tile<4>(nc, k, af, a_stride, w, c, c_stride); break;
  }
}

}  // namespace rvascend
