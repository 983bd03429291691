// CPU twin of the AscendC API subset the RGDR kernel uses. The kernel source
// compiles unchanged against this header (instead of CANN's) and runs once
// per block on the CPU, with the hardware's rules enforced:
//  - UB capacity per core and queue buffers per TPosition, from the SoC's
//    platform entry (never from the tiling),
//  - 32-byte alignment of UB operands of DMA and vector instructions,
//  - queue discipline (AllocTensor/EnQue/DeQue/FreeTensor, depth, leaks), and
//    no use of a tensor after FreeTensor or between its EnQue and DeQue,
//  - asynchrony: DMA data is visible only after its wait (DeQue, WaitFlag),
//    a vector result reaches the scalar unit only after a V_S sync and a DMA
//    out only after EnQue/DeQue or a V_MTE3 flag, a DMA out's source stays
//    read-only until FreeTensor or an MTE3 flag,
//  - reads of UB bytes nothing wrote,
//  - operands of one vector instruction either identical or disjoint,
//  - every element a repeat-strided instruction touches inside its tensor,
//  - GM reads and writes outside the tensors of the launch (this is how a
//    DMA tail that rounds up to 32 bytes gets caught),
//  - SetFlag without WaitFlag.
// Signatures follow CANN's documented ones (CANN 8.x Ascend C API reference),
// so code that builds here builds there. DMA bytes, vector instructions and
// their repeats, and V->S syncs are counted.
#ifndef RGDR_CPU_TWIN_KERNEL_OPERATOR_H_
#define RGDR_CPU_TWIN_KERNEL_OPERATOR_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "cpu_twin/twin_runtime.h"
#include "rvv_kernels/base/bf16.h"

#define __aicore__
#define __global__
#define __gm__
using GM_ADDR = uint8_t*;

struct bfloat16_t {
  uint16_t bits;
};
using half = _Float16;

// CANN declares the hardware event ids as a global type, outside AscendC; a
// kernel casts TPipe::FetchEventID's TEventID to it.
enum event_t : int32_t { EVENT_ID0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };

namespace AscendC {

using twin::TwinError;

inline float ToFloat(float x) { return x; }
inline float ToFloat(half x) { return static_cast<float>(x); }
inline float ToFloat(bfloat16_t x) { return rvascend::Bf16ToFloat(x.bits); }
template <typename T>
inline T FromFloat(float f);
template <>
inline float FromFloat<float>(float f) { return f; }
template <>
inline half FromFloat<half>(float f) { return static_cast<half>(f); }
template <>
inline bfloat16_t FromFloat<bfloat16_t>(float f) { return bfloat16_t{rvascend::FloatToBf16(f)}; }

enum class TPosition { GM, VECIN, VECOUT, VECCALC };
using QuePosition = TPosition;
enum class RoundMode { CAST_NONE, CAST_RINT, CAST_ROUND, CAST_FLOOR, CAST_CEIL, CAST_TRUNC };
enum class HardEvent { MTE2_V, V_MTE2, V_MTE3, MTE3_V, V_S, S_V, MTE2_S, S_MTE2, MTE3_S, S_MTE3, MTE3_MTE2 };
enum pipe_t { PIPE_S, PIPE_V, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };
using TEventID = int8_t;  // what TPipe::FetchEventID returns

inline int64_t GetBlockIdx() { return twin::Runtime::Get().block_idx(); }
inline int64_t GetBlockNum() { return twin::Runtime::Get().block_num(); }

template <HardEvent event>
inline void SetFlag(int32_t id) {
  ++twin::Runtime::Get().events()[{static_cast<int>(event), id}];
}

// What a completed wait makes visible, over the whole UB.
inline void Waited(HardEvent event) {
  auto& rt = twin::Runtime::Get();
  const uint32_t all = rt.ub_bytes();
  switch (event) {
    case HardEvent::V_S: rt.ScalarSynced(); break;
    case HardEvent::MTE2_V: case HardEvent::MTE2_S: rt.DmaInLanded(0, all); break;
    case HardEvent::V_MTE3: rt.VectorResultsSynced(0, all); break;
    case HardEvent::MTE3_V: case HardEvent::MTE3_MTE2: rt.DmaOutDone(0, all); break;
    default: break;
  }
}

template <HardEvent event>
inline void WaitFlag(int32_t id) {
  auto& rt = twin::Runtime::Get();
  auto& count = rt.events()[{static_cast<int>(event), id}];
  if (count <= 0) throw TwinError("WaitFlag on an event that was never set: the core would hang");
  --count;
  if (event == HardEvent::V_S) ++rt.counters.scalarSyncs;
  Waited(event);
}

template <pipe_t pipe>
inline void PipeBarrier() {
  // PipeBarrier<PIPE_V> orders vector instructions among themselves; it does
  // not make their results visible to the scalar unit (that takes a V_S
  // event) or to the DMA units. Only a full barrier does all of it.
  if (pipe == PIPE_ALL) {
    for (HardEvent e : {HardEvent::V_S, HardEvent::MTE2_V, HardEvent::V_MTE3, HardEvent::MTE3_V}) Waited(e);
  }
}

// ---------------------------------------------------------------------------
template <typename T>
class GlobalTensor {
 public:
  void SetGlobalBuffer(__gm__ T* base, uint64_t size = 0) {
    base_ = base;
    size_ = size;
  }
  GlobalTensor operator[](uint64_t offset) const {
    GlobalTensor g;
    g.base_ = base_ + offset;
    g.size_ = size_ > offset ? size_ - offset : 0;
    return g;
  }
  T GetValue(uint64_t i) const {
    twin::Runtime::Get().CheckGm(base_ + i, sizeof(T), "GlobalTensor::GetValue");
    return base_[i];
  }
  void SetValue(uint64_t i, T v) const {
    twin::Runtime::Get().CheckGm(base_ + i, sizeof(T), "GlobalTensor::SetValue");
    base_[i] = v;
  }
  T* GetPhyAddr() const { return base_; }

