// BF16 x packed-BF16 GEMV (1x128) and GEMM (4x32) with Zvfbfwma: vfwmaccbf16
// multiplies BF16 by BF16 and accumulates in FP32 in one instruction, so the
// minimum per 32 columns and k is a load and a widening FMA. Compiled with
// -march=...zvfbfwma; only ever called after the CPU reported the extension.
#include <riscv_vector.h>

#include <cstring>

#include "rvv_kernels/bf16_packed_ukernels.h"
#include "rvv_kernels/packed_layout.h"
#include "rvv_kernels/rvv_lmul.h"
#include "rvv_kernels/unroll.h"

namespace rvascend {
namespace {

template <int kLmul>
struct Bf16Lmul;

#define RVASCEND_DEFINE_BF16_LMUL(L, M32, M16)                                               \
  template <>                                                                                \
  struct Bf16Lmul<L> {                                                                       \
    using F = vfloat32##M32##_t;                                                             \
    using B = vbfloat16##M16##_t;                                                            \
    static B Load(const uint16_t* p, size_t vl) {                                            \
      return __riscv_vle16_v_bf16##M16(reinterpret_cast<const __bf16*>(p), vl);            \
    }                                                                                        \
    static F Fmacc(F acc, __bf16 a, B w, size_t vl) {                                        \
      return __riscv_vfwmaccbf16_vf_f32##M32(acc, a, w, vl);                           \
    }                                                                                        \
  };

RVASCEND_DEFINE_BF16_LMUL(1, m1, mf2)
RVASCEND_DEFINE_BF16_LMUL(2, m2, m1)
RVASCEND_DEFINE_BF16_LMUL(4, m4, m2)
RVASCEND_DEFINE_BF16_LMUL(8, m8, m4)
#undef RVASCEND_DEFINE_BF16_LMUL

inline __bf16 LoadScalar(const uint16_t* p) {
  __bf16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <int kLmul, int kBlocks>
void GemvGroup(size_t nc, size_t k, const uint16_t* a, const uint16_t* w, uint16_t* c) {
  static_assert(kBlocks >= 1 && kBlocks <= 4, "1..4 blocks in flight");
  using V = rvv::Lmul<kLmul>;
  using B = Bf16Lmul<kLmul>;
  // RVV register types are sizeless (no arrays): one named accumulator per block.
  const size_t vl = V::SetVl(kPackedBlockN);
  const size_t bs = k * kPackedBlockN;
  typename V::F acc0 = V::Zero(vl), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const uint16_t* wk = w;
  RVASCEND_UNROLL(4)
  for (size_t kk = 0; kk < k; ++kk) {
    const __bf16 av = LoadScalar(a + kk);
    acc0 = B::Fmacc(acc0, av, B::Load(wk, vl), vl);
    if constexpr (kBlocks > 1) acc1 = B::Fmacc(acc1, av, B::Load(wk + bs, vl), vl);
    if constexpr (kBlocks > 2) acc2 = B::Fmacc(acc2, av, B::Load(wk + 2 * bs, vl), vl);
    if constexpr (kBlocks > 3) acc3 = B::Fmacc(acc3, av, B::Load(wk + 3 * bs, vl), vl);
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

template <int kLmul, int kBlocks>
void Gemv(size_t nc, size_t k, const uint16_t* a, const uint16_t* w, uint16_t* c) {
  const size_t group_cols = kBlocks * kPackedBlockN;
  const size_t block_stride = k * kPackedBlockN;
  size_t j = 0;
  for (; j + group_cols <= nc; j += group_cols) {
    GemvGroup<kLmul, kBlocks>(group_cols, k, a, w + (j / kPackedBlockN) * block_stride, c + j);
  }
  for (; j < nc; j += kPackedBlockN) {
    const size_t cols = nc - j < kPackedBlockN ? nc - j : kPackedBlockN;
    GemvGroup<kLmul, 1>(cols, k, a, w + (j / kPackedBlockN) * block_stride, c + j);
  }
}

template <int kLmul, int kRows>
void GemmTile(size_t nc, size_t k, const uint16_t* a, size_t a_stride, const uint16_t* w,
              uint16_t* c, size_t c_stride) {
  static_assert(kRows >= 1 && kRows <= 4, "1..4 rows");
  using V = rvv::Lmul<kLmul>;
  using B = Bf16Lmul<kLmul>;
  const uint16_t* a0 = a;
  const uint16_t* a1 = a + (kRows > 1 ? a_stride : 0);
  const uint16_t* a2 = a + (kRows > 2 ? 2 * a_stride : 0);
  const uint16_t* a3 = a + (kRows > 3 ? 3 * a_stride : 0);
  for (size_t j = 0; j < nc;) {
    // Compute over the whole (zero-padded) chunk, store only the valid columns.
    const size_t vl = V::SetVl(kPackedBlockN - j);
    typename V::F acc0 = V::Zero(vl), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    const uint16_t* wk = w + j;
    RVASCEND_UNROLL(2)
    for (size_t kk = 0; kk < k; ++kk) {
      const typename B::B wv = B::Load(wk, vl);
      acc0 = B::Fmacc(acc0, LoadScalar(a0 + kk), wv, vl);
      if constexpr (kRows > 1) acc1 = B::Fmacc(acc1, LoadScalar(a1 + kk), wv, vl);
      if constexpr (kRows > 2) acc2 = B::Fmacc(acc2, LoadScalar(a2 + kk), wv, vl);
      if constexpr (kRows > 3) acc3 = B::Fmacc(acc3, LoadScalar(a3 + kk), wv, vl);
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
void Gemm(size_t m, size_t nc, size_t k, const uint16_t* a, size_t a_stride, const uint16_t* w,
          uint16_t* c, size_t c_stride) {
  switch (m) {
    case 1: GemmTile<kLmul, 1>(nc, k, a, a_stride, w, c, c_stride); break;
    case 2: GemmTile<kLmul, 2>(nc, k, a, a_stride, w, c, c_stride); break;
    case 3: GemmTile<kLmul, 3>(nc, k, a, a_stride, w, c, c_stride); break;
    default: GemmTile<kLmul, 4>(nc, k, a, a_stride, w, c, c_stride); break;
  }
}

}  // namespace

void bf16_gemv_packed_ukernel_1x128__zvfbfwma(size_t /*m*/, size_t nc, size_t k, const void* a,
                                               size_t /*a_stride*/, const uint16_t* w,
                                               uint16_t* c, size_t /*c_stride*/) {
  const uint16_t* ab = static_cast<const uint16_t*>(a);
  const size_t vlen = rvv::VlenBits();
  if (vlen <= 128) {
    Gemv<8, 1>(nc, k, ab, w, c);
  } else if (vlen == 256) {
    Gemv<4, 4>(nc, k, ab, w, c);
  } else if (vlen == 512) {
    Gemv<2, 4>(nc, k, ab, w, c);
  } else {
    Gemv<1, 4>(nc, k, ab, w, c);
  }
}

void bf16_gemm_packed_ukernel_4x32__zvfbfwma(size_t m, size_t nc, size_t k, const void* a,
                                              size_t a_stride, const uint16_t* w, uint16_t* c,
                                              size_t c_stride) {
  const uint16_t* ab = static_cast<const uint16_t*>(a);
  const size_t vlen = rvv::VlenBits();
  if (vlen <= 256) {
    Gemm<4>(m, nc, k, ab, a_stride, w, c, c_stride);
  } else if (vlen == 512) {
    Gemm<2>(m, nc, k, ab, a_stride, w, c, c_stride);
  } else {
    Gemm<1>(m, nc, k, ab, a_stride, w, c, c_stride);
  }
}

}  // namespace rvascend

namespace rvascend {

void ExecuteZvfbfwmaProbe() {
  const uint16_t one[1] = {0x3f80};
  float out[1];
  const size_t vl = __riscv_vsetvl_e16mf2(1);
  vfloat32m1_t acc = __riscv_vfmv_v_f_f32m1(0.0f, vl);
  acc = __riscv_vfwmaccbf16_vv_f32m1(acc, __riscv_vle16_v_bf16mf2(reinterpret_cast<const __bf16*>(one), vl),
                                     __riscv_vle16_v_bf16mf2(reinterpret_cast<const __bf16*>(one), vl), vl);
  __riscv_vse32_v_f32m1(out, acc, vl);
  asm volatile("" : : "m"(out));
}

}  // namespace rvascend
