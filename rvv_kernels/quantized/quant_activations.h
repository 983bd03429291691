// BF16 activation rows quantized to int8 per block, as llama.cpp quantizes them
// for its integer dot products: q8_0 (blocks of 32: d = amax / 127) for Q8_0,
// Q4_0 and Q4_1 weights, q8_K (blocks of 256: d = max / -127 with max the value
// of largest magnitude) for the K-quants. Rounding is to nearest, ties to even,
// as llama.cpp's vector paths round. A block holding a NaN or an infinity gets
// d = NaN, so the outputs it touches are NaN rather than silently finite.
#ifndef RVV_KERNELS_QUANTIZED_QUANT_ACTIVATIONS_H_
#define RVV_KERNELS_QUANTIZED_QUANT_ACTIVATIONS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "rvv_kernels/quantized/quant_ukernels.h"

namespace rvascend {

// The definition, in plain C++ (the portable set's and the reference of the others).
void QuantizeRowPortable(const uint16_t* x, size_t k, size_t block, int8_t* q, float* d, int32_t* sum32);
void QuantizeRowF32(const float* x, size_t k, size_t block, int8_t* q, float* d, int32_t* sum32);

// Owns the quantized activations of one call.
class QuantizedActivations {
 public:
  // rows: [m][k] BF16 with row stride `stride`; block: 32 or 256 (k a multiple of it);
  // quantize: the kernel set's (every set's gives the same bytes).
  QuantizedActivations(const uint16_t* rows, size_t m, size_t k, size_t stride, size_t block,
                       QuantizeRowFn quantize = QuantizeRowPortable);
  // FP32 rows (a model served with FP32 activations): the same definition, without the
  // BF16 rounding of the values before they are quantized.
  QuantizedActivations(const float* rows, size_t m, size_t k, size_t stride, size_t block);
  const QuantActs& view() const { return view_; }

 private:
  void SetView(size_t m, size_t k, size_t block);
  std::vector<int8_t> q_;
  std::vector<float> d_;
  std::vector<int32_t> sum32_;
  std::vector<int32_t> sum16_;
  QuantActs view_;
};

}  // namespace rvascend

#endif  // RVV_KERNELS_QUANTIZED_QUANT_ACTIVATIONS_H_
