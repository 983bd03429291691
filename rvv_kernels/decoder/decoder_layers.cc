#include "rvv_kernels/decoder/decoder_layers.h"

#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cpu/deltanet_decode.h"
#include "rvv_kernels/attention/kv_pool_attention.h"
#include "rvv_kernels/elementwise/elementwise.h"
#include "rvv_kernels/linear/bf16_packed_kernel_sets.h"
#include "rvv_kernels/linear/packed_linear.h"
#include "rvv_kernels/quantized/quantized_linear.h"

namespace rvascend {

const std::vector<std::string>& DecoderStageNames(LayerKind kind) {
  static const std::vector<std::string> kAttention = {
      "rms_norm", "qkv_proj", "qk_norm_rope", "attention", "o_proj", "rms_norm", "gate_up_proj", "silu_mul",
      "down_proj"};
  static const std::vector<std::string> kGated = {
      "rms_norm", "qkv_proj", "qk_norm_rope", "attention", "output_gate", "o_proj", "rms_norm", "gate_up_proj",
      "silu_mul", "down_proj"};
  static const std::vector<std::string> kDeltaNet = {
      "rms_norm", "in_proj", "deltanet", "out_proj", "rms_norm", "gate_up_proj", "silu_mul", "down_proj"};
  switch (kind) {
    case LayerKind::kAttention: return kAttention;
    case LayerKind::kGatedAttention: return kGated;
    case LayerKind::kDeltaNet: return kDeltaNet;
  }
  throw std::invalid_argument("unknown decoder layer kind " + std::to_string(static_cast<int>(kind)));
}

namespace {

// [rows, cols] BF16 scratch, grown once and reused by every step of this thread.
struct Scratch {
  std::vector<uint16_t> x, residual, qkv, q, k, v, attn, mixed, o, gate_up, act;
  static Scratch& ThisThread() {
    thread_local Scratch s;
    return s;
  }
};

uint16_t* Rows(std::vector<uint16_t>& buffer, size_t rows, size_t cols) {
  if (buffer.size() < rows * cols) buffer.resize(rows * cols);
  return buffer.data();
}

void Project(const DecoderKernels& kernels, const ProjectionWeight& w, size_t n, size_t k, const uint16_t* x,
             size_t m, uint16_t* out, size_t num_threads) {
  if (w.bf16 != nullptr) {
    PackedLinearArgs args;
    args.m = m;
    args.n = n;
    args.k = k;
    args.input = x;
    args.input_stride = k;
    args.packed = w.bf16;
    args.block_n = KernelSetBlockN(*kernels.linear);
    args.output = out;
    args.output_stride = n;
    PackedBf16Linear(*kernels.linear, args, num_threads);
    return;
  }
  size_t offset = 0;
  for (size_t i = 0; i < w.n_parts; ++i) {
    QuantizedLinearArgs args;
    args.format = w.parts[i].format;
    args.m = m;
    args.n = w.parts[i].rows;
    args.k = k;
    args.input = x;
    args.input_stride = k;
    args.weight = w.parts[i].data;
    args.tile = kernels.quant_tile;
    args.output = out + offset;
    args.output_stride = n;
    QuantizedLinear(*kernels.quantized, args, num_threads);
    offset += w.parts[i].rows;
  }
}

// The attention arguments of a step; q and out are set per call.
KvPoolAttentionArgs AttentionArgs(const DecoderShape& shape, const DecoderBatch& batch) {
  KvPoolAttentionArgs a;
  a.batch = batch.batch;
  a.q_starts = batch.q_starts;
  a.kv_starts = batch.kv_starts;
  a.kv_slots = batch.kv_slots;
  a.heads = shape.heads;
  a.kv_heads = shape.kv_heads;
  a.head_dim = shape.head_dim;
  a.num_slots = shape.num_slots;
  a.scale = shape.scale;
  return a;
}

// Everything the step will index, checked once before the first write.
void ValidateDecoderBatch(const DecoderShape& shape, const DecoderBatch& batch) {
  const KvPoolAttentionArgs a = AttentionArgs(shape, batch);
  if (batch.q_starts[batch.batch] != static_cast<int64_t>(batch.tokens)) {
    throw std::invalid_argument("q_starts ends at " + std::to_string(batch.q_starts[batch.batch]) + " but the step has " +
                                std::to_string(batch.tokens) + " tokens");
  }
  ValidateKvPoolAttention(a);
  ValidateWriteSlots(shape.num_slots, batch.write_slots, batch.tokens);
}

// The conv + delta-rule step's arguments for one DeltaNet layer, from its in_proj
// rows [qkv | z | b | a] (in_n apart) to the out_proj input [tokens, NV Dv].
rgdr::DeltaNetDecodeArgs DeltaNetArgs(const DecoderShape& s, const DecoderBatch& batch, const DeltaNetLayerWeights& w,
                                      const uint16_t* in, uint16_t* out) {
  const DeltaNetShape& g = s.deltanet;
  const size_t c = g.conv_dim(), in_n = g.in_proj_n(), value = g.nv * g.dv;
  rgdr::DeltaNetDecodeArgs a;
  a.elem = rgdr::Elem::kBFloat16;
  a.t = static_cast<uint32_t>(batch.tokens);
  a.sequences = static_cast<uint32_t>(batch.batch);
  a.nk = static_cast<uint32_t>(g.nk);
  a.nv = static_cast<uint32_t>(g.nv);
  a.dk = static_cast<uint32_t>(g.dk);
  a.dv = static_cast<uint32_t>(g.dv);
  a.kernel = static_cast<uint32_t>(g.kernel);
  a.num_slots = static_cast<uint32_t>(g.num_slots);
  a.mixed = in;
  a.mixed_stride = in_n;
  a.z = in + c;
  a.z_stride = in_n;
  a.b = in + c + value;
  a.a = in + c + value + g.nv;
  a.gate_stride = in_n;
  a.norm_weight = w.norm_weight;
  a.norm_eps = g.norm_eps;
  a.conv_state = w.conv_state;
  a.conv_weight = w.conv_weight;
  a.a_log = w.a_log;
  a.dt_bias = w.dt_bias;
  a.ssm_state = w.ssm_state;
  a.slots = batch.state_slots;
  a.read_slots = batch.state_read_slots;
  a.out = out;
  return a;
}

// A DeltaNet layer's step decodes one token per sequence from its state slot;
// checked here (the slots as the step itself checks them) so that a bad one stops
// the step before the first layer writes.
void ValidateStateSlots(const DecoderShape& shape, const DecoderBatch& batch, const DeltaNetLayerWeights& w) {
  for (size_t b = 0; b < batch.batch; ++b) {
    if (batch.q_starts[b + 1] - batch.q_starts[b] != 1) {
      throw std::invalid_argument("sequence " + std::to_string(b) + " has " +
                                  std::to_string(batch.q_starts[b + 1] - batch.q_starts[b]) +
                                  " tokens; a step through DeltaNet layers decodes one per sequence");
    }
  }
  rgdr::ValidateDeltaNetDecode(DeltaNetArgs(shape, batch, w, nullptr, nullptr));
}

void ValidateHead(const DecoderHead& head, const uint16_t* final_norm, size_t tokens) {
  if (final_norm == nullptr) throw std::invalid_argument("the head projects the final norm's rows: no final_norm");
  if (head.rows == nullptr) return;
  for (size_t i = 0; i < head.n_rows; ++i) {
    if (head.rows[i] < 0 || static_cast<size_t>(head.rows[i]) >= tokens) {
      throw std::invalid_argument("head row " + std::to_string(i) + " is " + std::to_string(head.rows[i]) +
                                  ", outside the step's " + std::to_string(tokens) + " rows");
    }
  }
}

}  // namespace

void DecoderLayers(const DecoderKernels& kernels, const DecoderLayerWeights* layers, size_t n_layers,
                   const DecoderShape& s, const DecoderBatch& batch, const uint16_t* h, uint16_t* h_out,
                   uint16_t* residual_out, const uint16_t* final_norm, const DecoderHead* head,
                   size_t num_threads) {
  if (n_layers == 0) throw std::invalid_argument("decoder_layers: no layers");
  ValidateDecoderBatch(s, batch);
  if (head != nullptr) ValidateHead(*head, final_norm, batch.tokens);
  const DecoderLayerWeights* a_deltanet = nullptr;  // any one: the check reads the batch's slots
  bool gated = false;
  for (size_t l = 0; l < n_layers; ++l) {
    if (layers[l].kind == LayerKind::kDeltaNet) a_deltanet = &layers[l];
    gated |= layers[l].kind == LayerKind::kGatedAttention;
  }
  const bool deltanet = a_deltanet != nullptr;
  if (deltanet) ValidateStateSlots(s, batch, a_deltanet->deltanet);
  const size_t t = batch.tokens;
  if (t == 0) return;
  const ElementwiseKernels& ew = *kernels.elementwise;
  const size_t d = s.head_dim, q_n = s.heads * d, kv_n = s.kv_heads * d;
  // With an output gate the projection's query part holds each head's query and gate.
  const size_t q_part = gated ? 2 * q_n : q_n, qkv_n = q_part + 2 * kv_n;
  const size_t in_n = deltanet ? s.deltanet.in_proj_n() : 0, value_n = s.deltanet.nv * s.deltanet.dv;
  Scratch& sc = Scratch::ThisThread();
  uint16_t* x = Rows(sc.x, t, s.hidden);
  uint16_t* res_tmp = Rows(sc.residual, t, s.hidden);
  uint16_t* qkv = Rows(sc.qkv, t, qkv_n > in_n ? qkv_n : in_n);
  uint16_t* q = Rows(sc.q, t, q_n);
  uint16_t* k = Rows(sc.k, t, kv_n);
  uint16_t* v = Rows(sc.v, t, kv_n);
  uint16_t* attn = Rows(sc.attn, t, q_n);
  uint16_t* mixed = Rows(sc.mixed, t, q_n > value_n ? q_n : value_n);  // the o/out_proj input
  uint16_t* o = Rows(sc.o, t, s.hidden);
  uint16_t* gate_up = Rows(sc.gate_up, t, 2 * s.intermediate);
  uint16_t* act = Rows(sc.act, t, s.intermediate);
  // The stream and the layer output alternate between the caller's buffers and
  // scratch; the last layer's land in residual_out and h_out.
  uint16_t* res = residual_out;
  const size_t bytes = t * s.hidden * sizeof(uint16_t);
  const uint16_t* layer_in = h;
  KvPoolAttentionArgs attention = AttentionArgs(s, batch);
  attention.q = q;
  attention.q_stride = q_n;
  attention.out = attn;
  attention.out_stride = q_n;
  RopeHeads q_heads, k_heads;  // per layer only the norm weights and the query's stride change
  q_heads.heads = s.heads;
  k_heads.heads = s.kv_heads;
  for (RopeHeads* r : {&q_heads, &k_heads}) {
    r->d = r->stride = d;
    r->rotary_dim = s.rotary_dim ? s.rotary_dim : d;
    r->eps = s.qk_norm_eps;
    r->zero_centred = s.zero_centred;
  }
  int stage = 0;
  auto mark = [&]() {
    if (kernels.stage_marker != nullptr) kernels.stage_marker(stage);
    ++stage;
  };
  for (size_t l = 0; l < n_layers; ++l) {
    const DecoderLayerWeights& w = layers[l];
    stage = 0;
    mark();
    if (l == 0) {  // the stream starts as the first layer's input
      RmsNormRows(ew, t, s.hidden, layer_in, s.hidden, nullptr, 0, w.input_norm, s.norm_eps, s.zero_centred, x,
                  nullptr, num_threads);
      std::memcpy(res, layer_in, bytes);
    } else {
      RmsNormRows(ew, t, s.hidden, layer_in, s.hidden, res, s.hidden, w.input_norm, s.norm_eps, s.zero_centred, x,
                  res_tmp, num_threads);
      std::swap(res, res_tmp);
    }
    mark();
    const uint16_t* o_in = attn;
    size_t o_k = q_n;
    if (w.kind == LayerKind::kDeltaNet) {
      Project(kernels, w.qkv, in_n, s.hidden, x, t, qkv, num_threads);
      mark();
      rgdr::DeltaNetDecodeCpu(DeltaNetArgs(s, batch, w.deltanet, qkv, mixed), num_threads);
      o_in = mixed;
      o_k = value_n;
    } else {
      const bool gate = w.kind == LayerKind::kGatedAttention;
      const size_t n = (gate ? 2 * q_n : q_n) + 2 * kv_n;
      Project(kernels, w.qkv, n, s.hidden, x, t, qkv, num_threads);
      mark();
      q_heads.norm_weight = w.q_norm;
      q_heads.stride = gate ? 2 * d : d;
      k_heads.norm_weight = w.k_norm;
      const uint16_t* k_in = qkv + n - 2 * kv_n;
      RopeRows(ew, t, q_heads, qkv, n, batch.cos, batch.sin, q, num_threads);
      RopeRows(ew, t, k_heads, k_in, n, batch.cos, batch.sin, k, num_threads);
      mark();
      for (size_t i = 0; i < t; ++i) std::memcpy(v + i * kv_n, k_in + i * n + kv_n, kv_n * sizeof(uint16_t));
      WriteKvPool(w.k_pool, s.num_slots, kv_n, k, batch.write_slots, t);
      WriteKvPool(w.v_pool, s.num_slots, kv_n, v, batch.write_slots, t);
      attention.k_pool = w.k_pool;
      attention.v_pool = w.v_pool;
      KvPoolAttention(attention, num_threads, kernels.attention);
      if (gate) {
        mark();
        SigmoidMulRows(ew, t, s.heads, d, attn, q_n, qkv + d, n, 2 * d, mixed, num_threads);
        o_in = mixed;
      }
    }
    mark();
    Project(kernels, w.o, s.hidden, o_k, o_in, t, o, num_threads);
    mark();
    RmsNormRows(ew, t, s.hidden, o, s.hidden, res, s.hidden, w.post_attention_norm, s.norm_eps, s.zero_centred, x,
                res_tmp, num_threads);
    std::swap(res, res_tmp);
    mark();
    Project(kernels, w.gate_up, 2 * s.intermediate, s.hidden, x, t, gate_up, num_threads);
    mark();
    SiluMulRows(ew, t, s.intermediate, gate_up, 2 * s.intermediate, act, num_threads);
    mark();
    Project(kernels, w.down, s.hidden, s.intermediate, act, t, h_out, num_threads);
    layer_in = h_out;
  }
  stage = 0;
  mark();
  if (final_norm != nullptr) {
    // Into scratch, then back: the norm's input and output may not alias.
    RmsNormRows(ew, t, s.hidden, h_out, s.hidden, res, s.hidden, final_norm, s.norm_eps, s.zero_centred, x,
                res_tmp, num_threads);
    std::swap(res, res_tmp);
    std::memcpy(h_out, x, bytes);
    mark();
    if (head != nullptr) {
      const uint16_t* in = x;
      size_t m = t;
      if (head->rows != nullptr) {  // gathered into the attention scratch, free by now
        uint16_t* gathered = Rows(sc.attn, head->n_rows, s.hidden);
        for (size_t i = 0; i < head->n_rows; ++i) {
          std::memcpy(gathered + i * s.hidden, x + static_cast<size_t>(head->rows[i]) * s.hidden,
                      s.hidden * sizeof(uint16_t));
        }
        in = gathered;
        m = head->n_rows;
      }
      if (m != 0) Project(kernels, head->weight, head->vocab, s.hidden, in, m, head->logits, num_threads);
      mark();
    }
  }
  if (res != residual_out) std::memcpy(residual_out, res, bytes);
}

}  // namespace rvascend
