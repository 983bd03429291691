// The SoCs this kernel is planned for, with where each figure comes from.
// Host tiling tests and the CPU twin read this one table: the twin emulates
// exactly the UB and queue limits the tiling was planned against, so a
// tiling that assumes a bigger UB than the SoC has fails on the twin.
// On a device, the tiling reads UB size and core count from CANN's platform
// info at run time (op_host/recurrent_gated_delta_rule_tiling_register.cpp);
// this table is for planning and testing without one.
#ifndef RECURRENT_GATED_DELTA_RULE_PLATFORMS_H_
#define RECURRENT_GATED_DELTA_RULE_PLATFORMS_H_

#include <cstdint>
#include <cstring>

namespace rgdr {

struct SocSpec {
  const char* name;                  // CANN SoC version (-DSOC_VERSION, platform_config/<name>.ini)
  uint32_t ubBytes;                  // unified buffer per vector core
  uint32_t vectorCores;              // AIV cores
  uint32_t queueBuffersPerPosition;  // TQue buffers one TPosition may hold
  uint32_t buffersPerKernel;         // all InitBuffer buffers of one kernel
  const char* source;
};

// Atlas A2 training / inference series (910B). UB: platform_config ub_size =
// 196608 (CANN's Ascend910B2.ini and Ascend910B3.ini, as published). Cores:
// vector_core_cnt / cube_core_cnt 40 / 20 (910B3) and 48 / 24 (Ascend910_9392,
// Atlas A3). Queue limits: CANN 8.0 Ascend C API reference, TPipe::InitBuffer
// ("at most 8 QUE buffers per TPosition on Atlas A2"; "the buffers of one
// kernel must not exceed 64"). The 310P (Atlas inference series) is not
// targeted: it has no BF16 and its AI Core lacks DataCopyPad.
inline constexpr SocSpec kSocs[] = {
    {"Ascend910B3", 196608, 40, 8, 64, "platform_config/Ascend910B3.ini; InitBuffer constraints (CANN 8.0)"},
    {"Ascend910_9392", 196608, 48, 8, 64, "platform_config/Ascend910_9392.ini; InitBuffer constraints (CANN 8.0)"},
};

inline const SocSpec* FindSoc(const char* name) {
  for (const SocSpec& s : kSocs) {
    if (std::strcmp(s.name, name) == 0) return &s;
  }
  return nullptr;
}

}  // namespace rgdr

#endif  // RECURRENT_GATED_DELTA_RULE_PLATFORMS_H_
