// The decoder layers of one decode step in one native call.
//
// Per layer, exactly the sequence of kernels the model runs op by op when the
// RVV policy routes every module (python/rvascend/models/decoder.py and
// qwen3_5.py): fused residual add + RMSNorm, then the layer's mixer, then
// add + RMSNorm, gate_up, SiLU*mul, down. The mixers:
//   attention:        the packed qkv projection, q/k RMSNorm + RoPE, the K/V
//                     write into the pool, pool attention, o_proj;
//   gated attention:  the same with each head's query beside its output gate
//                     (Qwen3.5): sigmoid(gate) * attention before o_proj;
//   Gated DeltaNet:   in_proj [qkv | z | b | a], the conv + delta-rule step on the
//                     sequence's recurrent-state slot (rgdr::DeltaNetDecodeCpu),
//                     out_proj.
// The same kernels in the same order give bit-identical results; what goes
// away is the per-op cost around them (interpreter, dispatcher, allocator),
// which on an in-order core is as large as the kernels outside the Linears.
#ifndef RVV_KERNELS_DECODER_DECODER_LAYERS_H_
#define RVV_KERNELS_DECODER_DECODER_LAYERS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rvv_kernels/decoder/decoder_layer_table.h"
#include "rvv_kernels/elementwise/elementwise_ukernels.h"
#include "rvv_kernels/linear/microkernel.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"

namespace rvascend {

// A projection's weight: BF16 packed with the linear kernel set's block_n
// (packed_layout.h), or quantized (quantized/quant_format.h) in up to four parts
// that cover its rows in order, each in one format (a Q4_K_M file's Q4_K q and k
// beside its Q6_K v; a DeltaNet in_proj's qkv, z, b and a).
struct ProjectionWeight {
  const uint16_t* bf16 = nullptr;
  struct Part {
    QuantFormat format = QuantFormat::kQ8_0;
    size_t rows = 0;
    const uint8_t* data = nullptr;
  };
  Part parts[4];
  size_t n_parts = 0;
};

enum class LayerKind : int {
#define RVASCEND_KIND_ENUMERATOR(enumerator, name) enumerator,
  RVASCEND_LAYER_KINDS(RVASCEND_KIND_ENUMERATOR)
#undef RVASCEND_KIND_ENUMERATOR
};

#define RVASCEND_KIND_COUNT(enumerator, name) +1
constexpr int kNumLayerKinds = 0 RVASCEND_LAYER_KINDS(RVASCEND_KIND_COUNT);
#undef RVASCEND_KIND_COUNT

// The kind masks of decoder_layer_table.h's buffers.
constexpr unsigned KindBit(LayerKind kind) { return 1u << static_cast<int>(kind); }
constexpr unsigned kAnyLayer = (1u << kNumLayerKinds) - 1;
constexpr unsigned kAttentionLayers = KindBit(LayerKind::kAttention) | KindBit(LayerKind::kGatedAttention);
constexpr unsigned kDeltaNetLayers = KindBit(LayerKind::kDeltaNet);
enum LayerBufferNeed { kRequired, kOptional };

// One layer's weights and its KV pool or recurrent state, every field of
// decoder_layer_table.h (null: the layer's kind has no such buffer, or an optional
// one is absent).
struct DecoderLayerWeights {
  LayerKind kind = LayerKind::kAttention;
#define RVASCEND_WEIGHT_PROJECTION(field, n, k) ProjectionWeight field;
  RVASCEND_LAYER_PROJECTIONS(RVASCEND_WEIGHT_PROJECTION)
#undef RVASCEND_WEIGHT_PROJECTION
#define RVASCEND_WEIGHT_BUFFER(field, type, kinds, need, elements) type* field = nullptr;
  RVASCEND_LAYER_BUFFERS(RVASCEND_WEIGHT_BUFFER)
#undef RVASCEND_WEIGHT_BUFFER
};

struct DeltaNetShape {
  size_t nk = 0, nv = 0, dk = 0, dv = 0, kernel = 0, num_slots = 0;
  float norm_eps = 0;

