// output[M, N] = input[M, K] x W^T for a quantized weight in the runtime layout:
// the activations are quantized once per call, the tiles split over the thread
// pool, each output rounded once to BF16 (to nearest even).
#ifndef RVV_KERNELS_QUANTIZED_QUANTIZED_LINEAR_H_
#define RVV_KERNELS_QUANTIZED_QUANTIZED_LINEAR_H_

#include <cstddef>
#include <cstdint>

#include "rvv_kernels/quantized/quant_format.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"

namespace rvascend {

struct QuantizedLinearArgs {
  QuantFormat format = QuantFormat::kQ8_0;
  size_t m = 0, n = 0, k = 0;
  const uint16_t* input = nullptr;  // BF16 [m][input_stride]
  const float* input_f32 = nullptr;  // or FP32 (then `input` is unused)
  size_t input_stride = 0;
  const uint8_t* weight = nullptr;  // runtime layout (quant_format.h)
  size_t tile = 0;                  // the layout's tile width
  uint16_t* output = nullptr;       // BF16 [m][output_stride]
  size_t output_stride = 0;
};

// Throws std::invalid_argument if the set cannot read the layout's tile width or
// K is not a whole number of blocks.
void QuantizedLinear(const QuantKernelSet& kernels, const QuantizedLinearArgs& args, size_t num_threads);

// The same with FP32 output (tests compare the kernel sets' FP32 results bit for bit).
void QuantizedLinearF32(const QuantKernelSet& kernels, const QuantizedLinearArgs& args, float* out,
                        size_t out_stride, size_t num_threads);

}  // namespace rvascend

#endif  // RVV_KERNELS_QUANTIZED_QUANTIZED_LINEAR_H_
