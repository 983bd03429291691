// The pieces of deltanet_decode (deltanet_pieces.h) in RVV 1.0 intrinsics,
// VLEN-agnostic, for FP32 and BF16 elements. The conv runs across channels:
// lane c holds channel c, and tap j of every channel is one strided load (the
// state and weight rows are kernel - 1 and kernel elements long), so the
// window slides by storing each loaded tap one place down, untouched bits.
// SiLU takes rvv::Exp (about 2 FP32 ulp from std::exp).
#include <riscv_vector.h>

#include <cstddef>
#include <cstdint>

#include "rvv_kernels/recurrent_gated_delta_rule/deltanet_pieces.h"
#include "rvv_kernels/base/rvv_lmul.h"
#include "rvv_kernels/base/rvv_math.h"

namespace rgdr {
namespace {

using V = rvascend::rvv::Lmul<4>;
using F = V::F;

// Element loads and stores as FP32 lanes, and taps moved as raw bits.
struct F32Elems {
  using T = float;
  using Raw = vuint32m4_t;
  static F Load(const float* p, size_t vl) { return V::Load(p, vl); }
  static Raw LoadRaw(const float* p, ptrdiff_t stride, size_t vl) {
    return __riscv_vlse32_v_u32m4(reinterpret_cast<const uint32_t*>(p), stride, vl);
  }
  static void StoreRaw(float* p, ptrdiff_t stride, Raw x, size_t vl) {
    __riscv_vsse32_v_u32m4(reinterpret_cast<uint32_t*>(p), stride, x, vl);
  }
  static Raw RawOf(const float* p, size_t vl) { return __riscv_vle32_v_u32m4(reinterpret_cast<const uint32_t*>(p), vl); }
  static F Widen(Raw x, size_t) { return __riscv_vreinterpret_v_u32m4_f32m4(x); }
  static F Round(F x, size_t) { return x; }
  static void Store(float* p, F x, size_t vl) { V::Store(p, x, vl); }
};

struct Bf16Elems {
  using T = uint16_t;
  using Raw = vuint16m2_t;
  static F Load(const uint16_t* p, size_t vl) { return V::LoadBf16(p, vl); }
  static Raw LoadRaw(const uint16_t* p, ptrdiff_t stride, size_t vl) { return __riscv_vlse16_v_u16m2(p, stride, vl); }
  static void StoreRaw(uint16_t* p, ptrdiff_t stride, Raw x, size_t vl) { __riscv_vsse16_v_u16m2(p, stride, x, vl); }
  static Raw RawOf(const uint16_t* p, size_t vl) { return __riscv_vle16_v_u16m2(p, vl); }
  static F Widen(Raw x, size_t vl) {
    return __riscv_vreinterpret_v_u32m4_f32m4(__riscv_vsll_vx_u32m4(__riscv_vzext_vf2_u32m4(x, vl), 16, vl));
  }
  static F Round(F x, size_t vl) { return rvascend::rvv::RoundBf16(x, vl); }
  static void Store(uint16_t* p, F x, size_t vl) { V::StoreBf16(p, x, vl); }
};

F Silu(F x, size_t vl) {
  const F e = rvascend::rvv::Exp(__riscv_vfneg_v_f32m4(x, vl), vl);
  return __riscv_vfdiv_vv_f32m4(x, __riscv_vfadd_vf_f32m4(e, 1.0f, vl), vl);
}

float Sum(F acc, size_t vl) {
  return __riscv_vfmv_f_s_f32m1_f32(V::SumTo(acc, __riscv_vfmv_v_f_f32m1(0.0f, 1), vl));
}

template <class E>
void ConvSilu(const typename E::T* x, const typename E::T* in, typename E::T* out, const typename E::T* weight,
              size_t n, size_t kept, float* y) {
  using T = typename E::T;
  const ptrdiff_t s_stride = static_cast<ptrdiff_t>(kept * sizeof(T)), w_stride = s_stride + sizeof(T);
  for (size_t c = 0; c < n;) {
    const size_t vl = V::SetVl(n - c);
    const T* s = in + c * kept;
    T* o = out + c * kept;
    const T* w = weight + c * (kept + 1);
    const typename E::Raw xr = E::RawOf(x + c, vl);
    // Taps in order, as the scalar sum adds them; each tap moves one place down once read
    // (in place, tap j - 1 was read before tap j overwrites it).
    typename E::Raw tap = E::LoadRaw(s, s_stride, vl);
    F sum = V::Mul(E::Widen(tap, vl), E::Widen(E::LoadRaw(w, w_stride, vl), vl), vl);
    for (size_t j = 1; j < kept; ++j) {
      tap = E::LoadRaw(s + j, s_stride, vl);
      sum = V::FmaccVv(sum, E::Widen(tap, vl), E::Widen(E::LoadRaw(w + j, w_stride, vl), vl), vl);
      E::StoreRaw(o + j - 1, s_stride, tap, vl);
    }
    sum = V::FmaccVv(sum, E::Widen(xr, vl), E::Widen(E::LoadRaw(w + kept, w_stride, vl), vl), vl);
    E::StoreRaw(o + kept - 1, s_stride, xr, vl);
    V::Store(y + c, E::Round(Silu(sum, vl), vl), vl);
    c += vl;
  }
}

void L2Norm(float* x, size_t n, float scale) {
  const size_t vlmax = V::VlMax();
  F acc = V::Zero(vlmax);
  for (size_t i = 0; i < n;) {
    const size_t vl = V::SetVl(n - i);
    const F v = V::Load(x + i, vl);
    acc = V::FmaccVvTu(acc, v, v, vl);
    i += vl;
  }
  const float r = scale / __builtin_sqrtf(Sum(acc, vlmax) + 1e-6f);
  for (size_t i = 0; i < n;) {
    const size_t vl = V::SetVl(n - i);
    V::Store(x + i, V::Scale(V::Load(x + i, vl), r, vl), vl);
    i += vl;
  }
}

template <class E>
void GatedNorm(float* o, const typename E::T* z, const typename E::T* weight, size_t n, float eps,
               typename E::T* out) {
  const size_t vlmax = V::VlMax();
  F acc = V::Zero(vlmax);
  for (size_t i = 0; i < n;) {
    const size_t vl = V::SetVl(n - i);
    const F v = E::Round(V::Load(o + i, vl), vl);
    V::Store(o + i, v, vl);
    acc = V::FmaccVvTu(acc, v, v, vl);
    i += vl;
  }
  const float rms = 1.0f / __builtin_sqrtf(Sum(acc, vlmax) / static_cast<float>(n) + eps);
  for (size_t i = 0; i < n;) {
    const size_t vl = V::SetVl(n - i);
    const F normed = E::Round(V::Scale(V::Load(o + i, vl), rms, vl), vl);
    const F scaled = E::Round(V::Mul(E::Load(weight + i, vl), normed, vl), vl);
    E::Store(out + i, V::Mul(scaled, Silu(E::Load(z + i, vl), vl), vl), vl);
    i += vl;
  }
}

}  // namespace

const DeltaNetPieces<float> kDeltaNetPiecesRvvF32{"rvv", ConvSilu<F32Elems>, L2Norm, GatedNorm<F32Elems>};
const DeltaNetPieces<uint16_t> kDeltaNetPiecesRvvBf16{"rvv", ConvSilu<Bf16Elems>, L2Norm, GatedNorm<Bf16Elems>};

}  // namespace rgdr
