// One value of a tensor whose element type is known only at run time (Elem),
// as FP32 and back; round-to-nearest-even into BF16 and FP16.
#ifndef RGDR_CPU_ELEM_VALUES_H_
#define RGDR_CPU_ELEM_VALUES_H_

#include <cstddef>
#include <cstdint>

#include "cpu/rgdr_args.h"
#include "rvv_kernels/base/bf16.h"

namespace rgdr {

inline float LoadElem(Elem e, const void* p, size_t i) {
  switch (e) {
    case Elem::kFloat32: return static_cast<const float*>(p)[i];
    case Elem::kFloat16: return static_cast<float>(static_cast<const _Float16*>(p)[i]);
    default: return rvascend::Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
}

inline void StoreElem(Elem e, void* p, size_t i, float x) {
  switch (e) {
    case Elem::kFloat32: static_cast<float*>(p)[i] = x; break;
    case Elem::kFloat16: static_cast<_Float16*>(p)[i] = static_cast<_Float16>(x); break;
    default: static_cast<uint16_t*>(p)[i] = rvascend::FloatToBf16(x); break;
  }
}

// x as a tensor of element type e holds it.
inline float RoundToElem(Elem e, float x) {
  switch (e) {
    case Elem::kFloat32: return x;
    case Elem::kFloat16: return static_cast<float>(static_cast<_Float16>(x));
    default: return rvascend::Bf16ToFloat(rvascend::FloatToBf16(x));
  }
}

}  // namespace rgdr

#endif  // RGDR_CPU_ELEM_VALUES_H_
