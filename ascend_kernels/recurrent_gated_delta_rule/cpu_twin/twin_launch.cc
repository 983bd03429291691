#include "cpu_twin/twin_launch.h"

#include <cstring>
#include <string>
#include <vector>

// The kernel source, compiled against the twin's kernel_operator.h, once per dtype.
#define DTYPE_QUERY bfloat16_t
#define recurrent_gated_delta_rule rgdr_twin_entry_bf16
#include "op_kernel/recurrent_gated_delta_rule.cpp"  // NOLINT(build/include)
#undef recurrent_gated_delta_rule
#undef DTYPE_QUERY
#define DTYPE_QUERY half
#define recurrent_gated_delta_rule rgdr_twin_entry_fp16
#include "op_kernel/recurrent_gated_delta_rule.cpp"  // NOLINT(build/include)
#undef recurrent_gated_delta_rule
#undef DTYPE_QUERY

namespace rgdr {

twin::Counters RunKernelOnTwin(const RecurrentGatedDeltaRuleTilingData& tiling, const RgdrArgs& a,
                               const SocSpec& soc) {
  if (a.elem == Elem::kFloat32) throw twin::TwinError("the AscendC kernel takes float16 or bfloat16 inputs");
  if (tiling.blockDim > soc.vectorCores) {
    throw twin::TwinError("the tiling launches " + std::to_string(tiling.blockDim) + " blocks; " + soc.name + " has " +
                          std::to_string(soc.vectorCores) + " vector cores");
  }
  auto& rt = twin::Runtime::Get();
  rt.Reset(twin::CoreLimits{soc.ubBytes, soc.queueBuffersPerPosition, soc.buffersPerKernel});
  const uint64_t e = 2, t = a.t;
  rt.RegisterGm(a.query, t * a.nk * a.dk * e, "query");
  rt.RegisterGm(a.key, t * a.nk * a.dk * e, "key");
  rt.RegisterGm(a.value, t * a.nv * a.dv * e, "value");
  rt.RegisterGm(a.beta, t * a.nv * e, "beta");
  rt.RegisterGm(a.g, t * a.nv * 4, "g");
  rt.RegisterGm(a.gk, t * a.nv * (a.gk_per_dim ? a.dk : 1) * 4, "gk");
  rt.RegisterGm(a.state, static_cast<uint64_t>(a.num_slots) * a.nv * a.dv * a.dk * e, "state");
  rt.RegisterGm(a.seq_lens, static_cast<uint64_t>(a.b) * (a.seq_lens_int64 ? 8 : 4), "actual_seq_lengths");
  rt.RegisterGm(a.indices, t * (a.indices_int64 ? 8 : 4), "ssm_state_indices");
  rt.RegisterGm(a.accepted, static_cast<uint64_t>(a.b) * 4, "num_accepted_tokens");
  rt.RegisterGm(a.out, t * a.nv * a.dv * e, "out");
  std::vector<uint8_t> tiling_bytes(sizeof(tiling));
  std::memcpy(tiling_bytes.data(), &tiling, sizeof(tiling));
  auto gm = [](const void* p) { return reinterpret_cast<GM_ADDR>(const_cast<void*>(p)); };
  auto entry = a.elem == Elem::kBFloat16 ? rgdr_twin_entry_bf16 : rgdr_twin_entry_fp16;
  rt.Launch(tiling.blockDim, [&] {
    entry(gm(a.query), gm(a.key), gm(a.value), gm(a.beta), gm(a.state), gm(a.seq_lens), gm(a.indices), gm(a.g),
          gm(a.gk), gm(a.accepted), gm(a.out), gm(a.state), nullptr, tiling_bytes.data());
  });
  return rt.counters;
}

}  // namespace rgdr
