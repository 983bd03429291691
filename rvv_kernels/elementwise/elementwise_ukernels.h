// Row microkernels of the per-layer elementwise work, BF16 in and out, FP32
// inside, with the same intermediate BF16 roundings as the torch code they
// replace (so a routed model gives the tokens the torch path gives):
//
// rms_norm:  h = bf16(x + residual) (or x), t = bf16(h * rsqrt(mean(h^2) + eps)),
//            out = bf16(weight * t); residual_out = h when a residual is given.
//            zero_centred (Qwen3.5, Qwen3-Next): out = bf16(h * rsqrt(...) * (1 + weight)),
//            FP32 throughout and rounded once, as their torch code computes it.
// silu_mul:  out = bf16(bf16(silu(gate)) * up) for a row [gate | up] of 2d.
// rope:      per head of d, after an optional per-head RMSNorm as above (plain or
//            zero-centred): rotate-half RoPE on the first r = rotary_dim values,
//            out = bf16(bf16(x * cos) + bf16(rot(x) * sin)), rot(x) = [-x[r/2:r], x[:r/2]];
//            the other d - r values pass through (partial RoPE, Qwen3.5).
// sigmoid_mul: out = bf16(x * bf16(sigmoid(gate))) (Qwen3.5's attention output gate).
// argmax:    the index of the largest value of a row (first on ties), -1 if any
//            value is NaN.
#ifndef RVV_KERNELS_ELEMENTWISE_ELEMENTWISE_UKERNELS_H_
#define RVV_KERNELS_ELEMENTWISE_ELEMENTWISE_UKERNELS_H_

#include <cstddef>
#include <cstdint>

namespace rvascend {

// One token's heads for rope: `heads` rows of d values, `stride` apart in x (a
// gated query's heads sit 2d apart, each beside its gate); cos/sin hold rotary_dim.
struct RopeHeads {
  size_t heads = 0, d = 0, stride = 0, rotary_dim = 0;
  const uint16_t* norm_weight = nullptr;  // the per-head RMSNorm's weight [d], or null: no norm
  float eps = 0;
  bool zero_centred = false;
};

struct ElementwiseKernels {
  const char* name;
  void (*rms_norm)(const uint16_t* x, const uint16_t* residual, const uint16_t* weight, size_t d, float eps,
                   bool zero_centred, uint16_t* out, uint16_t* residual_out);
  void (*silu_mul)(const uint16_t* gate_up, size_t d, uint16_t* out);
  // One token: out [heads, d] contiguous.
  void (*rope)(const uint16_t* x, const RopeHeads& h, const uint16_t* cos, const uint16_t* sin, uint16_t* out);
  void (*sigmoid_mul)(const uint16_t* x, const uint16_t* gate, size_t n, uint16_t* out);
  int64_t (*argmax)(const uint16_t* row, size_t n);
};

extern const ElementwiseKernels kElementwisePortable;
extern const ElementwiseKernels kElementwiseRvv;
extern const ElementwiseKernels kElementwiseAvx2;
extern const ElementwiseKernels kElementwiseAvx512;

}  // namespace rvascend

#endif  // RVV_KERNELS_ELEMENTWISE_ELEMENTWISE_UKERNELS_H_
