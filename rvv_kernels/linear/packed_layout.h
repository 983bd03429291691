// Packed BF16 weight layout, version 1: W[N, K] -> P[ceil(N/32), K, 32],
// P[b, k, j] = W[b*32 + j, k], rows past N zero. block_n = 32 is the contract
// whatever the VLEN. The layout is a runtime layout, never a checkpoint format.
#ifndef RVV_KERNELS_LINEAR_PACKED_LAYOUT_H_
#define RVV_KERNELS_LINEAR_PACKED_LAYOUT_H_

#include <cstddef>
#include <cstdint>

namespace rvascend {

inline constexpr int kPackedLayoutVersion = 1;
inline constexpr size_t kPackedBlockN = 32;

inline size_t PackedBlocks(size_t n) { return (n + kPackedBlockN - 1) / kPackedBlockN; }

// Packs a row-major weight (rows `row_stride` elements apart) into `packed`,
// which holds PackedBlocks(n) * k * 32 elements.
void PackBf16Weight(const uint16_t* weight, size_t n, size_t k, size_t row_stride,
                    uint16_t* packed);

}  // namespace rvascend

#endif  // RVV_KERNELS_LINEAR_PACKED_LAYOUT_H_
