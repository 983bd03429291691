// Scalar BF16 <-> FP32 conversions shared by the pack, the reference and the tests.
#ifndef RVV_KERNELS_BASE_BF16_H_
#define RVV_KERNELS_BASE_BF16_H_

#include <cstdint>
#include <cstring>

namespace rvascend {

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest, ties to even. A NaN stays a (quiet) NaN: adding the
// rounding bias to a NaN whose payload sits only in the low 16 bits would
// carry into the exponent and turn it into an infinity.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_BF16_H_
