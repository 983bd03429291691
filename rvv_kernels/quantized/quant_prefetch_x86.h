// Software prefetch for the x86 K-quant kernels (AVX2 and AVX-512 VNNI).
#ifndef RVV_KERNELS_QUANTIZED_QUANT_PREFETCH_X86_H_
#define RVV_KERNELS_QUANTIZED_QUANT_PREFETCH_X86_H_

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

namespace rvascend {

// Eighth `part` of the `bytes` from `next` (the next super-block), into L2. The
// K-quant kernels read a super-block's fields as several interleaved streams,
// which the hardware prefetchers follow poorly; with it, an lm_head-shaped Q6_K
// GEMV (248320 x 1024, cold) reads 19 GB/s on one Zen 4 thread and 25-31 GB/s on
// two. Into L2, not L1: a Q6_K super-block of a 64-column tile is 13 KB, and the
// one being read plus the one coming do not stay in a 32 KB L1.
inline void PrefetchEighth(const uint8_t* next, size_t bytes, size_t part) {
  const char* from = reinterpret_cast<const char*>(next) + part * (bytes / 8);
  for (size_t off = 0; off < bytes / 8; off += 64) _mm_prefetch(from + off, _MM_HINT_T1);
}

}  // namespace rvascend

#endif  // RVV_KERNELS_QUANTIZED_QUANT_PREFETCH_X86_H_
