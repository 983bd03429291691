// Tiling data of recurrent_gated_delta_rule and the constants host and kernel
// share. This header is the single definition of each (the seed's kernel and
// tiling each had their own MAX_MTP and block-dim formula).
#ifndef RECURRENT_GATED_DELTA_RULE_TILING_DATA_H_
#define RECURRENT_GATED_DELTA_RULE_TILING_DATA_H_

#include <cstdint>

// Helpers the kernel calls must be device functions there (__aicore__, which
// CANN's kernel headers define for device compiles) and plain functions in the
// host tiling, where nothing defines it.
#ifdef __aicore__
#define RGDR_AICORE __aicore__
#else
#define RGDR_AICORE
#endif

namespace rgdr {

constexpr uint32_t kMaxMtp = 8;             // tokens per sequence (speculative decode)
constexpr uint32_t kMaxHeads = 256;         // NK, NV
constexpr uint32_t kMaxHeadDim = 512;       // Dk, Dv
constexpr uint32_t kBlockBytes = 32;        // DMA / UB alignment unit
constexpr uint32_t kAlignElems = 16;        // 16 x 16-bit = one 32-byte block (8 FP32 = one block)
constexpr uint32_t kReduceLength = 64;      // FP32 elements one vector repeat takes (256 bytes)
constexpr uint32_t kDotRows = 64;           // state rows one batch of row dot products covers
constexpr uint32_t kMaxOutBuffers = 2;      // deepest output queue

RGDR_AICORE inline constexpr uint32_t AlignUp(uint32_t x, uint32_t a) { return (x + a - 1) / a * a; }

// Work units are (batch, value head) pairs dealt round-robin over the cores.
RGDR_AICORE inline constexpr uint32_t BlockDimFor(uint64_t batches, uint32_t value_heads, uint32_t vector_cores) {
  const uint64_t units = batches * value_heads;
  const uint64_t dim = units < vector_cores ? units : vector_cores;
  return dim == 0 ? 1 : static_cast<uint32_t>(dim);
}

// The kernel's UB layout in bytes: queue buffers, and the FP32 working buffer
// split into a part independent of vStep and a part per state value row.
// Host tiling and kernel both use this one definition.
struct UbLayout {
  uint32_t qIn, kIn, vIn, betaIn, gIn, gkIn, stateIn, stateOut, attnOut;  // one queue buffer each
  uint32_t tmpFixed;   // qF kF vF betaF gF gkF, and the products of kDotRows rows (dotTmp)
  uint32_t tmpPerRow;  // stateF row, its delta broadcast to a block (deltaB), kv, attn, delta scalars
};

RGDR_AICORE inline constexpr UbLayout LayoutFor(uint32_t align_k, uint32_t align_v, uint32_t v_step, uint32_t elem_bytes,
                                    bool has_g, bool has_gk, bool gk_per_dim) {
  UbLayout l{};
  l.qIn = kMaxMtp * align_k * elem_bytes;
  l.kIn = l.qIn;
  l.vIn = kMaxMtp * align_v * elem_bytes;
  l.betaIn = kMaxMtp * kBlockBytes;  // one 32-byte row per token
  l.gIn = has_g ? kMaxMtp * kBlockBytes : 0;
  l.gkIn = has_gk ? (gk_per_dim ? kMaxMtp * align_k * 4 : kMaxMtp * kBlockBytes) : 0;
  l.stateIn = v_step * align_k * elem_bytes;
  l.stateOut = l.stateIn;
  l.attnOut = v_step * elem_bytes;
  l.tmpFixed = 2 * kMaxMtp * align_k * 4 + kMaxMtp * align_v * 4       // qF, kF, vF
               + kMaxMtp * 16 * 4 + kMaxMtp * 8 * 4                    // betaF, gF
               + (gk_per_dim ? kMaxMtp * align_k * 4 : kMaxMtp * 8 * 4)  // gkF
               + kDotRows * kReduceLength * 4;                         // dotTmp
  l.tmpPerRow = align_k * 4 + kBlockBytes + 3 * 4;
  return l;
}

struct RecurrentGatedDeltaRuleTilingData {
  uint32_t b;                  // sequences (length of actual_seq_lengths)
  uint32_t t;                  // tokens in all sequences
  uint32_t nk;                 // key/query heads
  uint32_t nv;                 // value heads (multiple of nk; head h reads key head h / (nv / nk))
  uint32_t dk;                 // key head dim
  uint32_t dv;                 // value head dim
  uint32_t alignK;             // dk rounded up to kAlignElems (UB row length)
  uint32_t alignV;             // dv rounded up to kAlignElems
  uint32_t numSlots;           // state pool slots S
  uint32_t vStep;              // value rows of the state per chunk (multiple of 16)
  uint32_t stateOutBufferNum;  // depth of the state output queue (1 or 2)
  uint32_t attnOutBufferNum;   // depth of the attention output queue (1 or 2)
  uint32_t ubRestBytes;        // UB bytes of the FP32 working buffer (tmp)
  uint32_t ubTotalBytes;       // UB the tiling planned for (the twin enforces it)
  uint32_t blockDim;           // cores that work: BlockDimFor(b, nv, vector cores)
  uint32_t hasG;               // g given (scalar log-decay per token and value head)
  uint32_t hasGk;              // gk given
  uint32_t gkPerDim;           // gk is [T, NV, Dk] (else [T, NV])
  uint32_t hasAcceptedTokens;  // num_accepted_tokens given
  uint32_t seqLensInt64;       // actual_seq_lengths dtype is int64 (else int32)
  uint32_t indicesInt64;       // ssm_state_indices dtype is int64 (else int32)
  float scale;                 // query scale
};

}  // namespace rgdr

#endif  // RECURRENT_GATED_DELTA_RULE_TILING_DATA_H_