 private:
  T* base_ = nullptr;
  uint64_t size_ = 0;
};

class TQueBase;
// Throws if a queue tensor is used after FreeTensor, or between EnQue and DeQue.
inline void CheckQueueUse(const TQueBase* queue, int slot, uint32_t generation, const char* what);

template <typename T>
class LocalTensor {
 public:
  LocalTensor() = default;
  LocalTensor(uint32_t offset, uint32_t count, TQueBase* queue = nullptr, int slot = -1, uint32_t generation = 0)
      : offset_(offset), count_(count), queue_(queue), slot_(slot), generation_(generation) {}

  LocalTensor operator[](uint32_t i) const {
    if (i > count_) throw TwinError("LocalTensor index past the tensor");
    return LocalTensor(offset_ + i * sizeof(T), count_ - i, queue_, slot_, generation_);
  }
  T GetValue(uint32_t i) const {
    auto& rt = twin::Runtime::Get();
    CheckUse("LocalTensor::GetValue");
    if (rt.VectorDirty(offset_ + i * sizeof(T), sizeof(T))) {
      throw TwinError("scalar read of UB a vector instruction wrote, without a V_S synchronisation");
    }
    rt.CheckVectorRead(offset_ + i * sizeof(T), sizeof(T), "LocalTensor::GetValue");
    T v;
    std::memcpy(&v, rt.ub() + offset_ + i * sizeof(T), sizeof(T));
    return v;
  }
  void SetValue(uint32_t i, T v) const {
    auto& rt = twin::Runtime::Get();
    CheckUse("LocalTensor::SetValue");
    rt.CheckVectorWrite(offset_ + i * sizeof(T), sizeof(T), "LocalTensor::SetValue");
    std::memcpy(rt.ub() + offset_ + i * sizeof(T), &v, sizeof(T));
    rt.MarkUbWritten(offset_ + i * sizeof(T), sizeof(T));
  }
  uint32_t GetSize() const { return count_; }
  uint32_t offset() const { return offset_; }
  TQueBase* queue() const { return queue_; }
  int slot() const { return slot_; }
  uint32_t generation() const { return generation_; }
  void CheckUse(const char* what) const {
    if (queue_ != nullptr) CheckQueueUse(queue_, slot_, generation_, what);
  }
  T* data() const { return reinterpret_cast<T*>(twin::Runtime::Get().ub() + offset_); }
  template <typename U>
  LocalTensor<U> ReinterpretCast() const {
    return LocalTensor<U>(offset_, count_ * sizeof(T) / sizeof(U), queue_, slot_, generation_);
  }

