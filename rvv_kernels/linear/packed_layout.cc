#include "rvv_kernels/linear/packed_layout.h"

#include <cstring>

namespace rvascend {

void PackBf16Weight(const uint16_t* weight, size_t n, size_t k, size_t row_stride,
                    uint16_t* packed) {
  const size_t blocks = PackedBlocks(n);
  for (size_t b = 0; b < blocks; ++b) {
    uint16_t* dst = packed + b * k * kPackedBlockN;
    const size_t rows = (b + 1) * kPackedBlockN <= n ? kPackedBlockN : n - b * kPackedBlockN;
    if (rows < kPackedBlockN) std::memset(dst, 0, k * kPackedBlockN * sizeof(uint16_t));
    // Transpose a 32-row stripe in k-tiles so both sides stay in cache.
    constexpr size_t kTile = 64;
    for (size_t k0 = 0; k0 < k; k0 += kTile) {
      const size_t k1 = k0 + kTile < k ? k0 + kTile : k;
      for (size_t j = 0; j < rows; ++j) {
        const uint16_t* src = weight + (b * kPackedBlockN + j) * row_stride;
        for (size_t kk = k0; kk < k1; ++kk) dst[kk * kPackedBlockN + j] = src[kk];
      }
    }
  }
}

}  // namespace rvascend
