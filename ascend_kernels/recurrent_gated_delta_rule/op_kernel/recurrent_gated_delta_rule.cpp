// Kernel entry of recurrent_gated_delta_rule: one template instance per input dtype.
#include "op_kernel/recurrent_gated_delta_rule.h"

#ifndef DTYPE_QUERY
#define DTYPE_QUERY bfloat16_t
#endif

extern "C" __global__ __aicore__ void recurrent_gated_delta_rule(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                                                 GM_ADDR beta, GM_ADDR state,
                                                                 GM_ADDR actual_seq_lengths,
                                                                 GM_ADDR ssm_state_indices, GM_ADDR g, GM_ADDR gk,
                                                                 GM_ADDR num_accepted_tokens, GM_ADDR out,
                                                                 GM_ADDR workspace, GM_ADDR tiling) {
  (void)workspace;
  GET_TILING_DATA(tilingData, tiling);
  AscendC::TPipe pipe;
  rgdr::RGDRInitParams params{query, key, value, g, gk, beta, state, actual_seq_lengths, ssm_state_indices,
                              num_accepted_tokens, out};
  rgdr::RGDR<DTYPE_QUERY, DTYPE_QUERY> op(tilingData);
  op.Init(params, &pipe);
  op.Process();
}
