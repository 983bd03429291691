#include "recurrent_gated_delta_rule_tiling.h"

#include <sstream>

namespace rgdr {
namespace {

uint32_t ElemBytes(DType t) { return t == DType::kFloat32 ? 4 : 2; }

std::string Validate(const Shapes& s) {
  std::ostringstream e;
  if (s.inType != DType::kFloat16 && s.inType != DType::kBFloat16) {
    e << "query/key/value/beta/state must be float16 or bfloat16";
  } else if (s.nk < 1 || s.nk > kMaxHeads) {
    e << "NK = " << s.nk << " is outside 1.." << kMaxHeads;
  } else if (s.nv < 1 || s.nv > kMaxHeads) {
    e << "NV = " << s.nv << " is outside 1.." << kMaxHeads;
  } else if (s.nv % s.nk != 0) {
    e << "NV = " << s.nv << " is not a multiple of NK = " << s.nk;
  } else if (s.dk < 1 || s.dk > kMaxHeadDim) {
    e << "Dk = " << s.dk << " is outside 1.." << kMaxHeadDim;
  } else if (s.dv < 1 || s.dv > kMaxHeadDim) {
    e << "Dv = " << s.dv << " is outside 1.." << kMaxHeadDim;
  } else if (s.numSlots < 1) {
    e << "the state pool has no slots";
  } else if (s.seqLensType != DType::kInt32 && s.seqLensType != DType::kInt64) {
    e << "actual_seq_lengths must be int32 or int64";
  } else if (s.indicesType != DType::kInt32 && s.indicesType != DType::kInt64) {
    e << "ssm_state_indices must be int32 or int64";
  } else if (s.gkPerDim && !s.hasGk) {
    e << "gkPerDim set without gk";
  } else if (s.b < 1) {
    e << "B = " << s.b << ": at least one sequence is needed";
  } else if (static_cast<uint64_t>(s.t) > static_cast<uint64_t>(s.b) * kMaxMtp) {
    // The lengths themselves live in device memory; the shapes already prove
    // that some sequence would exceed the kernel's MAX_MTP-row buffers.
    e << "T = " << s.t << " tokens in B = " << s.b << " sequences: at least one sequence would have more than "
      << "MAX_MTP = " << kMaxMtp << " tokens";
  }
  return e.str();
}

}  // namespace

uint32_t PlannedUbBytes(const RecurrentGatedDeltaRuleTilingData& d, DType inType) {
  const UbLayout l = LayoutFor(d.alignK, d.alignV, d.vStep, ElemBytes(inType), d.hasG == 1, d.hasGk == 1,
                               d.gkPerDim == 1);
  return l.qIn + l.kIn + l.vIn + l.betaIn + l.gIn + l.gkIn + l.stateIn + d.stateOutBufferNum * l.stateOut +
         d.attnOutBufferNum * l.attnOut + d.ubRestBytes;
}

TilingResult ComputeTiling(const Shapes& s, const Platform& platform) {
  TilingResult best;
  best.error = Validate(s);
  if (!best.error.empty()) return best;

  RecurrentGatedDeltaRuleTilingData d{};
  d.b = s.b;
  d.t = s.t;
  d.nk = s.nk;
  d.nv = s.nv;
  d.dk = s.dk;
  d.dv = s.dv;
  d.alignK = AlignUp(s.dk, kAlignElems);
  d.alignV = AlignUp(s.dv, kAlignElems);
  d.numSlots = s.numSlots;
  d.hasG = s.hasG;
  d.hasGk = s.hasGk;
  d.gkPerDim = s.gkPerDim;
  d.hasAcceptedTokens = s.hasAcceptedTokens;
  d.seqLensInt64 = s.seqLensType == DType::kInt64;
  d.indicesInt64 = s.indicesType == DType::kInt64;
  d.scale = s.scale;
  d.ubTotalBytes = platform.ubBytes;
  d.blockDim = BlockDimFor(s.b, s.nv, platform.vectorCores);

  const uint32_t elem = ElemBytes(s.inType);
  const uint32_t profiles[3][2] = {{1, 1}, {1, 2}, {2, 2}};
  bool found = false;
  uint32_t bestChunks = 0, bestDepth = 0;
  for (const auto& profile : profiles) {
    const uint32_t sOut = profile[0], aOut = profile[1];
    // Bytes that do not depend on vStep, and bytes per value row of a chunk.
    const UbLayout one = LayoutFor(d.alignK, d.alignV, 1, elem, s.hasG, s.hasGk, s.gkPerDim);
    const UbLayout zero = LayoutFor(d.alignK, d.alignV, 0, elem, s.hasG, s.hasGk, s.gkPerDim);
    const uint32_t fixed = zero.qIn + zero.kIn + zero.vIn + zero.betaIn + zero.gIn + zero.gkIn + zero.tmpFixed;
    const uint32_t perRow = one.stateIn + sOut * one.stateOut + aOut * one.attnOut + one.tmpPerRow;
    if (fixed >= platform.ubBytes) continue;
    // InitBuffer rounds every buffer to 32 bytes: keep vStep a multiple of 16
    // rows so each chunk-sized buffer is already a whole number of blocks.
    uint32_t vStep = (platform.ubBytes - fixed) / perRow / kAlignElems * kAlignElems;
    if (vStep == 0) continue;
    vStep = vStep < AlignUp(s.dv, kAlignElems) ? vStep : AlignUp(s.dv, kAlignElems);
    const uint32_t chunks = (s.dv + vStep - 1) / vStep;
    vStep = AlignUp((s.dv + chunks - 1) / chunks, kAlignElems);  // balance the chunks
    const uint32_t depth = sOut + aOut;
    const bool better = !found || chunks < bestChunks || (chunks == bestChunks && depth > bestDepth) ||
                        (chunks == bestChunks && depth == bestDepth && vStep > best.data.vStep);
    if (!better) continue;
    found = true;
    bestChunks = chunks;
    bestDepth = depth;
    d.vStep = vStep;
    d.stateOutBufferNum = sOut;
    d.attnOutBufferNum = aOut;
    const UbLayout l = LayoutFor(d.alignK, d.alignV, vStep, elem, s.hasG, s.hasGk, s.gkPerDim);
    d.ubRestBytes = l.tmpFixed + vStep * l.tmpPerRow;
    best.data = d;
    best.fixedBytes = fixed;
    best.perRowBytes = perRow;
    best.chunks = chunks;
  }
  if (!found) {
    std::ostringstream e;
    e << "Dk = " << s.dk << ", Dv = " << s.dv << " do not fit the " << platform.ubBytes
      << "-byte UB even with 16 value rows per chunk";
    best.error = e.str();
    return best;
  }
  best.ok = true;
  return best;
}

}  // namespace rgdr
