// The microkernel contract of decode attention over a KV pool.
//
// One call handles one query row of one sequence for the `g` query heads that
// share one KV head (GQA by index: no K/V copy). Keys and values are read in
// place from the pool by slot: key j of the row is
// k_pool[slots[j] * slot_stride + d] (k_pool already offset to the KV head).
// q holds the g query vectors in FP32, already multiplied by the softmax scale.
// Softmax is exact (max-subtracted) in FP32; out receives g rows of d FP32
// values. scratch has room for g * n_keys floats.
//
// The block contract (prefill, chunked prefill): `rows` consecutive query rows
// of one sequence, the g heads of one KV head, BF16 in and out. Row r attends
// to the first first_keys + r keys (causal); q and out are read and written in
// place: row r, head h at q + r * q_stride + h * d (scaled by `scale` inside)
// and out + r * out_stride + h * d. Per-thread scratch is the kernel's own.
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

void bf16_attention_row__avx2(const float* q, size_t g, size_t d, const uint16_t* k_pool,
                              const uint16_t* v_pool, size_t slot_stride, const int64_t* slots,
                              size_t n_keys, float* scratch, float* out);

void bf16_attention_row__avx512(const float* q, size_t g, size_t d, const uint16_t* k_pool,
                                const uint16_t* v_pool, size_t slot_stride, const int64_t* slots,
                                size_t n_keys, float* scratch, float* out);

// The same row over an FP32 pool (FP32 models under deterministic inference).
using F32AttentionRowUkernel = void (*)(const float* q, size_t g, size_t d, const float* k_pool,
                                        const float* v_pool, size_t slot_stride, const int64_t* slots,
                                        size_t n_keys, float* scratch, float* out);

#define RVASCEND_DECLARE_F32_ROW(name)                                                                      \
  void name(const float* q, size_t g, size_t d, const float* k_pool, const float* v_pool, size_t slot_stride, \
            const int64_t* slots, size_t n_keys, float* scratch, float* out);
RVASCEND_DECLARE_F32_ROW(f32_attention_row__portable)
RVASCEND_DECLARE_F32_ROW(f32_attention_row__avx2)
RVASCEND_DECLARE_F32_ROW(f32_attention_row__avx512)
RVASCEND_DECLARE_F32_ROW(f32_attention_row__rvv)
#undef RVASCEND_DECLARE_F32_ROW

struct AttentionBlock {
  const uint16_t* q = nullptr;
  size_t q_stride = 0;
  float scale = 1.0f;
  size_t rows = 0, g = 0, d = 0;
  const uint16_t* k_pool = nullptr;  // offset to the KV head
  const uint16_t* v_pool = nullptr;
  size_t slot_stride = 0;
  const int64_t* slots = nullptr;  // the sequence's slots, first_keys + rows - 1 of them used
  size_t first_keys = 0;
  uint16_t* out = nullptr;
  size_t out_stride = 0;
};

using AttentionBlockUkernel = void (*)(const AttentionBlock& block);

void bf16_attention_block__rvv(const AttentionBlock& block);

}  // namespace rvascend

#endif  // RVV_KERNELS_ATTENTION_ATTENTION_UKERNELS_H_
