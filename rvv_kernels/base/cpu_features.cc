#include "rvv_kernels/base/cpu_features.h"

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

#if defined(__riscv)
#include <setjmp.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#endif

namespace rvascend {

#if defined(__riscv) && defined(RVASCEND_HAVE_ZVFBFWMA)
// Defined in the Zvfbfwma translation unit: executes one vfwmaccbf16.
void ExecuteZvfbfwmaProbe();
#endif

namespace {

#if defined(__riscv)
// Linux riscv_hwprobe (since 6.4); constants from the kernel's uapi hwprobe.h.
constexpr long kSysRiscvHwprobe = 258;
constexpr int64_t kHwprobeKeyImaExt0 = 4;
constexpr uint64_t kHwprobeImaV = 1ull << 2;
constexpr uint64_t kHwprobeExtZvfbfwma = 1ull << 54;

struct HwprobePair {
  int64_t key;
  uint64_t value;
};

bool Hwprobe(uint64_t* ext0) {
  HwprobePair pair{kHwprobeKeyImaExt0, 0};
  if (syscall(kSysRiscvHwprobe, &pair, 1, 0, nullptr, 0) != 0 || pair.key < 0) return false;
  *ext0 = pair.value;
  return true;
}

#if defined(RVASCEND_HAVE_ZVFBFWMA)
sigjmp_buf probe_jump;

void OnProbeSigill(int) { siglongjmp(probe_jump, 1); }

// Kernels older than 6.15 do not report Zvfbfwma through hwprobe (and QEMU's
// user mode never does), so a CPU that may have it is asked directly: run one
// vfwmaccbf16 and see whether it traps.
bool ZvfbfwmaExecutes() {
  struct sigaction action = {}, previous = {};
  action.sa_handler = OnProbeSigill;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGILL, &action, &previous) != 0) return false;
  bool ok = false;
  if (sigsetjmp(probe_jump, 1) == 0) {
    ExecuteZvfbfwmaProbe();
    ok = true;
  }
  sigaction(SIGILL, &previous, nullptr);
  return ok;
}
#endif
#endif

CpuFeatures Detect() {
  CpuFeatures f;
#if defined(__riscv)
  uint64_t ext0 = 0;
  const bool have_hwprobe = Hwprobe(&ext0);
  f.rvv = have_hwprobe ? (ext0 & kHwprobeImaV) != 0
                       : (getauxval(AT_HWCAP) & (1ul << ('V' - 'A'))) != 0;
  if (f.rvv) {
    // vlenb by its CSR number (0xc22): this file is built without V (rv64gc)
    // and reads it only after the CPU reported V.
    unsigned long vlenb;
    asm volatile("csrr %0, 0xc22" : "=r"(vlenb));
    f.vlen_bits = vlenb * 8;
  }
#if defined(RVASCEND_HAVE_ZVFBFWMA)
  if (!f.rvv) {
    f.zvfbfwma_source = "no RVV";
  } else if (have_hwprobe && (ext0 & kHwprobeExtZvfbfwma)) {
    f.zvfbfwma = true;
    f.zvfbfwma_source = "hwprobe";
  } else {
    f.zvfbfwma = ZvfbfwmaExecutes();
    f.zvfbfwma_source = f.zvfbfwma ? "probe instruction executed" : "probe instruction trapped";
  }
#else
  f.zvfbfwma_source = "not built (compiler without Zvfbfwma)";
#endif
#elif defined(__x86_64__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
  f.avx512bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  f.avx512vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
  f.amx_bf16 = __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("amx-tile");
#endif
  return f;
}

// RVASCEND_MAX_ISA caps what the kernel sets may use, for every family at once:
// an AVX-512 host then runs (and benchmarks) what an AVX2-only host would, as
// ATen's ATEN_CPU_CAPABILITY and oneDNN's ONEDNN_MAX_CPU_ISA do for torch.
CpuFeatures Capped(CpuFeatures f) {
  const char* env = std::getenv("RVASCEND_MAX_ISA");
  const std::string cap = env ? env : "";
  if (cap.empty() || cap == "native") return f;
  if (cap != "avx2" && cap != "avx512" && cap != "generic") {
    throw std::invalid_argument("RVASCEND_MAX_ISA=" + cap +
                                ": expected native, avx2 or avx512 (x86-64: AVX-512 F/BW/VL without BF16 and VNNI), "
                                "or generic");
  }
#if !defined(__x86_64__)
  if (cap != "generic") throw std::invalid_argument("RVASCEND_MAX_ISA=" + cap + " is for x86-64 hosts");
#endif
  f.max_isa = cap;
  f.avx512bf16 = f.avx512vnni = f.amx_bf16 = false;
  if (cap != "avx512") f.avx512 = false;
  if (cap == "generic") {
    f.avx2 = f.rvv = f.zvfbfwma = false;
    f.zvfbfwma_source = "RVASCEND_MAX_ISA=generic";
    f.vlen_bits = 0;
  }
  return f;
}

}  // namespace

std::string CpuFeatures::Describe() const {
  std::ostringstream out;
#if defined(__riscv)
  out << "riscv64 rvv=" << rvv << " vlen=" << vlen_bits << " zvfbfwma=" << zvfbfwma << " ("
      << zvfbfwma_source << ")";
#elif defined(__x86_64__)
  out << "x86-64 avx2=" << avx2 << " avx512=" << avx512 << " avx512bf16=" << avx512bf16 << " avx512vnni=" << avx512vnni
      << " amxbf16=" << amx_bf16;
#else
  out << "generic CPU";
#endif
  if (!max_isa.empty()) out << " (RVASCEND_MAX_ISA=" << max_isa << ")";
  return out.str();
}

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Capped(Detect());
  return features;
}

}  // namespace rvascend
