// Proves the riscv64 toolchain emits RVV 1.0 code and the QEMU rule runs it:
// a strip-mined saxpy whose element count is not a multiple of any VLMAX.
#include <riscv_vector.h>

#include <cstdio>
#include <vector>

int main() {
  const size_t n = 1000 + 3;
  std::vector<float> x(n), y(n), expected(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i) * 0.5f;
    y[i] = 1.0f + static_cast<float>(i % 7);
    expected[i] = 3.0f * x[i] + y[i];
  }
  for (size_t i = 0; i < n;) {
    size_t vl = __riscv_vsetvl_e32m4(n - i);
    vfloat32m4_t vx = __riscv_vle32_v_f32m4(&x[i], vl);
    vfloat32m4_t vy = __riscv_vle32_v_f32m4(&y[i], vl);
    __riscv_vse32_v_f32m4(&y[i], __riscv_vfmacc_vf_f32m4(vy, 3.0f, vx, vl), vl);
    i += vl;
  }
  for (size_t i = 0; i < n; ++i) {
    if (y[i] != expected[i]) {
      std::printf("mismatch at %zu: %f != %f\n", i, y[i], expected[i]);
      return 1;
    }
  }
  std::printf("saxpy over %zu elements ok, VLMAX(e32m4) = %zu\n", n, __riscv_vsetvlmax_e32m4());
  return 0;
}
