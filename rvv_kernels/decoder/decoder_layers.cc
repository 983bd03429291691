#include "rvv_kernels/decoder/decoder_layers.h"

#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "rvv_kernels/attention/kv_pool_attention.h"
#include "rvv_kernels/elementwise/elementwise.h"
#include "rvv_kernels/linear/bf16_packed_kernel_sets.h"
#include "rvv_kernels/linear/packed_linear.h"
#include "rvv_kernels/quantized/quantized_linear.h"

namespace rvascend {

const char* const kDecoderStageNames[kDecoderStages] = {
    "rms_norm", "qkv_proj", "qk_norm_rope", "attention", "o_proj", "rms_norm", "gate_up_proj", "silu_mul",
    "down_proj"};

namespace {

// [rows, cols] BF16 scratch, grown once and reused by every step of this thread.
struct Scratch {
  std::vector<uint16_t> x, residual, qkv, q, k, v, attn, o, gate_up, act;
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

}  // namespace

void DecoderLayers(const DecoderKernels& kernels, const DecoderLayerWeights* layers, size_t n_layers,
                   const DecoderShape& s, const DecoderBatch& batch, const uint16_t* h, uint16_t* h_out,
                   uint16_t* residual_out, size_t num_threads) {
  if (n_layers == 0) throw std::invalid_argument("decoder_layers: no layers");
  ValidateDecoderBatch(s, batch);
  const size_t t = batch.tokens;
  if (t == 0) return;
  const ElementwiseKernels& ew = *kernels.elementwise;
  const size_t d = s.head_dim, q_n = s.heads * d, kv_n = s.kv_heads * d, qkv_n = q_n + 2 * kv_n;
  Scratch& sc = Scratch::ThisThread();
  uint16_t* x = Rows(sc.x, t, s.hidden);
  uint16_t* res_tmp = Rows(sc.residual, t, s.hidden);
  uint16_t* qkv = Rows(sc.qkv, t, qkv_n);
  uint16_t* q = Rows(sc.q, t, q_n);
  uint16_t* k = Rows(sc.k, t, kv_n);
  uint16_t* v = Rows(sc.v, t, kv_n);
  uint16_t* attn = Rows(sc.attn, t, q_n);
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
  RopeHeads q_heads, k_heads;  // per layer only the norm weights change
  q_heads.heads = s.heads;
  k_heads.heads = s.kv_heads;
  for (RopeHeads* r : {&q_heads, &k_heads}) {
    r->d = r->stride = r->rotary_dim = d;
    r->eps = s.qk_norm_eps;
  }
  auto mark = [&](int stage) {
    if (kernels.stage_marker != nullptr) kernels.stage_marker(stage);
  };
  for (size_t l = 0; l < n_layers; ++l) {
    const DecoderLayerWeights& w = layers[l];
    mark(0);
    if (l == 0) {  // the stream starts as the first layer's input
      RmsNormRows(ew, t, s.hidden, layer_in, s.hidden, nullptr, 0, w.input_norm, s.norm_eps, false, x, nullptr,
                  num_threads);
      std::memcpy(res, layer_in, bytes);
    } else {
      RmsNormRows(ew, t, s.hidden, layer_in, s.hidden, res, s.hidden, w.input_norm, s.norm_eps, false, x, res_tmp,
                  num_threads);
      std::swap(res, res_tmp);
    }
    mark(1);
    Project(kernels, w.qkv, qkv_n, s.hidden, x, t, qkv, num_threads);
    mark(2);
    q_heads.norm_weight = w.q_norm;
    k_heads.norm_weight = w.k_norm;
    RopeRows(ew, t, q_heads, qkv, qkv_n, batch.cos, batch.sin, q, num_threads);
    RopeRows(ew, t, k_heads, qkv + q_n, qkv_n, batch.cos, batch.sin, k, num_threads);
    mark(3);
    for (size_t i = 0; i < t; ++i) std::memcpy(v + i * kv_n, qkv + i * qkv_n + q_n + kv_n, kv_n * sizeof(uint16_t));
    WriteKvPool(w.k_pool, s.num_slots, kv_n, k, batch.write_slots, t);
    WriteKvPool(w.v_pool, s.num_slots, kv_n, v, batch.write_slots, t);
    attention.k_pool = w.k_pool;
    attention.v_pool = w.v_pool;
    KvPoolAttention(attention, num_threads, kernels.attention);
    mark(4);
    Project(kernels, w.o, s.hidden, q_n, attn, t, o, num_threads);
    mark(5);
    RmsNormRows(ew, t, s.hidden, o, s.hidden, res, s.hidden, w.post_attention_norm, s.norm_eps, false, x, res_tmp,
                num_threads);
    std::swap(res, res_tmp);
    mark(6);
    Project(kernels, w.gate_up, 2 * s.intermediate, s.hidden, x, t, gate_up, num_threads);
    mark(7);
    SiluMulRows(ew, t, s.intermediate, gate_up, 2 * s.intermediate, act, num_threads);
    mark(8);
    Project(kernels, w.down, s.hidden, s.intermediate, act, t, h_out, num_threads);
    layer_in = h_out;
  }
  mark(0);
  if (res != residual_out) std::memcpy(residual_out, res, bytes);
}

}  // namespace rvascend
