// Declarations of every BF16 packed-linear microkernel, XNNPACK-style names:
// bf16_<op>_packed_ukernel_<MR>x<NR>__<isa>. Each is defined in the .cc file
// of the same name and registered in bf16_packed_kernel_sets.cc.
#ifndef RVV_KERNELS_LINEAR_BF16_PACKED_UKERNELS_H_
#define RVV_KERNELS_LINEAR_BF16_PACKED_UKERNELS_H_

#include <cstddef>
#include <cstdint>

namespace rvascend {

#define RVASCEND_DECLARE_UKERNEL(name)                                                     \
  void name(size_t m, size_t nc, size_t k, const void* a, size_t a_stride, const uint16_t* w, \
            uint16_t* c, size_t c_stride);

// Scalar reference (FP32 accumulation in k order): the floor every variant must match.
RVASCEND_DECLARE_UKERNEL(bf16_gemm_packed_ukernel_1x32__scalar)

// Portable vector path (compiler vector extensions), one build per host ISA.
RVASCEND_DECLARE_UKERNEL(bf16_gemv_packed_ukernel_1x64__portable)
RVASCEND_DECLARE_UKERNEL(bf16_gemm_packed_ukernel_4x32__portable)
RVASCEND_DECLARE_UKERNEL(bf16_gemv_packed_ukernel_1x64__portable_avx2)
RVASCEND_DECLARE_UKERNEL(bf16_gemm_packed_ukernel_4x32__portable_avx2)
RVASCEND_DECLARE_UKERNEL(bf16_gemv_packed_ukernel_1x64__portable_avx512)
RVASCEND_DECLARE_UKERNEL(bf16_gemm_packed_ukernel_4x32__portable_avx512)

// x86-64 AVX2 + FMA: six rows in registers (the portable 4x32 tile spills there).
RVASCEND_DECLARE_UKERNEL(bf16_gemm_packed_ukernel_6x32__avx2)

// x86-64 AVX512-BF16 (vdpbf16ps) host kernels.
RVASCEND_DECLARE_UKERNEL(bf16_gemv_packed_ukernel_1x64__avx512bf16)
RVASCEND_DECLARE_UKERNEL(bf16_gemm_packed_ukernel_8x32__avx512bf16)

// RVV 1.0: zero-extend + shift widening (default), and Zvfbfwma (vfwmaccbf16).
RVASCEND_DECLARE_UKERNEL(bf16_gemv_packed_ukernel_1x128__rvv)
RVASCEND_DECLARE_UKERNEL(bf16_gemm_packed_ukernel_4x32__rvv)
// RVV 1.0 over packed layout version 2 (block B = VLEN/2, paired columns).
RVASCEND_DECLARE_UKERNEL(bf16_gemv_packed_ukernel_1xB__rvv_wide)
RVASCEND_DECLARE_UKERNEL(bf16_gemm_packed_ukernel_6xB__rvv_wide)
RVASCEND_DECLARE_UKERNEL(bf16_gemv_packed_ukernel_1x128__zvfbfwma)
RVASCEND_DECLARE_UKERNEL(bf16_gemm_packed_ukernel_4x32__zvfbfwma)

#undef RVASCEND_DECLARE_UKERNEL

}  // namespace rvascend

#endif  // RVV_KERNELS_LINEAR_BF16_PACKED_UKERNELS_H_
