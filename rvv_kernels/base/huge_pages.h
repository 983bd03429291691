// Transparent huge pages for the weights a decode step streams.
//
// A decode step reads every weight once, hundreds of MB of it, so with 4 KiB
// pages it takes a TLB miss every 4 KiB, and the hardware prefetchers stop at
// every page boundary. Most distributions set transparent huge pages to
// "madvise", so anonymous memory gets 2 MiB pages only where asked. Measured on
// a Zen 4 host, the same weights in both kinds of memory, alternated in one
// process: an lm_head-shaped GEMV (150k x 1024) Q8_0 20 -> 24 GB/s on one
// thread and 27-28 -> 28-29 on two, BF16 19.5 -> 23 and 29-37 -> 31-43; the 112
// GEMVs of a Qwen3-0.6B-shaped step on two threads 0-10 % faster (Q4_0) and
// 2-6 % (BF16).
#ifndef RVV_KERNELS_BASE_HUGE_PAGES_H_
#define RVV_KERNELS_BASE_HUGE_PAGES_H_

#include <cstddef>

namespace rvascend {

// Asks the kernel to back the whole 2 MiB pages inside [data, data + bytes)
// with huge pages from their first touch on; call it before writing the
// buffer. A hint only: a no-op off Linux, for less than a huge page, or where
// the kernel refuses (transparent huge pages off). Returns whether it was taken.
bool AdviseHugePages(void* data, size_t bytes);

}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_HUGE_PAGES_H_
