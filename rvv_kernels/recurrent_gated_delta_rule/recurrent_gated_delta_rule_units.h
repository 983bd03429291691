// The CPU op's work split and the per-ISA entry points that run it.
//
// A unit is one (sequence, value head). Rows of the state are independent:
// row v of S only ever meets the token's k, q, value[v], beta and decay. So
// each unit runs rows outermost and tokens innermost: a row is read once from
// the read slot, kept in FP32 through all of the sequence's tokens, and
// written once per token to that token's slot. Per token and row:
//   r *= exp(gk) (per-dimension gk);  kv = r . k
//   d = (value[v] - c * kv) * beta;   r = c * r + d * k;  out[v] = r . q
// with c = exp(g) * exp(gk) for a scalar decay. The rows stay in L1 (FP32
// scratch): one pass for the first token's dot products, then one per token
// for its update, which goes on with the next token's dot products; the state
// crosses memory once each way, so the op runs at memory speed (one read and
// one write of every state row).
#ifndef RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_RECURRENT_GATED_DELTA_RULE_UNITS_H_
#define RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_RECURRENT_GATED_DELTA_RULE_UNITS_H_

#include <cstddef>
#include <cstdint>

#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_args.h"

namespace rgdr {

struct Unit {
  uint32_t h;
  int64_t seq0;
  uint32_t len;
  int64_t read_slot;
};

// The per-token vectors of a unit, prepared once (FP32): q * scale, k, and the
// per-dimension decay when gk is [T, NV, Dk]; the scalar decay and beta.
struct TokenInputs {
  const float* q;
  const float* k;
  const float* egk;  // nullptr unless gk is per dimension
  float c;           // scalar decay (1 with per-dimension gk)
  float beta;
  float kq;          // k . q
  const void* value;  // value[t, h, :] (elem type)
  void* out;          // out[t, h, :]
  void* state_row0;   // state[slot of token t, h, 0, :]; null: this token writes no state
};

// Rows a kernel may hold at once; `row` scratch is kMaxRowsAtOnce * dk floats.
constexpr size_t kMaxRowsAtOnce = 2;

// Runs rows [0, dv) of one unit whose tokens are prepared. `src_row0` is
// state[read_slot, h, 0, :].
using RunRowsFn = void (*)(Elem elem, size_t dk, size_t dv, const void* src_row0, const TokenInputs* tokens,
                           uint32_t len, float* row);

// One token's q * scale and k (`dk` elements of one key head, from element
// `offset` of `query` and `key`) as FP32 into `q` and `k`; returns k . q.
using PrepareFn = float (*)(Elem elem, const void* query, const void* key, size_t offset, size_t dk, float scale,
                            float* q, float* k);

struct RowKernels {
  const char* name;
  RunRowsFn run_rows;
  PrepareFn prepare;
};

// Generic vectors (recurrent_gated_delta_rule_rows_simd.cc), compiled for the baseline ISA and,
// on x86-64, for AVX2, AVX-512 and AVX-512 with BF16.
extern const RowKernels kRowsPortable;
#if defined(RGDR_HAVE_X86_ROWS)
extern const RowKernels kRowsAvx2;
extern const RowKernels kRowsAvx512;
extern const RowKernels kRowsAvx512Bf16;
#endif
#if defined(RVASCEND_HAVE_RVV)
// RVV 1.0 intrinsics, VLEN-agnostic (BF16 and FP32 states; FP16 runs portable).
extern const RowKernels kRowsRvv;
#endif

}  // namespace rgdr

#endif  // RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_RECURRENT_GATED_DELTA_RULE_UNITS_H_
