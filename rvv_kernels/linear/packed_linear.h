// The packed BF16 Linear driver: output[M, N] = input[M, K] x W[N, K]^T over a
// layout-1 packed weight, split over threads by N blocks (and by M for prefill).
#ifndef RVV_KERNELS_LINEAR_PACKED_LINEAR_H_
#define RVV_KERNELS_LINEAR_PACKED_LINEAR_H_

#include <cstddef>
#include <cstdint>

#include "rvv_kernels/linear/microkernel.h"

namespace rvascend {

struct PackedLinearArgs {
  size_t m = 0, n = 0, k = 0;
  const uint16_t* input = nullptr;  // BF16, rows input_stride elements apart
  size_t input_stride = 0;
  const uint16_t* packed = nullptr;  // [ceil(N/block_n), K, block_n] BF16 (packed_layout.h)
  size_t block_n = 32;               // must be the kernel set's KernelSetBlockN()
  uint16_t* output = nullptr;        // BF16, rows output_stride elements apart
  size_t output_stride = 0;
};

// Throws std::invalid_argument when args.block_n is not the layout the set reads.
void PackedBf16Linear(const Bf16PackedKernelSet& kernels, const PackedLinearArgs& args,
                      size_t num_threads);

}  // namespace rvascend

#endif  // RVV_KERNELS_LINEAR_PACKED_LINEAR_H_
