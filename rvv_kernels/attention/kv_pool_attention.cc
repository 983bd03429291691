#include "rvv_kernels/attention/kv_pool_attention.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "rvv_kernels/attention/attention_ukernels.h"
#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/kernel_set_selection.h"
#include "rvv_kernels/base/thread_pool.h"

namespace rvascend {
namespace {

struct Kernel {
  const char* name;
  AttentionRowUkernel row;
  AttentionBlockUkernel block;  // nullptr: a block runs row by row
  F32AttentionRowUkernel f32_row;  // over an FP32 pool
};

// Query rows per block task: enough to amortise the block's K/V copies (2 * keys
// * d elements against 2 * 12 * g * keys * d multiply-adds: 1/24 of them at GQA
// 2), few enough that a 64-token chunk of a 3-KV-head model still makes 18 tasks
// for 8 threads.
constexpr size_t kBlockRows = 12;

#if defined(RVASCEND_HAVE_RVV)
const Kernel kRvv{"rvv", bf16_attention_row__rvv, bf16_attention_block__rvv, f32_attention_row__rvv};
// Every row by the decode kernel: the baseline the block kernel is counted against.
const Kernel kRvvRows{"rvv_rows", bf16_attention_row__rvv, nullptr, f32_attention_row__rvv};
#endif
#if defined(RVASCEND_HAVE_X86_VARIANTS)
const Kernel kAvx512{"avx512", bf16_attention_row__avx512, nullptr, f32_attention_row__avx512};
const Kernel kAvx2{"avx2", bf16_attention_row__avx2, nullptr, f32_attention_row__avx2};
#endif
const Kernel kPortable{"portable", bf16_attention_row__portable, nullptr, f32_attention_row__portable};

// Best first.
const KernelSetEntry<Kernel> kKernels[] = {
#if defined(RVASCEND_HAVE_RVV)
    {&kRvv, {Isa::kRvv}},
    {&kRvvRows, {Isa::kRvv}},
#endif
#if defined(RVASCEND_HAVE_X86_VARIANTS)
    {&kAvx512, {Isa::kAvx512}},
    {&kAvx2, {Isa::kAvx2}},
#endif
    {&kPortable, {Isa::kAny}},
};

const std::vector<const Kernel*>& Supported() {
  static const std::vector<const Kernel*> supported = SupportedKernelSets(kKernels);
  return supported;
}

const Kernel& Choose(const std::string& name) { return SelectKernelSet(Supported(), name, "attention"); }

std::string Str(int64_t v) { return std::to_string(v); }

}  // namespace

std::vector<std::string> AvailableAttentionKernels() { return KernelSetNames(Supported()); }

bool AttentionKernelHasBlockForm(const std::string& kernel) { return Choose(kernel).block != nullptr; }

void ValidateKvPoolAttention(const KvPoolAttentionArgs& a) {
  if (a.kv_heads == 0 || a.heads % a.kv_heads != 0) {
    throw std::invalid_argument("heads (" + Str(a.heads) + ") must be a positive multiple of kv_heads (" +
                                Str(a.kv_heads) + ")");
  }
  if (a.head_dim == 0) throw std::invalid_argument("head_dim must be positive");
  if (a.q_starts[0] != 0 || a.kv_starts[0] != 0) throw std::invalid_argument("q_starts and kv_starts must start at 0");
  for (size_t b = 0; b < a.batch; ++b) {
    const int64_t n = a.q_starts[b + 1] - a.q_starts[b];
    const int64_t l = a.kv_starts[b + 1] - a.kv_starts[b];
    if (n < 0 || l < 0) throw std::invalid_argument("sequence " + Str(b) + ": q_starts/kv_starts decrease");
    if (n > l) {
      throw std::invalid_argument("sequence " + Str(b) + " has " + Str(n) + " query rows but only " + Str(l) +
                                  " K/V slots (its new tokens must be among its slots)");
    }
  }
  const int64_t total = a.kv_starts[a.batch];
  for (int64_t i = 0; i < total; ++i) {
    const int64_t s = a.kv_slots[i];
    if (s < 0 || static_cast<size_t>(s) >= a.num_slots) {
      throw std::invalid_argument("kv_slots[" + Str(i) + "] = " + Str(s) + " is outside the KV pool of " +
                                  Str(static_cast<int64_t>(a.num_slots)) + " slots");
    }
  }
}

void ValidateWriteSlots(size_t num_slots, const int64_t* slots, size_t n) {
  for (size_t t = 0; t < n; ++t) {
    if (slots[t] < 0 || static_cast<size_t>(slots[t]) >= num_slots) {
      throw std::invalid_argument("write_slots[" + Str(t) + "] = " + Str(slots[t]) + " is outside the KV pool of " +
                                  Str(static_cast<int64_t>(num_slots)) + " slots");
    }
  }
}

void WriteKvPool(void* pool, size_t num_slots, size_t row_elements, const void* rows, const int64_t* slots,
                 size_t n, size_t element_bytes) {
  ValidateWriteSlots(num_slots, slots, n);
  const size_t row_bytes = row_elements * element_bytes;
  for (size_t t = 0; t < n; ++t) {
    std::memcpy(static_cast<uint8_t*>(pool) + static_cast<size_t>(slots[t]) * row_bytes,
                static_cast<const uint8_t*>(rows) + t * row_bytes, row_bytes);
  }
}

void KvPoolAttention(const KvPoolAttentionArgs& a, size_t num_threads, const std::string& kernel) {
  ValidateKvPoolAttention(a);
  const Kernel& k = Choose(kernel);
  const bool fp32 = a.element == KvElement::kFloat32;
  const size_t group = a.heads / a.kv_heads, d = a.head_dim;
  const size_t slot_stride = a.kv_heads * d;
  // One task per (query rows, KV head): a decode row alone, several rows of a
  // BF16 prefill together when the kernel has a block form (an FP32 call runs
  // every row alone, by the kernel's FP32 row form). The heaviest first, since
  // causal rows grow.
  struct Task {
    size_t b, r0, rows, keys;  // keys: the last row's
  };
  std::vector<Task> tasks;
  for (size_t b = 0; b < a.batch; ++b) {
    const size_t n = static_cast<size_t>(a.q_starts[b + 1] - a.q_starts[b]);
    const size_t l = static_cast<size_t>(a.kv_starts[b + 1] - a.kv_starts[b]);
    const size_t step = (!fp32 && k.block != nullptr && n > 1) ? kBlockRows : 1;
    for (size_t r0 = 0; r0 < n; r0 += step) {
      const size_t rows = std::min(step, n - r0);
      tasks.push_back({b, r0, rows, l - n + r0 + rows});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& x, const Task& y) { return x.rows * x.keys > y.rows * y.keys; });
  ThreadPool::Global().ParallelFor(tasks.size() * a.kv_heads, num_threads, [&](size_t index) {
    const Task& task = tasks[index / a.kv_heads];
    const size_t kvh = index % a.kv_heads;
    const size_t t = static_cast<size_t>(a.q_starts[task.b]) + task.r0;
    const int64_t* slots = a.kv_slots + a.kv_starts[task.b];
    thread_local std::vector<float> q32, scratch, out32;
    if (fp32) {
      q32.resize(group * d);
      scratch.resize(group * task.keys);
      const float* qrow = static_cast<const float*>(a.q) + t * a.q_stride + kvh * group * d;
      for (size_t i = 0; i < group * d; ++i) q32[i] = qrow[i] * a.scale;
      k.f32_row(q32.data(), group, d, static_cast<const float*>(a.k_pool) + kvh * d,
                static_cast<const float*>(a.v_pool) + kvh * d, slot_stride, slots, task.keys, scratch.data(),
                static_cast<float*>(a.out) + t * a.out_stride + kvh * group * d);
      return;
    }
    const uint16_t* qrow = static_cast<const uint16_t*>(a.q) + t * a.q_stride + kvh * group * d;
    uint16_t* orow = static_cast<uint16_t*>(a.out) + t * a.out_stride + kvh * group * d;
    const auto* k_pool = static_cast<const uint16_t*>(a.k_pool);
    const auto* v_pool = static_cast<const uint16_t*>(a.v_pool);
    if (task.rows > 1) {
      AttentionBlock block;
      block.q = qrow;
      block.q_stride = a.q_stride;
      block.scale = a.scale;
      block.rows = task.rows;
      block.g = group;
      block.d = d;
      block.k_pool = k_pool + kvh * d;
      block.v_pool = v_pool + kvh * d;
      block.slot_stride = slot_stride;
      block.slots = slots;
      block.first_keys = task.keys - task.rows + 1;
      block.out = orow;
      block.out_stride = a.out_stride;
      k.block(block);
      return;
    }
    q32.resize(group * d);
    scratch.resize(group * task.keys);
    out32.resize(group * d);
    for (size_t i = 0; i < group * d; ++i) q32[i] = Bf16ToFloat(qrow[i]) * a.scale;
    k.row(q32.data(), group, d, k_pool + kvh * d, v_pool + kvh * d, slot_stride, slots, task.keys,
          scratch.data(), out32.data());
    for (size_t i = 0; i < group * d; ++i) orow[i] = FloatToBf16(out32[i]);
  });
}

}  // namespace rvascend
