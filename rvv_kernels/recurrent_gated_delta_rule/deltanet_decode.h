// The step of a Gated DeltaNet layer (Qwen3.5) between its in_proj and its
// out_proj, for B sequences of lens[b] tokens each (one each without lens:
// decode), in one native call; per token, in order within its sequence:
//
//   window = [conv_state[slot] (C x (K - 1)) | mixed[t] (C)]
//   y = round(silu(sum_j window[:, j] * w[:, j]))      (to the model's dtype)
//   conv_state[slot] = window[:, 1:]
//   q = l2norm(y[:NK Dk], per head) / sqrt(Dk), k = l2norm(y[NK Dk:2 NK Dk]), v = y[2 NK Dk:]
//   beta = round(sigmoid(b)), g = -exp(A_log) * softplus(a + dt_bias)
//   o = recurrent_gated_delta_rule(q, k, v, state[slot], beta, g)         (FP32;
//       the slot's state is written once, after the sequence's last token, and
//       after any earlier token that has a token slot)
//   x = round(o), per head: n = round(x * rsqrt(mean(x^2) + eps))
//   out[t] = round(round(norm_weight * n) * silu(z[t]))                  (gated RMSNorm)
//
// with l2norm(x) = x * rsqrt(sum(x^2) + 1e-6) and softplus(x) = x above 20,
// rounding where the PyTorch layer (python/rvascend/models/qwen3_5.py) does.
// Arguments are validated by the caller, except the conv taps, the lengths and
// the slots (ValidateDeltaNetDecode, which DeltaNetDecodeCpu calls first).
#ifndef RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_DELTANET_DECODE_H_
#define RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_DELTANET_DECODE_H_

#include <cstddef>
#include <cstdint>

#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_args.h"

namespace rgdr {

struct DeltaNetDecodeArgs {
  Elem elem = Elem::kBFloat16;  // mixed, b, a, conv_state, conv_weight, a_log, dt_bias
  uint32_t t = 0, sequences = 0, nk = 0, nv = 0, dk = 0, dv = 0, kernel = 0, num_slots = 0;
  const int64_t* lens = nullptr;  // [B] tokens per sequence (in order; they add up to T), or null: one each
  const void* mixed = nullptr;   // [T, C] rows `mixed_stride` elements apart, C = 2 NK Dk + NV Dv
  size_t mixed_stride = 0;
  const void* b = nullptr;       // [T, NV], rows `gate_stride` apart
  const void* a = nullptr;       // [T, NV], rows `gate_stride` apart
  size_t gate_stride = 0;
  const void* z = nullptr;       // [T, NV Dv], rows `z_stride` apart: the output gate
  size_t z_stride = 0;
  const void* norm_weight = nullptr;  // [Dv]
  float norm_eps = 0.0f;
  void* conv_state = nullptr;    // [S, C, K - 1]
  const void* conv_weight = nullptr;  // [C, K]
  const void* a_log = nullptr;   // [NV]
  const void* dt_bias = nullptr; // [NV]
  float* ssm_state = nullptr;    // [S, NV, Dv, Dk]
  const int64_t* slots = nullptr;  // [B], distinct, in [0, S): each sequence's conv and delta-rule slot
  // [B] or null. Null: each sequence's states are read from and written to its slot
  // (in place). Else sequence b's states are read from read_slots[b] and written to
  // slots[b], and read_slots[b] is left as it was: a caller that keeps two slots per
  // sequence can drop a failed step without copying the states to undo it.
  const int64_t* read_slots = nullptr;
  // [T] or null: per token, -1 or a slot its states (its conv window and the delta
  // rule's state after it) are also left in; a sequence's last token has -1 (its
  // states go to its slot). A speculative verify step keeps every drafted position's
  // states this way, so the next step continues from the last accepted token's slot
  // with nothing recomputed and nothing copied.
  const int64_t* token_slots = nullptr;
  void* out = nullptr;           // [T, NV Dv], elem
};

// Throws std::invalid_argument naming the first bad one of: conv taps (>= 2), the
// lengths (none negative, adding up to T; one token each without them), the slots
// (in [0, S), distinct), the token slots (-1 or in [0, S), -1 for a sequence's
// last token, distinct from each other and from every slot), the read slots (in
// [0, S); one that is not its own sequence's slot is no slot or token slot the step
// writes; several sequences may read one slot). Reads nothing but args.lens, args.slots,
// args.token_slots and args.read_slots.
void ValidateDeltaNetDecode(const DeltaNetDecodeArgs& args);

void DeltaNetDecodeCpu(const DeltaNetDecodeArgs& args, size_t num_threads);

}  // namespace rgdr

#endif  // RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_DELTANET_DECODE_H_
