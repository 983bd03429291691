// RVV 1.0 BF16 x packed-BF16 Linear over packed layout version 2 (block
// B = VLEN/2, each 32-bit lane two columns: packed_layout.h), for CPUs without
// BF16 vector extensions (the K1 class).
//
// GEMV (M = 1): one block per call, both halves of it in LMUL-8 accumulators.
// Per k: one scalar load, one vector load, a shift and an AND that widen the
// 2 x VLEN/4 columns, two FMAs; about 7 instructions per VLEN/2 weights
// (0.055 per weight at VLEN 256), against 4 loads + 2 widen pairs + 2 FMAs per
// 128 weights over version 1.
// GEMM (M >= 2, two rows per call): LMUL-4 chunks of the block, the chunk's
// widened weights feeding one FMA per row and half. (Four rows would need LMUL 2
// to fit the registers, and then the scalar loads per chunk cost more than the
// second pass over the weights saves.)
#include "rvv_kernels/base/rvv_lmul.h"
#include "rvv_kernels/base/unroll.h"
#include "rvv_kernels/linear/bf16_packed_ukernels.h"

namespace rvascend {
namespace {

// Stores the valid columns of lanes [t0, t0 + vl) of a block half that starts
// at column `half_start`; nc columns of the block are valid.
template <int kLmul>
void StoreHalf(uint16_t* c, size_t half_start, size_t t0, size_t vl, size_t nc, typename rvv::Lmul<kLmul>::F acc) {
  const size_t col = half_start + t0;
  if (col >= nc) return;
  const size_t n = nc - col < vl ? nc - col : vl;
  rvv::Lmul<kLmul>::StoreBf16(c + col, acc, rvv::Lmul<kLmul>::SetVl(n));
}

template <int kRows>
void GemmTile(size_t nc, size_t k, const float* a, size_t a_stride, const uint16_t* w, uint16_t* c,
              size_t c_stride, size_t half) {
  static_assert(kRows == 1 || kRows == 2, "one or two rows");
  using V = rvv::Lmul<4>;
  const float* a0 = a;
  const float* a1 = a + (kRows > 1 ? a_stride : 0);
  for (size_t t0 = 0; t0 < half && t0 < nc; ) {
    const size_t vl = V::SetVl(half - t0);
    V::F lo0 = V::Zero(vl), hi0 = lo0, lo1 = lo0, hi1 = lo0;
    const uint16_t* wk = w + 2 * t0;
    RVASCEND_UNROLL(2)
    for (size_t kk = 0; kk < k; ++kk) {
      V::F wl, wh;
      V::LoadBf16Pair(wk, vl, wl, wh);
      lo0 = V::Fmacc(lo0, a0[kk], wl, vl);
      hi0 = V::Fmacc(hi0, a0[kk], wh, vl);
      if constexpr (kRows > 1) {
        lo1 = V::Fmacc(lo1, a1[kk], wl, vl);
        hi1 = V::Fmacc(hi1, a1[kk], wh, vl);
      }
      wk += 2 * half;
    }
    StoreHalf<4>(c, 0, t0, vl, nc, lo0);
    StoreHalf<4>(c, half, t0, vl, nc, hi0);
    if constexpr (kRows > 1) {
      StoreHalf<4>(c + c_stride, 0, t0, vl, nc, lo1);
      StoreHalf<4>(c + c_stride, half, t0, vl, nc, hi1);
    }
    t0 += vl;
  }
}

}  // namespace

void bf16_gemv_packed_ukernel_1xB__rvv_wide(size_t /*m*/, size_t nc, size_t k, const void* a,
                                             size_t /*a_stride*/, const uint16_t* w, uint16_t* c,
                                             size_t /*c_stride*/) {
  using V = rvv::Lmul<8>;
  const float* af = static_cast<const float*>(a);
  const size_t half = rvv::VlenBits() / 4;  // B/2 lanes: exactly one LMUL-8 group of e32
  const size_t vl = V::SetVl(half);
  V::F lo = V::Zero(vl), hi = lo;
  const uint16_t* wk = w;
  // Two accumulators, the pair being widened and its shifted copy take all 32
  // vector registers: no unrolling across k.
  for (size_t kk = 0; kk < k; ++kk) {
    V::F wl, wh;
    V::LoadBf16Pair(wk, vl, wl, wh);
    const float av = af[kk];
    lo = V::Fmacc(lo, av, wl, vl);
    hi = V::Fmacc(hi, av, wh, vl);
    wk += 2 * half;
  }
  StoreHalf<8>(c, 0, 0, vl, nc, lo);
  StoreHalf<8>(c, half, 0, vl, nc, hi);
}

void bf16_gemm_packed_ukernel_2xB__rvv_wide(size_t m, size_t nc, size_t k, const void* a, size_t a_stride,
                                             const uint16_t* w, uint16_t* c, size_t c_stride) {
  const float* af = static_cast<const float*>(a);
  const size_t half = rvv::VlenBits() / 4;
  if (m == 1) {
    GemmTile<1>(nc, k, af, a_stride, w, c, c_stride, half);
  } else {
    GemmTile<2>(nc, k, af, a_stride, w, c, c_stride, half);
  }
}

}  // namespace rvascend