 private:
  uint32_t offset_ = 0;
  uint32_t count_ = 0;
  TQueBase* queue_ = nullptr;
  int slot_ = -1;
  uint32_t generation_ = 0;
};

// ---------------------------------------------------------------------------
class TQueBase {
 public:
  enum class State { kFree, kAllocated, kQueued, kDequeued };
  void Init(TPosition position, uint32_t depth, uint32_t bytes, uint32_t max_depth) {
    static const char* const kNames[] = {"GM", "VECIN", "VECOUT", "VECCALC"};
    name_ = std::string("TQue<") + kNames[static_cast<int>(position)] + ">";
    if (depth == 0 || depth > max_depth) {
      throw TwinError("InitBuffer: queue depth " + std::to_string(depth) + " outside 1.." + std::to_string(max_depth) +
                      " of the TQue template");
    }
    twin::Runtime::Get().AddBuffers(static_cast<int>(position), kNames[static_cast<int>(position)], depth);
    position_ = position;
    bytes_ = (bytes + 31) / 32 * 32;
    for (uint32_t i = 0; i < depth; ++i) {
      offsets_[i] = twin::Runtime::Get().AllocateUb(bytes_, name_.c_str());
      state_[i] = State::kFree;
    }
    depth_ = depth;
  }
  ~TQueBase() {
    for (uint32_t i = 0; i < depth_; ++i) {
      if (state_[i] != State::kFree) {
        twin::Runtime::Get().DeferError(name_ + ": buffer still held when the block ended");
        return;
      }
    }
  }
  int Alloc() {
    for (uint32_t i = 0; i < depth_; ++i) {
      if (state_[i] == State::kFree) {
        state_[i] = State::kAllocated;
        ++generation_[i];
        return static_cast<int>(i);
      }
    }
    throw TwinError(name_ + ": AllocTensor with all " + std::to_string(depth_) + " buffers in use");
  }
  void Enque(int slot, uint32_t generation) {
    CheckLive(slot, generation, "EnQue");
    Expect(slot, State::kAllocated, "EnQue");
    state_[slot] = State::kQueued;
    order_[tail_++ % 8] = slot;
  }
  int Deque() {
    if (head_ == tail_) throw TwinError(name_ + ": DeQue with nothing enqueued");
    const int slot = order_[head_++ % 8];
    state_[slot] = State::kDequeued;
    // DeQue is the consumer's wait: a VECIN tensor's DMA has landed, a VECOUT
    // tensor's vector results are visible to the DMA out.
    auto& rt = twin::Runtime::Get();
    if (position_ == TPosition::VECIN) rt.DmaInLanded(offsets_[slot], bytes_);
    if (position_ == TPosition::VECOUT) rt.VectorResultsSynced(offsets_[slot], bytes_);
    return slot;
  }
  void Free(int slot, uint32_t generation) {
    Check(slot, generation, "FreeTensor");  // a freed buffer fails the generation, a queued one the state
    state_[slot] = State::kFree;
    ++generation_[slot];
    // Freeing a VECOUT buffer waits for its DMA out (MTE3) before the buffer is reused.
    if (position_ == TPosition::VECOUT) twin::Runtime::Get().DmaOutDone(offsets_[slot], bytes_);
  }
  // The tensor's buffer is still the one it was given (not freed since).
  void CheckLive(int slot, uint32_t generation, const char* what) const {
    if (slot < 0 || static_cast<uint32_t>(slot) >= depth_) throw TwinError(name_ + ": " + what + " of a foreign tensor");
    if (generation != generation_[slot]) {
      throw TwinError(name_ + ": " + what + " uses a tensor after its FreeTensor");
    }
  }
  // ... and not handed over to the queue's consumer.
  void Check(int slot, uint32_t generation, const char* what) const {
    CheckLive(slot, generation, what);
    if (state_[slot] == State::kQueued) {
      throw TwinError(name_ + ": " + what + " uses a tensor between its EnQue and DeQue");
    }
  }
  uint32_t offset(int slot) const { return offsets_[slot]; }
  uint32_t bytes() const { return bytes_; }
  uint32_t generation(int slot) const { return generation_[slot]; }

 private:
  void Expect(int slot, State s, const char* op) {
    if (state_[slot] != s) throw TwinError(name_ + ": " + op + " of a tensor in the wrong state");
  }
  TPosition position_ = TPosition::VECCALC;
  uint32_t depth_ = 0, bytes_ = 0;
  uint32_t offsets_[8] = {};
  State state_[8] = {};
  uint32_t generation_[8] = {};
  int order_[8] = {};
  uint32_t head_ = 0, tail_ = 0;
  std::string name_;
};

inline void CheckQueueUse(const TQueBase* queue, int slot, uint32_t generation, const char* what) {
  queue->Check(slot, generation, what);
}

template <TPosition pos, int32_t depth>
class TQue : public TQueBase {
 public:
  static constexpr int32_t kDepth = depth;
  template <typename T>
  LocalTensor<T> AllocTensor() {
    const int slot = Alloc();
    return LocalTensor<T>(offset(slot), bytes() / sizeof(T), this, slot, generation(slot));
  }
  template <typename T>
  void EnQue(const LocalTensor<T>& t) {
    if (t.queue() != this) throw TwinError("EnQue of a tensor from another queue");
    Enque(t.slot(), GenerationOf(t));
  }
  template <typename T>
  LocalTensor<T> DeQue() {
    const int slot = Deque();
    return LocalTensor<T>(offset(slot), bytes() / sizeof(T), this, slot, generation(slot));
  }
  template <typename T>
  void FreeTensor(const LocalTensor<T>& t) {
    if (t.queue() != this) throw TwinError("FreeTensor of a tensor from another queue");
    Free(t.slot(), GenerationOf(t));
  }

