// Scalar reference microkernel: FP32 accumulation in k order, one RNE rounding.
// Kept for tests and as the last-resort path; every other variant must agree
// with it within the FP32 re-association error of the dot product.
#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/linear/bf16_packed_ukernels.h"
#include "rvv_kernels/linear/packed_layout.h"

namespace rvascend {

void bf16_gemm_packed_ukernel_1x32__scalar(size_t m, size_t nc, size_t k, const void* a,
                                            size_t a_stride, const uint16_t* w, uint16_t* c,
                                            size_t c_stride) {
  const float* af = static_cast<const float*>(a);
  for (size_t r = 0; r < m; ++r) {
    for (size_t j = 0; j < nc; ++j) {
      const uint16_t* wj = w + (j / kPackedBlockN) * k * kPackedBlockN + j % kPackedBlockN;
      float acc = 0.0f;
      for (size_t kk = 0; kk < k; ++kk) acc += af[r * a_stride + kk] * Bf16ToFloat(wj[kk * kPackedBlockN]);
      c[r * c_stride + j] = FloatToBf16(acc);
    }
  }
}

}  // namespace rvascend
