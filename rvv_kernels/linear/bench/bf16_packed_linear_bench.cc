// Runs packed_bf16_linear for one shape with one kernel set: timed on real
// hardware (--reps > 1), or once for instruction counting under QEMU.
//
//   bf16_packed_linear_bench [--kernel_set=NAME] [--m=1] [--n=2048] [--k=2048]
//                            [--reps=20] [--threads=1] [--copies=1]
// --copies=N cycles through N packed copies of the weight: with more bytes
// than the last-level cache each call streams its weight from memory, as a
// decode step does.
// Prints one line: kernel_set m n k threads seconds_per_call gmac_per_s
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "rvv_kernels/linear/bf16_packed_kernel_sets.h"
#include "rvv_kernels/base/cpu_features.h"
#include "rvv_kernels/linear/packed_layout.h"
#include "rvv_kernels/linear/packed_linear.h"

namespace {

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
  *value = arg + len + 1;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace rvascend;
  std::string kernel_set, value;
  size_t m = 1, n = 2048, k = 2048, reps = 20, threads = 1, copies = 1;
  for (int i = 1; i < argc; ++i) {
    if (Flag(argv[i], "--kernel_set", &value)) kernel_set = value;
    else if (Flag(argv[i], "--m", &value)) m = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--n", &value)) n = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--k", &value)) k = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--reps", &value)) reps = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--threads", &value)) threads = std::strtoul(value.c_str(), nullptr, 10);
    else if (Flag(argv[i], "--copies", &value)) copies = std::max<size_t>(1, std::strtoul(value.c_str(), nullptr, 10));
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const Bf16PackedKernelSet* set = kernel_set.empty() ? &DefaultKernelSet() : FindKernelSet(kernel_set);
  if (set == nullptr) {
    std::fprintf(stderr, "kernel set %s is not available (cpu: %s)\n", kernel_set.c_str(),
                 GetCpuFeatures().Describe().c_str());
    return 2;
  }
  // Weights and activations are bit patterns of small BF16 values: no
  // floating point is needed to make them (cheap under emulation).
  std::vector<uint16_t> weight(n * k), input(m * k), output(m * n);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = static_cast<uint16_t>(0x3c00 | (i * 2654435761u >> 25));
  for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<uint16_t>(0x3f00 | (i * 40503u >> 9 & 0x7f));
  const size_t block = KernelSetBlockN(*set);
  const size_t packed_elements = PackedBlocks(n, block) * k * block;
  std::vector<uint16_t> packed(packed_elements * copies);
  for (size_t c = 0; c < copies; ++c) PackBf16Weight(weight.data(), n, k, k, packed.data() + c * packed_elements, block);
  PackedLinearArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  args.input = input.data();
  args.input_stride = k;
  args.packed = packed.data();
  args.block_n = block;
  args.output = output.data();
  args.output_stride = n;
  if (reps > 1) PackedBf16Linear(*set, args, threads);  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t r = 0; r < reps; ++r) {
    args.packed = packed.data() + (r % copies) * packed_elements;
    PackedBf16Linear(*set, args, threads);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  std::printf("%s %zu %zu %zu %zu %.9f %.3f\n", set->name, m, n, k, threads, seconds,
              static_cast<double>(m) * n * k / seconds / 1e9);
  return 0;
}
