// Kernel entry of recurrent_gated_delta_rule (custom operator project): inputs
// in OpDef order, then the outputs (out, and state: the in-place output, the
// same memory as the state input), workspace and tiling. One template
// instance per input dtype.
#include "recurrent_gated_delta_rule.h"

#ifndef DTYPE_QUERY
#define DTYPE_QUERY bfloat16_t
#endif

extern "C" __global__ __aicore__ void recurrent_gated_delta_rule(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                                                 GM_ADDR beta, GM_ADDR state,
                                                                 GM_ADDR actual_seq_lengths,
                                                                 GM_ADDR ssm_state_indices, GM_ADDR g, GM_ADDR gk,
                                                                 GM_ADDR num_accepted_tokens, GM_ADDR out,
                                                                 GM_ADDR state_out, GM_ADDR workspace,
                                                                 GM_ADDR tiling) {
  (void)workspace;
  // The tiling is a plain struct (op_kernel/..._tiling_data.h); CANN parses it
  // once the kernel registers the type (Ascend C API: REGISTER_TILING_DEFAULT,
  // custom operator projects only).
  REGISTER_TILING_DEFAULT(rgdr::RecurrentGatedDeltaRuleTilingData);
  GET_TILING_DATA(tilingData, tiling);
  AscendC::TPipe pipe;
  rgdr::RGDRInitParams params{query, key, value, g, gk, beta, state, actual_seq_lengths, ssm_state_indices,
                              num_accepted_tokens, out, state_out};
  rgdr::RGDR<DTYPE_QUERY, DTYPE_QUERY> op(tilingData);
  op.Init(params, &pipe);
  op.Process();
}
