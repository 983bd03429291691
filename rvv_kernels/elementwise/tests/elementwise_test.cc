// The elementwise kernels against FP64 statements of their contracts, for
// every kernel set this build has and the CPU runs; under QEMU at four VLENs
// with tail and mask lanes set to all ones (rvv_cc_test).
//
// Tolerances follow the contracts' BF16 roundings: rms_norm and silu_mul round
// twice (2 BF16 ulps of the exact value); rope adds two rounded products
// (1 ulp of each product and 1 of the sum, absolute); argmax is exact.
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/kernel_testing.h"
#include "rvv_kernels/base/cpu_features.h"
#include "rvv_kernels/elementwise/elementwise.h"

namespace rvascend {
namespace {

using testing::Bf16Ulp;

double F(uint16_t h) { return Bf16ToFloat(h); }

std::vector<uint16_t> Random(std::mt19937& rng, size_t n, float scale, float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = FloatToBf16(dist(rng));
  return v;
}

void TestRmsNorm(const ElementwiseKernels& k, std::mt19937& rng) {
  for (size_t d : {1, 7, 64, 100, 576, 1024, 3000}) {
    for (bool with_residual : {false, true}) {
      const size_t rows = 3;
      auto x = Random(rng, rows * d, 2.0f), r = Random(rng, rows * d, 1.0f), w = Random(rng, d, 0.5f, 1.0f);
      std::vector<uint16_t> out(rows * d), res(rows * d, 0);
      RmsNormRows(k, rows, d, x.data(), d, with_residual ? r.data() : nullptr, d, w.data(), 1e-6f, out.data(),
                  res.data(), 2);
      int bad = 0;
      for (size_t row = 0; row < rows; ++row) {
        std::vector<double> h(d);
        double sq = 0;
        for (size_t i = 0; i < d; ++i) {
          h[i] = with_residual ? F(FloatToBf16(static_cast<float>(F(x[row * d + i]) + F(r[row * d + i]))))
                               : F(x[row * d + i]);
          if (with_residual && res[row * d + i] != FloatToBf16(static_cast<float>(h[i]))) ++bad;
          sq += h[i] * h[i];
        }
        const double rinv = 1.0 / std::sqrt(sq / d + 1e-6);
        for (size_t i = 0; i < d; ++i) {
          const double want = F(w[i]) * h[i] * rinv;
          if (!(std::fabs(F(out[row * d + i]) - want) <= 2 * Bf16Ulp(want) + 1e-6)) ++bad;
        }
      }
      EXPECT(bad == 0, "%s rms_norm d=%zu residual=%d: %d bad", k.name, d, with_residual, bad);
    }
  }
}

void TestSiluMul(const ElementwiseKernels& k, std::mt19937& rng) {
  for (size_t d : {1, 5, 64, 3072}) {
    const size_t rows = 2;
    auto x = Random(rng, rows * 2 * d, 4.0f);
    x[0] = FloatToBf16(-100.0f);  // exp overflow side
    x[1 % (2 * d)] = FloatToBf16(90.0f);
    std::vector<uint16_t> out(rows * d);
    SiluMulRows(k, rows, d, x.data(), 2 * d, out.data(), 2);
    int bad = 0;
    for (size_t row = 0; row < rows; ++row) {
      for (size_t i = 0; i < d; ++i) {
        const double g = F(x[row * 2 * d + i]), u = F(x[row * 2 * d + d + i]);
        const double want = g / (1 + std::exp(-g)) * u;
        if (!(std::fabs(F(out[row * d + i]) - want) <= 2 * Bf16Ulp(want) + 1e-30)) ++bad;
      }
    }
    EXPECT(bad == 0, "%s silu_mul d=%zu: %d bad", k.name, d, bad);
  }
}

void TestRope(const ElementwiseKernels& k, std::mt19937& rng) {
  for (size_t d : {2, 64, 128, 130}) {
    for (bool norm : {false, true}) {
      const size_t tokens = 3, heads = 5, stride = heads * d + 17;  // rows inside a wider qkv row
      auto x = Random(rng, tokens * stride, 1.5f), w = Random(rng, d, 0.2f, 1.0f);
      std::vector<uint16_t> cs(tokens * d), sn(tokens * d), out(tokens * heads * d);
      std::uniform_real_distribution<float> angle(-3.0f, 3.0f);
      for (size_t i = 0; i < tokens * d; ++i) {
        const float a = angle(rng);
        cs[i] = FloatToBf16(std::cos(a));
        sn[i] = FloatToBf16(std::sin(a));
      }
      RopeRows(k, tokens, heads, d, x.data(), stride, norm ? w.data() : nullptr, 1e-6f, cs.data(), sn.data(),
               out.data(), 2);
      int bad = 0;
      for (size_t t = 0; t < tokens; ++t) {
        for (size_t h = 0; h < heads; ++h) {
          std::vector<double> v(d);
          double sq = 0;
          for (size_t i = 0; i < d; ++i) sq += F(x[t * stride + h * d + i]) * F(x[t * stride + h * d + i]);
          const double rinv = 1.0 / std::sqrt(sq / d + 1e-6);
          for (size_t i = 0; i < d; ++i) {
            const double xi = F(x[t * stride + h * d + i]);
            v[i] = norm ? F(FloatToBf16(static_cast<float>(F(w[i]) * F(FloatToBf16(static_cast<float>(xi * rinv))))))
                        : xi;
          }
          for (size_t i = 0; i < d; ++i) {
            const double rot = i < d / 2 ? -v[i + d / 2] : v[i - d / 2];
            const double a = v[i] * F(cs[t * d + i]), b = rot * F(sn[t * d + i]);
            const double want = a + b;
            const double tol = Bf16Ulp(a) + Bf16Ulp(b) + Bf16Ulp(want) + (norm ? 2 * Bf16Ulp(v[i]) + 2 * Bf16Ulp(rot) : 0.0);
            if (!(std::fabs(F(out[(t * heads + h) * d + i]) - want) <= tol)) ++bad;
          }
        }
      }
      EXPECT(bad == 0, "%s rope d=%zu norm=%d: %d bad", k.name, d, norm, bad);
    }
  }
}

void TestArgmax(const ElementwiseKernels& k, std::mt19937& rng) {
  for (size_t n : {1, 3, 100, 49152, 151936}) {
    auto x = Random(rng, 2 * n, 3.0f);
    const size_t hot = n / 3;
    x[hot] = FloatToBf16(50.0f);
    x[n + n - 1] = FloatToBf16(60.0f);
    if (n > 10) x[n + 2] = FloatToBf16(60.0f);  // a tie: the first index wins
    std::vector<int64_t> out(2);
    ArgmaxRows(k, 2, n, x.data(), n, out.data(), 2);
    EXPECT(out[0] == static_cast<int64_t>(hot), "%s argmax n=%zu: %lld", k.name, n, static_cast<long long>(out[0]));
    const int64_t want = n > 10 ? 2 : static_cast<int64_t>(n - 1);
    EXPECT(out[1] == want, "%s argmax tie n=%zu: %lld", k.name, n, static_cast<long long>(out[1]));
    x[n - 1] = 0x7fc0;  // NaN
    ArgmaxRows(k, 1, n, x.data(), n, out.data(), 1);
    EXPECT(out[0] == -1, "%s argmax NaN n=%zu: %lld", k.name, n, static_cast<long long>(out[0]));
  }
}

void TestCopy(const ElementwiseKernels& k, std::mt19937& rng) {
  // Short, odd, unaligned at both ends, and several threads' chunks (256 KiB each) with a tail.
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{255}, size_t{4099}, size_t{(600 << 10) + 5}}) {
    for (size_t offset : {0, 1, 3}) {
      std::vector<uint8_t> src(bytes + 8), dst(bytes + 8, 0xa5);
      for (auto& b : src) b = static_cast<uint8_t>(rng());
      CopyBytes(k, dst.data() + offset, src.data() + 3 - offset, bytes, 2);
      size_t bad = 0;
      for (size_t i = 0; i < bytes; ++i) bad += dst[offset + i] != src[3 - offset + i];
      for (size_t i = 0; i < offset; ++i) bad += dst[i] != 0xa5;
      for (size_t i = offset + bytes; i < dst.size(); ++i) bad += dst[i] != 0xa5;
      EXPECT(bad == 0, "%s copy of %zu bytes at offset %zu: %zu bytes wrong", k.name, bytes, offset, bad);
    }
  }
  std::vector<uint8_t> buf(64);
  bool threw = false;
  try {
    CopyBytes(k, buf.data() + 8, buf.data(), 16, 1);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  EXPECT(threw, "%s: an overlapping copy is refused", k.name);
}

}  // namespace
}  // namespace rvascend

int main() {
  using namespace rvascend;
  std::printf("cpu: %s\n", GetCpuFeatures().Describe().c_str());
  std::mt19937 rng(7);
  for (const std::string& name : AvailableElementwiseKernels()) {
    const ElementwiseKernels& k = ChooseElementwiseKernels(name);
    std::printf("kernels %s\n", k.name);
    TestRmsNorm(k, rng);
    TestSiluMul(k, rng);
    TestRope(k, rng);
    TestArgmax(k, rng);
    TestCopy(k, rng);
  }
  bool threw = false;
  try {
    ChooseElementwiseKernels("nonexistent");
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  EXPECT(threw, "an unknown kernel set is refused");
  return testing::Summary();
}
