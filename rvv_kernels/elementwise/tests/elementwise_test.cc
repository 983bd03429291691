// The elementwise kernels against FP64 statements of their contracts, for
// every kernel set this build has and the CPU runs; under QEMU at four VLENs
// with tail and mask lanes set to all ones (rvv_cc_test).
//
// Tolerances follow the contracts' BF16 roundings: rms_norm and silu_mul round
// twice (2 BF16 ulps of the exact value); rope adds two rounded products
// (1 ulp of each product and 1 of the sum, absolute); argmax is exact.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
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
    for (int mode = 0; mode < 4; ++mode) {
      const bool with_residual = mode & 1, zero_centred = mode & 2;
      const size_t rows = 3;
      // Zero-centred weights sit near 0 (the scale is 1 + w); plain ones near 1.
      auto x = Random(rng, rows * d, 2.0f), r = Random(rng, rows * d, 1.0f),
           w = Random(rng, d, 0.5f, zero_centred ? 0.0f : 1.0f);
      std::vector<uint16_t> out(rows * d), res(rows * d, 0);
      RmsNormRows(k, rows, d, x.data(), d, with_residual ? r.data() : nullptr, d, w.data(), 1e-6f, zero_centred,
                  out.data(), res.data(), 2);
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
          const double want = (zero_centred ? 1.0 + F(w[i]) : F(w[i])) * h[i] * rinv;
          // Zero-centred rounds once: half an ulp of the exact value plus FP32 slack (a second
          // rounding, or 1 + w taken in BF16, exceeds it); the plain norm rounds twice.
          const double tolerance =
              zero_centred ? 0.5 * Bf16Ulp(want) + 1e-5 * std::fabs(want) + 1e-30 : 2 * Bf16Ulp(want) + 1e-6;
          if (!(std::fabs(F(out[row * d + i]) - want) <= tolerance)) ++bad;
        }
      }
      EXPECT(bad == 0, "%s rms_norm d=%zu residual=%d zero_centred=%d: %d bad", k.name, d, with_residual,
             zero_centred, bad);
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

// Per head, heads 2d apart in the gate rows (Qwen3.5's query beside its gate), and the
// exp overflow sides; sigmoid is rounded to BF16 before the product: 2 ulps.
void TestSigmoidMul(const ElementwiseKernels& k, std::mt19937& rng) {
  for (size_t d : {1, 7, 64, 256}) {
    const size_t tokens = 3, heads = 4, gate_stride = heads * 2 * d + 5;
    auto x = Random(rng, tokens * heads * d, 2.0f), gate = Random(rng, tokens * gate_stride, 3.0f);
    gate[0] = FloatToBf16(-100.0f);
    gate[gate_stride] = FloatToBf16(90.0f);
    std::vector<uint16_t> out(tokens * heads * d);
    SigmoidMulRows(k, tokens, heads, d, x.data(), heads * d, gate.data(), gate_stride, 2 * d, out.data(), 2);
    int bad = 0;
    for (size_t t = 0; t < tokens; ++t) {
      for (size_t h = 0; h < heads; ++h) {
        for (size_t i = 0; i < d; ++i) {
          const double g = F(gate[t * gate_stride + h * 2 * d + i]), xi = F(x[(t * heads + h) * d + i]);
          const double want = xi / (1.0 + std::exp(-g));
          if (!(std::fabs(F(out[(t * heads + h) * d + i]) - want) <= 2 * Bf16Ulp(want) + 1e-30)) ++bad;
        }
      }
    }
    EXPECT(bad == 0, "%s sigmoid_mul d=%zu: %d bad", k.name, d, bad);
  }
}

