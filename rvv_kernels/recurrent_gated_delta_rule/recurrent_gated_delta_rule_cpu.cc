#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_cpu.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "rvv_kernels/recurrent_gated_delta_rule/elem_values.h"
#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_units.h"
#include "rvv_kernels/base/kernel_set_selection.h"
#include "rvv_kernels/base/thread_pool.h"

namespace rgdr {
namespace {

int64_t Index(const void* p, size_t i, bool is64) {
  return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

size_t ElemBytes(Elem elem) { return elem == Elem::kFloat32 ? 4 : 2; }

// Best first; FP16 rows stay on the generic-vector code on riscv64 (no Zvfh assumed).
std::vector<const RowKernels*> Candidates(Elem elem) {
  using rvascend::Isa;
  static const rvascend::KernelSetEntry<RowKernels> kSets[] = {
#if defined(RVASCEND_HAVE_RVV)
      {&kRowsRvv, {Isa::kRvv}},
#endif
#if defined(RGDR_HAVE_X86_ROWS)
      {&kRowsAvx512Bf16, {Isa::kAvx512Bf16}},
      {&kRowsAvx512, {Isa::kAvx512}},
      {&kRowsAvx2, {Isa::kAvx2}},
#endif
      {&kRowsPortable, {Isa::kAny}},
  };
  std::vector<const RowKernels*> sets = rvascend::SupportedKernelSets(kSets);
#if defined(RVASCEND_HAVE_RVV)
  if (elem == Elem::kFloat16) sets.erase(std::remove(sets.begin(), sets.end(), &kRowsRvv), sets.end());
#endif
  (void)elem;
  return sets;
}

const RowKernels& ChooseRows(Elem elem, const std::string& name) {
  return rvascend::SelectKernelSet(Candidates(elem), name, "recurrent_gated_delta_rule rows");
}

// Scratch of one thread: per token q, k (FP32) and k . q, shared by the value
// heads of one key head (consecutive units reuse them); egk; the row buffer.
struct Scratch {
  std::vector<float> qk, kq, egk, row;
  std::vector<TokenInputs> tokens;
  int64_t qk_seq0 = -1;
  uint32_t qk_head = 0, qk_len = 0;
};

void RunUnit(const RgdrArgs& a, const Unit& u, const RowKernels& rows, Scratch& s) {
  const size_t dk = a.dk, dv = a.dv, e = ElemBytes(a.elem);
  const uint32_t hk = u.h / (a.nv / a.nk);
  const bool per_dim = a.gk != nullptr && a.gk_per_dim;
  s.row.resize(kMaxRowsAtOnce * dk);
  s.tokens.resize(u.len);
  if (s.qk_seq0 != u.seq0 || s.qk_head != hk || s.qk_len != u.len) {
    s.qk.resize(static_cast<size_t>(u.len) * 2 * dk);
    s.kq.resize(u.len);
    for (uint32_t t = 0; t < u.len; ++t) {
      const size_t qk0 = ((static_cast<size_t>(u.seq0) + t) * a.nk + hk) * dk;
      float* q = s.qk.data() + 2 * t * dk;
      s.kq[t] = rows.prepare(a.elem, a.query, a.key, qk0, dk, a.scale, q, q + dk);
    }
    s.qk_seq0 = u.seq0, s.qk_head = hk, s.qk_len = u.len;
  }
  if (per_dim) s.egk.resize(static_cast<size_t>(u.len) * dk);
  for (uint32_t t = 0; t < u.len; ++t) {
    const size_t tok = static_cast<size_t>(u.seq0) + t;
    const float* q = s.qk.data() + 2 * t * dk;
    const float* k = q + dk;
    const size_t th = tok * a.nv + u.h;
    float c = a.g != nullptr ? std::exp(a.g[th]) : 1.0f;
    float* egk = nullptr;
    if (per_dim) {
      egk = s.egk.data() + t * dk;
      for (size_t i = 0; i < dk; ++i) egk[i] = std::exp(a.gk[th * dk + i]) * c;
      c = 1.0f;
    } else if (a.gk != nullptr) {
      c *= std::exp(a.gk[th]);
    }
    const int64_t slot = Index(a.indices, tok, a.indices_int64);
    const bool writes = slot >= 0 && (!a.last_state_only || t + 1 == u.len);
    s.tokens[t] = TokenInputs{q, k, egk, c, LoadElem(a.elem, a.beta, th), s.kq[t],
                              static_cast<const char*>(a.value) + th * dv * e,
                              static_cast<char*>(a.out) + th * dv * e,
                              writes ? static_cast<char*>(a.state) + ((static_cast<size_t>(slot) * a.nv + u.h) * dv * dk) * e
                                     : nullptr};
  }
  const void* src = static_cast<const char*>(a.state) + ((static_cast<size_t>(u.read_slot) * a.nv + u.h) * dv * dk) * e;
  rows.run_rows(a.elem, dk, dv, src, s.tokens.data(), u.len, s.row.data());
}

}  // namespace

std::vector<std::string> AvailableRowKernels(Elem elem) {
  std::vector<std::string> names;
  for (const RowKernels* k : Candidates(elem)) names.emplace_back(k->name);
  return names;
}

void RecurrentGatedDeltaRuleCpu(const RgdrArgs& a, size_t num_threads, const std::string& rows_name) {
  const RowKernels& rows = ChooseRows(a.elem, rows_name);
  std::vector<Unit> units;
  int64_t seq0 = 0;
  for (uint32_t b = 0; b < a.b; ++b) {
    const int64_t len = Index(a.seq_lens, b, a.seq_lens_int64);
    if (len > 0) {
      int64_t read = Index(a.indices, seq0, a.indices_int64);
      if (a.read_slots != nullptr) {
        read = a.read_slots[b];
      } else if (a.accepted != nullptr && a.accepted[b] > 0 && a.accepted[b] <= len) {
        read = Index(a.indices, seq0 + a.accepted[b] - 1, a.indices_int64);
      }
      for (uint32_t h = 0; h < a.nv; ++h) units.push_back({h, seq0, static_cast<uint32_t>(len), read});
      seq0 += len;
    }
  }
  // A unit reads its read slot whole before it writes a row of a token's slot
  // only row by row; units of one call never share a slot (validated), so the
  // order of units across threads does not matter.
  const size_t chunk = (units.size() + 4 * num_threads - 1) / (4 * num_threads);
  const size_t tasks = chunk ? (units.size() + chunk - 1) / chunk : 0;
  rvascend::ThreadPool::Global().ParallelFor(tasks, num_threads, [&](size_t task) {
    thread_local Scratch scratch;
    scratch.qk_seq0 = -1;  // the q/k cache holds only within this call's task
    const size_t begin = task * chunk;
    const size_t end = begin + chunk < units.size() ? begin + chunk : units.size();
    for (size_t i = begin; i < end; ++i) RunUnit(a, units[i], rows, scratch);
  });
}

}  // namespace rgdr
