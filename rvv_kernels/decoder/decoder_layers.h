// The decoder layers of one decode step in one native call.
//
// Per layer, exactly the sequence of kernels the model runs op by op when the
// RVV policy routes every module (python/rvascend/models/decoder.py): fused
// residual add + RMSNorm, the packed qkv projection, q/k RMSNorm + RoPE, the
// K/V write into the pool, pool attention, o_proj, add + RMSNorm, gate_up,
// SiLU*mul, down. The same kernels in the same order give bit-identical
// results; what goes away is the per-op cost around them (interpreter,
// dispatcher, allocator), which on an in-order core is as large as the
// kernels outside the Linears.
#ifndef RVV_KERNELS_DECODER_DECODER_LAYERS_H_
#define RVV_KERNELS_DECODER_DECODER_LAYERS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "rvv_kernels/elementwise/elementwise_ukernels.h"
#include "rvv_kernels/linear/microkernel.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"

namespace rvascend {

// A projection's weight: BF16 packed with the linear kernel set's block_n
// (packed_layout.h), or quantized (quantized/quant_format.h) in up to three parts
// that cover its rows in order, each in one format (a Q4_K_M file's Q4_K q and k
// beside its Q6_K v).
struct ProjectionWeight {
  const uint16_t* bf16 = nullptr;
  struct Part {
    QuantFormat format = QuantFormat::kQ8_0;
    size_t rows = 0;
    const uint8_t* data = nullptr;
  };
  Part parts[3];
  size_t n_parts = 0;
};

// One layer's weights and KV pool: qkv [q | k | v] rows, gate_up [gate | up].
struct DecoderLayerWeights {
  const uint16_t* input_norm = nullptr;           // [hidden], BF16
  const uint16_t* post_attention_norm = nullptr;  // [hidden]
  ProjectionWeight qkv;                           // N = (heads + 2 kv_heads) head_dim, K = hidden
  ProjectionWeight o;                             // N = hidden, K = heads head_dim
  ProjectionWeight gate_up;                       // N = 2 intermediate, K = hidden
  ProjectionWeight down;                          // N = hidden, K = intermediate
  const uint16_t* q_norm = nullptr;               // [head_dim] or null (no q/k norm)
  const uint16_t* k_norm = nullptr;
  uint16_t* k_pool = nullptr;  // [num_slots, kv_heads, head_dim]
  uint16_t* v_pool = nullptr;
};

struct DecoderShape {
  size_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, num_slots = 0;
  float norm_eps = 0, qk_norm_eps = 0, scale = 1;
};

// The step's tokens: sequence b has query rows [q_starts[b], q_starts[b+1]) and
// K/V slots kv_slots[kv_starts[b] : kv_starts[b+1]] (kv_pool_attention.h); the
// new tokens' K/V go to write_slots[t]. cos/sin: [tokens, head_dim].
struct DecoderBatch {
  size_t tokens = 0, batch = 0;
  const int64_t* q_starts = nullptr;
  const int64_t* kv_starts = nullptr;
  const int64_t* kv_slots = nullptr;
  const int64_t* write_slots = nullptr;
  const uint16_t* cos = nullptr;
  const uint16_t* sin = nullptr;
};

struct DecoderKernels {
  const Bf16PackedKernelSet* linear = nullptr;
  const QuantKernelSet* quantized = nullptr;  // for quantized projections
  size_t quant_tile = 0;                      // their runtime layout's tile width
  const ElementwiseKernels* elementwise = nullptr;
  std::string attention;  // "" = the best this CPU runs
  // Called at every stage boundary when set (instruction counting under QEMU):
  // before each of the layer's kDecoderStages stages and once after the last layer.
  void (*stage_marker)(int) = nullptr;
};

// The stages a layer runs, in order (the names the step profiler reports).
constexpr int kDecoderStages = 9;
extern const char* const kDecoderStageNames[kDecoderStages];

// h: [tokens, hidden], the first layer's input, which is also where the
// residual stream starts (the embedding output). On return h_out holds the
// last layer's MLP output and residual_out the stream (both [tokens, hidden];
// they may not alias h). Throws std::invalid_argument naming the first bad
// value of the batch (starts, a slot outside the pool) before anything is written.
void DecoderLayers(const DecoderKernels& kernels, const DecoderLayerWeights* layers, size_t n_layers,
                   const DecoderShape& shape, const DecoderBatch& batch, const uint16_t* h, uint16_t* h_out,
                   uint16_t* residual_out, size_t num_threads);

}  // namespace rvascend

#endif  // RVV_KERNELS_DECODER_DECODER_LAYERS_H_
