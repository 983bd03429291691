// Runs KvPoolAttention for one sequence: `rows` new query rows after `prefix`
// cached tokens (rows = 1 is a decode step), with one kernel. Timed on real
// hardware (--reps > 1), or once for instruction counting under QEMU.
//
//   kv_pool_attention_bench [--kernel=NAME] [--heads=16] [--kv_heads=8] [--d=128]
//                           [--prefix=0] [--rows=64] [--reps=20] [--threads=1]
// Prints one line: kernel heads kv_heads d prefix rows threads seconds_per_call macs
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "rvv_kernels/attention/kv_pool_attention.h"
#include "rvv_kernels/base/bf16.h"

namespace {

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
  *value = arg + len + 1;
  return true;
}

std::vector<uint16_t> Random(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = rvascend::FloatToBf16(dist(rng));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string kernel, value;
  size_t heads = 16, kv_heads = 8, d = 128, prefix = 0, rows = 64, reps = 20, threads = 1;
  for (int i = 1; i < argc; ++i) {
    if (Flag(argv[i], "--kernel", &value)) kernel = value;
    else if (Flag(argv[i], "--heads", &value)) heads = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--kv_heads", &value)) kv_heads = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--d", &value)) d = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--prefix", &value)) prefix = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--rows", &value)) rows = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--reps", &value)) reps = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--threads", &value)) threads = std::strtoul(value.c_str(), nullptr, 10);
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const size_t keys = prefix + rows;
  std::mt19937 rng(7);
  std::vector<int64_t> slots(keys);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);  // a pool's slots are not in order
  const std::vector<int64_t> q_starts = {0, static_cast<int64_t>(rows)}, kv_starts = {0, static_cast<int64_t>(keys)};
  auto k_pool = Random(rng, keys * kv_heads * d), v_pool = Random(rng, keys * kv_heads * d);
  auto q = Random(rng, rows * heads * d);
  std::vector<uint16_t> out(rows * heads * d);
  rvascend::KvPoolAttentionArgs a;
  a.batch = 1;
  a.q_starts = q_starts.data();
  a.kv_starts = kv_starts.data();
  a.kv_slots = slots.data();
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = d;
  a.q = q.data();
  a.q_stride = heads * d;
  a.k_pool = k_pool.data();
  a.v_pool = v_pool.data();
  a.num_slots = keys;
  a.scale = 0.088f;
  a.out = out.data();
  a.out_stride = heads * d;
  // Scores and values: each row r sees prefix + r + 1 keys.
  const size_t macs = 2 * heads * d * (rows * prefix + rows * (rows + 1) / 2);
  rvascend::KvPoolAttention(a, threads, kernel);  // warm-up (and the one counted call at reps = 1)
  const auto start = std::chrono::steady_clock::now();
  for (size_t r = 1; r < reps; ++r) rvascend::KvPoolAttention(a, threads, kernel);
  const double seconds =
      reps > 1 ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / (reps - 1) : 0.0;
  std::printf("%s %zu %zu %zu %zu %zu %zu %.3e %zu\n", kernel.empty() ? "best" : kernel.c_str(), heads, kv_heads, d,
              prefix, rows, threads, seconds, macs);
  return 0;
}
