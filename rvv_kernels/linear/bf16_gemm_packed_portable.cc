// Portable vector path: the same packed-layout microkernels written with GCC/clang
// vector extensions, so the host runs every op at real speed. Built once per
// host ISA level (RVASCEND_PORTABLE_SUFFIX names the variant); on riscv64 the
// baseline build is the scalar-ISA fallback that GCC 12 can compile.
#include <cstring>

#include "rvv_kernels/base/bf16_vectors.h"
#include "rvv_kernels/linear/bf16_packed_ukernels.h"
#include "rvv_kernels/linear/packed_layout.h"
#include "rvv_kernels/base/unroll.h"

#ifndef RVASCEND_PORTABLE_SUFFIX
#error "define RVASCEND_PORTABLE_SUFFIX (portable, portable_avx2, portable_avx512)"
#endif
#define RVASCEND_CONCAT_(a, b) a##b
#define RVASCEND_CONCAT(a, b) RVASCEND_CONCAT_(a, b)
#define RVASCEND_UKERNEL(prefix) RVASCEND_CONCAT(prefix, RVASCEND_PORTABLE_SUFFIX)

namespace rvascend {
namespace {

// Vector width: 16 FP32 lanes where the ISA has 512-bit registers, else 8
// (GCC splits wider generic vectors badly on AVX2, down to scalar code).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
constexpr int kVecs = kPackedBlockN / kLanes;  // vectors per 32-column block

typedef float Vf __attribute__((vector_size(kLanes * 4)));
typedef uint32_t Vu __attribute__((vector_size(kLanes * 4)));
typedef uint16_t Vh __attribute__((vector_size(kLanes * 2)));

inline Vf Widen(const uint16_t* p) { return WidenBf16<Vf, Vu, Vh>(p); }

// Stores n <= kLanes lanes, rounded to BF16.
inline void Store(uint16_t* dst, Vf acc, size_t n) {
  const Vh narrow = NarrowBf16<Vf, Vu, Vh>(acc);
  if (n == static_cast<size_t>(kLanes)) {
    std::memcpy(dst, &narrow, sizeof(narrow));
  } else {
    uint16_t tmp[kLanes];
    std::memcpy(tmp, &narrow, sizeof(narrow));
    std::memcpy(dst, tmp, n * sizeof(uint16_t));
  }
}

inline void StoreBlock(uint16_t* dst, const Vf* acc, size_t nc) {
  for (int v = 0; v < kVecs && static_cast<size_t>(v * kLanes) < nc; ++v) {
    const size_t left = nc - v * kLanes;
    Store(dst + v * kLanes, acc[v], left < static_cast<size_t>(kLanes) ? left : kLanes);
  }
}

template <int kRows>
void Tile(size_t nc, size_t k, const float* a, size_t a_stride, const uint16_t* w, uint16_t* c,
          size_t c_stride) {
  Vf acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = Vf{};
  RVASCEND_UNROLL(2)
  for (size_t kk = 0; kk < k; ++kk) {
    Vf wv[kVecs];
    for (int v = 0; v < kVecs; ++v) wv[v] = Widen(w + kk * kPackedBlockN + v * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const float av = a[r * a_stride + kk];
      for (int v = 0; v < kVecs; ++v) acc[r][v] += av * wv[v];
    }
  }
  for (int r = 0; r < kRows; ++r) StoreBlock(c + r * c_stride, acc[r], nc);
}

// Two blocks per activation load for the memory-bound M = 1 case.
void GemvPair(size_t nc, size_t k, const float* a, const uint16_t* w, uint16_t* c) {
  const uint16_t* w1 = w + k * kPackedBlockN;
  Vf acc0[kVecs], acc1[kVecs];
  for (int v = 0; v < kVecs; ++v) acc0[v] = acc1[v] = Vf{};
  RVASCEND_UNROLL(2)
  for (size_t kk = 0; kk < k; ++kk) {
    const float av = a[kk];
    for (int v = 0; v < kVecs; ++v) {
      acc0[v] += av * Widen(w + kk * kPackedBlockN + v * kLanes);
      acc1[v] += av * Widen(w1 + kk * kPackedBlockN + v * kLanes);
    }
  }
  StoreBlock(c, acc0, kPackedBlockN);
  StoreBlock(c + kPackedBlockN, acc1, nc - kPackedBlockN);
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