// Every head layout the models use: whole-head RoPE (Llama, Qwen3), partial RoPE
// on a quarter of the head with zero-centred q/k norms (Qwen3.5), heads 2d apart
// (Qwen3.5's query beside its gate), and an odd head_dim past an even rotary_dim.
void TestRope(const ElementwiseKernels& k, std::mt19937& rng) {
  struct Case {
    size_t d, rotary_dim, stride_heads;  // heads sit stride_heads * d apart
    bool zero_centred;
  };
  const Case cases[] = {{2, 2, 1, false}, {64, 64, 1, false}, {128, 128, 1, false}, {130, 130, 1, false},
                        {256, 64, 2, true}, {64, 16, 1, true},  {130, 130, 2, true},   {67, 34, 1, false}};
  for (const Case& c : cases) {
    for (bool norm : {false, true}) {
      const size_t d = c.d, r = c.rotary_dim, tokens = 3, heads = 5, hs = c.stride_heads * d;
      const size_t stride = heads * hs + 17;  // rows inside a wider qkv row
      auto x = Random(rng, tokens * stride, 1.5f), w = Random(rng, d, 0.2f, c.zero_centred ? 0.0f : 1.0f);
      std::vector<uint16_t> cs(tokens * r), sn(tokens * r), out(tokens * heads * d);
      std::uniform_real_distribution<float> angle(-3.0f, 3.0f);
      for (size_t i = 0; i < tokens * r; ++i) {
        const float a = angle(rng);
        cs[i] = FloatToBf16(std::cos(a));
        sn[i] = FloatToBf16(std::sin(a));
      }
      RopeHeads spec;
      spec.heads = heads;
      spec.d = d;
      spec.stride = hs;
      spec.rotary_dim = r;
      spec.norm_weight = norm ? w.data() : nullptr;
      spec.eps = 1e-6f;
      spec.zero_centred = c.zero_centred;
      RopeRows(k, tokens, spec, x.data(), stride, cs.data(), sn.data(), out.data(), 2);
      int bad = 0;
      for (size_t t = 0; t < tokens; ++t) {
        for (size_t h = 0; h < heads; ++h) {
          const uint16_t* row = x.data() + t * stride + h * hs;
          std::vector<double> v(d), exact(d);
          double sq = 0;
          for (size_t i = 0; i < d; ++i) sq += F(row[i]) * F(row[i]);
          const double rinv = 1.0 / std::sqrt(sq / d + 1e-6);
          for (size_t i = 0; i < d; ++i) {
            const double xi = F(row[i]);
            exact[i] = !norm ? xi : c.zero_centred ? xi * rinv * (1.0 + F(w[i])) : F(w[i]) * xi * rinv;
            // The kernel's normed head is BF16: the reference rounds it the same way.
            v[i] = !norm ? xi
                         : c.zero_centred ? F(FloatToBf16(static_cast<float>(exact[i])))
                                          : F(FloatToBf16(static_cast<float>(F(w[i]) * F(FloatToBf16(static_cast<float>(xi * rinv))))));
          }
          const uint16_t* got = out.data() + (t * heads + h) * d;
          for (size_t i = 0; i < r; ++i) {
            const double rot = i < r / 2 ? -v[i + r / 2] : v[i - r / 2];
            const double a = v[i] * F(cs[t * r + i]), b = rot * F(sn[t * r + i]);
            const double want = a + b;
            const double tol = Bf16Ulp(a) + Bf16Ulp(b) + Bf16Ulp(want) + (norm ? 2 * Bf16Ulp(v[i]) + 2 * Bf16Ulp(rot) : 0.0);
            if (!(std::fabs(F(got[i]) - want) <= tol)) ++bad;
          }
          for (size_t i = r; i < d; ++i) {  // passed through: the (normed) value itself
            const double tol = !norm ? 0.0 : c.zero_centred ? 0.5 * Bf16Ulp(exact[i]) + 1e-5 * std::fabs(exact[i]) + 1e-30
                                                             : 2 * Bf16Ulp(exact[i]) + 1e-6;
            if (!(std::fabs(F(got[i]) - exact[i]) <= tol)) ++bad;
          }
        }
      }
      EXPECT(bad == 0, "%s rope d=%zu rotary_dim=%zu head stride %zu zero_centred=%d norm=%d: %d bad", k.name, d, r,
             hs, c.zero_centred, norm, bad);
    }
  }
  RopeHeads bad;
  bad.heads = 2;
  bad.d = 64;
  bad.stride = 64;
  std::vector<uint16_t> buf(256);
  for (auto [rotary_dim, stride] : {std::pair<size_t, size_t>{0, 64}, {66, 64}, {31, 64}, {64, 32}}) {
    bad.rotary_dim = rotary_dim;
    bad.stride = stride;
    bool threw = false;
    try {
      RopeRows(k, 1, bad, buf.data(), 128, buf.data(), buf.data(), buf.data(), 1);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    EXPECT(threw, "%s rope: rotary_dim %zu, head stride %zu refused", k.name, rotary_dim, stride);
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

// A vector set against its portable twin on the same inputs: within 2 BF16
// ulps everywhere (the sums run in another order, exp is a polynomial, and
// either may move a value across one of the two roundings) and bit-identical
// for at least 99 % of the values; argmax identical.
// Batch invariance: every row of an M-row call, M = 1 ... 17, bit for bit the row alone,
// on one thread and on three (RMSNorm with a residual, SiLU*mul, sigmoid*mul, argmax).
void TestRowsAreTheirRowsAlone(const ElementwiseKernels& k, std::mt19937& rng) {
  const size_t rows = 17, d = 576, stride = 2 * d;
  const auto x = Random(rng, rows * stride, 2.0f), res = Random(rng, rows * stride, 1.0f),
             w = Random(rng, d, 0.5f, 1.0f);
  // out (rows x d) and residual_out of the first m rows; argmax of the rows' first 2d values.
  auto run = [&](size_t row0, size_t m, size_t threads) {
    std::vector<uint16_t> norm(m * d), sum(m * d), silu(m * d), gated(m * d);
    std::vector<int64_t> top(m);
    const uint16_t* xr = x.data() + row0 * stride;
    const uint16_t* rr = res.data() + row0 * stride;
    RmsNormRows(k, m, d, xr, stride, rr, stride, w.data(), 1e-6f, false, norm.data(), sum.data(), threads);
    SiluMulRows(k, m, d, xr, stride, silu.data(), threads);
    SigmoidMulRows(k, m, 1, d, xr, stride, rr, stride, d, gated.data(), threads);
    ArgmaxRows(k, m, stride, xr, stride, top.data(), threads);
    return std::make_tuple(norm, sum, silu, gated, top);
  };
  std::vector<decltype(run(0, 1, 1))> alone;
  for (size_t r = 0; r < rows; ++r) alone.push_back(run(r, 1, 1));
  size_t differ = 0;
  for (size_t m = 1; m <= rows; ++m) {
    for (size_t threads : {1, 3}) {
      const auto [norm, sum, silu, gated, top] = run(0, m, threads);
      for (size_t r = 0; r < m; ++r) {
        const auto& [n1, s1, si1, g1, t1] = alone[r];
        differ += !std::equal(n1.begin(), n1.end(), norm.begin() + r * d) ||
                  !std::equal(s1.begin(), s1.end(), sum.begin() + r * d) ||
                  !std::equal(si1.begin(), si1.end(), silu.begin() + r * d) ||
                  !std::equal(g1.begin(), g1.end(), gated.begin() + r * d) || t1[0] != top[r];
      }
    }
  }
  EXPECT(differ == 0, "%s: %zu rows of M = 1..17 calls differ from the row alone", k.name, differ);
}

void TestAgainstPortable(const ElementwiseKernels& k, std::mt19937& rng) {
  const ElementwiseKernels& p = ChooseElementwiseKernels("portable");
  size_t values = 0, differ = 0, far = 0;
  auto compare = [&](const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      ++values;
      if (a[i] == b[i]) continue;
      ++differ;
      const double x = F(a[i]), y = F(b[i]);
      if (!(std::fabs(x - y) <= 2 * Bf16Ulp(std::max(std::fabs(x), std::fabs(y))))) ++far;
    }
  };
  for (size_t d : {5, 64, 576, 1000, 2048}) {
    const size_t rows = 4;
    auto x = Random(rng, rows * 2 * d, 2.0f), r = Random(rng, rows * 2 * d, 1.0f), w = Random(rng, d, 0.5f, 1.0f);
    std::vector<uint16_t> a(rows * d), b(rows * d), ra(rows * d), rb(rows * d);
    for (bool zero_centred : {false, true}) {
      RmsNormRows(k, rows, d, x.data(), 2 * d, r.data(), 2 * d, w.data(), 1e-6f, zero_centred, a.data(), ra.data(), 1);
      RmsNormRows(p, rows, d, x.data(), 2 * d, r.data(), 2 * d, w.data(), 1e-6f, zero_centred, b.data(), rb.data(), 1);
      compare(a, b);
      compare(ra, rb);
    }
    SiluMulRows(k, rows, d, x.data(), 2 * d, a.data(), 1);
    SiluMulRows(p, rows, d, x.data(), 2 * d, b.data(), 1);
    compare(a, b);
    SigmoidMulRows(k, rows, 1, d, x.data(), 2 * d, r.data(), 2 * d, d, a.data(), 1);
    SigmoidMulRows(p, rows, 1, d, x.data(), 2 * d, r.data(), 2 * d, d, b.data(), 1);
    compare(a, b);
    std::vector<int64_t> ia(rows), ib(rows);
    ArgmaxRows(k, rows, 2 * d, x.data(), 2 * d, ia.data(), 1);
    ArgmaxRows(p, rows, 2 * d, x.data(), 2 * d, ib.data(), 1);
    EXPECT(ia == ib, "%s argmax n=%zu differs from portable", k.name, 2 * d);
  }
  for (auto [d, r, zero_centred] : {std::tuple<size_t, size_t, bool>{64, 64, false}, {128, 128, false},
                                     {130, 130, false}, {256, 64, true}}) {
    const size_t heads = 6;
    auto x = Random(rng, heads * 2 * d, 1.5f), w = Random(rng, d, 0.2f, zero_centred ? 0.0f : 1.0f),
         cs = Random(rng, r, 0.7f), sn = Random(rng, r, 0.7f);
    RopeHeads spec;
    spec.heads = heads;
    spec.d = d;
    spec.stride = zero_centred ? 2 * d : d;
    spec.rotary_dim = r;
    spec.norm_weight = w.data();
    spec.eps = 1e-6f;
    spec.zero_centred = zero_centred;
    std::vector<uint16_t> a(heads * d), b(heads * d);
    RopeRows(k, 1, spec, x.data(), heads * 2 * d, cs.data(), sn.data(), a.data(), 1);
    RopeRows(p, 1, spec, x.data(), heads * 2 * d, cs.data(), sn.data(), b.data(), 1);
    compare(a, b);
  }
  EXPECT(far == 0, "%s against portable: %zu of %zu values more than 2 BF16 ulps apart", k.name, far, values);
  EXPECT(differ * 100 <= values, "%s against portable: %zu of %zu values not bit-identical", k.name, differ, values);
  std::printf("%s against portable: %zu of %zu values differ, none by more than 2 ulps\n", k.name, differ, values);
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
    TestSigmoidMul(k, rng);
    TestArgmax(k, rng);
    TestRowsAreTheirRowsAlone(k, rng);
    if (std::string(k.name) != "portable") TestAgainstPortable(k, rng);
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
