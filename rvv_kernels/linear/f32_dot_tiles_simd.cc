// The f32_linear tiles in generic vectors, built once per ISA level (RVASCEND_F32_TILE
// names the symbol): per output one vector of lane partial sums over K in k order (one
// fused multiply-add per step where the build has FMA), the tail in zero-filled lanes,
// then simd::Sum's fixed tree.
#include "rvv_kernels/base/simd_vectors.h"
#include "rvv_kernels/linear/f32_dot_tiles.h"

#ifndef RVASCEND_F32_TILE
#error "define RVASCEND_F32_TILE (f32_dot_tile__portable, __avx2, __avx512, __rvv)"
#endif

namespace rvascend {
namespace {

using simd::kLanes;
using simd::VF;

template <size_t kRows, size_t kCols>
void Tile(size_t k, const float* a, size_t a_stride, const float* w, size_t w_stride, const float* bias, float* c,
          size_t c_stride) {
  VF acc[kRows][kCols];
  for (size_t r = 0; r < kRows; ++r)
    for (size_t j = 0; j < kCols; ++j) acc[r][j] = VF{};
  const size_t full = k - k % kLanes;
  for (size_t kk = 0; kk < full; kk += kLanes) {
    VF wv[kCols];
    for (size_t j = 0; j < kCols; ++j) wv[j] = simd::LoadF(w + j * w_stride + kk);
    for (size_t r = 0; r < kRows; ++r) {
      const VF av = simd::LoadF(a + r * a_stride + kk);
      for (size_t j = 0; j < kCols; ++j) acc[r][j] = simd::MulAdd(av, wv[j], acc[r][j]);
    }
  }
  if (full < k) {  // zero lanes add +0 to their partial sums
    VF wv[kCols];
    for (size_t j = 0; j < kCols; ++j) wv[j] = simd::LoadFN(w + j * w_stride + full, k - full);
    for (size_t r = 0; r < kRows; ++r) {
      const VF av = simd::LoadFN(a + r * a_stride + full, k - full);
      for (size_t j = 0; j < kCols; ++j) acc[r][j] = simd::MulAdd(av, wv[j], acc[r][j]);
    }
  }
  for (size_t r = 0; r < kRows; ++r)
    for (size_t j = 0; j < kCols; ++j) c[r * c_stride + j] = simd::Sum(acc[r][j]) + (bias ? bias[j] : 0.0f);
}

template <size_t kRows>
void Rows(size_t cols, size_t k, const float* a, size_t a_stride, const float* w, size_t w_stride, const float* bias,
          float* c, size_t c_stride) {
  static_assert(kF32TileCols == 2, "one case per column count");
  if (cols == 2) {
    Tile<kRows, 2>(k, a, a_stride, w, w_stride, bias, c, c_stride);
  } else {
    Tile<kRows, 1>(k, a, a_stride, w, w_stride, bias, c, c_stride);
  }
}

}  // namespace

void RVASCEND_F32_TILE(size_t rows, size_t cols, size_t k, const float* a, size_t a_stride, const float* w,
                       size_t w_stride, const float* bias, float* c, size_t c_stride) {
  static_assert(kF32TileRows == 4, "one case per row count");
  switch (rows) {
    case 1: Rows<1>(cols, k, a, a_stride, w, w_stride, bias, c, c_stride); break;
    case 2: Rows<2>(cols, k, a, a_stride, w, w_stride, bias, c, c_stride); break;
    case 3: Rows<3>(cols, k, a, a_stride, w, w_stride, bias, c, c_stride); break;
    default: Rows<4>(cols, k, a, a_stride, w, w_stride, bias, c, c_stride); break;
  }
}

}  // namespace rvascend
