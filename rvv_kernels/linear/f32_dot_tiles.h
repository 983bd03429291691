// The FP32 dot-product tile every f32_linear set implements: C[r][c] = A[r, 0:K] . W[c, 0:K]
// (+ bias[c]) for r < rows <= kF32TileRows and c < cols <= kF32TileCols. Each output's
// arithmetic is the same for every rows x cols (f32_linear.h says why that matters).
#ifndef RVV_KERNELS_LINEAR_F32_DOT_TILES_H_
#define RVV_KERNELS_LINEAR_F32_DOT_TILES_H_

#include <cstddef>

namespace rvascend {

constexpr size_t kF32TileRows = 4;
constexpr size_t kF32TileCols = 2;

using F32DotTile = void (*)(size_t rows, size_t cols, size_t k, const float* a, size_t a_stride, const float* w,
                            size_t w_stride, const float* bias, float* c, size_t c_stride);

void f32_dot_tile__portable(size_t rows, size_t cols, size_t k, const float* a, size_t a_stride, const float* w,
                            size_t w_stride, const float* bias, float* c, size_t c_stride);
void f32_dot_tile__avx2(size_t rows, size_t cols, size_t k, const float* a, size_t a_stride, const float* w,
                        size_t w_stride, const float* bias, float* c, size_t c_stride);
void f32_dot_tile__avx512(size_t rows, size_t cols, size_t k, const float* a, size_t a_stride, const float* w,
                          size_t w_stride, const float* bias, float* c, size_t c_stride);
void f32_dot_tile__rvv(size_t rows, size_t cols, size_t k, const float* a, size_t a_stride, const float* w,
                       size_t w_stride, const float* bias, float* c, size_t c_stride);

}  // namespace rvascend

#endif  // RVV_KERNELS_LINEAR_F32_DOT_TILES_H_
