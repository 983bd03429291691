// simd_vectors.h's BF16 vector loads and stores, compiled once per ISA level
// (BUILD: baseline, AVX2 + FMA, AVX-512), checked lane by lane against bf16.h's
// scalar conversions: round to nearest even, ties, the largest finite values,
// infinities, subnormals, signalling and quiet NaNs of both signs, and random bits.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/simd_vectors.h"

namespace rvascend {

size_t SIMD_BF16_CHECK_SYMBOL(uint32_t* first_bad_bits) {
  using simd::kLanes;
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu,
                                0x3f808001u, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                                0xff800000u, 0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0xffc00001u, 0xff800001u,
                                0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u, 0x7fffffffu, 0xffffffffu};
  std::mt19937 rng(11);
  for (int i = 0; i < (1 << 16); ++i) bits.push_back(rng());
  while (bits.size() % kLanes != 0) bits.push_back(0x40490fdbu);
  size_t bad = 0;
  for (size_t i = 0; i < bits.size(); i += kLanes) {
    float in[kLanes];
    std::memcpy(in, &bits[i], sizeof(in));
    uint16_t out[kLanes];
    simd::StoreBf16(out, simd::LoadF(in));
    const simd::VF back = simd::LoadBf16(out);
    for (size_t l = 0; l < kLanes; ++l) {
      uint32_t widened;
      const float b = back[l];
      std::memcpy(&widened, &b, 4);
      if (out[l] != FloatToBf16(in[l]) || widened != static_cast<uint32_t>(out[l]) << 16) {
        if (bad++ == 0) *first_bad_bits = bits[i + l];
      }
    }
  }
  return bad;
}

}  // namespace rvascend
