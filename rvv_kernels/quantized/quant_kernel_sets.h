// The registry of quantized-linear kernel sets and the run-time choice among them.
#ifndef RVV_KERNELS_QUANTIZED_QUANT_KERNEL_SETS_H_
#define RVV_KERNELS_QUANTIZED_QUANT_KERNEL_SETS_H_

#include <string>
#include <vector>

#include "rvv_kernels/quantized/quant_ukernels.h"

namespace rvascend {

extern const QuantKernelSet kPortableQuantKernels;
#if defined(RVASCEND_HAVE_X86_VARIANTS)
extern const QuantKernelSet kAvx2QuantKernels;
// The AVX2 set with VNNI kernels for every format (built at first use from kAvx2QuantKernels).
const QuantKernelSet& Avx512VnniQuantKernels();
#endif
#if defined(RVASCEND_HAVE_RVV)
extern const QuantKernelSet kRvvQuantKernels;
#endif

// Sets compiled into this build whose ISA the CPU reports, best first (chosen once).
const std::vector<const QuantKernelSet*>& AvailableQuantKernelSets();

// The available set called `name` ("" = the best), or a std::invalid_argument naming the choices.
const QuantKernelSet& FindQuantKernelSet(const std::string& name);

// The tile width a set reads (resolves 0: VLEN/4 of this machine).
size_t QuantKernelSetTile(const QuantKernelSet& set);

// The set's kernel for `format`, or the portable one where the set leaves it out (as
// ggml's arch-fallback.h does): the portable kernels read any tile width. The sets
// compiled here fill every slot (WithPortableUkernels); a set built by hand may not.
QuantUkernel QuantUkernelFor(const QuantKernelSet& set, QuantFormat format);

}  // namespace rvascend

#endif  // RVV_KERNELS_QUANTIZED_QUANT_KERNEL_SETS_H_
