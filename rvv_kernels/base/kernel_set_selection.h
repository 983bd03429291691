// How every kernel family picks among its sets, one way: the family lists its
// sets best first, each with what it needs of the CPU (CpuNeeds, one vocabulary
// for all of them), and asks SupportedKernelSets / SelectKernelSet. A set is any
// struct with a `name`.
#ifndef RVV_KERNELS_BASE_KERNEL_SET_SELECTION_H_
#define RVV_KERNELS_BASE_KERNEL_SET_SELECTION_H_

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "rvv_kernels/base/cpu_features.h"

namespace rvascend {

// The instruction set a kernel set is built for (CpuFeatures says what each means).
enum class Isa { kAny, kRvv, kZvfbfwma, kAvx2, kAvx512, kAvx512Bf16, kAvx512Vnni };

struct CpuNeeds {
  Isa isa = Isa::kAny;
  // RVV sets: the VLENs whose layout the set reads (0: no bound).
  size_t min_vlen_bits = 0, max_vlen_bits = 0;
};

inline bool CpuMeets(const CpuNeeds& needs, const CpuFeatures& f) {
  const bool vlen_ok = (needs.min_vlen_bits == 0 || f.vlen_bits >= needs.min_vlen_bits) &&
                       (needs.max_vlen_bits == 0 || f.vlen_bits <= needs.max_vlen_bits);
  switch (needs.isa) {
    case Isa::kAny: return true;
    case Isa::kRvv: return f.rvv && vlen_ok;
    case Isa::kZvfbfwma: return f.zvfbfwma && vlen_ok;
    case Isa::kAvx2: return f.avx2;
    case Isa::kAvx512: return f.avx512;
    case Isa::kAvx512Bf16: return f.avx512bf16;
    case Isa::kAvx512Vnni: return f.avx512vnni && f.avx2;  // VNNI sets keep AVX2 kernels for the rest
  }
  return false;
}

// One line of a family's table: a set compiled into this build and what it needs
// (a null set never matches: one that can only be built where it runs).
template <typename Set>
struct KernelSetEntry {
  const Set* set;
  CpuNeeds needs;
};

// The table's sets this CPU runs, in the table's order (best first).
template <typename Set, size_t N>
std::vector<const Set*> SupportedKernelSets(const KernelSetEntry<Set> (&table)[N],
                                            const CpuFeatures& features = GetCpuFeatures()) {
  std::vector<const Set*> sets;
  for (const KernelSetEntry<Set>& entry : table) {
    if (entry.set != nullptr && CpuMeets(entry.needs, features)) sets.push_back(entry.set);
  }
  return sets;
}

template <typename Set>
std::vector<std::string> KernelSetNames(const std::vector<const Set*>& sets) {
  std::vector<std::string> names;
  for (const Set* set : sets) names.emplace_back(set->name);
  return names;
}

// The set called `name` among `supported` ("": the first, the best), or a
// std::invalid_argument naming the family, the set and the ones there are.
template <typename Set>
const Set& SelectKernelSet(const std::vector<const Set*>& supported, const std::string& name, const char* family) {
  if (name.empty() && !supported.empty()) return *supported.front();
  std::string names;
  for (const Set* set : supported) {
    if (name == set->name) return *set;
    names += std::string(names.empty() ? "" : ", ") + set->name;
  }
  throw std::invalid_argument(std::string(family) + " kernel set '" + name +
                              "' is not available on this CPU/build (available: " + names + ")");
}

}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_KERNEL_SET_SELECTION_H_
