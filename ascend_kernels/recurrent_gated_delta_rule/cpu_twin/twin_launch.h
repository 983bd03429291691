// Runs the AscendC kernel source on the CPU twin for one call of the op.
#ifndef RGDR_CPU_TWIN_TWIN_LAUNCH_H_
#define RGDR_CPU_TWIN_TWIN_LAUNCH_H_

#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_args.h"
#include "cpu_twin/twin_runtime.h"
#include "op_host/recurrent_gated_delta_rule_platforms.h"
#include "op_kernel/recurrent_gated_delta_rule_tiling_data.h"

namespace rgdr {

// Launches tiling.blockDim blocks of the kernel over `args` (fp16 or bf16) on
// cores of `soc` (UB and queue limits from the platform table, whatever the
// tiling assumed); throws twin::TwinError on anything the hardware would reject.
twin::Counters RunKernelOnTwin(const RecurrentGatedDeltaRuleTilingData& tiling, const RgdrArgs& args,
                               const SocSpec& soc);

}  // namespace rgdr

#endif  // RGDR_CPU_TWIN_TWIN_LAUNCH_H_
