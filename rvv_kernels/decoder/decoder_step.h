// The fused decode step's schema: what a caller (the Python plan,
// python/rvascend/dispatch/fused_decoder.py) hands over, field by field, and its
// resolution into DecoderLayers' arguments (decoder_layers.h).
//
// A DecoderModel is built once per plan from a DecoderModelDesc: every weight,
// norm, pool and state buffer is checked against the shape by its field name
// ("layer 3 gate_up: ...") and kept as a typed pointer. Each step then passes a
// DecoderStepArgs (the batch's index arrays, the activations, the logits) whose
// buffers are checked the same way before anything is written. The buffers are
// Spans: raw addresses that the caller keeps alive and unmoved while the model
// is in use (the plan watches them and rebuilds the model when one moves).
#ifndef RVV_KERNELS_DECODER_DECODER_STEP_H_
#define RVV_KERNELS_DECODER_DECODER_STEP_H_

#include <cstddef>
#include <string>
#include <vector>

#include "rvv_kernels/base/checked_buffer.h"
#include "rvv_kernels/decoder/decoder_layers.h"

namespace rvascend {

// One quantized part of a projection: its format's name (quant_format.h), the rows it
// covers, and its bytes in the runtime layout.
struct QuantPartDesc {
  std::string format;
  size_t rows = 0;
  Span data;
};

// A projection's weight: BF16 packed (with the model's block_n), or quantized in
// parts that cover its rows in order. Neither: absent (only the head may be).
struct ProjectionDesc {
  Span packed;
  std::vector<QuantPartDesc> parts;

  bool empty() const { return packed.empty() && parts.empty(); }
};

// One layer: its kind and every field of decoder_layer_table.h, a projection's as a
// ProjectionDesc and any other buffer's as a Span. A field its kind does not carry
// stays empty (filled, it is an error); q_norm and k_norm may both stay empty (no q/k
// norm). A DeltaNet layer's qkv and o hold its in_proj and out_proj.
struct LayerDesc {
  LayerKind kind = LayerKind::kAttention;
#define RVASCEND_DESC_PROJECTION(field, n, k) ProjectionDesc field;
  RVASCEND_LAYER_PROJECTIONS(RVASCEND_DESC_PROJECTION)
#undef RVASCEND_DESC_PROJECTION
#define RVASCEND_DESC_BUFFER(field, type, kinds, need, elements) Span field;
  RVASCEND_LAYER_BUFFERS(RVASCEND_DESC_BUFFER)
#undef RVASCEND_DESC_BUFFER
};

struct DecoderModelDesc {
  DecoderShape shape;        // shape.deltanet when some layer is a DeltaNet one; rotary_dim is the step's
  size_t block_n = 0;        // the BF16 packed weights' block (0: none is BF16 packed)
  size_t quant_tile = 0;     // the quantized weights' tile width
  std::vector<LayerDesc> layers;
  Span final_norm;           // the model's last RMSNorm (empty: none)
  ProjectionDesc head;       // the output projection (empty: none; it needs final_norm)
  size_t vocab = 0;          // the head's rows
};

// One step. `rotary_dim` is cos/sin's width (0: the whole head). With DeltaNet layers
// `state_slots` gives each sequence's state slot, and `state_read_slots` (optional)
// where to read it from. `project_head`: run the head over `head_rows` (empty: every
// row) into `logits`. Kernel sets by name ("": the best for this CPU).
struct DecoderStepArgs {
  size_t tokens = 0, batch = 0, rotary_dim = 0;
  Span q_starts, kv_starts, kv_slots, write_slots, cos, sin;
  Span state_slots, state_read_slots;
  Span h, h_out, residual_out;
  bool project_head = false;
  Span head_rows, logits;
  std::string kernel_set, quant_kernel_set;
  size_t num_threads = 1;
  void (*stage_marker)(int) = nullptr;
};

class DecoderModel {
 public:
  // Checks every buffer of `desc` against its shape; throws std::invalid_argument
  // naming the first bad field.
  explicit DecoderModel(const DecoderModelDesc& desc);

  // Checks the step's buffers (and the kernel sets against the weights' layouts), then
  // runs DecoderLayers; nothing is written when a check fails.
  void Run(const DecoderStepArgs& args) const;

  size_t num_layers() const { return layers_.size(); }

 private:
  DecoderShape shape_;
  size_t block_n_ = 0, quant_tile_ = 0, vocab_ = 0;
  bool any_quantized_ = false, has_head_ = false;
  std::vector<DecoderLayerWeights> layers_;
  const uint16_t* final_norm_ = nullptr;
  ProjectionWeight head_;
};

}  // namespace rvascend

#endif  // RVV_KERNELS_DECODER_DECODER_STEP_H_