  size_t conv_dim() const { return 2 * nk * dk + nv * dv; }
  size_t in_proj_n() const { return conv_dim() + nv * dv + 2 * nv; }
};

struct DecoderShape {
  size_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, num_slots = 0;
  size_t rotary_dim = 0;      // RoPE turns the first rotary_dim of each head (0: all of it)
  bool zero_centred = false;  // every RMSNorm but the DeltaNet's gated one scales by 1 + w (Qwen3.5)
  float norm_eps = 0, qk_norm_eps = 0, scale = 1;
  DeltaNetShape deltanet;     // when some layer is kDeltaNet
};

// The step's tokens: sequence b has query rows [q_starts[b], q_starts[b+1]) and
// K/V slots kv_slots[kv_starts[b] : kv_starts[b+1]] (kv_pool_attention.h); the
// new tokens' K/V go to write_slots[t]. cos/sin: [tokens, rotary_dim]. With
// DeltaNet layers every sequence decodes one token, and sequence b's recurrent
// state is at state_slots[b] (distinct), or, with state_read_slots, read from
// state_read_slots[b] and written to state_slots[b] (DeltaNetDecodeArgs::read_slots).
struct DecoderBatch {
  size_t tokens = 0, batch = 0;
  const int64_t* q_starts = nullptr;
  const int64_t* kv_starts = nullptr;
  const int64_t* kv_slots = nullptr;
  const int64_t* write_slots = nullptr;
  const uint16_t* cos = nullptr;
  const uint16_t* sin = nullptr;
  const int64_t* state_slots = nullptr;
  const int64_t* state_read_slots = nullptr;
};

struct DecoderKernels {
  const Bf16PackedKernelSet* linear = nullptr;
  const QuantKernelSet* quantized = nullptr;  // for quantized projections
  size_t quant_tile = 0;                      // their runtime layout's tile width
  const ElementwiseKernels* elementwise = nullptr;
  std::string attention;  // "" = the best this CPU runs
  // Called at every stage boundary when set (instruction counting under QEMU):
  // before each of a layer's stages (LayerKindInfo::stages), once after the last layer and,
  // with a final norm, once after it, and with a head once after that.
  void (*stage_marker)(int) = nullptr;
};

// The model's output projection after its final norm (lm_head, or the tied
// embedding), over the rows whose logits the step wants.
struct DecoderHead {
  ProjectionWeight weight;        // [vocab, hidden]
  size_t vocab = 0;
  const int64_t* rows = nullptr;  // the step's rows to project, in order; null: every row
  size_t n_rows = 0;              // with rows
  uint16_t* logits = nullptr;     // [rows (or tokens), vocab]
};

struct MixerStep;  // decoder_layers.cc's

// What the step knows of each layer kind, in one table (decoder_layers.cc).
struct LayerKindInfo {
  // The stages a layer of this kind runs, in order (the names the step profiler
  // reports); the stage marker gets each one's index into this list.
  std::vector<std::string> stages;
  size_t (*input_width)(const DecoderShape& s);   // its qkv (in_proj) rows
  size_t (*output_width)(const DecoderShape& s);  // its o (out_proj) input width
  // Throws std::invalid_argument when the shape cannot hold such a layer, or when a
  // step's batch cannot run through it (before the first layer writes).
  void (*check_shape)(const DecoderShape& s);
  void (*check_batch)(const DecoderShape& s, const DecoderBatch& batch, const DecoderLayerWeights& w);
  // The mixer: from the normed input to o's input (returned), through its stages.
  const uint16_t* (*mix)(MixerStep& step, const DecoderLayerWeights& w);
};

// A kind's entry and its name; both throw std::invalid_argument for a value outside LayerKind.
const LayerKindInfo& LayerKindOf(LayerKind kind);
const char* LayerKindName(LayerKind kind);

// h: [tokens, hidden], the first layer's input, which is also where the
// residual stream starts (the embedding output). On return h_out holds the
// last layer's MLP output and residual_out the stream (both [tokens, hidden];
// they may not alias h). With final_norm ([hidden], the model's last RMSNorm,
// same eps and scale as the layers'), h_out holds that norm of the output plus
// the stream and residual_out their sum, as the model's add + norm after its
// layers. With head (which needs final_norm) the normed rows it names are
// projected into head->logits, as the model's logits after its layers. Throws
// std::invalid_argument naming the first bad value of the batch (starts, a slot
// outside the pool, a head row outside the step) before anything is written.
void DecoderLayers(const DecoderKernels& kernels, const DecoderLayerWeights* layers, size_t n_layers,
                   const DecoderShape& shape, const DecoderBatch& batch, const uint16_t* h, uint16_t* h_out,
                   uint16_t* residual_out, const uint16_t* final_norm, const DecoderHead* head,
                   size_t num_threads);

}  // namespace rvascend

#endif  // RVV_KERNELS_DECODER_DECODER_LAYERS_H_
