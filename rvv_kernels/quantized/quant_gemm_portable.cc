// The portable quantized kernel set: quant_gemm_portable.h's kernels built for the
// baseline ISA, the path of CPUs without a vector set and the twin the others are
// checked against.
#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/quantized/quant_activations.h"
#include "rvv_kernels/quantized/quant_gemm_portable.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"

namespace rvascend {
namespace {

void StoreBf16(const float* c, size_t n, uint16_t* out) {
  for (size_t j = 0; j < n; ++j) out[j] = FloatToBf16(c[j]);
}

}  // namespace

const QuantKernelSet kPortableQuantKernels = {
    "portable", 64, true, 4,
    {
#define QUANT_FORMAT(name, ...) PortableGemm<QuantFormat::k##name>,
#include "rvv_kernels/quantized/quant_formats.inc"
#undef QUANT_FORMAT
    },
    QuantizeRowPortable, StoreBf16};

}  // namespace rvascend
