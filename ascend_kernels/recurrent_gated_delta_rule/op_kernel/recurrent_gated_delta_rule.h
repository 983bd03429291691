// AscendC kernel of recurrent_gated_delta_rule (Gated DeltaNet decode / MTP).
//
// Work unit: one (sequence b, value head h), dealt round-robin:
// unit b*NV + h runs on core (b*NV + h) % blockDim. Per unit the recurrent
// state S = state[read_slot, h] (Dv x Dk, Dk contiguous) is processed in
// chunks of vStep value rows; while a chunk computes, the next one is already
// being copied in. Per token t of the sequence, in order:
//   S *= exp(g[t,h]);  S *= exp(gk[t,h]) (scalar) or S[v,:] *= exp(gk[t,h,:])
//   d[v] = (value[t,h,v] - S[v,:].k) * beta[t,h];  S[v,:] += d[v] * k
//   out[t,h,v] = S[v,:].(scale * q);  state[ssm_state_indices[t], h] = S
// FP32 in UB throughout; every DMA moves exactly the tensor's bytes (rows are
// padded in UB, never on GM). Inputs are validated on the host before launch.
//
// Vector work is whole-chunk: the row dot products are one repeat-strided Mul
// (plus a MulAddDst per further 64 columns) over kDotRows rows and one
// WholeReduceSum; the rank-one update is a Brcb of the deltas and one
// MulAddDst per 64 columns. About 20 vector instructions per token and 128
// rows at Dk = 128 (the per-row form issued about 900), and the scalars a
// token needs (decay, beta) are read once per head after a single V->S sync.
// Repeat-strided forms, Brcb and MulAddDst: CANN 8.0 Ascend C API reference
// (BinaryRepeatParams, atlasascendc_api_07_0013; MulAddDst, 07_0048; Brcb,
// 07_0089).
#ifndef RECURRENT_GATED_DELTA_RULE_KERNEL_H_
#define RECURRENT_GATED_DELTA_RULE_KERNEL_H_

#include "kernel_operator.h"  // NOLINT(build/include_subdir)
#include "recurrent_gated_delta_rule_tiling_data.h"

namespace rgdr {

struct RGDRInitParams {
  GM_ADDR query;
  GM_ADDR key;
  GM_ADDR value;
  GM_ADDR g;
  GM_ADDR gk;
  GM_ADDR beta;
  GM_ADDR state;
  GM_ADDR actualSeqLengths;
  GM_ADDR ssmStateIndices;
  GM_ADDR numAcceptedTokens;
  GM_ADDR out;
  GM_ADDR stateOut;  // the in-place state output: the state input's memory
};

template <typename inType, typename outType>
class RGDR {
 public:
  __aicore__ inline explicit RGDR(const RecurrentGatedDeltaRuleTilingData& tiling) : t_(tiling) {
    layout_ = LayoutFor(t_.alignK, t_.alignV, t_.vStep, sizeof(inType), t_.hasG == 1, t_.hasGk == 1,
                        t_.gkPerDim == 1);
  }

