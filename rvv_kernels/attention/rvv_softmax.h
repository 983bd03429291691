// The exact (max-subtracted) FP32 softmax of one score row, shared by the
// decode row and the prefill block kernels so both normalise identically.
#ifndef RVV_KERNELS_ATTENTION_RVV_SOFTMAX_H_
#define RVV_KERNELS_ATTENTION_RVV_SOFTMAX_H_

#include <riscv_vector.h>

#include <cstddef>

#include "rvv_kernels/base/rvv_math.h"

namespace rvascend {
namespace rvv {

// In place: s[0:n] <- softmax(s[0:n]) (e32m4: vector max, vector exp, vector sum).
inline void Softmax(float* s, size_t n) {
  vfloat32m1_t m1 = __riscv_vfmv_v_f_f32m1(-__builtin_inff(), 1);
  for (size_t j = 0; j < n;) {
    const size_t vl = __riscv_vsetvl_e32m4(n - j);
    m1 = __riscv_vfredmax_vs_f32m4_f32m1(__riscv_vle32_v_f32m4(s + j, vl), m1, vl);
    j += vl;
  }
  const float m = __riscv_vfmv_f_s_f32m1_f32(m1);
  vfloat32m1_t sum1 = __riscv_vfmv_v_f_f32m1(0.0f, 1);
  for (size_t j = 0; j < n;) {
    const size_t vl = __riscv_vsetvl_e32m4(n - j);
    const vfloat32m4_t e = Exp(__riscv_vfsub_vf_f32m4(__riscv_vle32_v_f32m4(s + j, vl), m, vl), vl);
    __riscv_vse32_v_f32m4(s + j, e, vl);
    sum1 = __riscv_vfredusum_vs_f32m4_f32m1(e, sum1, vl);
    j += vl;
  }
  const float inv = 1.0f / __riscv_vfmv_f_s_f32m1_f32(sum1);
  for (size_t j = 0; j < n;) {
    const size_t vl = __riscv_vsetvl_e32m4(n - j);
    __riscv_vse32_v_f32m4(s + j, __riscv_vfmul_vf_f32m4(__riscv_vle32_v_f32m4(s + j, vl), inv, vl), vl);
    j += vl;
  }
}

}  // namespace rvv
}  // namespace rvascend

#endif  // RVV_KERNELS_ATTENTION_RVV_SOFTMAX_H_
