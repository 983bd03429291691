// What the kernel tests share: a counting EXPECT, the BF16 ulp of a value, and
// the closing 'N passed, N failed' line the test runners read.
#ifndef RVV_KERNELS_BASE_KERNEL_TESTING_H_
#define RVV_KERNELS_BASE_KERNEL_TESTING_H_

#include <cmath>
#include <cstdio>

namespace rvascend {
namespace testing {

inline int& Passed() {
  static int n = 0;
  return n;
}

inline int& Failed() {
  static int n = 0;
  return n;
}

// The spacing of BF16 values around x (2^-133 below the normal range).
inline double Bf16Ulp(double x) {
  const double ax = std::fabs(x);
  if (ax < 1e-38) return std::ldexp(1.0, -133);
  int e;
  std::frexp(ax, &e);  // ax = f * 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

// Prints the summary line; the process exit code.
inline int Summary() {
  std::printf("%d passed, %d failed\n", Passed(), Failed());
  return Failed() == 0 ? 0 : 1;
}

}  // namespace testing
}  // namespace rvascend

#define EXPECT(cond, ...)                                  \
  do {                                                     \
    if (cond) {                                            \
      ++::rvascend::testing::Passed();                     \
    } else {                                               \
      ++::rvascend::testing::Failed();                     \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__);     \
      std::printf(__VA_ARGS__);                            \
      std::printf("\n");                                   \
    }                                                      \
  } while (0)

#endif  // RVV_KERNELS_BASE_KERNEL_TESTING_H_
