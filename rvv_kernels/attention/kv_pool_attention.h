// Decode (and chunked-prefill) attention that reads K/V in place from a
// per-token KV pool [slots, kv_heads, head_dim] (BF16): no gather copy, no
// repeat_interleave for GQA, FP32 softmax, one BF16 rounding of the output.
// An FP32 call (q, pools and out FP32) runs every row alone by the kernel's FP32
// row form: one row's result never depends on the rows beside it, the property
// FP32 deterministic inference needs.
//
// Sequence b has query rows [q_starts[b], q_starts[b+1]) and keys/values in
// the slots kv_slots[kv_starts[b] : kv_starts[b+1]] (prefix first, then its
// new tokens). With n query rows and L slots, query row r sits at position
// L - n + r and attends to the first L - n + r + 1 slots (causal).
#ifndef RVV_KERNELS_ATTENTION_KV_POOL_ATTENTION_H_
#define RVV_KERNELS_ATTENTION_KV_POOL_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rvascend {

enum class KvElement { kBf16, kFloat32 };

struct KvPoolAttentionArgs {
  size_t batch = 0;
  const int64_t* q_starts = nullptr;   // [batch + 1]
  const int64_t* kv_starts = nullptr;  // [batch + 1]
  const int64_t* kv_slots = nullptr;   // [kv_starts[batch]]
  size_t heads = 0, kv_heads = 0, head_dim = 0;
  KvElement element = KvElement::kBf16;  // of q, the pools and out
  const void* q = nullptr;  // row t, head h at q + t * q_stride + h * head_dim (elements)
  size_t q_stride = 0;
  const void* k_pool = nullptr;  // [num_slots, kv_heads, head_dim], contiguous
  const void* v_pool = nullptr;
  size_t num_slots = 0;
  float scale = 1.0f;
  void* out = nullptr;  // row t, head h at out + t * out_stride + h * head_dim
  size_t out_stride = 0;
};

// Throws std::invalid_argument naming the first bad value: heads not a
// multiple of kv_heads, starts not increasing, a sequence with more query
// rows than slots, a slot outside the pool.
void ValidateKvPoolAttention(const KvPoolAttentionArgs& args);

// kernel: "" picks the best this CPU runs ("rvv", else "portable").
void KvPoolAttention(const KvPoolAttentionArgs& args, size_t num_threads, const std::string& kernel = "");

// Throws std::invalid_argument naming the first slot outside [0, num_slots).
void ValidateWriteSlots(size_t num_slots, const int64_t* slots, size_t n);

// pool[slots[t]] = rows[t] for t < n (rows: [n, row_elements] of element_bytes each,
// contiguous); slots are checked against num_slots first.
void WriteKvPool(void* pool, size_t num_slots, size_t row_elements, const void* rows, const int64_t* slots,
                 size_t n, size_t element_bytes = 2);

// Kernels this build has and this CPU runs, best first.
std::vector<std::string> AvailableAttentionKernels();

// Whether the kernel (empty: the default) runs prefill rows as blocks; without
// a block form each prefill row rereads the sequence's K/V.
bool AttentionKernelHasBlockForm(const std::string& kernel);

}  // namespace rvascend

#endif  // RVV_KERNELS_ATTENTION_KV_POOL_ATTENTION_H_
