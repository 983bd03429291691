// GGML quantized weights <-> the runtime layout (quant_format.h).
#ifndef RVV_KERNELS_QUANTIZED_QUANT_LAYOUT_H_
#define RVV_KERNELS_QUANTIZED_QUANT_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "rvv_kernels/quantized/quant_format.h"

namespace rvascend {

// Bytes of a GGML weight [n, k] and of its runtime layout with tiles of `tile` columns;
// std::invalid_argument if the product overflows.
size_t GgmlWeightBytes(QuantFormat format, size_t n, size_t k);
size_t QuantLayoutBytes(QuantFormat format, size_t n, size_t k, size_t tile);

// Throws std::invalid_argument naming the problem: K not a whole number of blocks
// (as llama.cpp refuses it), a tile width that is not a positive multiple of 16
// up to 256, or sizes that overflow. Reads nothing: check a buffer's byte count
// against GgmlWeightBytes after this and before CheckGgmlWeight.
void CheckGgmlShape(QuantFormat format, size_t n, size_t k, size_t tile);

// CheckGgmlShape, then every scale: NaN or infinite is an error (row and block named).
void CheckGgmlWeight(QuantFormat format, const uint8_t* ggml, size_t n, size_t k, size_t tile);

// ggml [n rows of k/block_k blocks] -> out [QuantLayoutBytes] (after CheckGgmlWeight).
void RepackGgmlWeight(QuantFormat format, const uint8_t* ggml, size_t n, size_t k, size_t tile, uint8_t* out,
                      size_t num_threads);

// Row `row` (one output feature) of a weight in the runtime layout, as FP32 values [k].
void DequantizeQuantRow(QuantFormat format, const uint8_t* packed, size_t n, size_t k, size_t tile, size_t row,
                        float* out);

// FP32 values [n][k] of a GGML weight (after CheckGgmlWeight): the same products as
// DequantizeQuantRow, for the paths that need the values, not the kernels.
void DequantizeGgmlRows(QuantFormat format, const uint8_t* ggml, size_t n, size_t k, float* out,
                        size_t num_threads);

}  // namespace rvascend

#endif  // RVV_KERNELS_QUANTIZED_QUANT_LAYOUT_H_
