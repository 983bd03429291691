// Native CPU implementation of recurrent_gated_delta_rule (the torch op's CPU
// path): FP32 math, one pass over the state each way (recurrent_gated_delta_rule_units.h), (sequence,
// value head) units threaded, rows vectorised for AVX-512, AVX2 or RVV as the
// CPU reports. Inputs must already be validated.
#ifndef RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_RECURRENT_GATED_DELTA_RULE_CPU_H_
#define RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_RECURRENT_GATED_DELTA_RULE_CPU_H_

#include <cstddef>
#include <string>
#include <vector>

#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_args.h"

namespace rgdr {

// `rows` names the row kernels (tests and benchmarks); empty: the best this CPU runs.
void RecurrentGatedDeltaRuleCpu(const RgdrArgs& args, size_t num_threads, const std::string& rows = "");

// The row kernels this CPU runs for `elem`, best first.
std::vector<std::string> AvailableRowKernels(Elem elem);

}  // namespace rgdr

#endif  // RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_RECURRENT_GATED_DELTA_RULE_CPU_H_
