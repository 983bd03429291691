// The contract every quantized-linear kernel implements, and the activations it reads.
//
// A kernel computes C[0:m, 0:T] = A[0:m, 0:K] x W^T for the T columns of one
// tile of the runtime layout (quant_format.h), all K blocks, in FP32. The
// weights are integers times per-block scales; the activations are quantized
// per block to int8 as llama.cpp does (q8_0 for the 32-blocks formats, q8_K for
// the K-quants). Every product of a block is summed exactly in integers; the
// scales are applied once per block (or superblock) in FP32 with a fused
// multiply-add, in the same order in every kernel set, so the portable kernels
// and the RVV kernels give bit-identical results.
#ifndef RVV_KERNELS_QUANTIZED_QUANT_UKERNELS_H_
#define RVV_KERNELS_QUANTIZED_QUANT_UKERNELS_H_

#include <cstddef>
#include <cstdint>

#include "rvv_kernels/quantized/quant_format.h"

namespace rvascend {

// One call's activations, quantized (quant_activations.h).
struct QuantActs {
  size_t m = 0, k = 0;
  size_t block = 32;             // activation block: 32 (q8_0) or 256 (q8_K)
  const int8_t* q = nullptr;     // [m][k]
  const float* d = nullptr;      // [m][k / block]
  const int32_t* sum32 = nullptr;  // [m][k / 32]: the sum of q over each 32
  const int32_t* sum16 = nullptr;  // block 256: [m][k / 16], the sum of q over each 16 (Q6_K's sub-blocks)
};

// Rows row0 .. row0+m-1 of `a` against one tile of T columns; c: [m][c_stride] FP32.
using QuantUkernel = void (*)(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c,
                              size_t c_stride);

// One BF16 row of k values quantized per `block` (32: q8_0, 256: q8_K): q[k], d[k / block],
// sum32[k / 32] (quant_activations.h gives the definition).
using QuantizeRowFn = void (*)(const uint16_t* x, size_t k, size_t block, int8_t* q, float* d, int32_t* sum32);

// n FP32 values rounded to BF16, to nearest even.
using StoreBf16Fn = void (*)(const float* c, size_t n, uint16_t* out);

struct QuantKernelSet {
  const char* name;
  size_t tile;      // the tile width T it reads; 0: VLEN/4 of this machine (one e8 m2 group)
  bool any_tile;    // reads any tile width (a multiple of 16 up to 256), not only `tile`
  size_t max_rows;  // rows per call
  // Indexed by QuantFormat; an empty slot runs the portable kernel (QuantUkernelFor).
  QuantUkernel ukernel[kQuantFormatCount];
  QuantizeRowFn quantize_row;
  StoreBf16Fn store_bf16;
};

// The scale product both kernel sets use: (d as FP32) * a_d, rounded once.
inline float ScaleProduct(uint16_t d_half, float a_d) { return HalfToFloat(d_half) * a_d; }

}  // namespace rvascend

#endif  // RVV_KERNELS_QUANTIZED_QUANT_UKERNELS_H_
