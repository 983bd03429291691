// Host tiling of recurrent_gated_delta_rule as a pure function of the shapes
// and the platform (UB size, vector cores), so it can be tested without CANN.
#ifndef RECURRENT_GATED_DELTA_RULE_TILING_H_
#define RECURRENT_GATED_DELTA_RULE_TILING_H_

#include <cstdint>
#include <string>

// Relative paths: the same includes resolve in this repository (Bazel) and in
// the msOpGen project build_npu_package.sh stages (op_host/ beside op_kernel/).
#include "../op_kernel/recurrent_gated_delta_rule_tiling_data.h"
#include "recurrent_gated_delta_rule_platforms.h"

namespace rgdr {

enum class DType : uint32_t { kFloat16, kBFloat16, kFloat32, kInt32, kInt64 };

struct Platform {
  uint32_t ubBytes;      // unified buffer per vector core
  uint32_t vectorCores;  // vector cores the op may use
};

inline constexpr Platform PlatformOf(const SocSpec& soc) { return Platform{soc.ubBytes, soc.vectorCores}; }

struct Shapes {
  uint32_t t = 0, nk = 0, nv = 0, dk = 0, dv = 0;  // query [t, nk, dk], value [t, nv, dv]
  uint32_t b = 0;                                  // actual_seq_lengths [b]
  uint32_t numSlots = 0;                           // state [numSlots, nv, dv, dk]
  DType inType = DType::kBFloat16;                 // query/key/value/beta/state/out
  bool hasG = false, hasGk = false, gkPerDim = false, hasAcceptedTokens = false;
  DType seqLensType = DType::kInt32, indicesType = DType::kInt32;
  float scale = 1.0f;
};

struct TilingResult {
  bool ok = false;
  std::string error;  // why the shapes cannot run, naming the value
  RecurrentGatedDeltaRuleTilingData data{};
  uint32_t fixedBytes = 0;     // UB bytes independent of vStep
  uint32_t perRowBytes = 0;    // UB bytes per state value row in a chunk
  uint32_t chunks = 0;         // ceil(dv / vStep)
};

// Validates the shapes (ranges, GQA, dtypes) and picks the UB plan: output
// queue profiles {1,1}, {1,2}, {2,2}, ranked by fewest state chunks, then
// deeper queues, then larger vStep.
TilingResult ComputeTiling(const Shapes& shapes, const Platform& platform);

// UB bytes the kernel allocates for a tiling (queues + working buffer),
// the quantity ComputeTiling keeps within platform.ubBytes.
uint32_t PlannedUbBytes(const RecurrentGatedDeltaRuleTilingData& d, DType inType);

}  // namespace rgdr

#endif  // RECURRENT_GATED_DELTA_RULE_TILING_H_