  __aicore__ inline void Init(const RGDRInitParams& p, AscendC::TPipe* pipe) {
    blockIdx_ = static_cast<uint32_t>(AscendC::GetBlockIdx());
    if (blockIdx_ >= t_.blockDim) {
      return;  // cores past blockDim get no work and allocate no UB
    }
    pipe_ = pipe;
    const uint64_t headRows = static_cast<uint64_t>(t_.t);
    queryGm_.SetGlobalBuffer(reinterpret_cast<__gm__ inType*>(p.query), headRows * t_.nk * t_.dk);
    keyGm_.SetGlobalBuffer(reinterpret_cast<__gm__ inType*>(p.key), headRows * t_.nk * t_.dk);
    valueGm_.SetGlobalBuffer(reinterpret_cast<__gm__ inType*>(p.value), headRows * t_.nv * t_.dv);
    betaGm_.SetGlobalBuffer(reinterpret_cast<__gm__ inType*>(p.beta), headRows * t_.nv);
    if (t_.hasG == 1) gGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(p.g), headRows * t_.nv);
    if (t_.hasGk == 1) {
      gkGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(p.gk), headRows * t_.nv * (t_.gkPerDim == 1 ? t_.dk : 1));
    }
    const uint64_t stateElems = static_cast<uint64_t>(t_.numSlots) * t_.nv * t_.dv * t_.dk;
    stateGm_.SetGlobalBuffer(reinterpret_cast<__gm__ inType*>(p.state), stateElems);
    outStateGm_.SetGlobalBuffer(reinterpret_cast<__gm__ outType*>(p.stateOut), stateElems);
    outGm_.SetGlobalBuffer(reinterpret_cast<__gm__ outType*>(p.out), headRows * t_.nv * t_.dv);
    seqLens32Gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(p.actualSeqLengths), t_.b);
    seqLens64Gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(p.actualSeqLengths), t_.b);
    indices32Gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(p.ssmStateIndices), headRows);
    indices64Gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(p.ssmStateIndices), headRows);
    if (t_.hasAcceptedTokens == 1) {
      acceptedGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(p.numAcceptedTokens), t_.b);
    }
    InitLocalBuffers();
  }

  __aicore__ inline void Process() {
    if (blockIdx_ >= t_.blockDim) {
      return;
    }
    // One pass over the sequences with a running token offset: O(B) scalar
    // reads per core (the seed re-summed the prefix for every batch, O(B^2)).
    int64_t seq0 = 0;
    for (uint32_t b = 0; b < t_.b; ++b) {
      const int64_t seqLen = SeqLen(b);
      // The host refuses lengths past MAX_MTP and T; should one reach the kernel
      // anyway, its sequence is skipped: its rows would not fit the MAX_MTP-row
      // UB buffers, and its tokens would lie past the inputs' T rows.
      if (seqLen > 0 && seqLen <= static_cast<int64_t>(kMaxMtp) && seq0 + seqLen <= static_cast<int64_t>(t_.t)) {
        const uint32_t len = static_cast<uint32_t>(seqLen);
        const int64_t readSlot = ReadSlot(b, seq0, len);
        for (uint32_t h = 0; h < t_.nv; ++h) {
          if ((static_cast<uint64_t>(b) * t_.nv + h) % t_.blockDim == blockIdx_) {
            ProcessHead(seq0, len, h, readSlot);
          }
        }
      }
      if (seqLen > 0) seq0 += seqLen;
    }
  }

 private:
  __aicore__ inline int64_t SeqLen(uint32_t b) const {
    return t_.seqLensInt64 == 1 ? seqLens64Gm_.GetValue(b) : static_cast<int64_t>(seqLens32Gm_.GetValue(b));
  }
  __aicore__ inline int64_t StateIndex(int64_t token) const {
    return t_.indicesInt64 == 1 ? indices64Gm_.GetValue(token) : static_cast<int64_t>(indices32Gm_.GetValue(token));
  }
  // With accepted speculative tokens the state to continue from is the one the
  // last accepted token wrote; otherwise the sequence's first slot.
  __aicore__ inline int64_t ReadSlot(uint32_t b, int64_t seq0, uint32_t len) const {
    if (t_.hasAcceptedTokens == 1) {
      const int32_t accepted = acceptedGm_.GetValue(b);
      if (accepted > 0 && static_cast<uint32_t>(accepted) <= len) {
        return StateIndex(seq0 + accepted - 1);
      }
    }
    return StateIndex(seq0);
  }

  __aicore__ inline void InitLocalBuffers() {
    pipe_->InitBuffer(qInQue_, 1, layout_.qIn);
    pipe_->InitBuffer(kInQue_, 1, layout_.kIn);
    pipe_->InitBuffer(vInQue_, 1, layout_.vIn);
    pipe_->InitBuffer(betaInQue_, 1, layout_.betaIn);
    if (t_.hasG == 1) pipe_->InitBuffer(gInQue_, 1, layout_.gIn);
    if (t_.hasGk == 1) pipe_->InitBuffer(gkInQue_, 1, layout_.gkIn);
    pipe_->InitBuffer(stateInQue_, 1, layout_.stateIn);
    // Queue depths are 1 or 2 (kMaxOutBuffers, checked by the host tiling);
    // InitBuffer takes them as uint8_t.
    pipe_->InitBuffer(stateOutQue_, static_cast<uint8_t>(t_.stateOutBufferNum), layout_.stateOut);
    pipe_->InitBuffer(attnOutQue_, static_cast<uint8_t>(t_.attnOutBufferNum), layout_.attnOut);
    pipe_->InitBuffer(tmpBuf_, t_.ubRestBytes);

    const uint32_t aK = t_.alignK, aV = t_.alignV;
    uint32_t off = 0;
    qF_ = TakeF32(off, kMaxMtp * aK);
    kF_ = TakeF32(off, kMaxMtp * aK);
    vF_ = TakeF32(off, kMaxMtp * aV);
    betaF_ = TakeF32(off, kMaxMtp * 16);
    gF_ = TakeF32(off, kMaxMtp * 8);
    gkF_ = TakeF32(off, t_.gkPerDim == 1 ? kMaxMtp * aK : kMaxMtp * 8);
    dotTmp_ = TakeF32(off, kDotRows * kReduceLength);
    stateF_ = TakeF32(off, t_.vStep * aK);
    deltaB_ = TakeF32(off, t_.vStep * 8);
    kvF_ = TakeF32(off, t_.vStep);
    attnF_ = TakeF32(off, t_.vStep);
    deltaF_ = TakeF32(off, t_.vStep);
    // Brcb reads deltas in groups of 8: a chunk of fewer rows reads a few
    // past its end, which must hold numbers (their products are never used).
    AscendC::Duplicate(deltaF_, 0.0f, t_.vStep);
  }

  // Rows [len] of `heads`-wide GM rows of `dim` elements into UB rows padded
  // to the next 32-byte block.
  template <typename T, typename Q>
  __aicore__ inline AscendC::LocalTensor<T> CopyInRows(Q& que, const AscendC::GlobalTensor<T>& src, uint32_t len,
                                                       uint32_t dim, uint32_t heads) {
    AscendC::LocalTensor<T> local = que.template AllocTensor<T>();
    AscendC::DataCopyExtParams params{static_cast<uint16_t>(len), static_cast<uint32_t>(dim * sizeof(T)),
                                      static_cast<uint32_t>((heads - 1) * dim * sizeof(T)), 0, 0};
    const uint32_t padTo = AlignUp(dim * sizeof(T), kBlockBytes) / sizeof(T);
    AscendC::DataCopyPadExtParams<T> pad{true, 0, static_cast<uint8_t>(padTo - dim), T{}};
    AscendC::DataCopyPad(local, src, params, pad);
    que.EnQue(local);
    return que.template DeQue<T>();
  }

  __aicore__ inline void CopyInToken(int64_t seq0, uint32_t len, uint32_t h) {
    const uint32_t hk = h / (t_.nv / t_.nk);
    const uint32_t aK = t_.alignK, aV = t_.alignV;
    auto q = CopyInRows(qInQue_, queryGm_[(seq0 * t_.nk + hk) * t_.dk], len, t_.dk, t_.nk);
    AscendC::Cast(qF_, q, AscendC::RoundMode::CAST_NONE, len * aK);
    AscendC::Muls(qF_, qF_, t_.scale, len * aK);
    qInQue_.FreeTensor(q);
    auto k = CopyInRows(kInQue_, keyGm_[(seq0 * t_.nk + hk) * t_.dk], len, t_.dk, t_.nk);
    AscendC::Cast(kF_, k, AscendC::RoundMode::CAST_NONE, len * aK);
    kInQue_.FreeTensor(k);
    auto v = CopyInRows(vInQue_, valueGm_[(seq0 * t_.nv + h) * t_.dv], len, t_.dv, t_.nv);
    AscendC::Cast(vF_, v, AscendC::RoundMode::CAST_NONE, len * aV);
    vInQue_.FreeTensor(v);
    auto beta = CopyInRows(betaInQue_, betaGm_[seq0 * t_.nv + h], len, 1, t_.nv);
    AscendC::Cast(betaF_, beta, AscendC::RoundMode::CAST_NONE, len * 16);
    betaInQue_.FreeTensor(beta);
    if (t_.hasG == 1) {
      auto g = CopyInRows(gInQue_, gGm_[seq0 * t_.nv + h], len, 1, t_.nv);
      AscendC::Exp(gF_, g, len * 8);
      gInQue_.FreeTensor(g);
    }
    if (t_.hasGk == 1) {
      if (t_.gkPerDim == 1) {
        auto gk = CopyInRows(gkInQue_, gkGm_[(seq0 * t_.nv + h) * t_.dk], len, t_.dk, t_.nv);
        const uint32_t rowDk = AlignUp(t_.dk * 4, kBlockBytes) / 4;
        for (uint32_t t = 0; t < len; ++t) {
          AscendC::Exp(gkF_[t * aK], gk[t * rowDk], rowDk);
        }
        gkInQue_.FreeTensor(gk);
      } else {
        auto gk = CopyInRows(gkInQue_, gkGm_[seq0 * t_.nv + h], len, 1, t_.nv);
        AscendC::Exp(gkF_, gk, len * 8);
        gkInQue_.FreeTensor(gk);
      }
    }
    // The per-token scalars, read once per head: one V->S sync, not one per token.
    WaitVectorToScalar();
    for (uint32_t t = 0; t < len; ++t) {
      float decay = t_.hasG == 1 ? gF_.GetValue(t * 8) : 1.0f;
      if (t_.hasGk == 1 && t_.gkPerDim != 1) decay *= gkF_.GetValue(t * 8);
      decay_[t] = decay;
      beta_[t] = betaF_.GetValue(t * 16);
    }
  }

  __aicore__ inline void CopyInStateChunk(int64_t slot, uint32_t h, uint32_t v0, uint32_t rows) {
    AscendC::LocalTensor<inType> s = stateInQue_.AllocTensor<inType>();
    const uint64_t base = ((static_cast<uint64_t>(slot) * t_.nv + h) * t_.dv + v0) * t_.dk;
    AscendC::DataCopyExtParams params{static_cast<uint16_t>(rows), static_cast<uint32_t>(t_.dk * sizeof(inType)),
                                      0, 0, 0};
    AscendC::DataCopyPadExtParams<inType> pad{true, 0, static_cast<uint8_t>(t_.alignK - t_.dk), inType{}};
    AscendC::DataCopyPad(s, stateGm_[base], params, pad);
    stateInQue_.EnQue(s);
  }

  // out[v] = S[v, :] . vec for the chunk's rows: per kDotRows rows, the
  // products of each 64-column group land in one 64-wide row of dotTmp (Mul
  // for the first group, MulAddDst for the others: vec is repeated with
  // repeat stride 0), and one WholeReduceSum sums each row.
  __aicore__ inline void RowDots(const AscendC::LocalTensor<float>& out, const AscendC::LocalTensor<float>& vec,
                                 uint32_t rows) {
    const uint32_t aK = t_.alignK;
    const uint8_t rowBlocks = static_cast<uint8_t>(aK / 8);
    for (uint32_t r0 = 0; r0 < rows; r0 += kDotRows) {
      const uint32_t n = rows - r0 < kDotRows ? rows - r0 : kDotRows;
      for (uint32_t c0 = 0; c0 < aK; c0 += kReduceLength) {
        const uint64_t mask = aK - c0 < kReduceLength ? aK - c0 : kReduceLength;
        const AscendC::BinaryRepeatParams p(1, 1, 1, 8, rowBlocks, 0);
        if (c0 == 0) {
          AscendC::Mul(dotTmp_, stateF_[r0 * aK], vec, mask, static_cast<uint8_t>(n), p);
        } else {
          AscendC::MulAddDst(dotTmp_, stateF_[r0 * aK + c0], vec[c0], mask, static_cast<uint8_t>(n), p);
        }
      }
      const int32_t width = static_cast<int32_t>(aK < kReduceLength ? aK : kReduceLength);
      AscendC::WholeReduceSum(out[r0], dotTmp_, width, static_cast<int32_t>(n), 1, 1, 8);
    }
  }

  // S[v, c] *= col[c] for the chunk's rows (per-dimension decay): col repeated
  // with stride 0, over the Dk columns rounded to a block (the rest stay zero).
  __aicore__ inline void ScaleColumns(const AscendC::LocalTensor<float>& col, uint32_t rows) {
    const uint32_t aK = t_.alignK, cols = AlignUp(t_.dk, 8);
    const uint8_t rowBlocks = static_cast<uint8_t>(aK / 8);
    for (uint32_t r0 = 0; r0 < rows; r0 += kDotRows) {
      const uint32_t n = rows - r0 < kDotRows ? rows - r0 : kDotRows;
      for (uint32_t c0 = 0; c0 < cols; c0 += kReduceLength) {
        const uint64_t mask = cols - c0 < kReduceLength ? cols - c0 : kReduceLength;
        AscendC::Mul(stateF_[r0 * aK + c0], stateF_[r0 * aK + c0], col[c0], mask, static_cast<uint8_t>(n),
                     AscendC::BinaryRepeatParams(1, 1, 1, rowBlocks, rowBlocks, 0));
      }
    }
  }

  // S[v, :] += delta[v] * k for the chunk's rows: Brcb spreads each delta over
  // a 32-byte block, which MulAddDst reads with block stride 0 (one delta per row).
  __aicore__ inline void RankOneUpdate(const AscendC::LocalTensor<float>& k, uint32_t rows) {
    const uint32_t aK = t_.alignK;
    const uint8_t rowBlocks = static_cast<uint8_t>(aK / 8);
    AscendC::Brcb(deltaB_, deltaF_, static_cast<uint8_t>((rows + 7) / 8), AscendC::BrcbRepeatParams(1, 8));
    for (uint32_t r0 = 0; r0 < rows; r0 += kDotRows) {
      const uint32_t n = rows - r0 < kDotRows ? rows - r0 : kDotRows;
      for (uint32_t c0 = 0; c0 < aK; c0 += kReduceLength) {
        const uint64_t mask = aK - c0 < kReduceLength ? aK - c0 : kReduceLength;
        AscendC::MulAddDst(stateF_[r0 * aK + c0], k[c0], deltaB_[r0 * 8], mask, static_cast<uint8_t>(n),
                           AscendC::BinaryRepeatParams(1, 1, 0, rowBlocks, 0, 1));
      }
    }
  }

  // The next FP32 slice of the working buffer: count elements at `off`, which
  // advances to the next 32-byte boundary. (A member, not a capturing lambda:
  // device code calls only __aicore__ functions.)
  __aicore__ inline AscendC::LocalTensor<float> TakeF32(uint32_t& off, uint32_t count) {
    AscendC::LocalTensor<float> tensor = tmpBuf_.GetWithOffset<float>(count, off);
    off += AlignUp(count * 4, kBlockBytes);
    return tensor;
  }

  // The V->S synchronisation as public AscendC kernels write it: event_t is a
  // global type and FetchEventID returns a TEventID, so the id is cast
  // (e.g. CANN ops-transformer's attention kernels:
  // `event_t id = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_S))`).
  __aicore__ inline void WaitVectorToScalar() {
    event_t id = static_cast<event_t>(pipe_->FetchEventID(AscendC::HardEvent::V_S));
    AscendC::SetFlag<AscendC::HardEvent::V_S>(id);
    AscendC::WaitFlag<AscendC::HardEvent::V_S>(id);
  }

  __aicore__ inline void ComputeToken(uint32_t t, uint32_t v0, uint32_t rows) {
    const uint32_t aK = t_.alignK;
    if (t_.hasG == 1 || (t_.hasGk == 1 && t_.gkPerDim != 1)) {
      AscendC::Muls(stateF_, stateF_, decay_[t], rows * aK);
    }
    if (t_.hasGk == 1 && t_.gkPerDim == 1) ScaleColumns(gkF_[t * aK], rows);
    const AscendC::LocalTensor<float> k = kF_[t * aK];
    RowDots(kvF_, k, rows);
    AscendC::Sub(deltaF_, vF_[t * t_.alignV + v0], kvF_, rows);
    AscendC::Muls(deltaF_, deltaF_, beta_[t], rows);
    RankOneUpdate(k, rows);
    RowDots(attnF_, qF_[t * aK], rows);
  }

  __aicore__ inline void CopyOutToken(int64_t token, uint32_t h, uint32_t v0, uint32_t rows) {
    AscendC::LocalTensor<outType> attn = attnOutQue_.AllocTensor<outType>();
    AscendC::Cast(attn, attnF_, AscendC::RoundMode::CAST_RINT, rows);
    attnOutQue_.EnQue(attn);
    attn = attnOutQue_.DeQue<outType>();
    // Exactly `rows` values: a tail write rounded up to 32 bytes would land on
    // the next head's output.
    AscendC::DataCopyExtParams attnParams{1, static_cast<uint32_t>(rows * sizeof(outType)), 0, 0, 0};
    AscendC::DataCopyPad(outGm_[(static_cast<uint64_t>(token) * t_.nv + h) * t_.dv + v0], attn, attnParams);
    attnOutQue_.FreeTensor(attn);

    AscendC::LocalTensor<outType> s = stateOutQue_.AllocTensor<outType>();
    AscendC::Cast(s, stateF_, AscendC::RoundMode::CAST_RINT, rows * t_.alignK);
    stateOutQue_.EnQue(s);
    s = stateOutQue_.DeQue<outType>();
    const int64_t slot = StateIndex(token);
    const uint64_t base = ((static_cast<uint64_t>(slot) * t_.nv + h) * t_.dv + v0) * t_.dk;
    AscendC::DataCopyExtParams stateParams{static_cast<uint16_t>(rows), static_cast<uint32_t>(t_.dk * sizeof(outType)),
                                           0, 0, 0};
    AscendC::DataCopyPad(outStateGm_[base], s, stateParams);
    stateOutQue_.FreeTensor(s);
  }

  __aicore__ inline void ProcessHead(int64_t seq0, uint32_t len, uint32_t h, int64_t readSlot) {
    CopyInToken(seq0, len, h);
    const uint32_t chunks = (t_.dv + t_.vStep - 1) / t_.vStep;
    CopyInStateChunk(readSlot, h, 0, t_.vStep < t_.dv ? t_.vStep : t_.dv);
    for (uint32_t c = 0; c < chunks; ++c) {
      const uint32_t v0 = c * t_.vStep;
      const uint32_t rows = t_.dv - v0 < t_.vStep ? t_.dv - v0 : t_.vStep;
      AscendC::LocalTensor<inType> s = stateInQue_.DeQue<inType>();
      AscendC::Cast(stateF_, s, AscendC::RoundMode::CAST_NONE, rows * t_.alignK);
      stateInQue_.FreeTensor(s);
      if (c + 1 < chunks) {  // prefetch: the next chunk's DMA overlaps this chunk's compute
        const uint32_t next = v0 + t_.vStep;
        CopyInStateChunk(readSlot, h, next, t_.dv - next < t_.vStep ? t_.dv - next : t_.vStep);
      }
      for (uint32_t t = 0; t < len; ++t) {
        ComputeToken(t, v0, rows);
        CopyOutToken(seq0 + t, h, v0, rows);
      }
    }
  }

  RecurrentGatedDeltaRuleTilingData t_;
  UbLayout layout_{};
  uint32_t blockIdx_ = 0;
  AscendC::TPipe* pipe_ = nullptr;

  AscendC::GlobalTensor<inType> queryGm_, keyGm_, valueGm_, betaGm_, stateGm_;
  AscendC::GlobalTensor<outType> outGm_, outStateGm_;
  AscendC::GlobalTensor<float> gGm_, gkGm_;
  AscendC::GlobalTensor<int32_t> seqLens32Gm_, indices32Gm_, acceptedGm_;
  AscendC::GlobalTensor<int64_t> seqLens64Gm_, indices64Gm_;

  AscendC::TQue<AscendC::QuePosition::VECIN, 1> qInQue_, kInQue_, vInQue_, betaInQue_, gInQue_, gkInQue_,
      stateInQue_;
  AscendC::TQue<AscendC::QuePosition::VECOUT, kMaxOutBuffers> stateOutQue_, attnOutQue_;
  AscendC::TBuf<AscendC::TPosition::VECCALC> tmpBuf_;
  AscendC::LocalTensor<float> qF_, kF_, vF_, betaF_, gF_, gkF_, dotTmp_, stateF_, deltaB_, kvF_, attnF_, deltaF_;
  float decay_[kMaxMtp] = {};  // per token: exp(g) * exp(gk) (scalar gk)
  float beta_[kMaxMtp] = {};
};

}  // namespace rgdr

#endif  // RECURRENT_GATED_DELTA_RULE_KERNEL_H_
