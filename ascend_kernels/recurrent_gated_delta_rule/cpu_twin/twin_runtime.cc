#include "cpu_twin/twin_runtime.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace twin {

Runtime& Runtime::Get() {
  static Runtime runtime;
  return runtime;
}

void Runtime::Reset(uint32_t ub_bytes) {
  gm_.clear();
  counters = Counters{};
  ub_bytes_ = ub_bytes;
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
    ub_used_ = 0;
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
