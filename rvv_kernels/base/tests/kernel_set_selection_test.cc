// The one selection every kernel family uses: what each ISA needs of the CPU (the
// VLEN bounds of an RVV set included), best-first order, and the error that names
// the family and the sets there are.
#include "rvv_kernels/base/kernel_set_selection.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace {

int failures = 0;

void Expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

struct Set {
  const char* name;
};

const Set kWide{"wide"}, kRvv{"rvv"}, kAvx2{"avx2"}, kPortable{"portable"};
const rvascend::KernelSetEntry<Set> kTable[] = {
    {&kWide, {rvascend::Isa::kRvv, 128, 1024}},
    {&kRvv, {rvascend::Isa::kRvv}},
    {&kAvx2, {rvascend::Isa::kAvx2}},
    {&kPortable, {rvascend::Isa::kAny}},
};

}  // namespace

int main() {
  using rvascend::CpuFeatures;
  CpuFeatures none;
  CpuFeatures rvv256;
  rvv256.rvv = true;
  rvv256.vlen_bits = 256;
  CpuFeatures rvv2048 = rvv256;
  rvv2048.vlen_bits = 2048;
  CpuFeatures avx2;
  avx2.avx2 = true;
  CpuFeatures vnni_without_avx2;
  vnni_without_avx2.avx512vnni = true;

  Expect(rvascend::KernelSetNames(rvascend::SupportedKernelSets(kTable, none)) ==
             std::vector<std::string>{"portable"}, "a CPU with nothing runs the portable set only");
  Expect(rvascend::KernelSetNames(rvascend::SupportedKernelSets(kTable, rvv256)) ==
             std::vector<std::string>{"wide", "rvv", "portable"}, "VLEN 256 runs the wide set, best first");
  Expect(rvascend::KernelSetNames(rvascend::SupportedKernelSets(kTable, rvv2048)) ==
             std::vector<std::string>{"rvv", "portable"}, "VLEN 2048 is past the wide set's bound");
  Expect(rvascend::KernelSetNames(rvascend::SupportedKernelSets(kTable, avx2)) ==
             std::vector<std::string>{"avx2", "portable"}, "AVX2");
  Expect(!rvascend::CpuMeets({rvascend::Isa::kAvx512Vnni}, vnni_without_avx2), "a VNNI set needs AVX2 too");

  const auto supported = rvascend::SupportedKernelSets(kTable, avx2);
  Expect(rvascend::SelectKernelSet(supported, "", "test").name == std::string("avx2"), "'' picks the best");
  Expect(rvascend::SelectKernelSet(supported, "portable", "test").name == std::string("portable"), "by name");
  try {
    rvascend::SelectKernelSet(supported, "rvv", "test");
    Expect(false, "a set the CPU lacks is refused");
  } catch (const std::invalid_argument& e) {
    Expect(std::string(e.what()) ==
               "test kernel set 'rvv' is not available on this CPU/build (available: avx2, portable)",
           e.what());
  }
  if (failures == 0) std::printf("kernel_set_selection_test: ok\n");
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
