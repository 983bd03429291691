#include "cpu_twin/twin_runtime.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace twin {

Runtime& Runtime::Get() {
  static Runtime runtime;
  return runtime;
}

void Runtime::Reset(const CoreLimits& limits) {
  gm_.clear();
  counters = Counters{};
  limits_ = limits;
  ub_bytes_ = limits.ubBytes;
  events_.clear();
}

void Runtime::RegisterGm(const void* base, uint64_t bytes, const std::string& name) {
  if (base != nullptr && bytes > 0) gm_.push_back({static_cast<const uint8_t*>(base), bytes, name});
}

const GmBuffer* Runtime::FindGm(const void* p) const {
  const auto* q = static_cast<const uint8_t*>(p);
  for (const auto& b : gm_) {
    if (q >= b.base && q < b.base + b.bytes) return &b;
  }
  return nullptr;
}

const GmBuffer& Runtime::CheckGm(const void* p, uint64_t bytes, const char* what) const {
  const auto* q = static_cast<const uint8_t*>(p);
  for (const auto& b : gm_) {
    if (q >= b.base && q < b.base + b.bytes) {
      if (q + bytes > b.base + b.bytes) {
        std::ostringstream msg;
        msg << what << ": " << bytes << " bytes at offset " << (q - b.base) << " of GM tensor '" << b.name
            << "' run " << (q + bytes - (b.base + b.bytes)) << " bytes past its end (" << b.bytes << " bytes)";
        throw TwinError(msg.str());
      }
      return b;
    }
  }
  throw TwinError(std::string(what) + ": address is outside every GM tensor of the launch");
}

void Runtime::Launch(uint32_t block_dim, const std::function<void()>& body) {
  block_num_ = block_dim;
  for (uint32_t i = 0; i < block_dim; ++i) {
    block_idx_ = i;
    ub_.assign(ub_bytes_, 0xA5);  // stale garbage, never a helpful zero
    ub_init_.assign(ub_bytes_, 0);
    dma_in_pending_.assign(ub_bytes_, 0);
    dma_out_pending_.assign(ub_bytes_, 0);
    vector_unsynced_.assign(ub_bytes_, 0);
    ub_used_ = 0;
    queue_buffers_.clear();
    buffers_ = 0;
    dirty_.clear();
    deferred_.clear();
    try {
      body();
    } catch (...) {
      deferred_.clear();  // the first error is the one worth reporting
      throw;
    }
    if (!deferred_.empty()) throw TwinError(deferred_);
    for (const auto& [key, count] : events_) {
      if (count != 0) {
        throw TwinError("block " + std::to_string(i) + " ended with a SetFlag that was never waited on");
      }
    }
  }
}

uint32_t Runtime::AllocateUb(uint32_t bytes, const char* what) {
  const uint32_t aligned = (bytes + 31) / 32 * 32;
  if (ub_used_ + aligned > ub_bytes_) {
    std::ostringstream msg;
    msg << "UB overflow: " << what << " needs " << aligned << " bytes, " << (ub_bytes_ - ub_used_) << " of "
        << ub_bytes_ << " are left";
    throw TwinError(msg.str());
  }
  const uint32_t offset = ub_used_;
  ub_used_ += aligned;
  counters.peakUbBytes = std::max<uint64_t>(counters.peakUbBytes, ub_used_);
  return offset;
}

void Runtime::AddBuffers(int position, const char* position_name, uint32_t count) {
  buffers_ += count;
  if (buffers_ > limits_.buffersPerKernel) {
    throw TwinError("InitBuffer: " + std::to_string(buffers_) + " buffers in one kernel; at most " +
                    std::to_string(limits_.buffersPerKernel));
  }
  if (position < 0) return;
  const uint32_t n = queue_buffers_[position] += count;
  if (n > limits_.queueBuffersPerPosition) {
    throw TwinError(std::string("InitBuffer: ") + std::to_string(n) + " queue buffers on TPosition " + position_name +
                    "; this SoC allows " + std::to_string(limits_.queueBuffersPerPosition));
  }
}

