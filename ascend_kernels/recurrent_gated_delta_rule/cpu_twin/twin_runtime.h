// State of the CPU twin: the emulated cores' unified buffers, the registered
// global-memory buffers, DMA counters, and the errors the hardware would hit.
#ifndef RGDR_CPU_TWIN_TWIN_RUNTIME_H_
#define RGDR_CPU_TWIN_TWIN_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace twin {

// Anything the real hardware or toolchain would reject or corrupt.
class TwinError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Counters {
  uint64_t dmaInBytes = 0;     // GM -> UB
  uint64_t dmaOutBytes = 0;    // UB -> GM
  uint64_t peakUbBytes = 0;    // most UB any core allocated
  uint64_t vectorCalls = 0;    // vector instructions issued (API calls; a call's repeats run as one)
  uint64_t vectorRepeats = 0;  // their repeats (one repeat: up to 256 bytes of operands)
  uint64_t scalarSyncs = 0;    // V->S waits (the scalar unit stalls until the vector pipe drains)
};

// What the emulated core provides: per-SoC figures, from the platform table
// (op_host/recurrent_gated_delta_rule_platforms.h), never from the tiling.
struct CoreLimits {
  uint32_t ubBytes;
  uint32_t queueBuffersPerPosition;  // TQue buffers one TPosition may hold
  uint32_t buffersPerKernel;         // TQue buffers + TBufs of one kernel
};

struct GmBuffer {
  const uint8_t* base;
  uint64_t bytes;
  std::string name;
};

class Runtime {
 public:
  static Runtime& Get();

  void Reset(const CoreLimits& limits);
  void RegisterGm(const void* base, uint64_t bytes, const std::string& name);
  // The registered buffer holding [p, p + bytes); throws if none does.
  const GmBuffer& CheckGm(const void* p, uint64_t bytes, const char* what) const;
  const GmBuffer* FindGm(const void* p) const;

  // Runs body once per block index 0..block_dim-1, each with a fresh UB.
  void Launch(uint32_t block_dim, const std::function<void()>& body);

  // The current core's UB.
  uint8_t* ub() { return ub_.data(); }
  uint8_t* ub_init() { return ub_init_.data(); }
  uint32_t ub_bytes() const { return ub_bytes_; }
  uint32_t AllocateUb(uint32_t bytes, const char* what);  // returns the offset
  // `count` more buffers on queue position `position` (or a TBuf when position < 0).
  void AddBuffers(int position, const char* position_name, uint32_t count);
  void CheckUbRead(uint32_t offset, uint32_t bytes, const char* what) const;
  void MarkUbWritten(uint32_t offset, uint32_t bytes);

  // Asynchrony. A GM->UB DMA (MTE2) lands only when it is waited for: DeQue of
  // its tensor or WaitFlag<MTE2_V>. A vector result reaches a UB->GM DMA
  // (MTE3) only through EnQue/DeQue of a VECOUT tensor or WaitFlag<V_MTE3>. A
  // UB->GM DMA reads its source until FreeTensor or WaitFlag<MTE3_V>. Any
  // access before that throws. A WaitFlag clears its kind over the whole UB.
  void DmaInStarted(uint32_t offset, uint32_t bytes);
  void DmaOutStarted(uint32_t offset, uint32_t bytes);
  void DmaInLanded(uint32_t offset, uint32_t bytes);         // DeQue of a VECIN tensor
  void VectorResultsSynced(uint32_t offset, uint32_t bytes);  // DeQue of a VECOUT tensor
  void DmaOutDone(uint32_t offset, uint32_t bytes);           // FreeTensor of a VECOUT tensor
  void CheckVectorRead(uint32_t offset, uint32_t bytes, const char* what) const;
  void CheckVectorWrite(uint32_t offset, uint32_t bytes, const char* what) const;
  void CheckDmaOutRead(uint32_t offset, uint32_t bytes, const char* what) const;

  uint32_t block_idx() const { return block_idx_; }
  uint32_t block_num() const { return block_num_; }

  // Scalar reads of UB must follow a V_S (vector -> scalar) synchronisation.
  void VectorWrote(uint32_t offset, uint32_t bytes) {
    dirty_.emplace_back(offset, bytes);
    Mark(vector_unsynced_, offset, bytes, 1);
  }
  void ScalarSynced() { dirty_.clear(); }
  void CountVector(uint64_t repeats) {
    ++counters.vectorCalls;
    counters.vectorRepeats += repeats;
  }
  bool VectorDirty(uint32_t offset, uint32_t bytes) const {
    for (const auto& [o, n] : dirty_) {
      if (offset < o + n && o < offset + bytes) return true;
    }
    return false;
  }

  // Event IDs set and not yet waited on, per hardware event kind.
  std::map<std::pair<int, int>, int>& events() { return events_; }
  // Problems found in destructors (queues still holding buffers), raised when the block ends.
  void DeferError(const std::string& message) {
    if (deferred_.empty()) deferred_ = message;
  }

  Counters counters;

 private:
  static void Mark(std::vector<uint8_t>& flags, uint32_t offset, uint32_t bytes, uint8_t value);
  static bool Any(const std::vector<uint8_t>& flags, uint32_t offset, uint32_t bytes);

  std::vector<GmBuffer> gm_;
  std::vector<uint8_t> ub_, ub_init_;
  std::vector<uint8_t> dma_in_pending_, dma_out_pending_, vector_unsynced_;  // per UB byte
  CoreLimits limits_{};
  uint32_t ub_bytes_ = 0, ub_used_ = 0;
  std::map<int, uint32_t> queue_buffers_;  // per TPosition
  uint32_t buffers_ = 0;
  uint32_t block_idx_ = 0, block_num_ = 1;
  std::vector<std::pair<uint32_t, uint32_t>> dirty_;  // UB written by vector ops since the last V_S sync
  std::map<std::pair<int, int>, int> events_;
  std::string deferred_;
};

}  // namespace twin

#endif  // RGDR_CPU_TWIN_TWIN_RUNTIME_H_
