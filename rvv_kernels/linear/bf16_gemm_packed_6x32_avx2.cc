// AVX2 + FMA GEMM over the packed layout (version 1: blocks of 32 columns, k-major):
// six rows against one block, as two passes of 16 columns.
//
// Why not the portable 4x32 tile: its 16 accumulators, four weight vectors and a
// broadcast do not fit AVX2's 16 registers, so accumulators spilled on every k
// (67 % of a SmolLM2 BF16 prefill's samples sat in that tile). Six rows of 16
// columns keep 12 accumulators, two weight vectors and one broadcast in registers,
// the classic 6x16 shape of AVX2 SGEMM kernels.
//
// Each output is the same sequence of FMAs in k order as the portable tile's, so
// the two give the same bits.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "rvv_kernels/base/simd_vectors.h"
#include "rvv_kernels/linear/bf16_packed_ukernels.h"
#include "rvv_kernels/linear/packed_layout.h"

namespace rvascend {
namespace {

constexpr size_t kHalf = 16;

inline __m256 Widen(const uint16_t* p) { return static_cast<__m256>(simd::LoadBf16(p)); }

// Columns [0, cols) (cols <= 16) of rows [0, R) from the 16 packed columns at w.
// Twelve named accumulators, not an array: GCC kept an array of them in memory
// and stored all twelve on every k (slower than the portable tile).
template <int R>
void Pass(size_t cols, size_t k, const float* a, size_t a_stride, const uint16_t* w, uint16_t* c,
          size_t c_stride) {
  __m256 s0a = _mm256_setzero_ps(), s0b = s0a, s1a = s0a, s1b = s0a, s2a = s0a, s2b = s0a, s3a = s0a, s3b = s0a,
         s4a = s0a, s4b = s0a, s5a = s0a, s5b = s0a;
#define RVASCEND_ROW(r)                                                 \
  if constexpr (R > r) {                                                \
    const __m256 av = _mm256_broadcast_ss(a + r * a_stride + kk);       \
    s##r##a = _mm256_fmadd_ps(av, w0, s##r##a);                         \
    s##r##b = _mm256_fmadd_ps(av, w1, s##r##b);                         \
  }
  for (size_t kk = 0; kk < k; ++kk) {
    const uint16_t* row = w + kk * kPackedBlockN;
    const __m256 w0 = Widen(row), w1 = Widen(row + 8);
    RVASCEND_ROW(0) RVASCEND_ROW(1) RVASCEND_ROW(2) RVASCEND_ROW(3) RVASCEND_ROW(4) RVASCEND_ROW(5)
  }
#undef RVASCEND_ROW
  const __m256 acc[6][2] = {{s0a, s0b}, {s1a, s1b}, {s2a, s2b}, {s3a, s3b}, {s4a, s4b}, {s5a, s5b}};
  for (int r = 0; r < R; ++r) {
    for (size_t j = 0; j < cols; j += simd::kLanes) {
      const size_t n = cols - j < simd::kLanes ? cols - j : simd::kLanes;
      simd::StoreBf16N(c + r * c_stride + j, static_cast<simd::VF>(acc[r][j / simd::kLanes]), n);
    }
  }
}

template <int R>
void Block(size_t nc, size_t k, const float* a, size_t a_stride, const uint16_t* w, uint16_t* c, size_t c_stride) {
  Pass<R>(nc < kHalf ? nc : kHalf, k, a, a_stride, w, c, c_stride);
  if (nc > kHalf) Pass<R>(nc - kHalf, k, a, a_stride, w + kHalf, c + kHalf, c_stride);
}

}  // namespace

void bf16_gemm_packed_ukernel_6x32__avx2(size_t m, size_t nc, size_t k, const void* a, size_t a_stride,
                                          const uint16_t* w, uint16_t* c, size_t c_stride) {
  const float* af = static_cast<const float*>(a);
  switch (m) {
    case 1: Block<1>(nc, k, af, a_stride, w, c, c_stride); break;
    case 2: Block<2>(nc, k, af, a_stride, w, c, c_stride); break;
    case 3: Block<3>(nc, k, af, a_stride, w, c, c_stride); break;
    case 4: Block<4>(nc, k, af, a_stride, w, c, c_stride); break;
    case 5: Block<5>(nc, k, af, a_stride, w, c, c_stride); break;
    default: Block<6>(nc, k, af, a_stride, w, c, c_stride); break;
  }
}

}  // namespace rvascend
