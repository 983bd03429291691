// The batch-invariant FP32 Linear, every set this build has and the CPU runs: each
// output against an FP64 reference (within the FP32 re-association bound
// K * 2^-23 * sum|a_i * w_i|, plus the bias's rounding), and every row of an M-row call,
// M = 1 ... 17, bit for bit the same row computed alone, on one thread and on three.
// Runs on the host and under QEMU at every VLEN (rvv_cc_test).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "rvv_kernels/base/kernel_testing.h"
#include "rvv_kernels/linear/f32_linear.h"

namespace rvascend {
namespace {

std::vector<float> Random(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

F32LinearArgs Args(size_t m, size_t n, size_t k, const float* x, const std::vector<float>& w,
                   const float* bias, float* out) {
  F32LinearArgs a;
  a.m = m;
  a.n = n;
  a.k = k;
  a.input = x;
  a.input_stride = k + 3;  // strided rows, as a slice of a wider activation
  a.weight = w.data();
  a.weight_stride = k;
  a.bias = bias;
  a.output = out;
  a.output_stride = n;
  return a;
}

void TestSet(const std::string& set, size_t n, size_t k, bool with_bias) {
  std::mt19937 rng(static_cast<unsigned>(n * 131 + k));
  const size_t max_m = 17, stride = k + 3;
  const auto x = Random(rng, max_m * stride);
  const auto w = Random(rng, n * k);
  const auto bias = Random(rng, n);
  const float* b = with_bias ? bias.data() : nullptr;

  // Each row alone, and its FP64 check.
  std::vector<float> alone(max_m * n);
  int far = 0;
  for (size_t r = 0; r < max_m; ++r) {
    F32Linear(Args(1, n, k, x.data() + r * stride, w, b, alone.data() + r * n), 1, set);
    for (size_t j = 0; j < n; ++j) {
      double exact = b ? b[j] : 0.0, magnitude = b ? std::fabs(b[j]) : 0.0;
      for (size_t i = 0; i < k; ++i) {
        exact += static_cast<double>(x[r * stride + i]) * w[j * k + i];
        magnitude += std::fabs(static_cast<double>(x[r * stride + i]) * w[j * k + i]);
      }
      const double bound = (k + 2) * std::ldexp(1.0, -23) * magnitude + 1e-30;
      if (std::fabs(alone[r * n + j] - exact) > bound) ++far;
    }
  }
  EXPECT(far == 0, "%s n=%zu k=%zu bias=%d: %d outputs beyond the FP32 bound of the FP64 result", set.c_str(), n, k,
         with_bias, far);

  for (size_t threads : {1, 3}) {
    int differ = 0;
    for (size_t m = 1; m <= max_m; ++m) {
      std::vector<float> out(m * n, NAN);
      F32Linear(Args(m, n, k, x.data(), w, b, out.data()), threads, set);
      if (std::memcmp(out.data(), alone.data(), m * n * sizeof(float)) != 0) ++differ;
    }
    EXPECT(differ == 0, "%s n=%zu k=%zu bias=%d threads=%zu: %d of 17 row counts changed a row's bits", set.c_str(),
           n, k, with_bias, threads, differ);
  }
}

void TestStrideRefused() {
  std::vector<float> x(8), w(8), out(8);
  F32LinearArgs a = Args(2, 2, 4, x.data(), w, nullptr, out.data());
  a.input_stride = 3;
  bool threw = false;
  try {
    F32Linear(a, 1);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  EXPECT(threw, "an input stride shorter than K is refused");
}

}  // namespace
}  // namespace rvascend

int main() {
  using namespace rvascend;
  const auto sets = AvailableF32LinearKernels();
  EXPECT(!sets.empty() && sets.back() == "portable", "the portable set is always there, last");
  for (const std::string& set : sets) {
    std::printf("set %s\n", set.c_str());
    TestSet(set, 70, 67, false);     // tails in K (not a lane multiple) and in N (not a tile multiple)
    TestSet(set, 130, 256, true);    // crosses a task's 64 columns
    TestSet(set, 1100, 300, false);  // above the parallel threshold at every M
  }
  TestStrideRefused();
  return testing::Summary();
}
