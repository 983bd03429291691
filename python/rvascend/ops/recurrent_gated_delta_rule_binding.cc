// pybind11 module `_recurrent_gated_delta_rule`: recurrent_gated_delta_rule's native CPU
// implementation, its host tiling, and the CPU twin that runs the AscendC
// kernel source. Tensors cross as data pointers inside a spec dict; the torch
// op (recurrent_gated_delta_rule.py) validates every shape, dtype and index
// before calling in.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "rvv_kernels/base/kernel_set_selection.h"
#include "rvv_kernels/recurrent_gated_delta_rule/deltanet_decode.h"
#include "rvv_kernels/recurrent_gated_delta_rule/deltanet_pieces.h"
#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_cpu.h"
#include "cpu_twin/twin_launch.h"
#include "op_host/recurrent_gated_delta_rule_tiling.h"

namespace py = pybind11;

namespace {

template <typename T>
T Get(const py::dict& d, const char* key) {
  if (!d.contains(key)) throw std::invalid_argument(std::string("spec lacks '") + key + "'");
  return d[key].cast<T>();
}

const void* Ptr(const py::dict& d, const char* key) {
  return reinterpret_cast<const void*>(d.contains(key) ? d[key].cast<uintptr_t>() : 0);
}

// The element type a spec's "elem" names (the Python op has checked it: float16, bfloat16 or float32).
rgdr::Elem ElemNamed(const std::string& elem) {
  return elem == "float16" ? rgdr::Elem::kFloat16 : elem == "bfloat16" ? rgdr::Elem::kBFloat16 : rgdr::Elem::kFloat32;
}

rgdr::RgdrArgs ArgsFrom(const py::dict& d) {
  rgdr::RgdrArgs a;
  a.elem = ElemNamed(Get<std::string>(d, "elem"));
  a.t = Get<uint32_t>(d, "t");
  a.b = Get<uint32_t>(d, "b");
  a.nk = Get<uint32_t>(d, "nk");
  a.nv = Get<uint32_t>(d, "nv");
  a.dk = Get<uint32_t>(d, "dk");
  a.dv = Get<uint32_t>(d, "dv");
  a.num_slots = Get<uint32_t>(d, "num_slots");
  a.query = Ptr(d, "query");
  a.key = Ptr(d, "key");
  a.value = Ptr(d, "value");
  a.beta = Ptr(d, "beta");
  a.g = static_cast<const float*>(Ptr(d, "g"));
  a.gk = static_cast<const float*>(Ptr(d, "gk"));
  a.gk_per_dim = Get<bool>(d, "gk_per_dim");
  a.state = const_cast<void*>(Ptr(d, "state"));
  a.seq_lens = Ptr(d, "seq_lens");
  a.seq_lens_int64 = Get<bool>(d, "seq_lens_int64");
  a.indices = Ptr(d, "indices");
  a.indices_int64 = Get<bool>(d, "indices_int64");
  a.accepted = static_cast<const int32_t*>(Ptr(d, "accepted"));
  a.out = const_cast<void*>(Ptr(d, "out"));
  a.scale = Get<float>(d, "scale");
  if (!a.query || !a.key || !a.value || !a.beta || !a.state || !a.seq_lens || !a.indices || !a.out) {
    throw std::invalid_argument("a required tensor pointer is null");
  }
  return a;
}

#define RGDR_TILING_FIELDS(X)                                                                          \
  X(b) X(t) X(nk) X(nv) X(dk) X(dv) X(alignK) X(alignV) X(numSlots) X(vStep) X(stateOutBufferNum)      \
  X(attnOutBufferNum) X(ubRestBytes) X(ubTotalBytes) X(blockDim) X(hasG) X(hasGk) X(gkPerDim)           \
  X(hasAcceptedTokens) X(seqLensInt64) X(indicesInt64)

py::dict TilingToDict(const rgdr::RecurrentGatedDeltaRuleTilingData& t) {
  py::dict d;
#define X(f) d[#f] = t.f;
  RGDR_TILING_FIELDS(X)
#undef X
  d["scale"] = t.scale;
  return d;
}

rgdr::RecurrentGatedDeltaRuleTilingData TilingFromDict(const py::dict& d) {
  rgdr::RecurrentGatedDeltaRuleTilingData t{};
#define X(f) t.f = Get<uint32_t>(d, #f);
  RGDR_TILING_FIELDS(X)
#undef X
  t.scale = Get<float>(d, "scale");
  return t;
}

py::dict ComputeTiling(const py::dict& spec, uint32_t ub_bytes, uint32_t vector_cores) {
  rgdr::Shapes s;
  const std::string elem = Get<std::string>(spec, "elem");
  s.inType = elem == "float16" ? rgdr::DType::kFloat16 : elem == "bfloat16" ? rgdr::DType::kBFloat16 : rgdr::DType::kFloat32;
  s.t = Get<uint32_t>(spec, "t");
  s.b = Get<uint32_t>(spec, "b");
  s.nk = Get<uint32_t>(spec, "nk");
  s.nv = Get<uint32_t>(spec, "nv");
  s.dk = Get<uint32_t>(spec, "dk");
  s.dv = Get<uint32_t>(spec, "dv");
  s.numSlots = Get<uint32_t>(spec, "num_slots");
  s.hasG = Get<bool>(spec, "has_g");
  s.hasGk = Get<bool>(spec, "has_gk");
  s.gkPerDim = Get<bool>(spec, "gk_per_dim");
  s.hasAcceptedTokens = Get<bool>(spec, "has_accepted");
  s.seqLensType = Get<bool>(spec, "seq_lens_int64") ? rgdr::DType::kInt64 : rgdr::DType::kInt32;
  s.indicesType = Get<bool>(spec, "indices_int64") ? rgdr::DType::kInt64 : rgdr::DType::kInt32;
  s.scale = Get<float>(spec, "scale");
  const rgdr::TilingResult r = rgdr::ComputeTiling(s, rgdr::Platform{ub_bytes, vector_cores});
  if (!r.ok) throw std::invalid_argument(r.error);
  py::dict out = TilingToDict(r.data);
  out["planned_ub_bytes"] = rgdr::PlannedUbBytes(r.data, s.inType);
  out["chunks"] = r.chunks;
  out["fixed_bytes"] = r.fixedBytes;
  out["per_row_bytes"] = r.perRowBytes;
  return out;
}

}  // namespace

