// One quantized GEMV/GEMM call per run, for instruction counting under QEMU
// (python/rvascend/bench/quantized_peers.py) and timing on a board:
//   quantized_linear_bench --format=Q4_0 --m=1 --n=2048 --k=2048 [--kernel_set=rvv] [--reps=1] [--threads=1]
//                          [--copies=1]
// --copies=N cycles through N copies of the weight: with more bytes than the
// last-level cache, each call reads its weight from memory, as in a decode step.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"
#include "rvv_kernels/quantized/quant_layout.h"
#include "rvv_kernels/quantized/quantized_linear.h"

namespace {

std::string Arg(int argc, char** argv, const char* name, const char* fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace rvascend;
  const QuantFormat format = FormatFromName(Arg(argc, argv, "format", "Q4_0"));
  const size_t m = std::stoul(Arg(argc, argv, "m", "1")), n = std::stoul(Arg(argc, argv, "n", "2048")),
               k = std::stoul(Arg(argc, argv, "k", "2048"));
  const int reps = std::stoi(Arg(argc, argv, "reps", "1"));
  const size_t threads = std::stoul(Arg(argc, argv, "threads", "1"));
  const std::string set_name = Arg(argc, argv, "kernel_set", "");
  const size_t copies = std::stoul(Arg(argc, argv, "copies", "1"));
  const QuantKernelSet& set = FindQuantKernelSet(set_name);
  const size_t tile = QuantKernelSetTile(set);
  std::mt19937 rng(7);
  std::vector<uint8_t> ggml(GgmlWeightBytes(format, n, k));
  for (auto& b : ggml) b = static_cast<uint8_t>(rng());
  // Finite scales: clear each f16's top exponent bit wherever a format keeps one (a block's start; Q2_K, Q3_K and Q6_K near its end).
  const QuantFormatInfo& info = FormatInfo(format);
  for (size_t b = 0; b < ggml.size() / info.ggml_block_bytes; ++b) {
    uint8_t* p = ggml.data() + b * info.ggml_block_bytes;
    for (size_t off : {size_t{0}, size_t{2}, size_t{80}, size_t{82}, size_t{108}, size_t{208}}) {
      if (off + 1 < info.ggml_block_bytes) p[off + 1] &= 0x3b;
    }
  }
  const size_t layout_bytes = QuantLayoutBytes(format, n, k, tile);
  std::vector<uint8_t> packed(layout_bytes * copies);
  for (size_t c = 0; c < copies; ++c) RepackGgmlWeight(format, ggml.data(), n, k, tile, packed.data() + c * layout_bytes, threads);
  std::vector<uint16_t> x(m * k), y(m * n);
  std::normal_distribution<float> normal;
  for (auto& v : x) v = FloatToBf16(normal(rng));
  QuantizedLinearArgs args;
  args.format = format;
  args.m = m;
  args.n = n;
  args.k = k;
  args.input = x.data();
  args.input_stride = k;
  args.weight = packed.data();
  args.tile = tile;
  args.output = y.data();
  args.output_stride = n;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    args.weight = packed.data() + (r % copies) * layout_bytes;
    QuantizedLinear(set, args, threads);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
  std::printf("%s %s tile=%zu m=%zu n=%zu k=%zu copies=%zu: %.3f ms/call, weight %.1f GB/s\n", set.name, info.name,
              tile, m, n, k, copies, s * 1e3, layout_bytes / s / 1e9);
  return 0;
}
