// Native CPU implementation of recurrent_gated_delta_rule (the torch op's CPU
// path): FP32 math, (sequence, value head) units threaded, inner loops
// vectorised by the compiler. Inputs must already be validated.
#ifndef RGDR_CPU_RGDR_CPU_H_
#define RGDR_CPU_RGDR_CPU_H_

#include <cstddef>

#include "cpu/rgdr_args.h"

namespace rgdr {

void RecurrentGatedDeltaRuleCpu(const RgdrArgs& args, size_t num_threads);

}  // namespace rgdr

#endif  // RGDR_CPU_RGDR_CPU_H_
