// One decode token of recurrent_gated_delta_rule through the native CPU op: B sequences of one
// token, NV value heads of Dv x Dk state each, FP32 or BF16 state. Timed on real hardware
// (--reps > 1), or run once for instruction counting under QEMU (python/rvascend/bench/recurrent_gated_delta_rule_kernel_counts.py).
//
//   recurrent_gated_delta_rule_decode_bench [--elem=f32|bf16] [--b=1] [--nk=16] [--nv=16] [--dk=128] [--dv=128]
//                     [--rows=NAME] [--reps=20] [--threads=1]
// Prints one line: elem b nk nv dk dv rows threads seconds_per_call state_elements
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_cpu.h"
#include "rvv_kernels/base/bf16.h"

namespace {

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
  *value = arg + len + 1;
  return true;
}

// `n` normal values in `elem`'s encoding, as raw bytes.
std::vector<uint8_t> Random(std::mt19937& rng, size_t n, rgdr::Elem elem, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  const size_t size = elem == rgdr::Elem::kFloat32 ? 4 : 2;
  std::vector<uint8_t> out(n * size);
  for (size_t i = 0; i < n; ++i) {
    const float x = dist(rng);
    if (elem == rgdr::Elem::kFloat32) {
      std::memcpy(&out[i * 4], &x, 4);
    } else {
      const uint16_t h = rvascend::FloatToBf16(x);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string elem_name = "f32", rows, value;
  size_t b = 1, nk = 16, nv = 16, dk = 128, dv = 128, reps = 20, threads = 1;
  for (int i = 1; i < argc; ++i) {
    if (Flag(argv[i], "--elem", &value)) elem_name = value;
    else if (Flag(argv[i], "--rows", &value)) rows = value;
    else if (Flag(argv[i], "--b", &value)) b = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--nk", &value)) nk = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--nv", &value)) nv = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--dk", &value)) dk = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--dv", &value)) dv = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--reps", &value)) reps = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--threads", &value)) threads = std::strtoul(value.c_str(), nullptr, 10);
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (elem_name != "f32" && elem_name != "bf16") {
    std::fprintf(stderr, "--elem must be f32 or bf16, got %s\n", elem_name.c_str());
    return 2;
  }
  const rgdr::Elem elem = elem_name == "f32" ? rgdr::Elem::kFloat32 : rgdr::Elem::kBFloat16;
  std::mt19937 rng(7);
  auto query = Random(rng, b * nk * dk, elem, 0.1f), key = Random(rng, b * nk * dk, elem, 0.1f);
  auto val = Random(rng, b * nv * dv, elem, 1.0f), beta = Random(rng, b * nv, elem, 0.5f);
  auto state = Random(rng, b * nv * dv * dk, elem, 0.1f);
  std::vector<float> g(b * nv, -0.1f);
  std::vector<int64_t> lens(b, 1), slots(b);
  for (size_t i = 0; i < b; ++i) slots[i] = static_cast<int64_t>(b - 1 - i);  // not in order
  std::vector<uint8_t> out(b * nv * dv * (elem == rgdr::Elem::kFloat32 ? 4 : 2));
  rgdr::RgdrArgs args;
  args.elem = elem;
  args.t = args.b = args.num_slots = static_cast<uint32_t>(b);
  args.nk = static_cast<uint32_t>(nk);
  args.nv = static_cast<uint32_t>(nv);
  args.dk = static_cast<uint32_t>(dk);
  args.dv = static_cast<uint32_t>(dv);
  args.query = query.data();
  args.key = key.data();
  args.value = val.data();
  args.beta = beta.data();
  args.g = g.data();
  args.state = state.data();
  args.seq_lens = lens.data();
  args.seq_lens_int64 = true;
  args.indices = slots.data();
  args.indices_int64 = true;
  args.out = out.data();
  args.scale = 1.0f / 11.3f;
  rgdr::RecurrentGatedDeltaRuleCpu(args, threads, rows);  // warm-up (the only call when reps = 1)
  double seconds = 0.0;
  if (reps > 1) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t r = 0; r < reps; ++r) rgdr::RecurrentGatedDeltaRuleCpu(args, threads, rows);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
  }
  std::printf("%s %zu %zu %zu %zu %zu %s %zu %.9f %zu\n", elem_name.c_str(), b, nk, nv, dk, dv,
              rows.empty() ? "best" : rows.c_str(), threads, seconds, b * nv * dv * dk);
  return 0;
}
