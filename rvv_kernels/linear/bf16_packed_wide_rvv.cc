// RVV 1.0 BF16 x packed-BF16 Linear over packed layout version 2 (block
// B = VLEN/2, each 32-bit lane two columns: packed_layout.h), for CPUs without
// BF16 vector extensions (the K1 class).
//
// GEMV (M = 1): one block per call, both halves of it in LMUL-8 accumulators.
// Per k: one scalar load, one vector load, a shift and an AND that widen the
// 2 x VLEN/4 columns, two FMAs; about 7 instructions per VLEN/2 weights
// (0.055 per weight at VLEN 256), against 4 loads + 2 widen pairs + 2 FMAs per
// 128 weights over version 1.
// GEMM (M >= 2, up to six rows per call): LMUL-4 chunks of the block.
//  - Three to six rows: one half of the block per pass (the shift for the low
//    columns, the AND for the high ones), so per k a chunk costs one load, one
//    widening op and one FMA per row: (2 + R) vector instructions per R x VLEN/8
//    multiply-adds, 0.198 instructions per multiply-add with the scalar loads
//    at six rows, against 0.234 for two rows over both halves. Six accumulators
//    and the loaded chunk fill 28 of the 32 registers.
//  - Two rows (and one): both halves per pass, the pair's widening shared by
//    the two rows.
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

// kRows rows x one half of the block: kHigh picks the high columns of every
// 32-bit lane (AND) or the low ones (shift).
template <int kRows, bool kHigh>
void GemmHalfTile(size_t nc, size_t k, const float* a, size_t a_stride, const uint16_t* w, uint16_t* c,
                  size_t c_stride, size_t half) {
  static_assert(kRows >= 1 && kRows <= 6, "one to six rows");
  using V = rvv::Lmul<4>;
  const size_t start = kHigh ? half : 0;
  for (size_t t0 = 0; t0 < half && start + t0 < nc;) {
    const size_t vl = V::SetVl(half - t0);
    V::F acc0 = V::Zero(vl), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0, acc5 = acc0;
    const uint32_t* wk = reinterpret_cast<const uint32_t*>(w) + t0;
    const float* a0 = a;
    const float* a1 = a + (kRows > 1 ? a_stride : 0);
    const float* a2 = a + (kRows > 2 ? 2 * a_stride : 0);
    const float* a3 = a + (kRows > 3 ? 3 * a_stride : 0);
    const float* a4 = a + (kRows > 4 ? 4 * a_stride : 0);
    const float* a5 = a + (kRows > 5 ? 5 * a_stride : 0);
    // j: the offset from the rows' pointers, a constant after unrolling, so each
    // activation load is one flw with an immediate offset (both compilers).
    auto step = [&](size_t j) {
      const V::U u = __riscv_vle32_v_u32m4(wk, vl);
      const V::F wv = __riscv_vreinterpret_v_u32m4_f32m4(
          kHigh ? __riscv_vand_vx_u32m4(u, 0xffff0000u, vl) : __riscv_vsll_vx_u32m4(u, 16, vl));
      acc0 = V::Fmacc(acc0, a0[j], wv, vl);
      if constexpr (kRows > 1) acc1 = V::Fmacc(acc1, a1[j], wv, vl);
      if constexpr (kRows > 2) acc2 = V::Fmacc(acc2, a2[j], wv, vl);
      if constexpr (kRows > 3) acc3 = V::Fmacc(acc3, a3[j], wv, vl);
      if constexpr (kRows > 4) acc4 = V::Fmacc(acc4, a4[j], wv, vl);
      if constexpr (kRows > 5) acc5 = V::Fmacc(acc5, a5[j], wv, vl);
      wk += half;
    };
    size_t kk = 0;
    for (; kk + 4 <= k; kk += 4) {
      step(0);
      step(1);
      step(2);
      step(3);
      a0 += 4, a1 += 4, a2 += 4, a3 += 4, a4 += 4, a5 += 4;
    }
    for (; kk < k; ++kk) {
      step(0);
      ++a0, ++a1, ++a2, ++a3, ++a4, ++a5;
    }
    StoreHalf<4>(c, start, t0, vl, nc, acc0);
    if constexpr (kRows > 1) StoreHalf<4>(c + c_stride, start, t0, vl, nc, acc1);
    if constexpr (kRows > 2) StoreHalf<4>(c + 2 * c_stride, start, t0, vl, nc, acc2);
    if constexpr (kRows > 3) StoreHalf<4>(c + 3 * c_stride, start, t0, vl, nc, acc3);
    if constexpr (kRows > 4) StoreHalf<4>(c + 4 * c_stride, start, t0, vl, nc, acc4);
    if constexpr (kRows > 5) StoreHalf<4>(c + 5 * c_stride, start, t0, vl, nc, acc5);
    t0 += vl;
  }
}

template <int kRows>
void GemmHalves(size_t nc, size_t k, const float* a, size_t a_stride, const uint16_t* w, uint16_t* c,
                size_t c_stride, size_t half) {
  GemmHalfTile<kRows, false>(nc, k, a, a_stride, w, c, c_stride, half);
  GemmHalfTile<kRows, true>(nc, k, a, a_stride, w, c, c_stride, half);
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

void bf16_gemm_packed_ukernel_6xB__rvv_wide(size_t m, size_t nc, size_t k, const void* a, size_t a_stride,
                                             const uint16_t* w, uint16_t* c, size_t c_stride) {
  const float* af = static_cast<const float*>(a);
  const size_t half = rvv::VlenBits() / 4;
  switch (m) {
    case 1: GemmTile<1>(nc, k, af, a_stride, w, c, c_stride, half); break;
    case 2: GemmTile<2>(nc, k, af, a_stride, w, c, c_stride, half); break;
    case 3: GemmHalves<3>(nc, k, af, a_stride, w, c, c_stride, half); break;
    case 4: GemmHalves<4>(nc, k, af, a_stride, w, c, c_stride, half); break;
    case 5: GemmHalves<5>(nc, k, af, a_stride, w, c, c_stride, half); break;
    default: GemmHalves<6>(nc, k, af, a_stride, w, c, c_stride, half); break;
  }
}

}  // namespace rvascend
