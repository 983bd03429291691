#include "rvv_kernels/linear/bf16_packed_kernel_sets.h"

#include <stdexcept>
#include <string>

#include "rvv_kernels/linear/bf16_packed_ukernels.h"
#include "rvv_kernels/base/kernel_set_selection.h"
#include "rvv_kernels/linear/packed_layout.h"

namespace rvascend {
namespace {

// Each set once; a new variant is one set and one table line here plus its .cc
// file; the tests and benchmarks iterate over the table.
#if defined(RVASCEND_HAVE_ZVFBFWMA)
const Bf16PackedKernelSet kZvfbfwma{"zvfbfwma", false, bf16_gemv_packed_ukernel_1x128__zvfbfwma, 128,
                                   bf16_gemm_packed_ukernel_4x32__zvfbfwma, 4, 32};
#endif
#if defined(RVASCEND_HAVE_RVV)
// Layout version 2 (block_n = VLEN/2): the fewest instructions per weight without BF16
// vector extensions.
const Bf16PackedKernelSet kRvvWide{"rvv_wide", true, bf16_gemv_packed_ukernel_1xB__rvv_wide, 0,
                                   bf16_gemm_packed_ukernel_6xB__rvv_wide, 6, 0, 0};
const Bf16PackedKernelSet kRvv{"rvv", true, bf16_gemv_packed_ukernel_1x128__rvv, 128,
                               bf16_gemm_packed_ukernel_4x32__rvv, 4, 32};
#endif
#if defined(RVASCEND_HAVE_X86_VARIANTS)
const Bf16PackedKernelSet kAvx512Bf16{"avx512bf16", false, bf16_gemv_packed_ukernel_1x64__avx512bf16, 64,
                                      bf16_gemm_packed_ukernel_8x32__avx512bf16, 8, 32};
const Bf16PackedKernelSet kPortableAvx512{"portable_avx512", true, bf16_gemv_packed_ukernel_1x64__portable_avx512, 64,
                                          bf16_gemm_packed_ukernel_4x32__portable_avx512, 4, 32};
const Bf16PackedKernelSet kAvx2{"avx2", true, bf16_gemv_packed_ukernel_1x64__portable_avx2, 64,
                                bf16_gemm_packed_ukernel_6x32__avx2, 6, 32};
const Bf16PackedKernelSet kPortableAvx2{"portable_avx2", true, bf16_gemv_packed_ukernel_1x64__portable_avx2, 64,
                                        bf16_gemm_packed_ukernel_4x32__portable_avx2, 4, 32};
#endif
const Bf16PackedKernelSet kPortable{"portable", true, bf16_gemv_packed_ukernel_1x64__portable, 64,
                                    bf16_gemm_packed_ukernel_4x32__portable, 4, 32};
const Bf16PackedKernelSet kScalar{"scalar", true, bf16_gemm_packed_ukernel_1x32__scalar, 32,
                                  bf16_gemm_packed_ukernel_1x32__scalar, 1, 32};

// Best first.
const KernelSetEntry<Bf16PackedKernelSet> kSets[] = {
#if defined(RVASCEND_HAVE_ZVFBFWMA)
    {&kZvfbfwma, {Isa::kZvfbfwma}},
#endif
#if defined(RVASCEND_HAVE_RVV)
    {&kRvvWide, {Isa::kRvv, 128, 1024}},  // block_n = VLEN/2 of 64 to 512 (IsWideBlockN)
    {&kRvv, {Isa::kRvv}},
#endif
#if defined(RVASCEND_HAVE_X86_VARIANTS)
    {&kAvx512Bf16, {Isa::kAvx512Bf16}},
    {&kPortableAvx512, {Isa::kAvx512}},
    {&kAvx2, {Isa::kAvx2}},
    {&kPortableAvx2, {Isa::kAvx2}},
#endif
    {&kPortable, {Isa::kAny}},
    {&kScalar, {Isa::kAny}},
};

}  // namespace

std::vector<const Bf16PackedKernelSet*> CompiledKernelSets() {
  std::vector<const Bf16PackedKernelSet*> sets;
  for (const auto& entry : kSets) sets.push_back(entry.set);
  return sets;
}

const std::vector<const Bf16PackedKernelSet*>& AvailableKernelSets() {
  static const std::vector<const Bf16PackedKernelSet*> supported = SupportedKernelSets(kSets);
  return supported;
}

const Bf16PackedKernelSet& DefaultKernelSet() {
  static const Bf16PackedKernelSet* best = AvailableKernelSets().front();
  return *best;
}

size_t KernelSetBlockN(const Bf16PackedKernelSet& set) {
  return set.block_n ? set.block_n : GetCpuFeatures().vlen_bits / 2;
}

const Bf16PackedKernelSet* BestKernelSetFor(size_t block_n) {
  for (const Bf16PackedKernelSet* set : AvailableKernelSets()) {
    if (KernelSetBlockN(*set) == block_n) return set;
  }
  return nullptr;
}

size_t WideKernelSetBlockN() {
  for (const Bf16PackedKernelSet* set : AvailableKernelSets()) {
    if (KernelSetBlockN(*set) != kPackedBlockN) return KernelSetBlockN(*set);
  }
  return 0;
}

const Bf16PackedKernelSet* FindKernelSet(const std::string& name) {
  for (const Bf16PackedKernelSet* set : AvailableKernelSets()) {
    if (name == set->name) return set;
  }
  return nullptr;
}

const Bf16PackedKernelSet& ChooseKernelSet(const std::string& name, size_t block_n) {
  if (name.empty()) {
    const Bf16PackedKernelSet* best = BestKernelSetFor(block_n);
    if (best == nullptr) {
      throw std::invalid_argument("no kernel set on this CPU reads a weight packed with block_n " +
                                  std::to_string(block_n) + " (layout version 2 is packed for one VLEN: " +
                                  "VLEN/2 columns per block); re-pack it on this machine");
    }
    return *best;
  }
  const Bf16PackedKernelSet* set = &SelectKernelSet(AvailableKernelSets(), name, "bf16 linear");
  // A named set reads its own layout; a weight packed for another block_n would be
  // read as the wrong columns without any error.
  if (block_n != 0 && KernelSetBlockN(*set) != block_n) {
    throw std::invalid_argument("kernel set '" + name + "' reads block_n " + std::to_string(KernelSetBlockN(*set)) +
                                " (its packed layout), but this weight is packed with block_n " +
                                std::to_string(block_n) + ": re-pack it for that set or use the best set ('')");
  }
  return *set;
}

}  // namespace rvascend
