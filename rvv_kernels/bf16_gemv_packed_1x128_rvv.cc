// M = 1 (decode) BF16 x packed-BF16 GEMV for RVV 1.0 without BF16 extensions.
//
// Four 32-column blocks are in flight, so one scalar load of a[k] serves four
// blocks. At VLEN 256 and 512 the four blocks live in two 64-lane accumulator
// groups (BlockPair): per k that is four loads, two zero-extends, two shifts
// and two FMAs, about 1.2x the load/widen/shift/FMA minimum per 32 columns.
// At VLEN 1024 four one-block groups; at VLEN 128 one 32-lane accumulator
// already takes an LMUL=8 group, so one block is in flight there.
#include "rvv_kernels/bf16_packed_ukernels.h"
#include "rvv_kernels/packed_layout.h"
#include "rvv_kernels/rvv_lmul.h"
#include "rvv_kernels/unroll.h"

namespace rvascend {
namespace {

template <int kLmul, int kBlocks>
void GemvGroup(size_t nc, size_t k, const float* a, const uint16_t* w, uint16_t* c) {
  static_assert(kBlocks >= 1 && kBlocks <= 4, "1..4 blocks in flight");
  using V = rvv::Lmul<kLmul>;
  // RVV register types are sizeless (no arrays): one named accumulator per block.
  const size_t vl = V::SetVl(kPackedBlockN);
  const size_t bs = k * kPackedBlockN;
  typename V::F acc0 = V::Zero(vl), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const uint16_t* wk = w;
  RVASCEND_UNROLL(4)
  for (size_t kk = 0; kk < k; ++kk) {
    const float av = a[kk];
    acc0 = V::Fmacc(acc0, av, V::LoadBf16(wk, vl), vl);
    if constexpr (kBlocks > 1) acc1 = V::Fmacc(acc1, av, V::LoadBf16(wk + bs, vl), vl);
    if constexpr (kBlocks > 2) acc2 = V::Fmacc(acc2, av, V::LoadBf16(wk + 2 * bs, vl), vl);
    if constexpr (kBlocks > 3) acc3 = V::Fmacc(acc3, av, V::LoadBf16(wk + 3 * bs, vl), vl);
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

// Four blocks as two 64-lane block pairs: per k, four loads and their
// addresses, then per pair one zero-extend, one shift and one FMA.
template <int kPairLmul>
void GemvFourBlocks(size_t nc, size_t k, const float* a, const uint16_t* w, uint16_t* c) {
  using P = rvv::BlockPair<kPairLmul>;
  using H = typename P::Half;
  const size_t vl32 = H::SetVl(kPackedBlockN);
  const size_t vl64 = P::SetVl(2 * kPackedBlockN);
  const size_t bs = k * kPackedBlockN;
  typename P::F acc01 = P::Zero(vl64), acc23 = acc01;
  const uint16_t* w0 = w;
  const uint16_t* w1 = w + bs;
  const uint16_t* w2 = w + 2 * bs;
  const uint16_t* w3 = w + 3 * bs;
  // Not unrolled: at LMUL 8 two accumulators and one widened pair already
  // hold 24 of the 32 vector registers.
  RVASCEND_UNROLL(1)
  for (size_t kk = 0; kk < k; ++kk) {
    const float av = a[kk];
    acc01 = P::Fmacc(acc01, av, P::LoadBf16(w0, w1, vl32, vl64), vl64);
    acc23 = P::Fmacc(acc23, av, P::LoadBf16(w2, w3, vl32, vl64), vl64);
    w0 += kPackedBlockN;
    w1 += kPackedBlockN;
    w2 += kPackedBlockN;
    w3 += kPackedBlockN;
  }
  H::StoreBf16(c, P::Lo(acc01), vl32);
  H::StoreBf16(c + kPackedBlockN, P::Hi(acc01), vl32);
  H::StoreBf16(c + 2 * kPackedBlockN, P::Lo(acc23), vl32);
  H::StoreBf16(c + 3 * kPackedBlockN, P::Hi(acc23), vl32);
  (void)nc;  // always 128: partial groups take the one-block path
}

template <int kLmul, int kBlocks, int kPairLmul = 0>
void Gemv(size_t nc, size_t k, const float* a, const uint16_t* w, uint16_t* c) {
  const size_t group_cols = kBlocks * kPackedBlockN;
  const size_t block_stride = k * kPackedBlockN;
  size_t j = 0;
  for (; j + group_cols <= nc; j += group_cols) {
    if constexpr (kPairLmul != 0) {
      GemvFourBlocks<kPairLmul>(group_cols, k, a, w + (j / kPackedBlockN) * block_stride, c + j);
    } else {
      GemvGroup<kLmul, kBlocks>(group_cols, k, a, w + (j / kPackedBlockN) * block_stride, c + j);
    }
  }
  // The last, partial group loads only the blocks that hold valid columns.
  for (; j < nc; j += kPackedBlockN) {
    const size_t cols = nc - j < kPackedBlockN ? nc - j : kPackedBlockN;
    GemvGroup<kLmul, 1>(cols, k, a, w + (j / kPackedBlockN) * block_stride, c + j);
  }
}

}  // namespace

void bf16_gemv_packed_ukernel_1x128__rvv(size_t m, size_t nc, size_t k, const void* a,
                                          size_t /*a_stride*/, const uint16_t* w, uint16_t* c,
                                          size_t /*c_stride*/) {
  (void)m;  // always 1
  const float* af = static_cast<const float*>(a);
  const size_t vlen = rvv::VlenBits();
  if (vlen <= 128) {
    Gemv<8, 1>(nc, k, af, w, c);
  } else if (vlen == 256) {
    Gemv<4, 4, 8>(nc, k, af, w, c);
  } else if (vlen == 512) {
    Gemv<2, 4, 4>(nc, k, af, w, c);
  } else {
    Gemv<1, 4>(nc, k, af, w, c);
  }
}

}  // namespace rvascend
