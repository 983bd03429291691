// What the CPU reports, detected once per process.
#ifndef RVV_KERNELS_BASE_CPU_FEATURES_H_
#define RVV_KERNELS_BASE_CPU_FEATURES_H_

#include <cstddef>
#include <string>

namespace rvascend {

struct CpuFeatures {
  bool rvv = false;        // RVV 1.0 usable (hwprobe IMA_V, else AT_HWCAP 'V')
  bool zvfbfwma = false;   // Zvfbfwma: hwprobe bit, else a trapped probe instruction
  const char* zvfbfwma_source = "not a riscv64 build";
  size_t vlen_bits = 0;    // 0 when there is no RVV
  bool avx2 = false;       // x86-64: AVX2 + FMA + F16C (every AVX2 CPU has F16C)
  bool avx512 = false;     // x86-64: AVX-512 F/BW/VL
  bool avx512bf16 = false; // x86-64: AVX-512 F/BW/VL + BF16 (vdpbf16ps)
  bool avx512vnni = false; // x86-64: AVX-512 F/BW/VL + VNNI (vpdpbusd)
  // x86-64: AMX-BF16 tiles. No kernel here uses them; oneDNN does, so the stock path's
  // BF16 prefill is that fast on such a host (deterministic inference's default reads it).
  bool amx_bf16 = false;
  std::string max_isa;     // RVASCEND_MAX_ISA when it capped the above, else empty
  std::string Describe() const;
};

const CpuFeatures& GetCpuFeatures();

}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_CPU_FEATURES_H_
