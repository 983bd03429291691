// Times each elementwise kernel set this build has and the CPU runs, one
// thread, on a decode step's shapes (Qwen3-0.6B: width 1024, MLP 3072, 16 q
// heads of 128 with q/k norm, vocabulary 151936), side by side in one run.
//
//   elementwise_bench [--reps=2000]
// Prints one line per set and op: set op microseconds_per_call speedup_over_portable
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/elementwise/elementwise.h"

namespace {

std::vector<uint16_t> Random(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = rvascend::FloatToBf16(dist(rng));
  return v;
}

double MicrosecondsPerCall(size_t reps, const std::function<void()>& call) {
  call();
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < reps; ++i) call();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
    best = us < best ? us : best;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  size_t reps = 2000;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0) {
      reps = std::strtoul(argv[i] + 7, nullptr, 10);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  std::mt19937 rng(7);
  const size_t width = 1024, mlp = 3072, heads = 16, d = 128, vocab = 151936;
  auto x = Random(rng, width), r = Random(rng, width), w = Random(rng, width), gate_up = Random(rng, 2 * mlp);
  auto q = Random(rng, heads * d), qn = Random(rng, d), cs = Random(rng, d), sn = Random(rng, d);
  auto logits = Random(rng, vocab);
  std::vector<uint16_t> out(2 * mlp), res(width);
  int64_t index = 0;
  rvascend::RopeHeads rope;
  rope.heads = heads;
  rope.d = rope.stride = rope.rotary_dim = d;
  rope.norm_weight = qn.data();
  rope.eps = 1e-6f;
  std::map<std::string, double> portable;
  const std::vector<std::string> names = rvascend::AvailableElementwiseKernels();
  // Portable first, so every other set's line can give its ratio.
  std::vector<std::string> order = {"portable"};
  for (const auto& n : names) {
    if (n != "portable") order.push_back(n);
  }
  for (const std::string& name : order) {
    const rvascend::ElementwiseKernels& k = rvascend::ChooseElementwiseKernels(name);
    const std::pair<const char*, std::function<void()>> ops[] = {
        {"add_rms_norm", [&] { k.rms_norm(x.data(), r.data(), w.data(), width, 1e-6f, false, out.data(), res.data()); }},
        {"add_rms_norm_zero_centred",
         [&] { k.rms_norm(x.data(), r.data(), w.data(), width, 1e-6f, true, out.data(), res.data()); }},
        {"silu_mul", [&] { k.silu_mul(gate_up.data(), mlp, out.data()); }},
        {"qk_norm_rope", [&] { k.rope(q.data(), rope, cs.data(), sn.data(), out.data()); }},
        {"argmax", [&] { index += k.argmax(logits.data(), vocab); }},
    };
    for (const auto& [op, call] : ops) {
      const double us = MicrosecondsPerCall(op == std::string("argmax") ? reps / 20 + 1 : reps, call);
      if (name == "portable") portable[op] = us;
      std::printf("%s %s %.3f %.2f\n", name.c_str(), op, us, portable[op] / us);
    }
  }
  return index == -7 ? 1 : 0;  // keeps the argmax calls
}
