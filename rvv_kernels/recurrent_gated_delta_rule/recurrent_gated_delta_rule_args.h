// Arguments of recurrent_gated_delta_rule as raw tensors (shared by the CPU
// implementation and the twin launcher). Shapes follow the op definition:
// query/key [T, NK, Dk], value [T, NV, Dv], beta [T, NV], g [T, NV] (FP32),
// gk [T, NV] or [T, NV, Dk] (FP32), state [S, NV, Dv, Dk], out [T, NV, Dv].
#ifndef RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_RECURRENT_GATED_DELTA_RULE_ARGS_H_
#define RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_RECURRENT_GATED_DELTA_RULE_ARGS_H_

#include <cstdint>

namespace rgdr {

enum class Elem : uint32_t { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };

struct RgdrArgs {
  Elem elem = Elem::kBFloat16;
  uint32_t t = 0, b = 0, nk = 0, nv = 0, dk = 0, dv = 0, num_slots = 0;
  const void* query = nullptr;
  const void* key = nullptr;
  const void* value = nullptr;
  const void* beta = nullptr;
  const float* g = nullptr;             // optional
  const float* gk = nullptr;            // optional
  bool gk_per_dim = false;
  void* state = nullptr;                // read and written
  const void* seq_lens = nullptr;       // [B] per-sample lengths
  bool seq_lens_int64 = false;
  // [T] one slot per token. CPU only: a negative one keeps no state for its token
  // (deltanet_decode's prompt tokens); such a caller passes read_slots.
  const void* indices = nullptr;
  bool indices_int64 = false;
  const int32_t* accepted = nullptr;    // optional [B]
  void* out = nullptr;
  float scale = 1.0f;
  // CPU only, for prompts: a sequence's tokens before its last write no state
  // (its slot's state is read once and the last token's written once), and
  // sequences may be longer than kMaxMtp.
  bool last_state_only = false;
  // CPU only: [B] or null, the slot sequence b's state is read from instead of its
  // first token's (or last accepted token's); the tokens' slots are written as ever.
  // Callers check that no read slot is another sequence's written slot.
  const int64_t* read_slots = nullptr;
};

}  // namespace rgdr

#endif  // RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_RECURRENT_GATED_DELTA_RULE_ARGS_H_
