// The row loop of the CPU op (rgdr_units.h) in RVV 1.0 intrinsics,
// VLEN-agnostic at e32m4: BF16 rows widen by zero-extend and shift (no BF16
// vector extension needed), dot products accumulate tail-undisturbed and are
// reduced once over VLMAX. FP32 states use the same loop with plain loads.
#include <riscv_vector.h>

#include "cpu/rgdr_units.h"
#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/rvv_lmul.h"

namespace rgdr {
namespace {

using V = rvascend::rvv::Lmul<4>;
using F = V::F;

struct Bf16Rows {
  static F Load(const void* p, size_t i, size_t vl) { return V::LoadBf16(static_cast<const uint16_t*>(p) + i, vl); }
  static void Store(void* p, size_t i, F x, size_t vl) { V::StoreBf16(static_cast<uint16_t*>(p) + i, x, vl); }
  static float Load1(const void* p, size_t i) { return rvascend::Bf16ToFloat(static_cast<const uint16_t*>(p)[i]); }
  static void Store1(void* p, size_t i, float x) { static_cast<uint16_t*>(p)[i] = rvascend::FloatToBf16(x); }
};

struct F32Rows {
  static F Load(const void* p, size_t i, size_t vl) { return V::Load(static_cast<const float*>(p) + i, vl); }
  static void Store(void* p, size_t i, F x, size_t vl) { V::Store(static_cast<float*>(p) + i, x, vl); }
  static float Load1(const void* p, size_t i) { return static_cast<const float*>(p)[i]; }
  static void Store1(void* p, size_t i, float x) { static_cast<float*>(p)[i] = x; }
};

float Reduce(F acc, size_t vlmax) {
  return __riscv_vfmv_f_s_f32m1_f32(V::SumTo(acc, __riscv_vfmv_v_f_f32m1(0.0f, 1), vlmax));
}

template <class E>
void RunRowsT(size_t dk, size_t dv, const void* src, const TokenInputs* tokens, uint32_t len, float* row) {
  const size_t vlmax = V::VlMax();
  for (size_t v = 0; v < dv; ++v) {
    const size_t base = v * dk;
    for (uint32_t t = 0; t < len; ++t) {
      const TokenInputs& tok = tokens[t];
      const bool first = t == 0, keep = t + 1 < len;
      // Pass 1: (first token: load the row) decay per dimension; r . k and r . q.
      F acc_k = V::Zero(vlmax), acc_q = V::Zero(vlmax);
      for (size_t i = 0; i < dk;) {
        const size_t vl = V::SetVl(dk - i);
        F r = first ? E::Load(src, base + i, vl) : V::Load(row + i, vl);
        if (tok.egk != nullptr) r = V::Mul(r, V::Load(tok.egk + i, vl), vl);
        if (tok.egk != nullptr || (first && keep)) V::Store(row + i, r, vl);
        acc_k = V::FmaccVvTu(acc_k, r, V::Load(tok.k + i, vl), vl);
        acc_q = V::FmaccVvTu(acc_q, r, V::Load(tok.q + i, vl), vl);
        i += vl;
      }
      const float d = (E::Load1(tok.value, v) - tok.c * Reduce(acc_k, vlmax)) * tok.beta;
      // out = (c r + d k) . q = c (r . q) + d (k . q): the second pass has no reduction.
      E::Store1(tok.out, v, tok.c * Reduce(acc_q, vlmax) + d * tok.kq);
      // Pass 2: r = c * r + d * k, to this token's slot (and kept for the next token).
      const bool reload = first && tok.egk == nullptr && !keep;  // pass 1 stored nothing
      for (size_t i = 0; i < dk;) {
        const size_t vl = V::SetVl(dk - i);
        F r = __riscv_vfmul_vf_f32m4(reload ? E::Load(src, base + i, vl) : V::Load(row + i, vl), tok.c, vl);
        r = V::Fmacc(r, d, V::Load(tok.k + i, vl), vl);
        if (keep) V::Store(row + i, r, vl);
        E::Store(tok.state_row0, base + i, r, vl);
        i += vl;
      }
    }
  }
}

void RunRowsRvv(Elem elem, size_t dk, size_t dv, const void* src, const TokenInputs* tokens, uint32_t len,
                float* row) {
  if (elem == Elem::kFloat32) {
    RunRowsT<F32Rows>(dk, dv, src, tokens, len, row);
  } else {
    RunRowsT<Bf16Rows>(dk, dv, src, tokens, len, row);  // FP16 never reaches here (ChooseRows)
  }
}

}  // namespace

const RowKernels kRowsRvv{"rvv", RunRowsRvv};

}  // namespace rgdr
