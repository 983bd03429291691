// M >= 2 BF16 x packed-BF16 GEMM for RVV 1.0 without BF16 extensions.
//
// A 4x32 register tile: one widened weight vector per k feeds four rows, so
// the load/zero-extend/shift cost is shared by four FMAs. At VLEN 128 the 32
// columns are two 16-lane chunks (a 4x32 tile at LMUL=8 would need all 32
// vector registers for accumulators).
#include "rvv_kernels/bf16_packed_ukernels.h"
#include "rvv_kernels/packed_layout.h"
#include "rvv_kernels/rvv_lmul.h"
#include "rvv_kernels/unroll.h"

namespace rvascend {
namespace {

template <int kLmul, int kRows>
void GemmTile(size_t nc, size_t k, const float* a, size_t a_stride, const uint16_t* w,
              uint16_t* c, size_t c_stride) {
  static_assert(kRows >= 1 && kRows <= 4, "1..4 rows");
  using V = rvv::Lmul<kLmul>;
  const float* a0 = a;
  const float* a1 = a + (kRows > 1 ? a_stride : 0);
  const float* a2 = a + (kRows > 2 ? 2 * a_stride : 0);
  const float* a3 = a + (kRows > 3 ? 3 * a_stride : 0);
  for (size_t j = 0; j < nc;) {
    // Compute over the whole (zero-padded) chunk, store only the valid columns.
    const size_t vl = V::SetVl(kPackedBlockN - j);
    typename V::F acc0 = V::Zero(vl), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    const uint16_t* wk = w + j;
    RVASCEND_UNROLL(2)
    for (size_t kk = 0; kk < k; ++kk) {
      const typename V::F wv = V::LoadBf16(wk, vl);
      acc0 = V::Fmacc(acc0, a0[kk], wv, vl);
      if constexpr (kRows > 1) acc1 = V::Fmacc(acc1, a1[kk], wv, vl);
      if constexpr (kRows > 2) acc2 = V::Fmacc(acc2, a2[kk], wv, vl);
      if constexpr (kRows > 3) acc3 = V::Fmacc(acc3, a3[kk], wv, vl);
      wk += kPackedBlockN;
    }
    const size_t svl = V::SetVl(nc - j < vl ? nc - j : vl);
    V::StoreBf16(c + j, acc0, svl);
    if constexpr (kRows > 1) V::StoreBf16(c + c_stride + j, acc1, svl);
    if constexpr (kRows > 2) V::StoreBf16(c + 2 * c_stride + j, acc2, svl);
    if constexpr (kRows > 3) V::StoreBf16(c + 3 * c_stride + j, acc3, svl);
    j += vl;
  }
}

template <int kLmul>
void Gemm(size_t m, size_t nc, size_t k, const float* a, size_t a_stride, const uint16_t* w,
          uint16_t* c, size_t c_stride) {
  switch (m) {
    case 1: GemmTile<kLmul, 1>(nc, k, a, a_stride, w, c, c_stride); break;
    case 2: GemmTile<kLmul, 2>(nc, k, a, a_stride, w, c, c_stride); break;
    case 3: GemmTile<kLmul, 3>(nc, k, a, a_stride, w, c, c_stride); break;
    default: GemmTile<kLmul, 4>(nc, k, a, a_stride, w, c, c_stride); break;
  }
}

}  // namespace

void bf16_gemm_packed_ukernel_4x32__rvv(size_t m, size_t nc, size_t k, const void* a,
                                         size_t a_stride, const uint16_t* w, uint16_t* c,
                                         size_t c_stride) {
  const float* af = static_cast<const float*>(a);
  const size_t vlen = rvv::VlenBits();
  if (vlen <= 256) {
    Gemm<4>(m, nc, k, af, a_stride, w, c, c_stride);
  } else if (vlen == 512) {
    Gemm<2>(m, nc, k, af, a_stride, w, c, c_stride);
  } else {
    Gemm<1>(m, nc, k, af, a_stride, w, c, c_stride);
  }
}

}  // namespace rvascend
