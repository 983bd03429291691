// Software prefetch for the x86 K-quant kernels (AVX2 and AVX-512 VNNI).
#ifndef RVV_KERNELS_QUANTIZED_QUANT_PREFETCH_X86_H_
#define RVV_KERNELS_QUANTIZED_QUANT_PREFETCH_X86_H_

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

namespace rvascend {

// Eighth `part` of the `bytes` from `next` (the next super-block), into L2. The
// K-quant kernels read a super-block's fields as several interleaved streams,
// which the hardware prefetchers follow poorly: a Q6_K GEMV over 128 MB went from
// 10.3 to 15.5 GB/s on one Zen 3 thread (19.4 to 28 on two, the copy bandwidth),
// and without it the VNNI Q4_K and Q6_K GEMVs ran at half the AVX2 kernels'
// 18-20 GB/s on one Zen 4 thread. Into L2, not L1: a Q6_K super-block of a
// 64-column tile is 13 KB, and the one being read plus the one coming did not
// stay in a 32 KB L1. On Zen 4, an lm_head-shaped GEMV (248320 x 1024, cold):
// Q6_K 10 -> 19 GB/s on one thread and 14-17 -> 25-31 on two, Q4_K 12 -> 20
// and 20 -> 24-28 (the AVX2 Q6_K kernel 17.5 -> 28 on two).
inline void PrefetchEighth(const uint8_t* next, size_t bytes, size_t part) {
  const char* from = reinterpret_cast<const char*>(next) + part * (bytes / 8);
  for (size_t off = 0; off < bytes / 8; off += 64) _mm_prefetch(from + off, _MM_HINT_T1);
}

}  // namespace rvascend

#endif  // RVV_KERNELS_QUANTIZED_QUANT_PREFETCH_X86_H_