PYBIND11_MODULE(_recurrent_gated_delta_rule, m) {
  m.doc() = "recurrent_gated_delta_rule: native CPU op, host tiling, and the AscendC kernel on the CPU twin";
  m.attr("MAX_MTP") = rgdr::kMaxMtp;
  m.attr("MAX_HEADS") = rgdr::kMaxHeads;
  m.attr("MAX_HEAD_DIM") = rgdr::kMaxHeadDim;
  py::dict socs;
  for (const rgdr::SocSpec& soc : rgdr::kSocs) {
    py::dict d;
    d["ub_bytes"] = soc.ubBytes;
    d["vector_cores"] = soc.vectorCores;
    d["queue_buffers_per_position"] = soc.queueBuffersPerPosition;
    d["source"] = soc.source;
    socs[soc.name] = d;
  }
  m.attr("SOCS") = socs;
  py::register_exception<twin::TwinError>(m, "TwinError");
  m.def("run_cpu", [](const py::dict& spec, size_t threads, const std::string& rows) {
    rgdr::RgdrArgs a = ArgsFrom(spec);
    a.last_state_only = spec.contains("last_state_only") && Get<bool>(spec, "last_state_only");
    py::gil_scoped_release release;
    rgdr::RecurrentGatedDeltaRuleCpu(a, threads == 0 ? 1 : threads, rows);
  }, py::arg("spec"), py::arg("threads"), py::arg("rows") = "");
  m.def("deltanet_decode", [](const py::dict& d, size_t threads) {
    rgdr::DeltaNetDecodeArgs a;
    a.elem = ElemNamed(Get<std::string>(d, "elem"));
    a.t = Get<uint32_t>(d, "t");
    a.sequences = Get<uint32_t>(d, "sequences");
    a.lens = static_cast<const int64_t*>(Ptr(d, "lens"));
    a.nk = Get<uint32_t>(d, "nk");
    a.nv = Get<uint32_t>(d, "nv");
    a.dk = Get<uint32_t>(d, "dk");
    a.dv = Get<uint32_t>(d, "dv");
    a.kernel = Get<uint32_t>(d, "kernel");
    a.num_slots = Get<uint32_t>(d, "num_slots");
    a.mixed = Ptr(d, "mixed");
    a.mixed_stride = Get<size_t>(d, "mixed_stride");
    a.b = Ptr(d, "b");
    a.a = Ptr(d, "a");
    a.gate_stride = Get<size_t>(d, "gate_stride");
    a.z = Ptr(d, "z");
    a.z_stride = Get<size_t>(d, "z_stride");
    a.norm_weight = Ptr(d, "norm_weight");
    a.norm_eps = Get<float>(d, "norm_eps");
    a.conv_state = const_cast<void*>(Ptr(d, "conv_state"));
    a.conv_weight = Ptr(d, "conv_weight");
    a.a_log = Ptr(d, "a_log");
    a.dt_bias = Ptr(d, "dt_bias");
    a.ssm_state = static_cast<float*>(const_cast<void*>(Ptr(d, "ssm_state")));
    a.slots = static_cast<const int64_t*>(Ptr(d, "slots"));
    a.read_slots = static_cast<const int64_t*>(Ptr(d, "read_slots"));  // 0: in place
    a.token_slots = static_cast<const int64_t*>(Ptr(d, "token_slots"));  // 0: none
    a.out = const_cast<void*>(Ptr(d, "out"));
    if (!a.mixed || !a.b || !a.a || !a.z || !a.norm_weight || !a.conv_state || !a.conv_weight || !a.a_log || !a.dt_bias || !a.ssm_state ||
        !a.slots || !a.out) {
      throw std::invalid_argument("deltanet_decode: a required tensor pointer is null");
    }
    py::gil_scoped_release release;
    rgdr::DeltaNetDecodeCpu(a, threads == 0 ? 1 : threads);
  }, py::arg("spec"), py::arg("threads"));
  m.def("available_row_kernels", [](const std::string& elem) {
    return rgdr::AvailableRowKernels(ElemNamed(elem));
  });
  m.def("available_deltanet_pieces", [](const std::string& elem) {
    if (elem == "bfloat16") return rvascend::KernelSetNames(rgdr::AvailableDeltaNetPieces<uint16_t>());
    if (elem == "float32") return rvascend::KernelSetNames(rgdr::AvailableDeltaNetPieces<float>());
    throw std::invalid_argument("deltanet pieces: dtype " + elem + " (bfloat16 or float32)");
  });
  m.def("compute_tiling", &ComputeTiling, py::arg("spec"), py::arg("ub_bytes"), py::arg("vector_cores"));
  m.def("run_twin", [](const py::dict& spec, const py::dict& tiling, const std::string& soc_name) {
    const rgdr::SocSpec* soc = rgdr::FindSoc(soc_name.c_str());
    if (soc == nullptr) throw std::invalid_argument("unknown SoC '" + soc_name + "'");
    const twin::Counters c = rgdr::RunKernelOnTwin(TilingFromDict(tiling), ArgsFrom(spec), *soc);
    py::dict out;
    out["dma_in_bytes"] = c.dmaInBytes;
    out["dma_out_bytes"] = c.dmaOutBytes;
    out["peak_ub_bytes"] = c.peakUbBytes;
    out["vector_calls"] = c.vectorCalls;
    out["vector_repeats"] = c.vectorRepeats;
    out["scalar_syncs"] = c.scalarSyncs;
    return out;
  }, py::arg("spec"), py::arg("tiling"), py::arg("soc"));
}
