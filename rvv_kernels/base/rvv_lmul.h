// Type-level wrappers over RVV 1.0 intrinsics for one LMUL, so each
// microkernel is written once and instantiated for the LMUL that makes a
// 32-column FP32 accumulator fit the machine's VLEN (chosen at run time).
//
// BF16 -> FP32 without BF16 vector extensions: zero-extend the 16-bit pattern
// to 32 bits and shift it into the high half (the K1 class of CPUs).
//
// Accumulators use the tail-agnostic policy on purpose: every kernel keeps vl
// fixed for an accumulator's whole life and stores exactly those vl lanes, so
// no tail lane is ever read back. (Tail-undisturbed would make LLVM toggle
// vtype around every FMA.) The QEMU tests run with rvv_ta_all_1s to prove it.
#ifndef RVV_KERNELS_BASE_RVV_LMUL_H_
#define RVV_KERNELS_BASE_RVV_LMUL_H_

#include <riscv_vector.h>

#include <cstddef>
#include <cstdint>

namespace rvascend {
namespace rvv {

template <int kLmul>
struct Lmul;

#define RVASCEND_DEFINE_LMUL(L, F32, U32, U16, M32, M16, B1, BS)                                    \
  template <>                                                                                  \
  struct Lmul<L> {                                                                             \
    using F = F32;                                                                             \
    using U = U32;                                                                             \
    using H = U16;                                                                             \
    static size_t SetVl(size_t n) { return __riscv_vsetvl_e32##M32(n); }                      \
    static size_t VlMax() { return __riscv_vsetvlmax_e32##M32(); }                            \
    static F Zero(size_t vl) { return __riscv_vfmv_v_f_f32##M32(0.0f, vl); }                  \
    static F LoadBf16(const uint16_t* p, size_t vl) {                                          \
      H h = __riscv_vle16_v_u16##M16(p, vl);                                                   \
      U u = __riscv_vsll_vx_u32##M32(__riscv_vzext_vf2_u32##M32(h, vl), 16, vl);              \
      return __riscv_vreinterpret_v_u32##M32##_f32##M32(u);                                    \
    }                                                                                          \
    /* Packed layout version 2: vl 32-bit lanes, each two BF16 columns (packed_layout.h). */   \
    static void LoadBf16Pair(const uint16_t* p, size_t vl, F& lo, F& hi) {                     \
      U u = __riscv_vle32_v_u32##M32(reinterpret_cast<const uint32_t*>(p), vl);               \
      lo = __riscv_vreinterpret_v_u32##M32##_f32##M32(__riscv_vsll_vx_u32##M32(u, 16, vl));    \
      hi = __riscv_vreinterpret_v_u32##M32##_f32##M32(__riscv_vand_vx_u32##M32(u, 0xffff0000u, vl)); \
    }                                                                                          \
    static F Fmacc(F acc, float a, F w, size_t vl) {                                           \
      return __riscv_vfmacc_vf_f32##M32(acc, a, w, vl);                                   \
    }                                                                                          \
    static F Load(const float* p, size_t vl) { return __riscv_vle32_v_f32##M32(p, vl); }      \
    /* p[0], p[stride_bytes / 4], ...: every other float of an interleaved row */              \
    static F LoadStrided(const float* p, ptrdiff_t stride_bytes, size_t vl) {                   \
      return __riscv_vlse32_v_f32##M32(p, stride_bytes, vl);                                  \
    }                                                                                          \
    static F Mul(F a, F b, size_t vl) { return __riscv_vfmul_vv_f32##M32(a, b, vl); }          \
    static F Scale(F a, float b, size_t vl) { return __riscv_vfmul_vf_f32##M32(a, b, vl); }  \
    static F FmaccVv(F acc, F a, F b, size_t vl) {                                             \
      return __riscv_vfmacc_vv_f32##M32(acc, a, b, vl);                                       \
    }                                                                                          \
    static void Store(float* p, F v, size_t vl) { __riscv_vse32_v_f32##M32(p, v, vl); }      \
    /* acc += a * b on the first vl lanes; the lanes past vl keep their values */             \
    static F FmaccVvTu(F acc, F a, F b, size_t vl) {                                          \
      return __riscv_vfmacc_vv_f32##M32##_tu(acc, a, b, vl);                                  \
    }                                                                                          \
    /* init[0] + the sum of the first vl lanes of x */                                         \
    static vfloat32m1_t SumTo(F x, vfloat32m1_t init, size_t vl) {                            \
      return __riscv_vfredusum_vs_f32##M32##_f32m1(x, init, vl);                               \
    }                                                                                          \
    /* Round to nearest even; NaN lanes keep their sign and stay quiet NaNs. */               \
    static void StoreBf16(uint16_t* p, F acc, size_t vl) {                                     \
      U bits = __riscv_vreinterpret_v_f32##M32##_u32##M32(acc);                                \
      U lsb = __riscv_vand_vx_u32##M32(__riscv_vsrl_vx_u32##M32(bits, 16, vl), 1, vl);       \
      U biased = __riscv_vadd_vv_u32##M32(__riscv_vadd_vx_u32##M32(bits, 0x7fff, vl), lsb, vl); \
      H rounded = __riscv_vnsrl_wx_u16##M16(biased, 16, vl);                                   \
      B1 nan = __riscv_vmfne_vv_f32##M32##_##BS(acc, acc, vl);                                       \
      H quiet = __riscv_vor_vx_u16##M16(__riscv_vnsrl_wx_u16##M16(bits, 16, vl), 0x40, vl);   \
      __riscv_vse16_v_u16##M16(p, __riscv_vmerge_vvm_u16##M16(rounded, quiet, nan, vl), vl);   \
    }                                                                                          \
  };


RVASCEND_DEFINE_LMUL(1, vfloat32m1_t, vuint32m1_t, vuint16mf2_t, m1, mf2, vbool32_t, b32)
RVASCEND_DEFINE_LMUL(2, vfloat32m2_t, vuint32m2_t, vuint16m1_t, m2, m1, vbool16_t, b16)
RVASCEND_DEFINE_LMUL(4, vfloat32m4_t, vuint32m4_t, vuint16m2_t, m4, m2, vbool8_t, b8)
RVASCEND_DEFINE_LMUL(8, vfloat32m8_t, vuint32m8_t, vuint16m4_t, m8, m4, vbool4_t, b4)

#undef RVASCEND_DEFINE_LMUL

// Two 32-column blocks in one accumulator group of 64 FP32 lanes (LMUL L
// holding exactly 64 lanes: m8 at VLEN 256, m4 at 512; at 1024 the BF16 half
// would be a fractional group, which cannot be inserted into a whole one). Each
// block's row k is loaded into one half of a BF16 group, then one
// zero-extend, one shift and one FMA cover both blocks.
template <int kLmul>
struct BlockPair;

#define RVASCEND_DEFINE_BLOCK_PAIR(L, HALF, M32, M16, H16)                                   \
  template <>                                                                                \
  struct BlockPair<L> {                                                                      \
    using Half = Lmul<HALF>;                                                                 \
    using F = vfloat32##M32##_t;                                                             \
    static size_t SetVl(size_t n) { return __riscv_vsetvl_e32##M32(n); }                     \
    static F Zero(size_t vl) { return __riscv_vfmv_v_f_f32##M32(0.0f, vl); }                 \
    /* rows of two blocks -> 64 widened lanes; vl32 = 32, vl64 = 64 */                       \
    static F LoadBf16(const uint16_t* b0, const uint16_t* b1, size_t vl32, size_t vl64) {    \
      vuint16##M16##_t h = __riscv_vundefined_u16##M16();                                    \
      h = __riscv_vset_v_u16##H16##_u16##M16(h, 0, __riscv_vle16_v_u16##H16(b0, vl32));      \
      h = __riscv_vset_v_u16##H16##_u16##M16(h, 1, __riscv_vle16_v_u16##H16(b1, vl32));      \
      vuint32##M32##_t u = __riscv_vsll_vx_u32##M32(__riscv_vzext_vf2_u32##M32(h, vl64), 16, vl64); \
      return __riscv_vreinterpret_v_u32##M32##_f32##M32(u);                                  \
    }                                                                                        \
    static F Fmacc(F acc, float a, F w, size_t vl64) {                                       \
      return __riscv_vfmacc_vf_f32##M32(acc, a, w, vl64);                                    \
    }                                                                                        \
    static typename Half::F Lo(F x) { return __riscv_vget_v_f32##M32##_f32m##HALF(x, 0); }   \
    static typename Half::F Hi(F x) { return __riscv_vget_v_f32##M32##_f32m##HALF(x, 1); }   \
  };

RVASCEND_DEFINE_BLOCK_PAIR(8, 4, m8, m4, m2)
RVASCEND_DEFINE_BLOCK_PAIR(4, 2, m4, m2, m1)
#undef RVASCEND_DEFINE_BLOCK_PAIR

// The widening policy of CPUs without BF16 vector extensions (see
// bf16_packed_rvv_tiles.h): FP32 activations, weights widened by shift.
template <int kLmul>
struct ShiftWiden {
  using Act = float;
  using W = typename Lmul<kLmul>::F;
  static float LoadScalar(const float* p) { return *p; }
  static W Load(const uint16_t* p, size_t vl) { return Lmul<kLmul>::LoadBf16(p, vl); }
  static W Fmacc(W acc, float a, W w, size_t vl) { return Lmul<kLmul>::Fmacc(acc, a, w, vl); }
};

// VLEN in bits, read from the vlenb CSR.
inline size_t VlenBits() { return __riscv_vlenb() * 8; }

}  // namespace rvv
}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_RVV_LMUL_H_
