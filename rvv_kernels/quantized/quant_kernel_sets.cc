#include "rvv_kernels/quantized/quant_kernel_sets.h"

#include <stdexcept>

#include "rvv_kernels/base/cpu_features.h"

namespace rvascend {

std::vector<const QuantKernelSet*> AvailableQuantKernelSets() {
  std::vector<const QuantKernelSet*> sets;
#if defined(RVASCEND_HAVE_RVV)
  // The RVV tile is one e8 m2 group: at least 32 columns (VLEN >= 128).
  if (GetCpuFeatures().rvv && GetCpuFeatures().vlen_bits >= 128) sets.push_back(&kRvvQuantKernels);
#endif
#if defined(RVASCEND_HAVE_X86_VARIANTS)
  if (GetCpuFeatures().avx512vnni && GetCpuFeatures().avx2) sets.push_back(&Avx512VnniQuantKernels());
  if (GetCpuFeatures().avx2) sets.push_back(&kAvx2QuantKernels);
#endif
  sets.push_back(&kPortableQuantKernels);
  return sets;
}

const QuantKernelSet& FindQuantKernelSet(const std::string& name) {
  const auto sets = AvailableQuantKernelSets();
  if (name.empty()) return *sets.front();
  std::string names;
  for (const auto* s : sets) {
    if (name == s->name) return *s;
    names += std::string(names.empty() ? "" : ", ") + s->name;
  }
  throw std::invalid_argument("quantized kernel set '" + name + "' is not available on this CPU/build (available: " +
                              names + ")");
}

size_t QuantKernelSetTile(const QuantKernelSet& set) {
  return set.tile ? set.tile : GetCpuFeatures().vlen_bits / 4;
}

QuantUkernel QuantUkernelFor(const QuantKernelSet& set, QuantFormat format) {
  const QuantUkernel own = set.ukernel[static_cast<int>(format)];
  return own != nullptr ? own : kPortableQuantKernels.ukernel[static_cast<int>(format)];
}

}  // namespace rvascend