void Runtime::Mark(std::vector<uint8_t>& flags, uint32_t offset, uint32_t bytes, uint8_t value) {
  if (static_cast<uint64_t>(offset) + bytes > flags.size()) throw TwinError("UB range past the end of UB");
  std::memset(flags.data() + offset, value, bytes);
}

bool Runtime::Any(const std::vector<uint8_t>& flags, uint32_t offset, uint32_t bytes) {
  if (static_cast<uint64_t>(offset) + bytes > flags.size()) return true;
  for (uint32_t i = 0; i < bytes; ++i) {
    if (flags[offset + i]) return true;
  }
  return false;
}

void Runtime::DmaInStarted(uint32_t offset, uint32_t bytes) {
  if (Any(dma_out_pending_, offset, bytes)) {
    throw TwinError("DMA in (MTE2) overwrites UB a DMA out (MTE3) is still reading: FreeTensor or "
                    "WaitFlag<MTE3_MTE2> first");
  }
  Mark(dma_in_pending_, offset, bytes, 1);
}
void Runtime::DmaOutStarted(uint32_t offset, uint32_t bytes) { Mark(dma_out_pending_, offset, bytes, 1); }
void Runtime::DmaInLanded(uint32_t offset, uint32_t bytes) { Mark(dma_in_pending_, offset, bytes, 0); }
void Runtime::VectorResultsSynced(uint32_t offset, uint32_t bytes) { Mark(vector_unsynced_, offset, bytes, 0); }
void Runtime::DmaOutDone(uint32_t offset, uint32_t bytes) { Mark(dma_out_pending_, offset, bytes, 0); }

void Runtime::CheckVectorRead(uint32_t offset, uint32_t bytes, const char* what) const {
  if (Any(dma_in_pending_, offset, bytes)) {
    throw TwinError(std::string(what) + ": reads UB a DMA in (MTE2) has not landed in: DeQue the tensor or "
                    "WaitFlag<MTE2_V> first");
  }
  CheckUbRead(offset, bytes, what);
}

void Runtime::CheckVectorWrite(uint32_t offset, uint32_t bytes, const char* what) const {
  if (Any(dma_out_pending_, offset, bytes)) {
    throw TwinError(std::string(what) + ": overwrites UB a DMA out (MTE3) is still reading: FreeTensor or "
                    "WaitFlag<MTE3_V> first");
  }
  if (Any(dma_in_pending_, offset, bytes)) {
    throw TwinError(std::string(what) + ": writes UB a DMA in (MTE2) is still filling");
  }
}

void Runtime::CheckDmaOutRead(uint32_t offset, uint32_t bytes, const char* what) const {
  if (Any(vector_unsynced_, offset, bytes)) {
    throw TwinError(std::string(what) + ": DMA out (MTE3) reads a vector result without a V->MTE3 sync "
                    "(EnQue/DeQue of the VECOUT tensor or WaitFlag<V_MTE3>)");
  }
  CheckVectorRead(offset, bytes, what);
}

void Runtime::CheckUbRead(uint32_t offset, uint32_t bytes, const char* what) const {
  if (static_cast<uint64_t>(offset) + bytes > ub_bytes_) {
    throw TwinError(std::string(what) + ": read past the end of UB");
  }
  for (uint32_t i = 0; i < bytes; ++i) {
    if (!ub_init_[offset + i]) {
      std::ostringstream msg;
      msg << what << ": reads uninitialised UB at byte " << (offset + i) << " (block " << block_idx_ << ")";
      throw TwinError(msg.str());
    }
  }
}

void Runtime::MarkUbWritten(uint32_t offset, uint32_t bytes) {
  if (static_cast<uint64_t>(offset) + bytes > ub_bytes_) throw TwinError("write past the end of UB");
  std::memset(ub_init_.data() + offset, 1, bytes);
}

}  // namespace twin
