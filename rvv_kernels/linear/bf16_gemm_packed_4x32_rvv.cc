// M >= 2 BF16 x packed-BF16 GEMM for RVV 1.0 without BF16 extensions: a 4x32
// register tile where one widened weight vector per k feeds four rows, so the
// load/zero-extend/shift cost is shared by four FMAs.
#include "rvv_kernels/linear/bf16_packed_rvv_tiles.h"
#include "rvv_kernels/linear/bf16_packed_ukernels.h"

namespace rvascend {

void bf16_gemm_packed_ukernel_4x32__rvv(size_t m, size_t nc, size_t k, const void* a, size_t a_stride,
                                         const uint16_t* w, uint16_t* c, size_t c_stride) {
  rvv::GemmForVlen<rvv::ShiftWiden>(m, nc, k, static_cast<const float*>(a), a_stride, w, c, c_stride);
}

}  // namespace rvascend
