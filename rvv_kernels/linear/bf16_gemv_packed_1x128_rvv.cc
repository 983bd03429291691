// M = 1 (decode) BF16 x packed-BF16 GEMV for RVV 1.0 without BF16 extensions.
//
// Four 32-column blocks are in flight, so one scalar load of a[k] serves four
// blocks. At VLEN 256 and 512 the four blocks live in two 64-lane accumulator
// groups (BlockPair): per k that is four loads, two zero-extends, two shifts
// and two FMAs, about 1.2x the load/widen/shift/FMA minimum per 32 columns.
// At VLEN 1024 four one-block groups; at VLEN 128 one 32-lane accumulator
// already takes an LMUL=8 group, so one block is in flight there.
#include "rvv_kernels/linear/bf16_packed_rvv_tiles.h"
#include "rvv_kernels/linear/bf16_packed_ukernels.h"

#include <type_traits>

namespace rvascend {
namespace {

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

}  // namespace

void bf16_gemv_packed_ukernel_1x128__rvv(size_t m, size_t nc, size_t k, const void* a,
                                          size_t /*a_stride*/, const uint16_t* w, uint16_t* c,
                                          size_t /*c_stride*/) {
  (void)m;  // always 1
  const float* af = static_cast<const float*>(a);
  const size_t vlen = rvv::VlenBits();
  auto pairs = [&](auto pair_lmul) {
    constexpr int kPairLmul = decltype(pair_lmul)::value;
    rvv::GemvBlocks<rvv::ShiftWiden, kPairLmul / 2, 4>(nc, k, af, w, c, [&](size_t, const uint16_t* wj, uint16_t* cj) {
      GemvFourBlocks<kPairLmul>(4 * kPackedBlockN, k, af, wj, cj);
    });
  };
  if (vlen <= 128) {
    rvv::Gemv<rvv::ShiftWiden, 8, 1>(nc, k, af, w, c);
  } else if (vlen == 256) {
    pairs(std::integral_constant<int, 8>{});
  } else if (vlen == 512) {
    pairs(std::integral_constant<int, 4>{});
  } else {
    rvv::Gemv<rvv::ShiftWiden, 1, 4>(nc, k, af, w, c);
  }
}

}  // namespace rvascend
