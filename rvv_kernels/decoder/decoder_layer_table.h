// A decoder layer, defined once: its kinds, its four projections and every other
// buffer it may carry. The layer's weights (DecoderLayerWeights), the caller's
// description of them (LayerDesc), their checks against the shape (DecoderModel)
// and the Python binding's fields all expand these lists, so a field is added or
// renamed here and nowhere else.
//
// A new layer kind: a line in RVASCEND_LAYER_KINDS, its buffers below, its entry in
// decoder_layers.cc's kind table (stages, widths, mixer), and the Python layer's
// describe() with what fused_decoder.py hands over for it.
#ifndef RVV_KERNELS_DECODER_DECODER_LAYER_TABLE_H_
#define RVV_KERNELS_DECODER_DECODER_LAYER_TABLE_H_

// X(enumerator, name): LayerKind's values in order, and their Python names.
#define RVASCEND_LAYER_KINDS(X)       \
  X(kAttention, attention)            \
  X(kGatedAttention, gated_attention) \
  X(kDeltaNet, deltanet)

// X(field, N, K): the projections every kind has, N and K over `s` (the
// DecoderShape) and `kind`. qkv is [q | k | v] rows ([q0 g0 q1 g1 ... | k | v] head by
// head with an output gate), or a DeltaNet layer's in_proj [qkv | z | b | a]; o is
// o_proj or out_proj; gate_up is [gate | up].
#define RVASCEND_LAYER_PROJECTIONS(X)                     \
  X(qkv, LayerKindOf(kind).input_width(s), s.hidden)      \
  X(o, s.hidden, LayerKindOf(kind).output_width(s))       \
  X(gate_up, 2 * s.intermediate, s.hidden)                \
  X(down, s.hidden, s.intermediate)

// X(field, element type, kinds, need, elements): the other buffers. `kinds` is a
// mask of the kinds that carry the buffer (a layer of another kind must leave it
// empty); `need` is kRequired, or kOptional where an empty buffer means "none"; the
// element count is over `s`, `dn` (s.deltanet) and `field_name` (the error's name).
// BF16 but the delta rule's FP32 state; the pools and states are indexed by slot.
#define RVASCEND_LAYER_BUFFERS(X)                                                                           \
  X(input_norm, const uint16_t, kAnyLayer, kRequired, s.hidden)                                             \
  X(post_attention_norm, const uint16_t, kAnyLayer, kRequired, s.hidden)                                    \
  X(q_norm, const uint16_t, kAttentionLayers, kOptional, s.head_dim) /* q/k norms: both or neither */      \
  X(k_norm, const uint16_t, kAttentionLayers, kOptional, s.head_dim)                                        \
  X(k_pool, uint16_t, kAttentionLayers, kRequired,                                                          \
    CheckedProduct(field_name, s.num_slots, s.kv_heads, s.head_dim))                                        \
  X(v_pool, uint16_t, kAttentionLayers, kRequired,                                                          \
    CheckedProduct(field_name, s.num_slots, s.kv_heads, s.head_dim))                                        \
  X(conv_weight, const uint16_t, kDeltaNetLayers, kRequired, CheckedProduct(field_name, dn.conv_dim(),      \
                                                                            dn.kernel))                     \
  X(a_log, const uint16_t, kDeltaNetLayers, kRequired, dn.nv)                                               \
  X(dt_bias, const uint16_t, kDeltaNetLayers, kRequired, dn.nv)                                             \
  X(deltanet_norm, const uint16_t, kDeltaNetLayers, kRequired, dn.dv) /* the gated RMSNorm's (plain) */    \
  X(conv_state, uint16_t, kDeltaNetLayers, kRequired,                                                       \
    CheckedProduct(field_name, dn.num_slots, dn.conv_dim(), dn.kernel - 1))                                 \
  X(ssm_state, float, kDeltaNetLayers, kRequired, CheckedProduct(field_name, dn.num_slots, dn.nv, dn.dv, dn.dk))

#endif  // RVV_KERNELS_DECODER_DECODER_LAYER_TABLE_H_
