// Element values as FP32 and back (round-to-nearest-even into BF16 and FP16),
// for element types known at compile time or only at run time (Elem).
#ifndef RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_ELEM_VALUES_H_
#define RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_ELEM_VALUES_H_

#include <cstddef>
#include <cstdint>

#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_args.h"
#include "rvv_kernels/base/bf16.h"

namespace rgdr {

// Typed element values: float, _Float16, and uint16_t holding BF16 bits.
inline float ToFloat(float x) { return x; }
inline float ToFloat(_Float16 x) { return static_cast<float>(x); }
inline float ToFloat(uint16_t bf16) { return rvascend::Bf16ToFloat(bf16); }

template <typename T>
T FromFloat(float x);
template <>
inline float FromFloat<float>(float x) { return x; }
template <>
inline _Float16 FromFloat<_Float16>(float x) { return static_cast<_Float16>(x); }
template <>
inline uint16_t FromFloat<uint16_t>(float x) { return rvascend::FloatToBf16(x); }

// x as a T holds it.
template <typename T>
float RoundTo(float x) { return ToFloat(FromFloat<T>(x)); }

// Calls f(T{}) with the C++ type of e (f's argument only carries the type).
template <typename F>
auto WithElemType(Elem e, F&& f) {
  switch (e) {
    case Elem::kFloat32: return f(float{});
    case Elem::kFloat16: return f(_Float16{});
    default: return f(uint16_t{});
  }
}

inline float LoadElem(Elem e, const void* p, size_t i) {
  return WithElemType(e, [&](auto t) { return ToFloat(static_cast<const decltype(t)*>(p)[i]); });
}

}  // namespace rgdr

#endif  // RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_ELEM_VALUES_H_
