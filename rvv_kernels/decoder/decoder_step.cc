#include "rvv_kernels/decoder/decoder_step.h"

#include <iterator>
#include <stdexcept>
#include <string>

#include "rvv_kernels/base/checked_size.h"
#include "rvv_kernels/elementwise/elementwise.h"
#include "rvv_kernels/linear/bf16_packed_kernel_sets.h"
#include "rvv_kernels/linear/packed_layout.h"
#include "rvv_kernels/quantized/quant_format.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"
#include "rvv_kernels/quantized/quant_layout.h"

namespace rvascend {
namespace {

// What a model's projection is checked against: its shape and the model's layouts.
struct ProjectionShape {
  size_t n, k, block_n, quant_tile;
};

template <typename What>
ProjectionWeight ResolveProjection(const ProjectionDesc& desc, const ProjectionShape& s, const What& what,
                                   bool* quantized) {
  ProjectionWeight w;
  if (desc.parts.empty()) {
    if (s.block_n == 0) throw std::invalid_argument(Named(what) + ": a BF16 projection needs the model's block_n");
    w.bf16 = Extent<const uint16_t>(desc.packed, CheckedProduct("packed weight", PackedBlocks(s.n, s.block_n),
                                                                s.block_n, s.k), what);
    return w;
  }
  if (!desc.packed.empty()) throw std::invalid_argument(Named(what) + " is both BF16 packed and quantized");
  if (desc.parts.size() > std::size(w.parts)) {
    throw std::invalid_argument(Named(what) + ": a quantized projection has 1 to " + std::to_string(std::size(w.parts)) +
                                " parts, got " + std::to_string(desc.parts.size()));
  }
  size_t rows_total = 0;
  for (size_t q = 0; q < desc.parts.size(); ++q) {
    const QuantPartDesc& part = desc.parts[q];
    ProjectionWeight::Part& out = w.parts[q];
    const auto part_what = [&] { return Named(what) + " part " + std::to_string(q); };
    try {
      out.format = FormatFromName(part.format);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(part_what() + ": " + e.what());
    }
    out.rows = part.rows;
    if (s.k % FormatInfo(out.format).block_k) {
      throw std::invalid_argument(part_what() + ": K = " + std::to_string(s.k) + " is not a whole number of " +
                                  FormatInfo(out.format).name + " blocks");
    }
    out.data = Extent<const uint8_t>(part.data, QuantLayoutBytes(out.format, out.rows, s.k, s.quant_tile), part_what);
    rows_total += out.rows;
  }
  if (rows_total != s.n) {
    throw std::invalid_argument(Named(what) + ": quantized parts cover " + std::to_string(rows_total) + " of " +
                                std::to_string(s.n) + " rows");
  }
  w.n_parts = desc.parts.size();
  *quantized = true;
  return w;
}

}  // namespace

DecoderModel::DecoderModel(const DecoderModelDesc& desc)
    : shape_(desc.shape), block_n_(desc.block_n), quant_tile_(desc.quant_tile), vocab_(desc.vocab) {
  if (desc.layers.empty()) throw std::invalid_argument("decoder model: no layers");
  const DecoderShape& s = shape_;
  const DeltaNetShape& dn = s.deltanet;
  bool shape_checked[kNumLayerKinds] = {};
  layers_.resize(desc.layers.size());
  for (size_t l = 0; l < desc.layers.size(); ++l) {
    const LayerDesc& d = desc.layers[l];
    DecoderLayerWeights& w = layers_[l];
    const auto field = [l](const char* name) { return [l, name] { return "layer " + std::to_string(l) + " " + name; }; };
    const LayerKind kind = d.kind;
    const LayerKindInfo* info;
    try {
      info = &LayerKindOf(kind);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(field("kind")() + ": " + e.what());
    }
    const unsigned bit = KindBit(kind);
    w.kind = kind;
    if (!shape_checked[static_cast<int>(kind)]) {
      info->check_shape(s);
      shape_checked[static_cast<int>(kind)] = true;
    }
#define RVASCEND_CHECK_PROJECTION(name, n, k) \
  w.name = ResolveProjection(d.name, {n, k, block_n_, quant_tile_}, field(#name), &any_quantized_);
    RVASCEND_LAYER_PROJECTIONS(RVASCEND_CHECK_PROJECTION)
#undef RVASCEND_CHECK_PROJECTION
#define RVASCEND_CHECK_BUFFER(name, type, kinds, need, elements)                                             \
  if (!((kinds) & bit)) {                                                                                    \
    if (!d.name.empty()) {                                                                                   \
      throw std::invalid_argument(field(#name)() + ": a layer of kind " + LayerKindName(kind) + " has none"); \
    }                                                                                                        \
  } else if (!((need) == kOptional && d.name.empty())) {                                                     \
    [[maybe_unused]] const char* field_name = #name;                                                         \
    w.name = Extent<type>(d.name, elements, field(field_name));                                             \
  }
    RVASCEND_LAYER_BUFFERS(RVASCEND_CHECK_BUFFER)
#undef RVASCEND_CHECK_BUFFER
    if ((w.q_norm == nullptr) != (w.k_norm == nullptr)) {
      throw std::invalid_argument(field("q_norm")() + " and k_norm: give both or neither");
    }
  }
  if (!desc.final_norm.empty()) final_norm_ = Extent<const uint16_t>(desc.final_norm, s.hidden, "final_norm");
  if (!desc.head.empty()) {
    if (final_norm_ == nullptr) throw std::invalid_argument("head: the output projection needs final_norm");
    if (vocab_ == 0) throw std::invalid_argument("head: vocab is 0");
    head_ = ResolveProjection(desc.head, {vocab_, s.hidden, block_n_, quant_tile_}, "head", &any_quantized_);
    has_head_ = true;
  }
}

void DecoderModel::Run(const DecoderStepArgs& a) const {
  DecoderShape s = shape_;
  s.rotary_dim = a.rotary_dim;  // cos and sin's width, the step's
  if (a.project_head && !has_head_) throw std::invalid_argument("project_head: the model has no head");
  if (a.tokens == 0) return;
  if (a.rotary_dim > s.head_dim || a.rotary_dim % 2) {
    throw std::invalid_argument("rotary_dim " + std::to_string(a.rotary_dim) + " is not an even number <= head_dim " +
                                std::to_string(s.head_dim));
  }
  DecoderKernels kernels;
  kernels.linear = block_n_ ? &ChooseKernelSet(a.kernel_set, block_n_) : nullptr;
  kernels.elementwise = &ChooseElementwiseKernels("");
  kernels.stage_marker = a.stage_marker;
  if (any_quantized_) {
    kernels.quantized = &FindQuantKernelSet(a.quant_kernel_set);
    if (kernels.quantized->tile == 0 && quant_tile_ != QuantKernelSetTile(*kernels.quantized)) {
      throw std::invalid_argument("the quantized weights were repacked with tiles of " + std::to_string(quant_tile_) +
                                  " columns; kernel set '" + kernels.quantized->name + "' reads " +
                                  std::to_string(QuantKernelSetTile(*kernels.quantized)));
    }
    kernels.quant_tile = quant_tile_;
  }
  DecoderBatch b;
  b.tokens = a.tokens;
  b.batch = a.batch;
  b.q_starts = Extent<const int64_t>(a.q_starts, a.batch + 1, "q_starts");
  b.kv_starts = Extent<const int64_t>(a.kv_starts, a.batch + 1, "kv_starts");
  if (b.kv_starts[a.batch] != static_cast<int64_t>(a.kv_slots.elements)) {
    throw std::invalid_argument("kv_starts ends at " + std::to_string(b.kv_starts[a.batch]) + " but kv_slots has " +
                                std::to_string(a.kv_slots.elements));
  }
  b.kv_slots = Extent<const int64_t>(a.kv_slots, a.kv_slots.elements, "kv_slots");
  b.write_slots = Extent<const int64_t>(a.write_slots, a.tokens, "write_slots");
  const size_t rope = CheckedProduct("cos", a.tokens, a.rotary_dim ? a.rotary_dim : s.head_dim);
  b.cos = Extent<const uint16_t>(a.cos, rope, "cos");
  b.sin = Extent<const uint16_t>(a.sin, rope, "sin");
  if (s.deltanet.nk != 0) {
    b.state_slots = Extent<const int64_t>(a.state_slots, a.batch, "state_slots");
    if (!a.state_read_slots.empty()) b.state_read_slots = Extent<const int64_t>(a.state_read_slots, a.batch,
                                                                                "state_read_slots");
  }
  const size_t activations = CheckedProduct("h", a.tokens, s.hidden);
  const uint16_t* h = Extent<const uint16_t>(a.h, activations, "h");
  uint16_t* h_out = Extent<uint16_t>(a.h_out, activations, "h_out");
  uint16_t* residual_out = Extent<uint16_t>(a.residual_out, activations, "residual_out");
  DecoderHead head;
  if (a.project_head) {
    head.weight = head_;
    head.vocab = vocab_;
    size_t m = a.tokens;
    if (!a.head_rows.empty()) {
      head.rows = Extent<const int64_t>(a.head_rows, a.head_rows.elements, "head_rows");
      head.n_rows = m = a.head_rows.elements;
    }
    head.logits = Extent<uint16_t>(a.logits, CheckedProduct("logits", m, vocab_), "logits");
  }
  DecoderLayers(kernels, layers_.data(), layers_.size(), s, b, h, h_out, residual_out, final_norm_,
                a.project_head ? &head : nullptr, a.num_threads ? a.num_threads : 1);
}

}  // namespace rvascend