 private:
  template <typename T>
  static uint32_t GenerationOf(const LocalTensor<T>& t) {
    return t.generation();
  }
};

template <TPosition pos>
class TBuf {
 public:
  void Init(uint32_t bytes) {
    twin::Runtime::Get().AddBuffers(-1, "TBuf", 1);
    bytes_ = (bytes + 31) / 32 * 32;
    offset_ = twin::Runtime::Get().AllocateUb(bytes_, "TBuf");
  }
  template <typename T>
  LocalTensor<T> Get() const {
    return LocalTensor<T>(offset_, bytes_ / sizeof(T));
  }
  template <typename T>
  LocalTensor<T> GetWithOffset(uint32_t count, uint32_t byte_offset) const {
    if (byte_offset % 32 != 0) throw TwinError("TBuf::GetWithOffset: offset not 32-byte aligned");
    if (static_cast<uint64_t>(byte_offset) + count * sizeof(T) > bytes_) {
      throw TwinError("TBuf::GetWithOffset: " + std::to_string(count * sizeof(T)) + " bytes at offset " +
                      std::to_string(byte_offset) + " exceed the buffer's " + std::to_string(bytes_));
    }
    return LocalTensor<T>(offset_ + byte_offset, count);
  }

 private:
  uint32_t offset_ = 0, bytes_ = 0;
};

class TPipe {
 public:
  TPipe();
  template <TPosition pos, int32_t depth>
  void InitBuffer(TQue<pos, depth>& que, uint8_t num, uint32_t len) {
    que.Init(pos, num, len, depth);
  }
  template <TPosition pos>
  void InitBuffer(TBuf<pos>& buf, uint32_t len) {
    buf.Init(len);
  }
  TEventID FetchEventID(HardEvent) { return static_cast<TEventID>(next_event_++ % 8); }

 private:
  int32_t next_event_ = 0;
};

inline TPipe*& CurrentPipe() {
  static TPipe* pipe = nullptr;
  return pipe;
}
inline TPipe::TPipe() { CurrentPipe() = this; }
inline TPipe* GetTPipePtr() { return CurrentPipe(); }

// ---------------------------------------------------------------------------
struct DataCopyExtParams {
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;   // bytes per row
  uint32_t srcStride = 0;  // gap after each row: bytes on GM, 32-byte blocks on UB
  uint32_t dstStride = 0;  // gap after each row: 32-byte blocks on UB, bytes on GM
  uint32_t rsv = 0;
};

template <typename T>
struct DataCopyPadExtParams {
  bool isPad = false;
  uint8_t leftPadding = 0;
  uint8_t rightPadding = 0;  // elements filled with paddingValue after each row
  T paddingValue = T{};
};

namespace detail {
inline void CheckUbAligned(uint32_t offset, const char* what) {
  if (offset % 32 != 0) throw TwinError(std::string(what) + ": UB address not 32-byte aligned");
}
template <typename T>
inline void CheckRange(const LocalTensor<T>& t, uint64_t count, const char* what) {
  if (count > t.GetSize()) {
    throw TwinError(std::string(what) + ": " + std::to_string(count) + " elements exceed the tensor's " +
                    std::to_string(t.GetSize()));
  }
}
// Operands of one vector instruction: the same address or no shared byte
// (CANN's vector API documents partial overlap as unsupported).
inline void CheckOverlap(uint32_t a, uint32_t a_bytes, uint32_t b, uint32_t b_bytes, const char* what) {
  if (a != b && a < b + b_bytes && b < a + a_bytes) {
    throw TwinError(std::string(what) + ": operands partially overlap (only identical or disjoint operands)");
  }
}
}  // namespace detail

// GM -> UB. Each row lands at a 32-byte aligned UB address; the bytes after a
// row up to the next 32-byte boundary hold padding only if isPad asks for it.
// The data is visible only after the DMA is waited for (DeQue, WaitFlag<MTE2_*>).
template <typename T>
inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                        const DataCopyPadExtParams<T>& pad) {
  auto& rt = twin::Runtime::Get();
  dst.CheckUse("DataCopyPad GM->UB");
  detail::CheckUbAligned(dst.offset(), "DataCopyPad GM->UB");
  const uint32_t row_ub = (p.blockLen + 31) / 32 * 32 + p.dstStride * 32;
  const uint8_t* gm = reinterpret_cast<const uint8_t*>(src.GetPhyAddr());
  if (static_cast<uint64_t>(row_ub) * p.blockCount > static_cast<uint64_t>(dst.GetSize()) * sizeof(T)) {
    throw TwinError("DataCopyPad GM->UB: rows exceed the destination tensor");
  }
  for (uint32_t r = 0; r < p.blockCount; ++r) {
    const uint8_t* row = gm + static_cast<uint64_t>(r) * (p.blockLen + p.srcStride);
    rt.CheckGm(row, p.blockLen, "DataCopyPad GM->UB");
    const uint32_t at = dst.offset() + r * row_ub;
    rt.DmaInStarted(at, (p.blockLen + 31) / 32 * 32);
    std::memcpy(rt.ub() + at, row, p.blockLen);
    rt.MarkUbWritten(at, p.blockLen);
    if (pad.isPad && pad.rightPadding) {
      for (uint32_t i = 0; i < pad.rightPadding; ++i) {
        std::memcpy(rt.ub() + at + p.blockLen + i * sizeof(T), &pad.paddingValue, sizeof(T));
      }
      rt.MarkUbWritten(at + p.blockLen, pad.rightPadding * sizeof(T));
    }
  }
  rt.counters.dmaInBytes += static_cast<uint64_t>(p.blockLen) * p.blockCount;
}

