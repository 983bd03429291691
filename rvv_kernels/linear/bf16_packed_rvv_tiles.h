// The RVV GEMV/GEMM tiles over the packed layout, written once for both
// widening policies:
//  - ShiftWiden (rvv_lmul.h): FP32 activations; weights zero-extended and
//    shifted into FP32 lanes, then vfmacc.vf (CPUs without BF16 extensions).
//  - the Zvfbfwma policy (bf16_packed_zvfbfwma.cc): BF16 activations and
//    weights straight into vfwmaccbf16.
// A policy provides: Act (activation element in memory), Scalar, W (weight
// vector), Scalar LoadScalar(const Act*), W Load(const uint16_t*, vl),
// F Fmacc(F, Scalar, W, vl), with F = rvv::Lmul<kLmul>::F.
#ifndef RVV_KERNELS_LINEAR_BF16_PACKED_RVV_TILES_H_
#define RVV_KERNELS_LINEAR_BF16_PACKED_RVV_TILES_H_

#include "rvv_kernels/linear/packed_layout.h"
#include "rvv_kernels/base/rvv_lmul.h"
#include "rvv_kernels/base/unroll.h"

namespace rvascend {
namespace rvv {

// Up to four 32-column blocks of one row; RVV register types are sizeless
// (no arrays), so each block has a named accumulator.
template <template <int> class Widen, int kLmul, int kBlocks>
inline void GemvGroup(size_t nc, size_t k, const typename Widen<kLmul>::Act* a, const uint16_t* w, uint16_t* c) {
  static_assert(kBlocks >= 1 && kBlocks <= 4, "1..4 blocks in flight");
  using V = Lmul<kLmul>;
  using P = Widen<kLmul>;
  const size_t vl = V::SetVl(kPackedBlockN);
  const size_t bs = k * kPackedBlockN;
  typename V::F acc0 = V::Zero(vl), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const uint16_t* wk = w;
  RVASCEND_UNROLL(4)
  for (size_t kk = 0; kk < k; ++kk) {
    const auto av = P::LoadScalar(a + kk);
    acc0 = P::Fmacc(acc0, av, P::Load(wk, vl), vl);
    if constexpr (kBlocks > 1) acc1 = P::Fmacc(acc1, av, P::Load(wk + bs, vl), vl);
    if constexpr (kBlocks > 2) acc2 = P::Fmacc(acc2, av, P::Load(wk + 2 * bs, vl), vl);
    if constexpr (kBlocks > 3) acc3 = P::Fmacc(acc3, av, P::Load(wk + 3 * bs, vl), vl);
    wk += kPackedBlockN;
  }
  auto store = [&](size_t block, typename V::F acc) {
    const size_t done = block * kPackedBlockN;
    if (done >= nc) return;
    V::StoreBf16(c + done, acc, V::SetVl(nc - done < kPackedBlockN ? nc - done : kPackedBlockN));
  };
  store(0, acc0);
  if constexpr (kBlocks > 1) store(1, acc1);
  if constexpr (kBlocks > 2) store(2, acc2);
  if constexpr (kBlocks > 3) store(3, acc3);
}

// Full groups of kBlocks through `full(j)`, then the last partial group one
// block at a time (only the blocks holding valid columns are loaded).
template <template <int> class Widen, int kLmul, int kBlocks, typename FullGroup>
inline void GemvBlocks(size_t nc, size_t k, const typename Widen<kLmul>::Act* a, const uint16_t* w, uint16_t* c,
                       FullGroup full) {
  const size_t group_cols = kBlocks * kPackedBlockN;
  const size_t bs = k * kPackedBlockN;
  size_t j = 0;
  for (; j + group_cols <= nc; j += group_cols) full(j, w + (j / kPackedBlockN) * bs, c + j);
  for (; j < nc; j += kPackedBlockN) {
    const size_t cols = nc - j < kPackedBlockN ? nc - j : kPackedBlockN;
    GemvGroup<Widen, kLmul, 1>(cols, k, a, w + (j / kPackedBlockN) * bs, c + j);
  }
}

template <template <int> class Widen, int kLmul, int kBlocks>
inline void Gemv(size_t nc, size_t k, const typename Widen<kLmul>::Act* a, const uint16_t* w, uint16_t* c) {
  GemvBlocks<Widen, kLmul, kBlocks>(nc, k, a, w, c, [&](size_t, const uint16_t* wj, uint16_t* cj) {
    GemvGroup<Widen, kLmul, kBlocks>(kBlocks * kPackedBlockN, k, a, wj, cj);
  });
}

// kRows x 32: one weight vector per k feeds kRows FMAs. Where one LMUL group
// holds fewer than 32 lanes (VLEN 128) the block is two chunks.
template <template <int> class Widen, int kLmul, int kRows>
inline void GemmTile(size_t nc, size_t k, const typename Widen<kLmul>::Act* a, size_t a_stride, const uint16_t* w,
                     uint16_t* c, size_t c_stride) {
  static_assert(kRows >= 1 && kRows <= 4, "1..4 rows");
  using V = Lmul<kLmul>;
  using P = Widen<kLmul>;
  const auto* a0 = a;
  const auto* a1 = a + (kRows > 1 ? a_stride : 0);
  const auto* a2 = a + (kRows > 2 ? 2 * a_stride : 0);
  const auto* a3 = a + (kRows > 3 ? 3 * a_stride : 0);
  for (size_t j = 0; j < nc;) {
    // Compute over the whole (zero-padded) chunk, store only the valid columns.
    const size_t vl = V::SetVl(kPackedBlockN - j);
    typename V::F acc0 = V::Zero(vl), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    const uint16_t* wk = w + j;
    RVASCEND_UNROLL(2)
    for (size_t kk = 0; kk < k; ++kk) {
      const auto wv = P::Load(wk, vl);
      acc0 = P::Fmacc(acc0, P::LoadScalar(a0 + kk), wv, vl);
      if constexpr (kRows > 1) acc1 = P::Fmacc(acc1, P::LoadScalar(a1 + kk), wv, vl);
      if constexpr (kRows > 2) acc2 = P::Fmacc(acc2, P::LoadScalar(a2 + kk), wv, vl);
      if constexpr (kRows > 3) acc3 = P::Fmacc(acc3, P::LoadScalar(a3 + kk), wv, vl);
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

template <template <int> class Widen, int kLmul>
inline void Gemm(size_t m, size_t nc, size_t k, const typename Widen<kLmul>::Act* a, size_t a_stride,
                 const uint16_t* w, uint16_t* c, size_t c_stride) {
  switch (m) {
    case 1: GemmTile<Widen, kLmul, 1>(nc, k, a, a_stride, w, c, c_stride); break;
    case 2: GemmTile<Widen, kLmul, 2>(nc, k, a, a_stride, w, c, c_stride); break;
    case 3: GemmTile<Widen, kLmul, 3>(nc, k, a, a_stride, w, c, c_stride); break;
    default: GemmTile<Widen, kLmul, 4>(nc, k, a, a_stride, w, c, c_stride); break;
  }
}

// The M >= 2 entry for any policy: LMUL 4 up to VLEN 256 (two chunks at 128,
// where a 4x32 tile at LMUL 8 would need every register for accumulators).
template <template <int> class Widen, typename Act>
inline void GemmForVlen(size_t m, size_t nc, size_t k, const Act* a, size_t a_stride, const uint16_t* w,
                        uint16_t* c, size_t c_stride) {
  const size_t vlen = VlenBits();
  if (vlen <= 256) {
    Gemm<Widen, 4>(m, nc, k, a, a_stride, w, c, c_stride);
  } else if (vlen == 512) {
    Gemm<Widen, 2>(m, nc, k, a, a_stride, w, c, c_stride);
  } else {
    Gemm<Widen, 1>(m, nc, k, a, a_stride, w, c, c_stride);
  }
}

}  // namespace rvv
}  // namespace rvascend

#endif  // RVV_KERNELS_LINEAR_BF16_PACKED_RVV_TILES_H_
