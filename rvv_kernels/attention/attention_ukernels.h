// The microkernel contract of decode attention over a KV pool.
//
// One call handles one query row of one sequence for the `g` query heads that
// share one KV head (GQA by index: no K/V copy). Keys and values are read in
// place from the pool by slot: key j of the row is
// k_pool[slots[j] * slot_stride + d] (k_pool already offset to the KV head).
// q holds the g query vectors in FP32, already multiplied by the softmax scale.
// Softmax is exact (max-subtracted) in FP32; out receives g rows of d FP32
// values. scratch has room for g * n_keys floats.
#ifndef RVV_KERNELS_ATTENTION_ATTENTION_UKERNELS_H_
#define RVV_KERNELS_ATTENTION_ATTENTION_UKERNELS_H_

#include <cstddef>
#include <cstdint>

namespace rvascend {

using AttentionRowUkernel = void (*)(const float* q, size_t g, size_t d, const uint16_t* k_pool,
                                     const uint16_t* v_pool, size_t slot_stride, const int64_t* slots,
                                     size_t n_keys, float* scratch, float* out);

void bf16_attention_row__portable(const float* q, size_t g, size_t d, const uint16_t* k_pool,
                                  const uint16_t* v_pool, size_t slot_stride, const int64_t* slots,
                                  size_t n_keys, float* scratch, float* out);

void bf16_attention_row__rvv(const float* q, size_t g, size_t d, const uint16_t* k_pool,
                             const uint16_t* v_pool, size_t slot_stride, const int64_t* slots,
                             size_t n_keys, float* scratch, float* out);

}  // namespace rvascend

#endif  // RVV_KERNELS_ATTENTION_ATTENTION_UKERNELS_H_
