#include "rvv_kernels/quantized/quant_kernel_sets.h"

#include <stdexcept>

#include "rvv_kernels/base/kernel_set_selection.h"

namespace rvascend {

namespace {

#if defined(RVASCEND_HAVE_X86_VARIANTS)
// The VNNI set is built at first use by code compiled for AVX-512 (copying the AVX2
// set): built only on a CPU that runs it, else null (a table line that never matches).
const QuantKernelSet* Avx512VnniIfRuns() {
  return CpuMeets({Isa::kAvx512Vnni}, GetCpuFeatures()) ? &Avx512VnniQuantKernels() : nullptr;
}
#endif

}  // namespace

const std::vector<const QuantKernelSet*>& AvailableQuantKernelSets() {
  // Best first.
  static const KernelSetEntry<QuantKernelSet> kSets[] = {
#if defined(RVASCEND_HAVE_RVV)
      // The RVV tile is one e8 m2 group: at least 32 columns (VLEN >= 128).
      {&kRvvQuantKernels, {Isa::kRvv, 128}},
#endif
#if defined(RVASCEND_HAVE_X86_VARIANTS)
      {Avx512VnniIfRuns(), {Isa::kAvx512Vnni}},
      {&kAvx2QuantKernels, {Isa::kAvx2}},
#endif
      {&kPortableQuantKernels, {Isa::kAny}},
  };
  static const std::vector<const QuantKernelSet*> supported = SupportedKernelSets(kSets);
  return supported;
}

const QuantKernelSet& FindQuantKernelSet(const std::string& name) {
  return SelectKernelSet(AvailableQuantKernelSets(), name, "quantized");
}

size_t QuantKernelSetTile(const QuantKernelSet& set) {
  return set.tile ? set.tile : GetCpuFeatures().vlen_bits / 4;
}

QuantUkernel QuantUkernelFor(const QuantKernelSet& set, QuantFormat format) {
  const QuantUkernel own = set.ukernel[static_cast<int>(format)];
  return own != nullptr ? own : kPortableQuantKernels.ukernel[static_cast<int>(format)];
}

}  // namespace rvascend
