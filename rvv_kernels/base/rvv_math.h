// FP32 vector math on e32m4 groups shared by the RVV kernels: exp, and the
// round-to-nearest-even BF16 value of each lane kept as FP32 (to reproduce
// torch's intermediate BF16 roundings exactly).
#ifndef RVV_KERNELS_BASE_RVV_MATH_H_
#define RVV_KERNELS_BASE_RVV_MATH_H_

#include <riscv_vector.h>

#include <cstddef>

namespace rvascend {
namespace rvv {

// exp(x) to about 2 FP32 ulp: x = n*ln2 + r with |r| <= ln2/2 (Cody-Waite,
// ln2 split in two), e^r by its Taylor polynomial to degree 6 (truncation
// below 2^-23), 2^n put into the exponent. x is clamped to [-87, 88] (results
// below ~1.6e-38 flush to that, above ~1.6e38 saturate there, not to inf).
inline vfloat32m4_t Exp(vfloat32m4_t x, size_t vl) {
  x = __riscv_vfmin_vf_f32m4(__riscv_vfmax_vf_f32m4(x, -87.0f, vl), 88.0f, vl);
  const vint32m4_t n = __riscv_vfcvt_x_f_v_i32m4(__riscv_vfmul_vf_f32m4(x, 1.44269504088896341f, vl), vl);
  const vfloat32m4_t nf = __riscv_vfcvt_f_x_v_f32m4(n, vl);
  vfloat32m4_t r = __riscv_vfnmsac_vf_f32m4(x, 0.693359375f, nf, vl);
  r = __riscv_vfnmsac_vf_f32m4(r, -2.12194440e-4f, nf, vl);
  vfloat32m4_t p = __riscv_vfmv_v_f_f32m4(1.0f / 720, vl);
  p = __riscv_vfmadd_vv_f32m4(p, r, __riscv_vfmv_v_f_f32m4(1.0f / 120, vl), vl);
  p = __riscv_vfmadd_vv_f32m4(p, r, __riscv_vfmv_v_f_f32m4(1.0f / 24, vl), vl);
  p = __riscv_vfmadd_vv_f32m4(p, r, __riscv_vfmv_v_f_f32m4(1.0f / 6, vl), vl);
  p = __riscv_vfmadd_vv_f32m4(p, r, __riscv_vfmv_v_f_f32m4(0.5f, vl), vl);
  p = __riscv_vfmadd_vv_f32m4(p, r, __riscv_vfmv_v_f_f32m4(1.0f, vl), vl);
  p = __riscv_vfmadd_vv_f32m4(p, r, __riscv_vfmv_v_f_f32m4(1.0f, vl), vl);
  // 2^n, split in two factors so that n = 128 (x near 88) stays representable.
  const vint32m4_t half = __riscv_vsra_vx_i32m4(n, 1, vl);
  const vfloat32m4_t a = __riscv_vreinterpret_v_i32m4_f32m4(__riscv_vsll_vx_i32m4(__riscv_vadd_vx_i32m4(half, 127, vl), 23, vl));
  const vfloat32m4_t b = __riscv_vreinterpret_v_i32m4_f32m4(
      __riscv_vsll_vx_i32m4(__riscv_vadd_vx_i32m4(__riscv_vsub_vv_i32m4(n, half, vl), 127, vl), 23, vl));
  return __riscv_vfmul_vv_f32m4(__riscv_vfmul_vv_f32m4(p, a, vl), b, vl);
}

// Each lane rounded to BF16 (nearest even) and widened back; NaN stays NaN.
inline vfloat32m4_t RoundBf16(vfloat32m4_t x, size_t vl) {
  const vuint32m4_t bits = __riscv_vreinterpret_v_f32m4_u32m4(x);
  const vuint32m4_t lsb = __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(bits, 16, vl), 1, vl);
  const vuint32m4_t rounded =
      __riscv_vand_vx_u32m4(__riscv_vadd_vv_u32m4(__riscv_vadd_vx_u32m4(bits, 0x7fff, vl), lsb, vl), 0xffff0000u, vl);
  const vbool8_t nan = __riscv_vmfne_vv_f32m4_b8(x, x, vl);
  return __riscv_vmerge_vvm_f32m4(__riscv_vreinterpret_v_u32m4_f32m4(rounded), x, nan, vl);
}

}  // namespace rvv
}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_RVV_MATH_H_
