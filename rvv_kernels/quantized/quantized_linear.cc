#include "rvv_kernels/quantized/quantized_linear.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/thread_pool.h"
#include "rvv_kernels/quantized/quant_activations.h"

namespace rvascend {
namespace {

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Below this many weight bytes a call is cheaper on one thread than the wake-up.
constexpr size_t kMinParallelBytes = 1 << 16;

void Check(const QuantKernelSet& kernels, const QuantizedLinearArgs& args) {
  const QuantFormatInfo& info = FormatInfo(args.format);
  if (args.k == 0 || args.k % info.block_k) {
    throw std::invalid_argument(std::string(info.name) + ": K = " + std::to_string(args.k) +
                                " is not a whole number of " + std::to_string(info.block_k) + "-value blocks");
  }
  if (args.tile == 0 || args.tile % 16 || args.tile > 256) {
    throw std::invalid_argument("quantized tile width " + std::to_string(args.tile) + " is invalid");
  }
  // The scratch and the x86 kernels' loads are sized for the set's own tile: a
  // weight repacked with another width read NaN or past the scratch (an abort).
  if (!kernels.any_tile && args.tile != QuantKernelSetTile(kernels)) {
    throw std::invalid_argument("kernel set '" + std::string(kernels.name) + "' reads tiles of " +
                                std::to_string(QuantKernelSetTile(kernels)) + " columns, the weight was repacked "
                                "with tiles of " + std::to_string(args.tile) + ": repack it on this machine");
  }
}

// f(tile index, rows r0..r0+rows, FP32 scratch [rows][tile]) for every tile and row group.
template <typename Store>
void Run(const QuantKernelSet& kernels, const QuantizedLinearArgs& args, size_t num_threads, Store store) {
  const QuantFormatInfo& info = FormatInfo(args.format);
  const QuantizedActivations acts = args.input_f32 != nullptr
      ? QuantizedActivations(args.input_f32, args.m, args.k, args.input_stride, info.act_block)
      : QuantizedActivations(args.input, args.m, args.k, args.input_stride, info.act_block, kernels.quantize_row);
  const size_t t = args.tile;
  const size_t tiles = CeilDiv(args.n, t);
  const size_t tile_bytes = (args.k / info.block_k) * info.tile_block_bytes * t;
  const size_t mr = kernels.max_rows;
  if (tiles * tile_bytes < kMinParallelBytes) num_threads = 1;
  const size_t chunks = std::min(tiles, std::max<size_t>(1, num_threads) * 4);
  const size_t per_chunk = CeilDiv(tiles, chunks);
  const QuantUkernel ukernel = QuantUkernelFor(kernels, args.format);
  const size_t scratch_floats = std::min(mr, args.m) * t;
  ThreadPool::Global().ParallelFor(chunks, num_threads, [&](size_t chunk) {
    // Per thread and grown once: a vector per chunk cost a malloc and a zero fill of
    // max_rows x tile floats (64 KiB on the VNNI set) for every chunk of every call.
    thread_local std::vector<float> scratch;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    for (size_t ti = chunk * per_chunk; ti < std::min(tiles, (chunk + 1) * per_chunk); ++ti) {
      const uint8_t* tile = args.weight + ti * tile_bytes;
      for (size_t r = 0; r < args.m; r += mr) {
        const size_t rows = std::min(mr, args.m - r);
        ukernel(rows, acts.view(), r, tile, t, scratch.data(), t);
        store(ti, r, rows, scratch.data());
      }
    }
  });
}

}  // namespace

void QuantizedLinear(const QuantKernelSet& kernels, const QuantizedLinearArgs& args, size_t num_threads) {
  Check(kernels, args);
  if (args.m == 0 || args.n == 0) return;
  const size_t t = args.tile;
  Run(kernels, args, num_threads, [&](size_t ti, size_t r0, size_t rows, const float* c) {
    const size_t j0 = ti * t, cols = std::min(t, args.n - j0);
    for (size_t r = 0; r < rows; ++r) kernels.store_bf16(c + r * t, cols, args.output + (r0 + r) * args.output_stride + j0);
  });
}

void QuantizedLinearF32(const QuantKernelSet& kernels, const QuantizedLinearArgs& args, float* out,
                        size_t out_stride, size_t num_threads) {
  Check(kernels, args);
  if (args.m == 0 || args.n == 0) return;
  const size_t t = args.tile;
  Run(kernels, args, num_threads, [&](size_t ti, size_t r0, size_t rows, const float* c) {
    const size_t j0 = ti * t, cols = std::min(t, args.n - j0);
    for (size_t r = 0; r < rows; ++r) std::copy(c + r * t, c + r * t + cols, out + (r0 + r) * out_stride + j0);
  });
}

}  // namespace rvascend
