// Packed BF16 weight layouts. Both are runtime layouts, never a checkpoint format.
//
// Version 1 (every kernel set reads it): W[N, K] -> P[ceil(N/32), K, 32],
// P[b, k, j] = W[b*32 + j, k], rows past N zero. block_n = 32 whatever the VLEN.
//
// Version 2, "wide" (the RVV wide kernel set): P[ceil(N/B), K, B] with B = VLEN/2
// of the machine that packs it (64, 128, 256 or 512), and the columns of a k-row
// paired: P[b, k, 2t] = W[b*B + t, k], P[b, k, 2t+1] = W[b*B + B/2 + t, k]. One
// 32-bit lane then carries two columns: shifted left by 16 it is column t in
// FP32, masked to its high half it is column B/2 + t, so one load and two ALU
// operations widen B/2 lanes twice over (no BF16 vector extension needed).
#ifndef RVV_KERNELS_LINEAR_PACKED_LAYOUT_H_
#define RVV_KERNELS_LINEAR_PACKED_LAYOUT_H_

#include <cstddef>
#include <cstdint>

namespace rvascend {

inline constexpr size_t kPackedBlockN = 32;

inline constexpr size_t kMaxWideBlockN = 512;

inline bool IsWideBlockN(size_t block_n) {
  return block_n == 64 || block_n == 128 || block_n == 256 || block_n == 512;
}
inline bool IsPackedBlockN(size_t block_n) { return block_n == kPackedBlockN || IsWideBlockN(block_n); }

inline size_t PackedBlocks(size_t n, size_t block_n = kPackedBlockN) { return (n + block_n - 1) / block_n; }

// The lane of a k-row that holds row j of its block: j in version 1; in version 2
// row t sits in lane 2t and row block_n/2 + t in lane 2t + 1.
inline size_t PackedLane(size_t j, size_t block_n) {
  const size_t half = block_n / 2;
  return block_n == kPackedBlockN ? j : j < half ? 2 * j : 2 * (j - half) + 1;
}

// Packs a row-major weight (rows `row_stride` elements apart) into `packed`,
// which holds PackedBlocks(n, block_n) * k * block_n elements: version 1 for
// block_n = 32, version 2 for a wide block_n.
void PackBf16Weight(const uint16_t* weight, size_t n, size_t k, size_t row_stride,
                    uint16_t* packed, size_t block_n = kPackedBlockN);

// Rows `ids` of the [n, k] weight packed in `packed` (layout by block_n, as
// PackBf16Weight writes it), row-major into out [count, k]: an embedding lookup
// from the packed copy. Throws std::out_of_range naming the first id outside
// [0, n) before anything is written.
void GatherPackedRows(const uint16_t* packed, size_t n, size_t k, size_t block_n, const int64_t* ids,
                      size_t count, uint16_t* out);

}  // namespace rvascend

#endif  // RVV_KERNELS_LINEAR_PACKED_LAYOUT_H_