// UB -> GM, exactly blockLen bytes per row (no rounding up to 32 bytes). The
// source must hold synced vector results and stays read-only until the DMA
// is waited for (FreeTensor of its VECOUT tensor, WaitFlag<MTE3_*>).
template <typename T>
inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p) {
  auto& rt = twin::Runtime::Get();
  src.CheckUse("DataCopyPad UB->GM");
  detail::CheckUbAligned(src.offset(), "DataCopyPad UB->GM");
  const uint32_t row_ub = (p.blockLen + 31) / 32 * 32 + p.srcStride * 32;
  uint8_t* gm = reinterpret_cast<uint8_t*>(dst.GetPhyAddr());
  for (uint32_t r = 0; r < p.blockCount; ++r) {
    uint8_t* row = gm + static_cast<uint64_t>(r) * (p.blockLen + p.dstStride);
    rt.CheckGm(row, p.blockLen, "DataCopyPad UB->GM");
    const uint32_t at = src.offset() + r * row_ub;
    rt.CheckDmaOutRead(at, p.blockLen, "DataCopyPad UB->GM");
    std::memcpy(row, rt.ub() + at, p.blockLen);
    rt.DmaOutStarted(at, p.blockLen);
  }
  rt.counters.dmaOutBytes += static_cast<uint64_t>(p.blockLen) * p.blockCount;
}

// ---------------------------------------------------------------------------
// Vector instructions. Count forms (first `count` elements) and the
// repeat-strided forms of CANN's "tensor high-dimension" API: repeat r of an
// operand starts at repStride * r blocks, block b of a repeat at blkStride * b
// blocks (32 bytes each), and the first `mask` elements of a repeat take part.

