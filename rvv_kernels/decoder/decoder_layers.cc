#include "rvv_kernels/decoder/decoder_layers.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "rvv_kernels/recurrent_gated_delta_rule/deltanet_decode.h"
#include "rvv_kernels/attention/kv_pool_attention.h"
#include "rvv_kernels/elementwise/elementwise.h"
#include "rvv_kernels/linear/bf16_packed_kernel_sets.h"
#include "rvv_kernels/linear/packed_linear.h"
#include "rvv_kernels/quantized/quantized_linear.h"

namespace rvascend {

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
rgdr::DeltaNetDecodeArgs DeltaNetArgs(const DecoderShape& s, const DecoderBatch& batch, const DecoderLayerWeights& w,
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
  a.norm_weight = w.deltanet_norm;
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

}  // namespace

// A step's state of the layers loop that the mixers share: the batch, the scratch
// rows, and the stage marker.
struct MixerStep {
  const DecoderKernels& kernels;
  const DecoderShape& s;
  const DecoderBatch& batch;
  size_t t, num_threads;
  const uint16_t* x;  // the normed layer input [t, hidden]
  uint16_t *qkv = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr, *mixed = nullptr;
  KvPoolAttentionArgs attention = {};  // per layer only the pools change
  RopeHeads q_heads = {}, k_heads = {};  // per layer only the norm weights and the query's stride change
  int stage = 0;

