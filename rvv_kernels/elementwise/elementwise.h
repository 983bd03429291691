// Row drivers of the elementwise kernels (contracts in elementwise_ukernels.h):
// the kernel set chosen from the CPU, argument checks, rows over threads.
// Strides are in elements between consecutive rows (tokens).
#ifndef RVV_KERNELS_ELEMENTWISE_ELEMENTWISE_H_
#define RVV_KERNELS_ELEMENTWISE_ELEMENTWISE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rvv_kernels/elementwise/elementwise_ukernels.h"

namespace rvascend {

// name "" picks the best this CPU runs ("rvv", else "portable").
const ElementwiseKernels& ChooseElementwiseKernels(const std::string& name);
std::vector<std::string> AvailableElementwiseKernels();

// out[r] = rms_norm(x[r] (+ residual[r])); residual_out[r] = x[r] + residual[r]
// (residual may be null; then residual_out is not written). zero_centred scales
// by (1 + weight) (elementwise_ukernels.h).
void RmsNormRows(const ElementwiseKernels& k, size_t rows, size_t d, const uint16_t* x, size_t x_stride,
                 const uint16_t* residual, size_t residual_stride, const uint16_t* weight, float eps,
                 bool zero_centred, uint16_t* out, uint16_t* residual_out, size_t num_threads);

// out[r, :d] = silu(x[r, :d]) * x[r, d:2d]
void SiluMulRows(const ElementwiseKernels& k, size_t rows, size_t d, const uint16_t* x, size_t x_stride,
                 uint16_t* out, size_t num_threads);

// out[t] ([heads, d], contiguous) = rope(norm(x[t])) with cos[t], sin[t] (rows of
// h.rotary_dim). Throws std::invalid_argument for a head_dim, rotary_dim or head
// stride the kernels cannot take.
void RopeRows(const ElementwiseKernels& k, size_t tokens, const RopeHeads& h, const uint16_t* x, size_t x_stride,
              const uint16_t* cos, const uint16_t* sin, uint16_t* out, size_t num_threads);

// out[t, h * d + i] = x[t, h * d + i] * sigmoid(gate[t * gate_stride + h * gate_head_stride + i]):
// per head, the attention output times its gate (a gated query's heads sit beside their gates).
void SigmoidMulRows(const ElementwiseKernels& k, size_t tokens, size_t heads, size_t d, const uint16_t* x,
                    size_t x_stride, const uint16_t* gate, size_t gate_stride, size_t gate_head_stride, uint16_t* out,
                    size_t num_threads);

// out[r] = argmax(x[r, :n]) (first index on ties), -1 for a row holding a NaN.
void ArgmaxRows(const ElementwiseKernels& k, size_t rows, size_t n, const uint16_t* x, size_t x_stride, int64_t* out,
                size_t num_threads);

}  // namespace rvascend

#endif  // RVV_KERNELS_ELEMENTWISE_ELEMENTWISE_H_
