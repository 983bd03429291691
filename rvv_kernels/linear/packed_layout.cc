#include "rvv_kernels/linear/packed_layout.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "rvv_kernels/base/huge_pages.h"

namespace rvascend {

void PackBf16Weight(const uint16_t* weight, size_t n, size_t k, size_t row_stride,
                    uint16_t* packed, size_t block_n) {
  const size_t blocks = PackedBlocks(n, block_n);
  AdviseHugePages(packed, blocks * k * block_n * sizeof(uint16_t));
  for (size_t b = 0; b < blocks; ++b) {
    uint16_t* dst = packed + b * k * block_n;
    const size_t rows = (b + 1) * block_n <= n ? block_n : n - b * block_n;
    if (rows < block_n) std::memset(dst, 0, k * block_n * sizeof(uint16_t));
    // Transpose a block_n-row stripe in k-tiles so both sides stay in cache.
    constexpr size_t kTile = 64;
    for (size_t k0 = 0; k0 < k; k0 += kTile) {
      const size_t k1 = k0 + kTile < k ? k0 + kTile : k;
      for (size_t j = 0; j < rows; ++j) {
        const uint16_t* src = weight + (b * block_n + j) * row_stride;
        const size_t lane = PackedLane(j, block_n);
        for (size_t kk = k0; kk < k1; ++kk) dst[kk * block_n + lane] = src[kk];
      }
    }
  }
}

void GatherPackedRows(const uint16_t* packed, size_t n, size_t k, size_t block_n, const int64_t* ids,
                      size_t count, uint16_t* out) {
  for (size_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || static_cast<uint64_t>(ids[i]) >= n) {
      throw std::out_of_range("token id out of range [0, " + std::to_string(n) + "): got " + std::to_string(ids[i]));
    }
  }
  for (size_t i = 0; i < count; ++i) {
    const size_t row = static_cast<size_t>(ids[i]);
    const uint16_t* src = packed + (row / block_n) * k * block_n + PackedLane(row % block_n, block_n);
    uint16_t* dst = out + i * k;
    for (size_t kk = 0; kk < k; ++kk) dst[kk] = src[kk * block_n];
  }
}

}  // namespace rvascend
