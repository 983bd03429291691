// The pieces of the DeltaNet decode step (deltanet_pieces.h) against FP64
// statements of their contracts, for FP32 and BF16 elements and every piece
// set this build has and the CPU runs (portable; RVV on riscv64, under QEMU at
// four VLENs; AVX2 and AVX-512 on x86), and each vector set against the portable one.
//
// Tolerances: a value the contract rounds to BF16 once may be one BF16 ulp
// from the FP64 value's rounding (the FP32 work decides near ties); the gated
// norm is compared with its three roundings taken from FP64 values (one ulp,
// and few values off at all). FP32 outputs:
// 1e-5 relative to the row's largest magnitude (sums in another order, and
// rvv::Exp's 2 ulps). The conv's state must slide exactly, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "rvv_kernels/recurrent_gated_delta_rule/deltanet_pieces.h"
#include "rvv_kernels/recurrent_gated_delta_rule/elem_values.h"
#include "rvv_kernels/base/kernel_testing.h"

namespace rgdr {
namespace {

using rvascend::testing::Bf16Ulp;

double Silu(double x) { return x / (1.0 + std::exp(-x)); }

template <typename T>
std::vector<T> Random(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = FromFloat<T>(dist(rng));
  return v;
}

// |got - want| within the tolerance of one (BF16: `ulps` ulps of want; FP32: 1e-5 of `scale`).
template <typename T>
bool Close(double got, double want, double ulps, double scale) {
  if constexpr (std::is_same_v<T, float>) return std::fabs(got - want) <= 1e-5 * scale + 1e-30;
  return std::fabs(got - want) <= ulps * Bf16Ulp(want) + 1e-30;
}

template <typename T>
void TestConvSilu(const DeltaNetPieces<T>& p, std::mt19937& rng) {
  // In place (the window read and written in one slot), and from one slot to another
  // (double-buffered states: the read window is left as it was).
  for (bool in_place : {true, false}) for (size_t kept : {1, 3, 4}) {
    for (size_t n : {1, 7, 33, 100, 2048 + 5}) {
      auto x = Random<T>(rng, n, 1.0f), in = Random<T>(rng, n * kept, 1.0f),
           weight = Random<T>(rng, n * (kept + 1), 0.7f);
      x[0] = FromFloat<T>(-30.0f);  // SiLU's far negative side: exp(-x) is 1e13
      const std::vector<T> before = in;
      std::vector<T> other = Random<T>(rng, n * kept, 1.0f);
      std::vector<T>& state = in_place ? in : other;
      std::vector<float> y(n);
      p.conv_silu(x.data(), in.data(), state.data(), weight.data(), n, kept, y.data());
      int bad = 0, slid = in_place || in == before ? 0 : 1;
      double scale = 0;
      std::vector<double> want(n);
      for (size_t c = 0; c < n; ++c) {
        double sum = ToFloat(x[c]) * static_cast<double>(ToFloat(weight[c * (kept + 1) + kept]));
        for (size_t j = 0; j < kept; ++j) {
          sum += ToFloat(before[c * kept + j]) * static_cast<double>(ToFloat(weight[c * (kept + 1) + j]));
        }
        want[c] = Silu(sum);
        scale = std::max(scale, std::fabs(want[c]));
        for (size_t j = 0; j < kept; ++j) {
          const T expect = j + 1 < kept ? before[c * kept + j + 1] : x[c];
          if (std::memcmp(&state[c * kept + j], &expect, sizeof(T)) != 0) ++slid;
        }
      }
      for (size_t c = 0; c < n; ++c) {
        if (!Close<T>(y[c], RoundTo<T>(static_cast<float>(want[c])), 1.0, scale)) ++bad;
        if (ToFloat(FromFloat<T>(y[c])) != y[c]) ++bad;  // y holds values of T
      }
      EXPECT(bad == 0 && slid == 0, "%s conv_silu %zu bytes n=%zu kept=%zu%s: %d bad values, %d bad state slots",
             p.name, sizeof(T), n, kept, in_place ? "" : " (to another slot)", bad, slid);
    }
  }
}

template <typename T>
void TestL2Norm(const DeltaNetPieces<T>& p, std::mt19937& rng) {
  for (size_t n : {1, 5, 64, 128, 300}) {
    std::vector<float> x = Random<float>(rng, n, 2.0f);
    const std::vector<float> before = x;
    p.l2norm(x.data(), n, 0.125f);
    double sq = 0;
    for (float v : before) sq += static_cast<double>(v) * v;
    int bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const double want = before[i] * 0.125 / std::sqrt(sq + 1e-6);
      if (!(std::fabs(x[i] - want) <= 2e-6 * 0.125 + 1e-30)) ++bad;
    }
    EXPECT(bad == 0, "%s l2norm n=%zu: %d bad", p.name, n, bad);
  }
}

template <typename T>
void TestGatedNorm(const DeltaNetPieces<T>& p, std::mt19937& rng) {
  for (size_t n : {1, 7, 64, 128, 130}) {
    std::vector<float> o = Random<float>(rng, n, 0.5f);
    const std::vector<float> before = o;
    auto z = Random<T>(rng, n, 2.0f), w = Random<T>(rng, n, 0.3f);
    std::vector<T> out(n);
    p.gated_norm(o.data(), z.data(), w.data(), n, 1e-6f, out.data());
    double sq = 0, scale = 0;
    for (float v : before) sq += static_cast<double>(RoundTo<T>(v)) * RoundTo<T>(v);
    const double rms = 1.0 / std::sqrt(sq / n + 1e-6);
    // The contract's roundings, taken from FP64 values; an FP32 sum of squares (in any
    // order) is a few FP32 ulps from FP64's, which may move normed across a rounding
    // boundary and the output by one more ulp: accepted when the statement with rms
    // moved by 4 FP32 ulps gives it.
    auto round = [](double x) { return static_cast<double>(RoundTo<T>(static_cast<float>(x))); };
    auto statement = [&](size_t i, double r) {
      return round(round(ToFloat(w[i]) * round(RoundTo<T>(before[i]) * r)) * Silu(ToFloat(z[i])));
    };
    std::vector<double> want(n);
    for (size_t i = 0; i < n; ++i) {
      want[i] = statement(i, rms);
      scale = std::max(scale, std::fabs(want[i]));
    }
    int bad = 0, differ = 0;
    for (size_t i = 0; i < n; ++i) {
      const double got = ToFloat(out[i]);
      bool close = false;
      for (double r : {rms, rms * (1 - 4.8e-7), rms * (1 + 4.8e-7)}) close |= Close<T>(got, statement(i, r), 1.0, scale);
      bad += !close;
      differ += got != want[i];
      if (o[i] != RoundTo<T>(before[i])) ++bad;  // the delta rule's output, rounded in place
    }
    // Three roundings: a tie decided by the FP32 work moves a value by one ulp, rarely.
    const bool rare = std::is_same_v<T, float> || differ <= static_cast<int>(n / 50 + 1);
    EXPECT(bad == 0 && rare, "%s gated_norm %zu bytes n=%zu: %d bad, %d differ from the rounded statement", p.name,
           sizeof(T), n, bad, differ);
  }
}

// A vector set against the portable one on a Qwen3.5-0.8B-sized token.
template <typename T>
void TestAgainstPortable(const DeltaNetPieces<T>& k, std::mt19937& rng) {
  const DeltaNetPieces<T>& p = PortableDeltaNetPieces<T>();
  const size_t n = 6144, kept = 3;
  auto x = Random<T>(rng, n, 1.0f), state = Random<T>(rng, n * kept, 1.0f), weight = Random<T>(rng, n * 4, 0.7f);
  std::vector<T> s1 = state, s2 = state;
  std::vector<float> y1(n), y2(n);
  k.conv_silu(x.data(), s1.data(), s1.data(), weight.data(), n, kept, y1.data());
  p.conv_silu(x.data(), s2.data(), s2.data(), weight.data(), n, kept, y2.data());
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += y1[i] != y2[i];
  EXPECT(s1 == s2, "%s conv_silu: the state differs from portable", k.name);
  // BF16: the same roundings, so nearly every value is identical; FP32 differs in the last bits.
  if constexpr (!std::is_same_v<T, float>) {
    EXPECT(differ <= n / 100, "%s conv_silu: %zu of %zu values differ from portable", k.name, differ, n);
  }
}

template <typename T>
void TestAll(std::mt19937& rng) {
  const std::vector<const DeltaNetPieces<T>*> sets = AvailableDeltaNetPieces<T>();
  EXPECT(&ChooseDeltaNetPieces<T>() == sets.front(), "the chosen set is not the first available one");
  EXPECT(sets.back() == &PortableDeltaNetPieces<T>(), "the portable set is not the last available one");
  for (const DeltaNetPieces<T>* p : sets) {
    std::printf("pieces %s, %zu-byte elements\n", p->name, sizeof(T));
    TestConvSilu(*p, rng);
    TestL2Norm(*p, rng);
    TestGatedNorm(*p, rng);
    if (p != sets.back()) TestAgainstPortable(*p, rng);
  }
}

}  // namespace
}  // namespace rgdr

int main() {
  std::mt19937 rng(11);
  rgdr::TestAll<float>(rng);
  rgdr::TestAll<uint16_t>(rng);
  return rvascend::testing::Summary();
}
