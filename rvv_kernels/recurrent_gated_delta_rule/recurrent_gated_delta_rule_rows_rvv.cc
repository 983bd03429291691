// The row loop of the CPU op (recurrent_gated_delta_rule_units.h) in RVV 1.0 intrinsics,
// VLEN-agnostic. BF16 rows widen by zero-extend and shift (no BF16 vector
// extension needed). Rows go two at a time: k and q are loaded once for both,
// and one loop runs both rows' four dot products.
//
// The per-token passes take different LMULs because they need different
// registers. The dot-product pass holds k, q, a row and four accumulators:
// seven m4 groups. The update pass holds k and two rows and has no
// reduction, so m8 halves its instructions for FP32 states. BF16 stores
// round through three more wide temporaries, so BF16 updates stay at m4.
//
// The dot product of a token's q with the updated row needs no second
// reduction pass: (c r + d k) . q = c (r . q) + d (k . q).
#include <riscv_vector.h>

#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_units.h"
#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/rvv_lmul.h"

namespace rgdr {
namespace {

using V4 = rvascend::rvv::Lmul<4>;
using V8 = rvascend::rvv::Lmul<8>;
using F4 = V4::F;

// Element types of rows: Load / Store at any LMUL, at element offset i.
struct Bf16Rows {
  using Update = V4;
  template <class V>
  static typename V::F Load(const void* p, size_t i, size_t vl) {
    return V::LoadBf16(static_cast<const uint16_t*>(p) + i, vl);
  }
  template <class V>
  static void Store(void* p, size_t i, typename V::F x, size_t vl) {
    V::StoreBf16(static_cast<uint16_t*>(p) + i, x, vl);
  }
  static float Load1(const void* p, size_t i) { return rvascend::Bf16ToFloat(static_cast<const uint16_t*>(p)[i]); }
  static void Store1(void* p, size_t i, float x) { static_cast<uint16_t*>(p)[i] = rvascend::FloatToBf16(x); }
};

struct F32Rows {
  using Update = V8;
  template <class V>
  static typename V::F Load(const void* p, size_t i, size_t vl) {
    return V::Load(static_cast<const float*>(p) + i, vl);
  }
  template <class V>
  static void Store(void* p, size_t i, typename V::F x, size_t vl) {
    V::Store(static_cast<float*>(p) + i, x, vl);
  }
  static float Load1(const void* p, size_t i) { return static_cast<const float*>(p)[i]; }
  static void Store1(void* p, size_t i, float x) { static_cast<float*>(p)[i] = x; }
};

float Reduce(F4 acc, size_t vlmax) {
  return __riscv_vfmv_f_s_f32m1_f32(V4::SumTo(acc, __riscv_vfmv_v_f_f32m1(0.0f, 1), vlmax));
}

// How a chunk meets the running sums: the first chunk starts them with
// products (no zeroed accumulators), whole chunks add at VLMAX, a short last
// chunk adds tail-undisturbed, so the reduction covers the first chunk's lanes.
enum class Sum { kStart, kAdd, kAddTail };

template <Sum kSum>
inline __attribute__((always_inline)) F4 Accumulate(F4 acc, F4 x, F4 y, size_t vl) {
  if constexpr (kSum == Sum::kStart) return V4::Mul(x, y, vl);
  if constexpr (kSum == Sum::kAdd) return V4::FmaccVv(acc, x, y, vl);
  return V4::FmaccVvTu(acc, x, y, vl);
}

// One chunk of `vl` elements from element i of rows a (and b) into the four sums.
template <class S, bool kTwo, bool kDecay, Sum kSum>
inline __attribute__((always_inline)) void DotsChunk(size_t i, size_t vl, const void* src, size_t a, size_t b,
                                                     const float* k, const float* q, const float* egk,
                                                     float* decayed, F4& ka, F4& qa, F4& kb, F4& qb) {
  const F4 kk = V4::Load(k + i, vl), qq = V4::Load(q + i, vl);
  F4 x = S::template Load<V4>(src, a + i, vl);
  if constexpr (kDecay) {
    x = V4::Mul(x, V4::Load(egk + i, vl), vl);
    V4::Store(decayed + i, x, vl);
  }
  ka = Accumulate<kSum>(ka, x, kk, vl);
  qa = Accumulate<kSum>(qa, x, qq, vl);
  if constexpr (kTwo) {
    const F4 y = S::template Load<V4>(src, b + i, vl);
    kb = Accumulate<kSum>(kb, y, kk, vl);
    qb = Accumulate<kSum>(qb, y, qq, vl);
  }
}

// r . k and r . q of row a of `src` (S elements), and of row b when kTwo. With
// kDecay the row is first scaled by the per-dimension decay, and the scaled
// row goes to `decayed` for the update pass (one row at a time: the decay
// vector would be the eighth m4 group).
template <class S, bool kTwo, bool kDecay>
void Dots(size_t dk, const void* src, size_t a, size_t b, const float* k, const float* q, const float* egk,
          float* decayed, float dots[4]) {
  const size_t vlmax = V4::VlMax(), vl1 = dk < vlmax ? dk : vlmax;
  F4 ka, qa, kb, qb;
  DotsChunk<S, kTwo, kDecay, Sum::kStart>(0, vl1, src, a, b, k, q, egk, decayed, ka, qa, kb, qb);
  size_t i = vl1;
  for (; i + vlmax <= dk; i += vlmax) {
    DotsChunk<S, kTwo, kDecay, Sum::kAdd>(i, vlmax, src, a, b, k, q, egk, decayed, ka, qa, kb, qb);
  }
  if (i < dk) {
    DotsChunk<S, kTwo, kDecay, Sum::kAddTail>(i, V4::SetVl(dk - i), src, a, b, k, q, egk, decayed, ka, qa, kb, qb);
  }
  dots[0] = Reduce(ka, vl1);
  dots[1] = Reduce(qa, vl1);
  if constexpr (kTwo) {
    dots[2] = Reduce(kb, vl1);
    dots[3] = Reduce(qb, vl1);
  }
}

// Rows a (and b) of `src` (S elements) become c r + d k, written at the same
// offsets of `dst` (E elements) when kStore, and of the FP32 buffer `keep`
// when the sequence has a next token.
template <class S, class E, bool kTwo, bool kKeep, bool kStore = true>
void Update(size_t dk, const void* src, size_t a, size_t b, float c, float da, float db, const float* k, void* dst,
            size_t dst_a, size_t dst_b, float* keep) {
  using V = typename E::Update;
  for (size_t i = 0; i < dk;) {
    const size_t vl = V::SetVl(dk - i);
    const typename V::F kk = V::Load(k + i, vl);
    const typename V::F x = V::Fmacc(V::Scale(S::template Load<V>(src, a + i, vl), c, vl), da, kk, vl);
    if constexpr (kKeep) V::Store(keep + i, x, vl);
    if constexpr (kStore) E::template Store<V>(dst, dst_a + i, x, vl);
    if constexpr (kTwo) {
      const typename V::F y = V::Fmacc(V::Scale(S::template Load<V>(src, b + i, vl), c, vl), db, kk, vl);
      if constexpr (kKeep) V::Store(keep + dk + i, y, vl);
      if constexpr (kStore) E::template Store<V>(dst, dst_b + i, y, vl);
    }
    i += vl;
  }
}

template <class S, class E, bool kTwo>
void UpdateRows(bool keep, size_t dk, const void* src, size_t a, size_t b, float c, float da, float db,
                const float* k, void* dst, size_t dst_a, size_t dst_b, float* buffer) {
  if (keep && dst == nullptr) {  // a prompt's token before its last: the rows stay in the buffer only
    Update<S, E, kTwo, true, false>(dk, src, a, b, c, da, db, k, dst, dst_a, dst_b, buffer);
  } else if (keep) {
    Update<S, E, kTwo, true>(dk, src, a, b, c, da, db, k, dst, dst_a, dst_b, buffer);
  } else {
    Update<S, E, kTwo, false>(dk, src, a, b, c, da, db, k, dst, dst_a, dst_b, buffer);
  }
}

// Rows v (and v + 1 when kTwo) through every token of the unit. `buffer`
// holds the rows between tokens (FP32, row v at 0, row v + 1 at dk).
template <class E, bool kTwo>
void RowPair(size_t dk, size_t v, const void* src, const TokenInputs* tokens, uint32_t len, float* buffer) {
  const size_t a = v * dk, b = kTwo ? a + dk : a;
  for (uint32_t t = 0; t < len; ++t) {
    // Locals, not fields: the output stores would otherwise force reloads of them.
    const TokenInputs& tok = tokens[t];
    const float* const k = tok.k;
    const float* const q = tok.q;
    const float* const egk = tok.egk;
    const float c = tok.c, beta = tok.beta, kq = tok.kq;
    void* const dst = tok.state_row0;
    const bool first = t == 0, keep = t + 1 < len;
    float dots[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // Until the update, the rows are the read slot's (first token, scalar
    // decay) or the buffer's (decayed, or a later token's).
    bool from_buffer = !first;
    if (egk != nullptr) {
      float second[4];
      if (first) {
        Dots<E, false, true>(dk, src, a, 0, k, q, egk, buffer, dots);
        if constexpr (kTwo) Dots<E, false, true>(dk, src, b, 0, k, q, egk, buffer + dk, second);
      } else {
        Dots<F32Rows, false, true>(dk, buffer, 0, 0, k, q, egk, buffer, dots);
        if constexpr (kTwo) Dots<F32Rows, false, true>(dk, buffer, dk, 0, k, q, egk, buffer + dk, second);
      }
      if constexpr (kTwo) dots[2] = second[0], dots[3] = second[1];
      from_buffer = true;
    } else if (first) {
      Dots<E, kTwo, false>(dk, src, a, b, k, q, nullptr, nullptr, dots);
    } else {
      Dots<F32Rows, kTwo, false>(dk, buffer, 0, dk, k, q, nullptr, nullptr, dots);
    }
    const float da = (E::Load1(tok.value, v) - c * dots[0]) * beta;
    float db = 0.0f;
    if constexpr (kTwo) db = (E::Load1(tok.value, v + 1) - c * dots[2]) * beta;
    E::Store1(tok.out, v, c * dots[1] + da * kq);
    if constexpr (kTwo) E::Store1(tok.out, v + 1, c * dots[3] + db * kq);
    if (from_buffer) {
      UpdateRows<F32Rows, E, kTwo>(keep, dk, buffer, 0, dk, c, da, db, k, dst, a, b, buffer);
    } else {
      UpdateRows<E, E, kTwo>(keep, dk, src, a, b, c, da, db, k, dst, a, b, buffer);
    }
  }
}

// Decode: one token with a scalar decay, the rows read from the read slot and
// written once to the token's slot (no buffer, no branch per row pair).
template <class E>
void DecodeRows(size_t dk, size_t dv, const void* src, const TokenInputs& tok) {
  const float* const k = tok.k;
  const float* const q = tok.q;
  const float c = tok.c, beta = tok.beta, kq = tok.kq;
  const void* const value = tok.value;
  void* const out = tok.out;
  void* const dst = tok.state_row0;
  size_t v = 0;
  for (; v + 2 <= dv; v += 2) {
    const size_t a = v * dk;
    float dots[4];
    Dots<E, true, false>(dk, src, a, a + dk, k, q, nullptr, nullptr, dots);
    const float da = (E::Load1(value, v) - c * dots[0]) * beta, db = (E::Load1(value, v + 1) - c * dots[2]) * beta;
    E::Store1(out, v, c * dots[1] + da * kq);
    E::Store1(out, v + 1, c * dots[3] + db * kq);
    Update<E, E, true, false>(dk, src, a, a + dk, c, da, db, k, dst, a, a + dk, nullptr);
  }
  if (v < dv) {
    const size_t a = v * dk;
    float dots[4];
    Dots<E, false, false>(dk, src, a, a, k, q, nullptr, nullptr, dots);
    const float da = (E::Load1(value, v) - c * dots[0]) * beta;
    E::Store1(out, v, c * dots[1] + da * kq);
    Update<E, E, false, false>(dk, src, a, a, c, da, 0.0f, k, dst, a, a, nullptr);
  }
}

template <class E>
void RunRowsT(size_t dk, size_t dv, const void* src, const TokenInputs* tokens, uint32_t len, float* buffer) {
  if (len == 1 && tokens[0].egk == nullptr) return DecodeRows<E>(dk, dv, src, tokens[0]);
  size_t v = 0;
  for (; v + 2 <= dv; v += 2) RowPair<E, true>(dk, v, src, tokens, len, buffer);
  if (v < dv) RowPair<E, false>(dk, v, src, tokens, len, buffer);
}

template <class E>
float PrepareT(const void* query, const void* key, size_t offset, size_t dk, float scale, float* q, float* k) {
  const size_t vlmax = V4::VlMax();
  F4 acc = V4::Zero(vlmax);
  for (size_t i = 0; i < dk;) {
    const size_t vl = V4::SetVl(dk - i);
    const F4 qq = V4::Scale(E::template Load<V4>(query, offset + i, vl), scale, vl);
    const F4 kk = E::template Load<V4>(key, offset + i, vl);
    V4::Store(q + i, qq, vl);
    V4::Store(k + i, kk, vl);
    acc = V4::FmaccVvTu(acc, qq, kk, vl);
    i += vl;
  }
  return Reduce(acc, vlmax);
}

float PrepareRvv(Elem elem, const void* query, const void* key, size_t offset, size_t dk, float scale, float* q,
                 float* k) {
  if (elem == Elem::kFloat32) return PrepareT<F32Rows>(query, key, offset, dk, scale, q, k);
  return PrepareT<Bf16Rows>(query, key, offset, dk, scale, q, k);  // FP16 never reaches here (ChooseRows)
}

void RunRowsRvv(Elem elem, size_t dk, size_t dv, const void* src, const TokenInputs* tokens, uint32_t len,
                float* buffer) {
  if (elem == Elem::kFloat32) {
    RunRowsT<F32Rows>(dk, dv, src, tokens, len, buffer);
  } else {
    RunRowsT<Bf16Rows>(dk, dv, src, tokens, len, buffer);  // FP16 never reaches here (ChooseRows)
  }
}

}  // namespace

const RowKernels kRowsRvv{"rvv", RunRowsRvv, PrepareRvv};

}  // namespace rgdr
