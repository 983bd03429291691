// Attention over the KV pool (decode rows and prefill blocks) against an FP64
// reference, for every kernel this build has and the CPU runs. Runs on the host and, through
// rvv_cc_test, under QEMU at VLEN 128/256/512/1024 with tail and mask lanes
// set to all ones (a kernel that reads lanes it did not write fails).
//
// Tolerance: 1 BF16 ulp of the exact value (the one output rounding) plus
// 1e-4 * max|V| for the FP32 scores, exponentials and sums. The FP32 form
// (FP32 pools): 8e-5 absolute at |V| ~ 1. In both, every query row of a batch is bit for
// bit the row attended alone (the block kernels included).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "rvv_kernels/attention/kv_pool_attention.h"
#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/kernel_testing.h"
#include "rvv_kernels/base/cpu_features.h"

namespace rvascend {
namespace {

using testing::Bf16Ulp;

struct Case {
  std::vector<int64_t> q_lens, kv_lens;
  size_t heads, kv_heads, d;
};

std::vector<uint16_t> Random(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = FloatToBf16(dist(rng));
  return v;
}

void Run(const Case& c, const std::string& kernel, std::mt19937& rng) {
  const size_t batch = c.q_lens.size();
  std::vector<int64_t> q_starts(batch + 1, 0), kv_starts(batch + 1, 0);
  for (size_t b = 0; b < batch; ++b) {
    q_starts[b + 1] = q_starts[b] + c.q_lens[b];
    kv_starts[b + 1] = kv_starts[b] + c.kv_lens[b];
  }
  const size_t total_slots = kv_starts[batch], rows = q_starts[batch];
  const size_t num_slots = total_slots + 7;
  std::vector<int64_t> perm(num_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(perm.begin(), perm.begin() + total_slots);
  const size_t row = c.kv_heads * c.d;
  auto k_pool = Random(rng, num_slots * row, 1.0f), v_pool = Random(rng, num_slots * row, 1.0f);
  auto q = Random(rng, rows * c.heads * c.d, 1.0f);
  const auto k_before = k_pool, v_before = v_pool;
  std::vector<uint16_t> out(rows * c.heads * c.d, 0xffff);
  KvPoolAttentionArgs a;
  a.batch = batch;
  a.q_starts = q_starts.data();
  a.kv_starts = kv_starts.data();
  a.kv_slots = slots.data();
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.d;
  a.q = q.data();
  a.q_stride = c.heads * c.d;
  a.k_pool = k_pool.data();
  a.v_pool = v_pool.data();
  a.num_slots = num_slots;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  a.out = out.data();
  a.out_stride = c.heads * c.d;
  KvPoolAttention(a, 2, kernel);
  EXPECT(k_pool == k_before && v_pool == v_before, "%s: the pool was modified", kernel.c_str());

  double vmax = 0;
  for (uint16_t x : v_pool) vmax = std::max(vmax, std::fabs(static_cast<double>(Bf16ToFloat(x))));
  int bad = 0;
  double worst = 0;
  const size_t group = c.heads / c.kv_heads;
  for (size_t b = 0; b < batch; ++b) {
    for (int64_t r = 0; r < c.q_lens[b]; ++r) {
      const size_t t = q_starts[b] + r, keys = c.kv_lens[b] - c.q_lens[b] + r + 1;
      for (size_t h = 0; h < c.heads; ++h) {
        const size_t kvh = h / group;
        std::vector<double> s(keys);
        double m = -1e300;
        for (size_t j = 0; j < keys; ++j) {
          const size_t base = slots[kv_starts[b] + j] * row + kvh * c.d;
          double dot = 0;
          for (size_t i = 0; i < c.d; ++i) dot += static_cast<double>(Bf16ToFloat(q[(t * c.heads + h) * c.d + i])) * Bf16ToFloat(k_pool[base + i]);
          s[j] = dot * a.scale;
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - m));
        for (size_t i = 0; i < c.d; ++i) {
          double want = 0;
          for (size_t j = 0; j < keys; ++j) want += s[j] / sum * Bf16ToFloat(v_pool[slots[kv_starts[b] + j] * row + kvh * c.d + i]);
          const double got = Bf16ToFloat(out[(t * c.heads + h) * c.d + i]);
          const double err = std::fabs(got - want), tol = Bf16Ulp(want) + 1e-4 * vmax;
          worst = std::max(worst, err / tol);
          if (!(err <= tol)) ++bad;
        }
      }
    }
  }
  EXPECT(bad == 0, "%s: batch %zu heads %zu/%zu d %zu: %d outputs out of tolerance (worst %.2f x tol)",
         kernel.c_str(), batch, c.heads, c.kv_heads, c.d, bad, worst);
}

// Batch invariance: each query row of a batch (two sequences, several rows each, so the
// block kernels take some rows in blocks) bit for bit that row attended alone; for FP32
// pools (each kernel's FP32 row form) also against FP64.
template <typename T>
void RunRowsAlone(const std::string& kernel, std::mt19937& rng) {
  constexpr bool kF32 = std::is_same_v<T, float>;
  const size_t heads = 6, kv_heads = 2, d = 40, group = heads / kv_heads, row = kv_heads * d;
  const std::vector<int64_t> q_starts = {0, 5, 31}, kv_starts = {0, 20, 57};
  const size_t rows = 31, slots_n = 57, num_slots = 64;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto draw = [&](size_t n) {
    std::vector<T> v(n);
    for (T& x : v) x = kF32 ? static_cast<T>(dist(rng)) : static_cast<T>(FloatToBf16(dist(rng)));
    return v;
  };
  auto value = [](T x) { return kF32 ? static_cast<double>(x) : static_cast<double>(Bf16ToFloat(x)); };
  const auto k_pool = draw(num_slots * row), v_pool = draw(num_slots * row), q = draw(rows * heads * d);
  std::vector<int64_t> slots(slots_n);
  for (size_t i = 0; i < slots_n; ++i) slots[i] = static_cast<int64_t>((i * 37) % num_slots);
  auto attend = [&](size_t batch, const int64_t* qs, const int64_t* ks, const int64_t* sl, const T* qp, T* out) {
    KvPoolAttentionArgs a;
    a.batch = batch;
    a.q_starts = qs;
    a.kv_starts = ks;
    a.kv_slots = sl;
    a.heads = heads;
    a.kv_heads = kv_heads;
    a.head_dim = d;
    a.element = kF32 ? KvElement::kFloat32 : KvElement::kBf16;
    a.q = qp;
    a.q_stride = heads * d;
    a.k_pool = k_pool.data();
    a.v_pool = v_pool.data();
    a.num_slots = num_slots;
    a.scale = 0.15f;
    a.out = out;
    a.out_stride = heads * d;
    KvPoolAttention(a, 3, kernel);
  };
  std::vector<T> out(rows * heads * d);
  attend(2, q_starts.data(), kv_starts.data(), slots.data(), q.data(), out.data());
  int bad = 0, differ = 0;
  for (size_t b = 0; b < 2; ++b) {
    const int64_t n = q_starts[b + 1] - q_starts[b], l = kv_starts[b + 1] - kv_starts[b];
    for (int64_t r = 0; r < n; ++r) {
      const size_t t = q_starts[b] + r, keys = l - n + r + 1;
      const int64_t qs[] = {0, 1}, ks[] = {0, static_cast<int64_t>(keys)};
      std::vector<T> alone(heads * d);
      attend(1, qs, ks, slots.data() + kv_starts[b], q.data() + t * heads * d, alone.data());
      if (std::memcmp(alone.data(), out.data() + t * heads * d, alone.size() * sizeof(T)) != 0) ++differ;
      if (!kF32) continue;
      for (size_t h = 0; h < heads; ++h) {
        const size_t kvh = h / group;
        std::vector<double> s(keys);
        double m = -1e300, sum = 0;
        for (size_t j = 0; j < keys; ++j) {
          double dot = 0;
          for (size_t i = 0; i < d; ++i)
            dot += value(q[(t * heads + h) * d + i]) * value(k_pool[slots[kv_starts[b] + j] * row + kvh * d + i]);
          m = std::max(m, s[j] = dot * 0.15f);
        }
        for (double& x : s) sum += (x = std::exp(x - m));
        for (size_t i = 0; i < d; ++i) {
          double want = 0;
          for (size_t j = 0; j < keys; ++j) want += s[j] / sum * value(v_pool[slots[kv_starts[b] + j] * row + kvh * d + i]);
          if (!(std::fabs(value(out[(t * heads + h) * d + i]) - want) <= 8e-5)) ++bad;
        }
      }
    }
  }
  EXPECT(bad == 0, "%s %s: %d outputs beyond 8e-5 of FP64", kernel.c_str(), kF32 ? "FP32" : "BF16", bad);
  EXPECT(differ == 0, "%s %s: %d of %zu rows differ from the row attended alone", kernel.c_str(),
         kF32 ? "FP32" : "BF16", differ, rows);
}

void TestErrors() {
  std::vector<int64_t> q_starts = {0, 2}, kv_starts = {0, 1}, slots = {0};
  std::vector<uint16_t> buf(64, 0);
  KvPoolAttentionArgs a;
  a.batch = 1;
  a.q_starts = q_starts.data();
  a.kv_starts = kv_starts.data();
  a.kv_slots = slots.data();
  a.heads = 2;
  a.kv_heads = 1;
  a.head_dim = 4;
  a.q = a.k_pool = a.v_pool = buf.data();
  a.out = buf.data();
  a.num_slots = 4;
  auto throws = [&](const char* what) {
    try {
      ValidateKvPoolAttention(a);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what()).find(what) != std::string::npos;
    }
    return false;
  };
  EXPECT(throws("2 query rows but only 1"), "more query rows than slots is refused");
  q_starts[1] = 1;
  slots[0] = 4;
  EXPECT(throws("kv_slots[0] = 4 is outside the KV pool of 4 slots"), "slot past the pool is refused");
  slots[0] = -1;
  EXPECT(throws("kv_slots[0] = -1"), "negative slot is refused");
  slots[0] = 0;
  a.heads = 3;
  a.kv_heads = 2;
  EXPECT(throws("multiple of kv_heads"), "heads not a multiple of kv_heads is refused");
  int64_t bad_slot = 9;
  bool threw = false;
  try {
    WriteKvPool(buf.data(), 4, 4, buf.data(), &bad_slot, 1);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  EXPECT(threw, "WriteKvPool refuses a slot past the pool");
}

}  // namespace
}  // namespace rvascend

