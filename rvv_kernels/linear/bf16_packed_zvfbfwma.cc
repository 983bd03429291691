// BF16 x packed-BF16 GEMV (1x128) and GEMM (4x32) with Zvfbfwma: vfwmaccbf16
// multiplies BF16 by BF16 and accumulates in FP32 in one instruction, so the
// minimum per 32 columns and k is a load and a widening FMA. Compiled with
// -march=...zvfbfwma; only ever called after the CPU reported the extension.
#include <riscv_vector.h>

#include <cstring>

#include "rvv_kernels/linear/bf16_packed_rvv_tiles.h"
#include "rvv_kernels/linear/bf16_packed_ukernels.h"

namespace rvascend {
namespace {

// The Zvfbfwma widening policy of bf16_packed_rvv_tiles.h: BF16 activations.
template <int kLmul>
struct Zvfbfwma;

#define RVASCEND_DEFINE_ZVFBFWMA(L, M32, M16)                                                 \
  template <>                                                                                \
  struct Zvfbfwma<L> {                                                                       \
    using Act = uint16_t;                                                                    \
    using F = vfloat32##M32##_t;                                                             \
    using W = vbfloat16##M16##_t;                                                            \
    static __bf16 LoadScalar(const uint16_t* p) {                                            \
      __bf16 v;                                                                              \
      std::memcpy(&v, p, sizeof(v));                                                         \
      return v;                                                                              \
    }                                                                                        \
    static W Load(const uint16_t* p, size_t vl) {                                            \
      return __riscv_vle16_v_bf16##M16(reinterpret_cast<const __bf16*>(p), vl);             \
    }                                                                                        \
    static F Fmacc(F acc, __bf16 a, W w, size_t vl) {                                        \
      return __riscv_vfwmaccbf16_vf_f32##M32(acc, a, w, vl);                                 \
    }                                                                                        \
  };

RVASCEND_DEFINE_ZVFBFWMA(1, m1, mf2)
RVASCEND_DEFINE_ZVFBFWMA(2, m2, m1)
RVASCEND_DEFINE_ZVFBFWMA(4, m4, m2)
RVASCEND_DEFINE_ZVFBFWMA(8, m8, m4)
#undef RVASCEND_DEFINE_ZVFBFWMA

}  // namespace

void bf16_gemv_packed_ukernel_1x128__zvfbfwma(size_t /*m*/, size_t nc, size_t k, const void* a,
                                               size_t /*a_stride*/, const uint16_t* w, uint16_t* c,
                                               size_t /*c_stride*/) {
  const uint16_t* ab = static_cast<const uint16_t*>(a);
  const size_t vlen = rvv::VlenBits();
  if (vlen <= 128) {
    rvv::Gemv<Zvfbfwma, 8, 1>(nc, k, ab, w, c);
  } else if (vlen == 256) {
    rvv::Gemv<Zvfbfwma, 4, 4>(nc, k, ab, w, c);
  } else if (vlen == 512) {
    rvv::Gemv<Zvfbfwma, 2, 4>(nc, k, ab, w, c);
  } else {
    rvv::Gemv<Zvfbfwma, 1, 4>(nc, k, ab, w, c);
  }
}

void bf16_gemm_packed_ukernel_4x32__zvfbfwma(size_t m, size_t nc, size_t k, const void* a, size_t a_stride,
                                              const uint16_t* w, uint16_t* c, size_t c_stride) {
  rvv::GemmForVlen<Zvfbfwma>(m, nc, k, static_cast<const uint16_t*>(a), a_stride, w, c, c_stride);
}

}  // namespace rvascend