  void Mark() {
    if (kernels.stage_marker != nullptr) kernels.stage_marker(stage);
    ++stage;
  }
};

namespace {

const uint16_t* AttentionMix(MixerStep& m, const DecoderLayerWeights& w, bool gate) {
  const DecoderShape& s = m.s;
  const size_t d = s.head_dim, q_n = s.heads * d, kv_n = s.kv_heads * d, t = m.t;
  const size_t n = (gate ? 2 * q_n : q_n) + 2 * kv_n;
  const ElementwiseKernels& ew = *m.kernels.elementwise;
  Project(m.kernels, w.qkv, n, s.hidden, m.x, t, m.qkv, m.num_threads);
  m.Mark();
  m.q_heads.norm_weight = w.q_norm;
  m.q_heads.stride = gate ? 2 * d : d;
  m.k_heads.norm_weight = w.k_norm;
  const uint16_t* k_in = m.qkv + n - 2 * kv_n;
  RopeRows(ew, t, m.q_heads, m.qkv, n, m.batch.cos, m.batch.sin, m.q, m.num_threads);
  RopeRows(ew, t, m.k_heads, k_in, n, m.batch.cos, m.batch.sin, m.k, m.num_threads);
  m.Mark();
  for (size_t i = 0; i < t; ++i) std::memcpy(m.v + i * kv_n, k_in + i * n + kv_n, kv_n * sizeof(uint16_t));
  WriteKvPool(w.k_pool, s.num_slots, kv_n, m.k, m.batch.write_slots, t);
  WriteKvPool(w.v_pool, s.num_slots, kv_n, m.v, m.batch.write_slots, t);
  m.attention.k_pool = w.k_pool;
  m.attention.v_pool = w.v_pool;
  KvPoolAttention(m.attention, m.num_threads, m.kernels.attention);
  if (!gate) return m.attn;
  m.Mark();
  SigmoidMulRows(ew, t, s.heads, d, m.attn, q_n, m.qkv + d, n, 2 * d, m.mixed, m.num_threads);
  return m.mixed;
}

const uint16_t* DeltaNetMix(MixerStep& m, const DecoderLayerWeights& w) {
  Project(m.kernels, w.qkv, m.s.deltanet.in_proj_n(), m.s.hidden, m.x, m.t, m.qkv, m.num_threads);
  m.Mark();
  rgdr::DeltaNetDecodeCpu(DeltaNetArgs(m.s, m.batch, w, m.qkv, m.mixed), m.num_threads);
  return m.mixed;
}

size_t AttentionInputWidth(const DecoderShape& s) { return (s.heads + 2 * s.kv_heads) * s.head_dim; }
size_t GatedAttentionInputWidth(const DecoderShape& s) { return 2 * (s.heads + s.kv_heads) * s.head_dim; }
size_t AttentionOutputWidth(const DecoderShape& s) { return s.heads * s.head_dim; }
size_t DeltaNetInputWidth(const DecoderShape& s) { return s.deltanet.in_proj_n(); }
size_t DeltaNetOutputWidth(const DecoderShape& s) { return s.deltanet.nv * s.deltanet.dv; }

void NoShapeCheck(const DecoderShape&) {}
void NoBatchCheck(const DecoderShape&, const DecoderBatch&, const DecoderLayerWeights&) {}

void CheckDeltaNetShape(const DecoderShape& s) {
  const DeltaNetShape& dn = s.deltanet;
  if (dn.nk == 0 || dn.nv % dn.nk || dn.dk == 0 || dn.dv == 0 || dn.kernel < 2) {
    throw std::invalid_argument("shape.deltanet: NV must be a multiple of NK >= 1, Dk and Dv positive, 2+ conv taps");
  }
}

// A DeltaNet layer's step decodes one token per sequence from its state slot;
// checked before the first layer writes (the slots as the step itself checks them).
void CheckDeltaNetBatch(const DecoderShape& shape, const DecoderBatch& batch, const DecoderLayerWeights& w) {
  for (size_t b = 0; b < batch.batch; ++b) {
    if (batch.q_starts[b + 1] - batch.q_starts[b] != 1) {
      throw std::invalid_argument("sequence " + std::to_string(b) + " has " +
                                  std::to_string(batch.q_starts[b + 1] - batch.q_starts[b]) +
                                  " tokens; a step through DeltaNet layers decodes one per sequence");
    }
  }
  rgdr::ValidateDeltaNetDecode(DeltaNetArgs(shape, batch, w, nullptr, nullptr));
}

// LayerKind's entries, in its order.
const LayerKindInfo kLayerKinds[] = {
    {{"rms_norm", "qkv_proj", "qk_norm_rope", "attention", "o_proj", "rms_norm", "gate_up_proj", "silu_mul",
      "down_proj"},
     AttentionInputWidth, AttentionOutputWidth, NoShapeCheck, NoBatchCheck,
     [](MixerStep& m, const DecoderLayerWeights& w) { return AttentionMix(m, w, false); }},
    {{"rms_norm", "qkv_proj", "qk_norm_rope", "attention", "output_gate", "o_proj", "rms_norm", "gate_up_proj",
      "silu_mul", "down_proj"},
     GatedAttentionInputWidth, AttentionOutputWidth, NoShapeCheck, NoBatchCheck,
     [](MixerStep& m, const DecoderLayerWeights& w) { return AttentionMix(m, w, true); }},
    {{"rms_norm", "in_proj", "deltanet", "out_proj", "rms_norm", "gate_up_proj", "silu_mul", "down_proj"},
     DeltaNetInputWidth, DeltaNetOutputWidth, CheckDeltaNetShape, CheckDeltaNetBatch, DeltaNetMix},
};
static_assert(sizeof(kLayerKinds) / sizeof(kLayerKinds[0]) == kNumLayerKinds, "one entry per LayerKind");

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

const LayerKindInfo& LayerKindOf(LayerKind kind) {
  const int i = static_cast<int>(kind);
  if (i < 0 || i >= kNumLayerKinds) throw std::invalid_argument("unknown layer kind " + std::to_string(i));
  return kLayerKinds[i];
}

const char* LayerKindName(LayerKind kind) {
  static const char* const kNames[] = {
#define RVASCEND_KIND_NAME(enumerator, name) #name,
      RVASCEND_LAYER_KINDS(RVASCEND_KIND_NAME)
#undef RVASCEND_KIND_NAME
  };
  LayerKindOf(kind);  // the range check
  return kNames[static_cast<int>(kind)];
}

void DecoderLayers(const DecoderKernels& kernels, const DecoderLayerWeights* layers, size_t n_layers,
                   const DecoderShape& s, const DecoderBatch& batch, const uint16_t* h, uint16_t* h_out,
                   uint16_t* residual_out, const uint16_t* final_norm, const DecoderHead* head,
                   size_t num_threads) {
  if (n_layers == 0) throw std::invalid_argument("decoder_layers: no layers");
  ValidateDecoderBatch(s, batch);
  if (head != nullptr) ValidateHead(*head, final_norm, batch.tokens);
  // Each kind present checks the batch once (any one layer: the checks read the batch's slots),
  // and sizes the scratch its mixer reads and writes.
  const DecoderLayerWeights* first_of_kind[kNumLayerKinds] = {};
  size_t in_n = 0, mixed_n = 0;
  for (size_t l = 0; l < n_layers; ++l) {
    const LayerKindInfo& info = LayerKindOf(layers[l].kind);
    const DecoderLayerWeights*& first = first_of_kind[static_cast<int>(layers[l].kind)];
    if (first != nullptr) continue;
    first = &layers[l];
    info.check_batch(s, batch, layers[l]);
    in_n = std::max(in_n, info.input_width(s));
    mixed_n = std::max(mixed_n, info.output_width(s));
  }
  const size_t t = batch.tokens;
  if (t == 0) return;
  const ElementwiseKernels& ew = *kernels.elementwise;
  const size_t d = s.head_dim, q_n = s.heads * d, kv_n = s.kv_heads * d;
  Scratch& sc = Scratch::ThisThread();
  uint16_t* x = Rows(sc.x, t, s.hidden);
  uint16_t* res_tmp = Rows(sc.residual, t, s.hidden);
  MixerStep m{kernels, s, batch, t, num_threads, x};
  m.qkv = Rows(sc.qkv, t, in_n);
  m.q = Rows(sc.q, t, q_n);
  m.k = Rows(sc.k, t, kv_n);
  m.v = Rows(sc.v, t, kv_n);
  m.attn = Rows(sc.attn, t, q_n);
  m.mixed = Rows(sc.mixed, t, mixed_n);  // the o/out_proj input
  uint16_t* o = Rows(sc.o, t, s.hidden);
  uint16_t* gate_up = Rows(sc.gate_up, t, 2 * s.intermediate);
  uint16_t* act = Rows(sc.act, t, s.intermediate);
  // The stream and the layer output alternate between the caller's buffers and
  // scratch; the last layer's land in residual_out and h_out.
  uint16_t* res = residual_out;
  const size_t bytes = t * s.hidden * sizeof(uint16_t);
  const uint16_t* layer_in = h;
  m.attention = AttentionArgs(s, batch);
  m.attention.q = m.q;
  m.attention.q_stride = q_n;
  m.attention.out = m.attn;
  m.attention.out_stride = q_n;
  m.q_heads.heads = s.heads;
  m.k_heads.heads = s.kv_heads;
  for (RopeHeads* r : {&m.q_heads, &m.k_heads}) {
    r->d = r->stride = d;
    r->rotary_dim = s.rotary_dim ? s.rotary_dim : d;
    r->eps = s.qk_norm_eps;
    r->zero_centred = s.zero_centred;
  }
  for (size_t l = 0; l < n_layers; ++l) {
    const DecoderLayerWeights& w = layers[l];
    const LayerKindInfo& info = LayerKindOf(w.kind);
    m.stage = 0;
    m.Mark();
    if (l == 0) {  // the stream starts as the first layer's input
      RmsNormRows(ew, t, s.hidden, layer_in, s.hidden, nullptr, 0, w.input_norm, s.norm_eps, s.zero_centred, x,
                  nullptr, num_threads);
      std::memcpy(res, layer_in, bytes);
    } else {
      RmsNormRows(ew, t, s.hidden, layer_in, s.hidden, res, s.hidden, w.input_norm, s.norm_eps, s.zero_centred, x,
                  res_tmp, num_threads);
      std::swap(res, res_tmp);
    }
    m.Mark();
    const uint16_t* o_in = info.mix(m, w);
    m.Mark();
    Project(kernels, w.o, s.hidden, info.output_width(s), o_in, t, o, num_threads);
    m.Mark();
    RmsNormRows(ew, t, s.hidden, o, s.hidden, res, s.hidden, w.post_attention_norm, s.norm_eps, s.zero_centred, x,
                res_tmp, num_threads);
    std::swap(res, res_tmp);
    m.Mark();
    Project(kernels, w.gate_up, 2 * s.intermediate, s.hidden, x, t, gate_up, num_threads);
    m.Mark();
    SiluMulRows(ew, t, s.intermediate, gate_up, 2 * s.intermediate, act, num_threads);
    m.Mark();
    Project(kernels, w.down, s.hidden, s.intermediate, act, t, h_out, num_threads);
    layer_in = h_out;
  }
  m.stage = 0;
  m.Mark();
  if (final_norm != nullptr) {
    // Into scratch, then back: the norm's input and output may not alias.
    RmsNormRows(ew, t, s.hidden, h_out, s.hidden, res, s.hidden, final_norm, s.norm_eps, s.zero_centred, x,
                res_tmp, num_threads);
    std::swap(res, res_tmp);
    std::memcpy(h_out, x, bytes);
    m.Mark();
    if (head != nullptr) {
      const uint16_t* in = x;
      size_t rows = t;
      if (head->rows != nullptr) {  // gathered into the attention scratch, free by now
        uint16_t* gathered = Rows(sc.attn, head->n_rows, s.hidden);
        for (size_t i = 0; i < head->n_rows; ++i) {
          std::memcpy(gathered + i * s.hidden, x + static_cast<size_t>(head->rows[i]) * s.hidden,
                      s.hidden * sizeof(uint16_t));
        }
        in = gathered;
        rows = head->n_rows;
      }
      if (rows != 0) Project(kernels, head->weight, head->vocab, s.hidden, in, rows, head->logits, num_threads);
      m.Mark();
    }
  }
  if (res != residual_out) std::memcpy(residual_out, res, bytes);
}

}  // namespace rvascend