namespace detail {
// Repeats a count-form instruction issues: 256 bytes of the widest operand per repeat.
inline uint64_t Repeats(uint64_t bytes) { return (bytes + 255) / 256; }

template <typename D, typename S, typename F>
inline void Unary(const LocalTensor<D>& dst, const LocalTensor<S>& src, uint32_t count, const char* what, F f) {
  auto& rt = twin::Runtime::Get();
  dst.CheckUse(what);
  src.CheckUse(what);
  CheckUbAligned(dst.offset(), what);
  CheckUbAligned(src.offset(), what);
  CheckRange(dst, count, what);
  CheckRange(src, count, what);
  CheckOverlap(dst.offset(), count * sizeof(D), src.offset(), count * sizeof(S), what);
  rt.CheckVectorRead(src.offset(), count * sizeof(S), what);
  rt.CheckVectorWrite(dst.offset(), count * sizeof(D), what);
  for (uint32_t i = 0; i < count; ++i) {
    S s;
    std::memcpy(&s, rt.ub() + src.offset() + i * sizeof(S), sizeof(S));
    const D d = f(s);
    std::memcpy(rt.ub() + dst.offset() + i * sizeof(D), &d, sizeof(D));
  }
  rt.MarkUbWritten(dst.offset(), count * sizeof(D));
  rt.VectorWrote(dst.offset(), count * sizeof(D));
  rt.CountVector(Repeats(count * (sizeof(D) > sizeof(S) ? sizeof(D) : sizeof(S))));
}

template <typename T, typename F>
inline void Binary(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, uint32_t count,
                   const char* what, F f) {
  auto& rt = twin::Runtime::Get();
  for (auto* t : {&dst, &a, &b}) {
    t->CheckUse(what);
    CheckUbAligned(t->offset(), what);
    CheckRange(*t, count, what);
  }
  const uint32_t n = count * sizeof(T);
  CheckOverlap(dst.offset(), n, a.offset(), n, what);
  CheckOverlap(dst.offset(), n, b.offset(), n, what);
  rt.CheckVectorRead(a.offset(), n, what);
  rt.CheckVectorRead(b.offset(), n, what);
  rt.CheckVectorWrite(dst.offset(), n, what);
  for (uint32_t i = 0; i < count; ++i) {
    T x, y;
    std::memcpy(&x, rt.ub() + a.offset() + i * sizeof(T), sizeof(T));
    std::memcpy(&y, rt.ub() + b.offset() + i * sizeof(T), sizeof(T));
    const T z = f(x, y);
    std::memcpy(rt.ub() + dst.offset() + i * sizeof(T), &z, sizeof(T));
  }
  rt.MarkUbWritten(dst.offset(), n);
  rt.VectorWrote(dst.offset(), n);
  rt.CountVector(Repeats(n));
}

// UB byte offset of element j of repeat r of an FP32 operand.
inline uint32_t Strided(uint32_t base, uint32_t r, uint32_t j, uint32_t blk, uint32_t rep) {
  return base + (r * rep + (j / 8) * blk) * 32 + (j % 8) * 4;
}

// dst[r, j] = f(dst[r, j], src0[r, j], src1[r, j]) for the first `mask` elements of each repeat.
template <typename F>
inline void RepeatBinary(const LocalTensor<float>& dst, const LocalTensor<float>& src0, const LocalTensor<float>& src1,
                         uint64_t mask, uint8_t repeat, uint32_t blk[3], uint32_t rep[3], bool reads_dst,
                         const char* what, F f) {
  auto& rt = twin::Runtime::Get();
  if (mask < 1 || mask > 64) throw TwinError(std::string(what) + ": FP32 mask must be 1..64");
  const LocalTensor<float>* ops[3] = {&dst, &src0, &src1};
  for (int o = 0; o < 3; ++o) {
    ops[o]->CheckUse(what);
    CheckUbAligned(ops[o]->offset(), what);
    if (repeat == 0) continue;
    // The last element any repeat touches (strides only grow addresses) must lie inside the tensor.
    CheckRange(*ops[o], Strided(0, repeat - 1u, static_cast<uint32_t>(mask - 1), blk[o], rep[o]) / 4 + 1, what);
  }
  if (repeat != 0) {
    const uint32_t dst_span = Strided(0, repeat - 1u, static_cast<uint32_t>(mask - 1), blk[0], rep[0]) + 4;
    for (int o = 1; o < 3; ++o) {
      const uint32_t span = Strided(0, repeat - 1u, static_cast<uint32_t>(mask - 1), blk[o], rep[o]) + 4;
      CheckOverlap(dst.offset(), dst_span, ops[o]->offset(), span, what);
    }
  }
  for (uint32_t r = 0; r < repeat; ++r) {
    for (uint32_t j = 0; j < mask; ++j) {
      const uint32_t d = Strided(dst.offset(), r, j, blk[0], rep[0]);
      const uint32_t s0 = Strided(src0.offset(), r, j, blk[1], rep[1]);
      const uint32_t s1 = Strided(src1.offset(), r, j, blk[2], rep[2]);
      rt.CheckVectorRead(s0, 4, what);
      rt.CheckVectorRead(s1, 4, what);
      if (reads_dst) rt.CheckVectorRead(d, 4, what);
      rt.CheckVectorWrite(d, 4, what);
      float x, y, z = 0.0f;
      std::memcpy(&x, rt.ub() + s0, 4);
      std::memcpy(&y, rt.ub() + s1, 4);
      if (reads_dst) std::memcpy(&z, rt.ub() + d, 4);
      z = f(z, x, y);
      std::memcpy(rt.ub() + d, &z, 4);
      rt.MarkUbWritten(d, 4);
      rt.VectorWrote(d, 4);
    }
  }
  rt.CountVector(repeat);
}
}  // namespace detail

