// One vfwmaccbf16, executed (under a SIGILL handler in cpu_features.cc) to
// ask a CPU whether it has Zvfbfwma when the kernel does not say. Compiled
// with -march=...zvfbfwma; nothing else in this file.
#include <riscv_vector.h>

#include <cstddef>
#include <cstdint>

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