int main() {
  using namespace rvascend;
  std::printf("cpu: %s\n", GetCpuFeatures().Describe().c_str());
  std::mt19937 rng(1234);
  const std::vector<Case> cases = {
      {{1}, {1}, 1, 1, 1},
      {{1}, {17}, 2, 1, 7},
      {{1}, {100}, 16, 8, 128},          // Qwen3-0.6B: GQA 2, head_dim 128
      {{1, 1}, {513, 33}, 32, 8, 64},    // Llama-3.2-1B-like: GQA 4, two sequences
      {{1}, {64}, 12, 2, 128},           // GQA 6 (> 4 heads per pass)
      {{1}, {40}, 14, 2, 64},            // GQA 7
      {{3, 16}, {10, 40}, 4, 2, 100},    // several query rows: prefix + new tokens
      {{5}, {5}, 2, 2, 256},             // prefill from empty (causal)
      {{1, 2, 1}, {1, 9, 300}, 6, 3, 33},
      // Prefill blocks (12 rows, tiles of 3): whole blocks, a one-row block
      // left over (13), tiles of 2 and 1, a prefix before the chunk.
      {{64}, {64}, 16, 8, 128},           // Qwen3-0.6B prompt of 64
      {{20, 13}, {50, 13}, 9, 3, 64},     // SmolLM2: a chunk after 30 cached tokens; 12 + 1 rows
      {{2, 14}, {2, 70}, 2, 1, 33},       // odd head dimension
  };
  for (const std::string& kernel : AvailableAttentionKernels()) {
    std::printf("kernel %s\n", kernel.c_str());
    for (const Case& c : cases) Run(c, kernel, rng);
    RunRowsAlone<float>(kernel, rng);
    RunRowsAlone<uint16_t>(kernel, rng);
  }
  TestErrors();
  return testing::Summary();
}