template <typename D, typename S>
inline void Cast(const LocalTensor<D>& dst, const LocalTensor<S>& src, RoundMode, uint32_t count) {
  detail::Unary(dst, src, count, "Cast", [](S s) { return FromFloat<D>(ToFloat(s)); });
}
inline void Exp(const LocalTensor<float>& dst, const LocalTensor<float>& src, uint32_t count) {
  detail::Unary(dst, src, count, "Exp", [](float x) { return std::exp(x); });
}
inline void Muls(const LocalTensor<float>& dst, const LocalTensor<float>& src, float s, uint32_t count) {
  detail::Unary(dst, src, count, "Muls", [s](float x) { return x * s; });
}
inline void Adds(const LocalTensor<float>& dst, const LocalTensor<float>& src, float s, uint32_t count) {
  detail::Unary(dst, src, count, "Adds", [s](float x) { return x + s; });
}
inline void Mul(const LocalTensor<float>& dst, const LocalTensor<float>& a, const LocalTensor<float>& b,
                uint32_t count) {
  detail::Binary(dst, a, b, count, "Mul", [](float x, float y) { return x * y; });
}
inline void Add(const LocalTensor<float>& dst, const LocalTensor<float>& a, const LocalTensor<float>& b,
                uint32_t count) {
  detail::Binary(dst, a, b, count, "Add", [](float x, float y) { return x + y; });
}
inline void Sub(const LocalTensor<float>& dst, const LocalTensor<float>& a, const LocalTensor<float>& b,
                uint32_t count) {
  detail::Binary(dst, a, b, count, "Sub", [](float x, float y) { return x - y; });
}
// dst += src * s
inline void Axpy(const LocalTensor<float>& dst, const LocalTensor<float>& src, float s, uint32_t count) {
  detail::Binary(dst, dst, src, count, "Axpy", [s](float d, float x) { return d + x * s; });
}
inline void Duplicate(const LocalTensor<float>& dst, float v, uint32_t count) {
  auto& rt = twin::Runtime::Get();
  dst.CheckUse("Duplicate");
  detail::CheckUbAligned(dst.offset(), "Duplicate");
  detail::CheckRange(dst, count, "Duplicate");
  rt.CheckVectorWrite(dst.offset(), count * 4, "Duplicate");
  for (uint32_t i = 0; i < count; ++i) std::memcpy(rt.ub() + dst.offset() + i * 4, &v, 4);
  rt.MarkUbWritten(dst.offset(), count * 4);
  rt.VectorWrote(dst.offset(), count * 4);
  rt.CountVector(detail::Repeats(count * 4));
}

// Strides of the repeat-strided binary forms, in 32-byte blocks (CANN's
// BinaryRepeatParams: constructor order dstBlk, src0Blk, src1Blk, dstRep,
// src0Rep, src1Rep; defaults 1 and 8).
struct BinaryRepeatParams {
  BinaryRepeatParams() = default;
  BinaryRepeatParams(uint8_t dstBlk, uint8_t src0Blk, uint8_t src1Blk, uint8_t dstRep, uint8_t src0Rep, uint8_t src1Rep)
      : dstBlkStride(dstBlk), src0BlkStride(src0Blk), src1BlkStride(src1Blk), dstRepStride(dstRep),
        src0RepStride(src0Rep), src1RepStride(src1Rep) {}
  uint8_t dstBlkStride = 1, src0BlkStride = 1, src1BlkStride = 1;
  uint8_t dstRepStride = 8, src0RepStride = 8, src1RepStride = 8;
};

// dst = src0 * src1 (mask-continuous, repeat-strided form).
template <typename T, bool isSetMask = true>
inline void Mul(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, uint64_t mask,
                const uint8_t repeatTime, const BinaryRepeatParams& p) {
  static_assert(std::is_same<T, float>::value, "the twin's repeat-strided Mul is FP32");
  uint32_t blk[3] = {p.dstBlkStride, p.src0BlkStride, p.src1BlkStride};
  uint32_t rep[3] = {p.dstRepStride, p.src0RepStride, p.src1RepStride};
  detail::RepeatBinary(dst, src0, src1, mask, repeatTime, blk, rep, false, "Mul",
                       [](float, float x, float y) { return x * y; });
}

// dst = src0 * src1 + dst (mask-continuous, repeat-strided form).
template <typename T, typename U, bool isSetMask = true>
inline void MulAddDst(const LocalTensor<T>& dst, const LocalTensor<U>& src0, const LocalTensor<U>& src1, uint64_t mask,
                      const uint8_t repeatTime, const BinaryRepeatParams& p) {
  static_assert(std::is_same<T, float>::value && std::is_same<U, float>::value, "the twin's MulAddDst is FP32");
  uint32_t blk[3] = {p.dstBlkStride, p.src0BlkStride, p.src1BlkStride};
  uint32_t rep[3] = {p.dstRepStride, p.src0RepStride, p.src1RepStride};
  detail::RepeatBinary(dst, src0, src1, mask, repeatTime, blk, rep, true, "MulAddDst",
                       [](float d, float x, float y) { return x * y + d; });
}

// CANN's BrcbRepeatParams(dstBlkStride, dstRepStride), in 32-byte blocks.
struct BrcbRepeatParams {
  BrcbRepeatParams() = default;
  BrcbRepeatParams(uint16_t dstBlk, uint16_t dstRep) : dstRepStride(dstRep), dstBlkStride(dstBlk) {}
  uint16_t dstRepStride = 8;
  uint16_t dstBlkStride = 1;
};

