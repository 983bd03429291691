// Every BF16 vector conversion the host can run agrees with the scalar one
// (tests/simd_bf16_check.cc, one object per ISA level).
#include <cstdio>

#include "rvv_kernels/base/cpu_features.h"
#include "rvv_kernels/base/kernel_testing.h"

namespace rvascend {
size_t CheckSimdBf16Baseline(uint32_t* first_bad_bits);
#if defined(__x86_64__)
size_t CheckSimdBf16Avx2(uint32_t* first_bad_bits);
size_t CheckSimdBf16Avx512(uint32_t* first_bad_bits);
#endif
}  // namespace rvascend

int main() {
  using namespace rvascend;
  struct Level {
    const char* name;
    bool usable;
    size_t (*check)(uint32_t*);
  };
  const CpuFeatures& f = GetCpuFeatures();
  const Level levels[] = {
      {"baseline", true, CheckSimdBf16Baseline},
#if defined(__x86_64__)
      {"avx2", f.avx2, CheckSimdBf16Avx2},
      {"avx512", f.avx512, CheckSimdBf16Avx512},
#endif
  };
  for (const Level& level : levels) {
    if (!level.usable) {
      std::printf("%s: not run, this CPU lacks it (%s)\n", level.name, f.Describe().c_str());
      continue;
    }
    uint32_t first = 0;
    const size_t bad = level.check(&first);
    EXPECT(bad == 0, "%s: %zu lanes differ from the scalar conversion, first FP32 bits 0x%08x", level.name, bad,
           first);
  }
  return testing::Summary();
}
