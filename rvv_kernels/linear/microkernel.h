// The microkernel contract every BF16 packed-linear variant implements.
//
// A microkernel computes C[0:m, 0:nc] = A[0:m, 0:K] * W^T for m <= mr rows and
// nc <= nr columns that start on a 32-column block boundary of the packed
// weight (`w` points at that block; the next block is K*32 elements further).
// Accumulation is FP32; each output is rounded once to BF16, to nearest even.
// Only the nc valid columns are written.
#ifndef RVV_KERNELS_LINEAR_MICROKERNEL_H_
#define RVV_KERNELS_LINEAR_MICROKERNEL_H_

#include <cstddef>
#include <cstdint>

namespace rvascend {

// `a` holds FP32 activations (row stride a_stride) when the kernel set's
// `fp32_activations` is true, else BF16 activations.
using Bf16PackedUkernel = void (*)(size_t m, size_t nc, size_t k, const void* a, size_t a_stride,
                                   const uint16_t* w, uint16_t* c, size_t c_stride);

struct Bf16PackedKernelSet {
  const char* name;
  bool fp32_activations;
  Bf16PackedUkernel gemv;  // M = 1
  size_t gemv_nr;
  Bf16PackedUkernel gemm;  // M >= 2, any m <= gemm_mr
  size_t gemm_mr;
  size_t gemm_nr;
  // The packed layout the set reads: 32 (version 1), or 0 for version 2 with
  // block_n = VLEN/2 of this machine (then gemv_nr and gemm_nr are 0 too: one
  // block per call). KernelSetBlockN() resolves it.
  size_t block_n = 32;
};

}  // namespace rvascend

#endif  // RVV_KERNELS_LINEAR_MICROKERNEL_H_