// Each repeat takes 8 elements of src0 and fills one 32-byte block of dst with each.
template <typename T>
inline void Brcb(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const uint8_t repeatTime,
                 const BrcbRepeatParams& p) {
  static_assert(std::is_same<T, float>::value, "the twin's Brcb is FP32");
  auto& rt = twin::Runtime::Get();
  dst.CheckUse("Brcb");
  src0.CheckUse("Brcb");
  detail::CheckUbAligned(dst.offset(), "Brcb");
  detail::CheckUbAligned(src0.offset(), "Brcb");
  if (dst.offset() == src0.offset()) throw TwinError("Brcb: src0 and dst must not be the same memory");
  const uint32_t blk = p.dstBlkStride ? p.dstBlkStride : 1;  // 0 is taken as 1 (CANN)
  detail::CheckRange(src0, 8u * repeatTime, "Brcb");
  if (repeatTime) {
    detail::CheckRange(dst, ((repeatTime - 1u) * p.dstRepStride + 7u * blk) * 8 + 8, "Brcb");
  }
  rt.CheckVectorRead(src0.offset(), 32u * repeatTime, "Brcb");
  for (uint32_t r = 0; r < repeatTime; ++r) {
    for (uint32_t b = 0; b < 8; ++b) {
      float v;
      std::memcpy(&v, rt.ub() + src0.offset() + (r * 8 + b) * 4, 4);
      const uint32_t at = dst.offset() + (r * p.dstRepStride + b * blk) * 32;
      rt.CheckVectorWrite(at, 32, "Brcb");
      for (uint32_t i = 0; i < 8; ++i) std::memcpy(rt.ub() + at + i * 4, &v, 4);
      rt.MarkUbWritten(at, 32);
      rt.VectorWrote(at, 32);
    }
  }
  rt.CountVector(repeatTime);
}

// For r in [0, repeat): dst[r * dstRepStride] = sum of `mask` elements starting
// at src + r * srcRepStride blocks (8 FP32 per 32-byte block).
inline void WholeReduceSum(const LocalTensor<float>& dst, const LocalTensor<float>& src, int32_t mask,
                           int32_t repeat, int32_t dstRepStride, int32_t srcBlkStride, int32_t srcRepStride) {
  auto& rt = twin::Runtime::Get();
  dst.CheckUse("WholeReduceSum");
  src.CheckUse("WholeReduceSum");
  detail::CheckUbAligned(src.offset(), "WholeReduceSum");
  if (mask < 1 || mask > 64 || repeat < 1 || repeat > 255 || srcBlkStride != 1) {
    throw TwinError("WholeReduceSum: unsupported mask/repeat/stride");
  }
  // Every sum must land inside dst and every element read inside src.
  detail::CheckRange(dst, static_cast<uint64_t>(repeat - 1) * dstRepStride + 1, "WholeReduceSum (destination)");
  detail::CheckRange(src, static_cast<uint64_t>(repeat - 1) * srcRepStride * 8 + mask, "WholeReduceSum (source)");
  for (int32_t r = 0; r < repeat; ++r) {
    const uint32_t at = src.offset() + static_cast<uint32_t>(r * srcRepStride * 32);
    rt.CheckVectorRead(at, mask * 4, "WholeReduceSum");
    float sum = 0.0f;
    for (int32_t i = 0; i < mask; ++i) {
      float x;
      std::memcpy(&x, rt.ub() + at + i * 4, 4);
      sum += x;
    }
    const uint32_t out = dst.offset() + static_cast<uint32_t>(r * dstRepStride * 4);
    rt.CheckVectorWrite(out, 4, "WholeReduceSum");
    std::memcpy(rt.ub() + out, &sum, 4);
    rt.MarkUbWritten(out, 4);
    rt.VectorWrote(out, 4);
  }
  rt.CountVector(repeat);
}

}  // namespace AscendC

// A plain C++ tiling struct must be registered before GET_TILING_DATA reads
// it (CANN: REGISTER_TILING_DEFAULT); here the registration names the type
// GET_TILING_DATA copies into, so a kernel that skips it does not compile.
#define REGISTER_TILING_DEFAULT(type)                                                                    \
  static_assert(std::is_trivially_copyable<type>::value && std::is_standard_layout<type>::value, #type); \
  using RgdrTwinRegisteredTiling = type

#define GET_TILING_DATA(name, tiling) \
  RgdrTwinRegisteredTiling name;      \
  std::memcpy(&name, tiling, sizeof(name))

#endif  // RGDR_CPU_TWIN_KERNEL_OPERATOR_H_
