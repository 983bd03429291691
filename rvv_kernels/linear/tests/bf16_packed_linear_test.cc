// Correctness of every BF16 packed-linear kernel set this build has and the
// CPU supports, against an FP64 reference. Runs on the host and, through
// rvv_cc_test, under QEMU at VLEN 128/256/512/1024 with tail and mask
// elements set to all ones.
//
// Tolerance: a result must lie within 1 BF16 ulp of the exact dot product
// plus the FP32 re-association bound 2*K*2^-24*sum|a_i*w_i| (FP32 sums in a
// different order may differ that much before the one final rounding). With
// integer-valued data every FP32 partial sum is exact, and the result must
// then be bit-identical to the round-to-nearest-even of the exact value.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/kernel_testing.h"
#include "rvv_kernels/linear/bf16_packed_kernel_sets.h"
#include "rvv_kernels/base/cpu_features.h"
#include "rvv_kernels/linear/packed_layout.h"
#include "rvv_kernels/linear/packed_linear.h"

namespace rvascend {
namespace {

using testing::Bf16Ulp;

uint16_t Bf16(float f) { return FloatToBf16(f); }

void TestRounding() {
  // 1.0 + half an ulp (ties to even -> 1.0), + 1.5 ulp (-> 1.0 + 2 ulp).
  EXPECT(FloatToBf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80, "tie rounds to even (down)");
  EXPECT(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82, "tie rounds to even (up)");
  EXPECT(FloatToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3f81, "above tie rounds up");
  EXPECT(FloatToBf16(-2.0f) == 0xc000, "sign kept");
  EXPECT(FloatToBf16(INFINITY) == 0x7f80, "inf stays inf");
  EXPECT(FloatToBf16(3.4e38f) == 0x7f80, "max float rounds to inf");
  uint32_t nan_low_payload = 0x7f800001u;
  float nan;
  std::memcpy(&nan, &nan_low_payload, 4);
  const uint16_t h = FloatToBf16(nan);
  EXPECT((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0, "NaN with low payload stays NaN (got 0x%04x)", h);
  EXPECT(Bf16ToFloat(0x3f80) == 1.0f, "widen 1.0");
}

void TestPack() {
  const size_t n = 37, k = 5, stride = 7;
  std::vector<uint16_t> w(n * stride);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint16_t>(i + 1);
  std::vector<uint16_t> p(PackedBlocks(n) * k * kPackedBlockN, 0xffff);
  PackBf16Weight(w.data(), n, k, stride, p.data());
  bool ok = true;
  for (size_t b = 0; b < PackedBlocks(n); ++b)
    for (size_t kk = 0; kk < k; ++kk)
      for (size_t j = 0; j < kPackedBlockN; ++j) {
        const size_t row = b * kPackedBlockN + j;
        const uint16_t want = row < n ? w[row * stride + kk] : 0;
        ok &= p[(b * k + kk) * kPackedBlockN + j] == want;
      }
  EXPECT(ok, "pack: P[b,k,j] == W[b*32+j,k] with zero padding");
  EXPECT(PackedBlocks(3072) == 96 && PackedBlocks(1) == 1 && PackedBlocks(33) == 2, "block count");
  // Version 2: lanes 2t and 2t+1 of a k-row hold columns t and B/2 + t.
  for (size_t block : {64, 128, 256, 512}) {
    const size_t wn = block + 37;  // one full block and a ragged one
    std::vector<uint16_t> ww(wn * stride);
    for (size_t i = 0; i < ww.size(); ++i) ww[i] = static_cast<uint16_t>(i + 1);
    std::vector<uint16_t> wp(PackedBlocks(wn, block) * k * block, 0xffff);
    PackBf16Weight(ww.data(), wn, k, stride, wp.data(), block);
    bool wide_ok = true;
    for (size_t b = 0; b < PackedBlocks(wn, block); ++b)
      for (size_t kk = 0; kk < k; ++kk)
        for (size_t t = 0; t < block / 2; ++t)
          for (size_t hi = 0; hi < 2; ++hi) {
            const size_t row = b * block + hi * block / 2 + t;
            const uint16_t want = row < wn ? ww[row * stride + kk] : 0;
            wide_ok &= wp[(b * k + kk) * block + 2 * t + hi] == want;
          }
    EXPECT(wide_ok, "pack v2 (block %zu): P[b,k,2t+h] == W[b*B + h*B/2 + t, k] with zero padding", block);
  }
  EXPECT(IsWideBlockN(64) && IsWideBlockN(512) && !IsWideBlockN(32) && !IsWideBlockN(96), "wide blocks");
}

struct Problem {
  size_t m, n, k;
  std::vector<uint16_t> a, w, packed;
  std::vector<double> exact, bound;  // exact dot products and tolerance per output
};

Problem MakeProblem(size_t m, size_t n, size_t k, bool integer_valued, uint32_t seed) {
  Problem p{m, n, k, {}, {}, {}, {}, {}};
  // Bit-level generation: emulated floating point (QEMU's softfloat) would
  // make a 2M-element weight take seconds to draw.
  uint32_t state = seed * 2654435761u + 1;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  };
  auto value = [&]() -> uint16_t {
    const uint32_t r = next();
    if (integer_valued) return Bf16(static_cast<float>(static_cast<int>(r % 9) - 4));
    // sign | exponent 2^-8 .. 2^0 | 7 random mantissa bits
    return static_cast<uint16_t>(((r >> 31) << 15) | ((119 + (r >> 8) % 9) << 7) | (r & 0x7f));
  };
  p.a.resize(m * k);
  p.w.resize(n * k);
  for (auto& x : p.a) x = value();
  for (auto& x : p.w) x = value();
  p.packed.resize(PackedBlocks(n) * k * kPackedBlockN);
  PackBf16Weight(p.w.data(), n, k, k, p.packed.data());
  p.exact.resize(m * n);
  p.bound.resize(m * n);
  for (size_t r = 0; r < m; ++r)
    for (size_t j = 0; j < n; ++j) {
      double s = 0, sabs = 0;
      for (size_t kk = 0; kk < k; ++kk) {
        const double t = static_cast<double>(Bf16ToFloat(p.a[r * k + kk])) * Bf16ToFloat(p.w[j * k + kk]);
        s += t;
        sabs += std::fabs(t);
      }
      p.exact[r * n + j] = s;
      p.bound[r * n + j] = Bf16Ulp(s) + 2.0 * k * std::ldexp(1.0, -24) * sabs;
    }
  return p;
}

std::vector<uint16_t> Run(const Bf16PackedKernelSet& ks, const Problem& p, size_t threads,
                          size_t out_stride) {
  std::vector<uint16_t> out(p.m * out_stride, 0xdead);
  // Each set reads its own layout: version 1 is packed once per problem, version 2 here.
  const size_t block = KernelSetBlockN(ks);
  std::vector<uint16_t> wide;
  if (block != kPackedBlockN) {
    wide.resize(PackedBlocks(p.n, block) * p.k * block);
    PackBf16Weight(p.w.data(), p.n, p.k, p.k, wide.data(), block);
  }
  PackedLinearArgs args;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.input = p.a.data();
  args.input_stride = p.k;
  args.packed = block != kPackedBlockN ? wide.data() : p.packed.data();
  args.block_n = block;
  args.output = out.data();
  args.output_stride = out_stride;
  PackedBf16Linear(ks, args, threads);
  return out;
}

void Check(const Bf16PackedKernelSet& ks, const Problem& p, bool integer_valued, size_t threads) {
  const size_t stride = p.n + 3;  // padding columns must stay untouched
  const std::vector<uint16_t> out = Run(ks, p, threads, stride);
  size_t bad = 0, first = 0;
  bool guard_ok = true;
  for (size_t r = 0; r < p.m; ++r) {
    for (size_t j = 0; j < p.n; ++j) {
      const double got = Bf16ToFloat(out[r * stride + j]);
      const double exact = p.exact[r * p.n + j];
      const bool ok = integer_valued ? out[r * stride + j] == FloatToBf16(static_cast<float>(exact))
                                     : std::fabs(got - exact) <= p.bound[r * p.n + j];
      if (!ok && bad++ == 0) first = r * p.n + j;
    }
    for (size_t j = p.n; j < stride; ++j) guard_ok &= out[r * stride + j] == 0xdead;
  }
  EXPECT(bad == 0, "%s m=%zu n=%zu k=%zu threads=%zu %s: %zu wrong, first at (%zu,%zu): got %g want %.9g",
         ks.name, p.m, p.n, p.k, threads, integer_valued ? "integer" : "random", bad, first / p.n,
         first % p.n, Bf16ToFloat(out[(first / p.n) * stride + first % p.n]), p.exact[first]);
  EXPECT(guard_ok, "%s m=%zu n=%zu k=%zu: wrote past the last column", ks.name, p.m, p.n, p.k);
}

void TestShapes(const std::vector<const Bf16PackedKernelSet*>& sets) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<size_t> ms;
  for (size_t m = 1; m <= 17; ++m) ms.push_back(m);
  ms.push_back(64);
  ms.push_back(128);
  uint32_t seed = 1;
  // Every M against every small N (tails on both sides of a block, and of a
  // wide block's halves) and K.
  for (size_t n : {1, 31, 32, 33, 100, 300}) {
    for (size_t k : {1, 7, 64}) {
      for (size_t m : ms) {
        for (bool integer_valued : {false, true}) {
          const Problem p = MakeProblem(m, n, k, integer_valued, seed++);
          for (const auto* ks : sets) Check(*ks, p, integer_valued, 2);
        }
      }
    }
  }
  const auto t_small = std::chrono::steady_clock::now();
  // Model-sized N and K (Llama-3.2-1B's o_proj/qkv) at decode and small-batch M.
  // Under emulation only the VLEN-dependent sets take these (the portable and
  // scalar code is the same C++ the host test runs at full size).
  std::vector<const Bf16PackedKernelSet*> heavy;
  for (const auto* ks : sets) {
#if defined(__riscv)
    const std::string name = ks->name;
    if (name != "rvv" && name != "rvv_wide" && name != "zvfbfwma") continue;
#endif
    heavy.push_back(ks);
  }
  // The FP64 reference, scalar under emulation, is most of this test's time: every tile of
  // the GEMV and GEMM paths at N = 1024, and N = 3072 (more blocks than threads split
  // evenly) at decode only.
  for (size_t m : {1, 2, 3, 4, 5, 17}) {
    const Problem p = MakeProblem(m, 1024, 2048, false, seed++);
    for (const auto* ks : heavy) Check(*ks, p, false, 2);
  }
  {
    const Problem p = MakeProblem(1, 3072, 2048, false, seed++);
    for (const auto* ks : heavy) Check(*ks, p, false, 2);
  }
  // K = 2048 with a ragged N at bucket-boundary M.
  for (size_t m : {1, 2, 8, 9, 16, 17}) {
    const Problem p = MakeProblem(m, 100, 2048, true, seed++);
    for (const auto* ks : heavy) Check(*ks, p, true, 3);
  }
  const auto t1 = std::chrono::steady_clock::now();
  std::printf("  shapes: small %.2f s, model-sized %.2f s\n",
              std::chrono::duration<double>(t_small - t0).count(),
              std::chrono::duration<double>(t1 - t_small).count());
}

// A layout the set does not read is refused, not misread.
void TestLayoutMismatch(const std::vector<const Bf16PackedKernelSet*>& sets) {
  const Problem p = MakeProblem(1, 40, 8, false, 5);
  for (const auto* ks : sets) {
    PackedLinearArgs args;
    args.m = 1;
    args.n = p.n;
    args.k = p.k;
    args.input = p.a.data();
    args.input_stride = p.k;
    args.packed = p.packed.data();
    args.block_n = KernelSetBlockN(*ks) == kPackedBlockN ? 64 : kPackedBlockN;
    std::vector<uint16_t> out(p.n);
    args.output = out.data();
    args.output_stride = p.n;
    bool threw = false;
    try {
      PackedBf16Linear(*ks, args, 1);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    EXPECT(threw, "%s: a weight packed with block_n %zu is refused", ks->name, args.block_n);
  }
}

void TestThreadsAgree(const std::vector<const Bf16PackedKernelSet*>& sets) {
  // A GEMV large enough to be split over threads (smaller calls run on one) and
  // a small-batch GEMM.
  for (const Problem& p : {MakeProblem(1, 333, 1024, false, 98), MakeProblem(9, 333, 96, false, 99)}) {
    for (const auto* ks : sets) {
      const auto one = Run(*ks, p, 1, p.n);
      bool same = true;
      for (size_t t : {2, 3, 5}) same &= Run(*ks, p, t, p.n) == one;
      EXPECT(same, "%s m=%zu: results independent of the thread count", ks->name, p.m);
    }
  }
}

// Batch invariance (deterministic inference): every row of an M-row call, M = 1 ... 17,
// is bit for bit what that row gives alone, whichever tile (GEMV or GEMM, a full or a
// ragged row tile) computes it and however the call is split over threads.
void TestRowsAreTheirRowsAlone(const std::vector<const Bf16PackedKernelSet*>& sets) {
  const Problem all = MakeProblem(17, 333, 96, false, 1234);
  for (const auto* ks : sets) {
    std::vector<std::vector<uint16_t>> alone(all.m);
    for (size_t r = 0; r < all.m; ++r) {
      Problem row = all;
      row.m = 1;
      row.a.assign(all.a.begin() + r * all.k, all.a.begin() + (r + 1) * all.k);
      alone[r] = Run(*ks, row, 1, all.n);
    }
    size_t differ = 0;
    for (size_t m = 1; m <= all.m; ++m) {
      Problem some = all;
      some.m = m;
      some.a.resize(m * all.k);
      for (size_t threads : {1, 3}) {
        const auto out = Run(*ks, some, threads, all.n);
        for (size_t r = 0; r < m; ++r) {
          differ += !std::equal(alone[r].begin(), alone[r].end(), out.begin() + r * all.n);
        }
      }
    }
    EXPECT(differ == 0, "%s: %zu rows of M = 1..17 calls differ from the row alone", ks->name, differ);
  }
}

void TestNonFinite(const std::vector<const Bf16PackedKernelSet*>& sets) {
  Problem p = MakeProblem(2, 40, 16, false, 7);
  p.a[3] = 0x7fc0;           // NaN in row 0 poisons all of row 0
  p.w[5 * p.k + 2] = 0x7f80;  // +inf weight in column 5
  PackBf16Weight(p.w.data(), p.n, p.k, p.k, p.packed.data());  // (Run packs version 2 itself)
  for (const auto* ks : sets) {
    const auto out = Run(*ks, p, 1, p.n);
    bool row0_nan = true;
    for (size_t j = 0; j < p.n; ++j) row0_nan &= std::isnan(Bf16ToFloat(out[j]));
    const float c5 = Bf16ToFloat(out[p.n + 5]);
    EXPECT(row0_nan, "%s: NaN input gives NaN outputs", ks->name);
    EXPECT(std::isinf(c5) || std::isnan(c5), "%s: inf weight propagates (got %g)", ks->name, c5);
  }
}

}  // namespace
}  // namespace rvascend

int main() {
  using namespace rvascend;
  const auto sets = AvailableKernelSets();
  std::printf("cpu: %s\nkernel sets:", GetCpuFeatures().Describe().c_str());
  for (const auto* ks : sets) std::printf(" %s", ks->name);
  std::printf("\n");
  if (const char* want = std::getenv("RVASCEND_EXPECT_KERNEL_SET")) {
    // The QEMU target says which set the emulated CPU must select by default.
    EXPECT(std::string(DefaultKernelSet().name) == want, "default kernel set is %s, expected %s",
           DefaultKernelSet().name, want);
  }
  auto timed = [](const char* name, auto&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  %-16s %.2f s\n", name, s);
  };
  timed("rounding", [] { TestRounding(); });
  timed("pack", [] { TestPack(); });
  timed("shapes", [&] { TestShapes(sets); });
  timed("rows alone", [&] { TestRowsAreTheirRowsAlone(sets); });
  timed("threads", [&] { TestThreadsAgree(sets); });
  timed("layout mismatch", [&] { TestLayoutMismatch(sets); });
  timed("non-finite", [&] { TestNonFinite(sets); });
  return testing::Summary();
}
