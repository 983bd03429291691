// The pieces of deltanet_decode (deltanet_pieces.h) in GCC/Clang generic
// vectors (simd_vectors.h: 16 FP32 lanes with AVX-512, 8 with AVX2), for FP32
// and BF16 elements; compiled once per x86 ISA level the dispatcher may pick
// (BUILD), each object defining the two piece sets named by RGDR_PIECES_F32
// and RGDR_PIECES_BF16. SiLU takes simd::Exp (about 2 FP32 ulp from
// std::exp), which is what the portable pieces spent their time in: a
// Qwen3.5-0.8B token's 6144 conv channels and 2048 gated outputs.
//
// The conv's taps are [channel, tap] in memory. For BF16 and 4 taps (Qwen3.5's
// conv: 3 kept inputs and 4 weights per channel) kLanes channels' windows and
// weights are loaded whole and split into taps by shuffles, the slid window
// shuffled back; otherwise each channel's sum is taken in scalar code into a
// lane. The SiLU and the rounding run across channels either way.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "rvv_kernels/recurrent_gated_delta_rule/deltanet_pieces.h"
#include "rvv_kernels/recurrent_gated_delta_rule/elem_values.h"
#include "rvv_kernels/base/simd_vectors.h"

namespace rgdr {
namespace {

namespace simd = rvascend::simd;
using simd::kLanes;
using simd::VF;

// Element loads and stores as FP32 lanes (n <= kLanes of them).
struct F32Elems {
  using T = float;
  static VF Load(const float* p, size_t n) { return simd::LoadFN(p, n); }
  static VF Round(VF x) { return x; }
  static void Store(float* p, VF x, size_t n) { simd::StoreFN(p, x, n); }
};

struct Bf16Elems {
  using T = uint16_t;
  static VF Load(const uint16_t* p, size_t n) { return simd::LoadBf16N(p, n); }
  static VF Round(VF x) { return simd::RoundBf16(x); }
  static void Store(uint16_t* p, VF x, size_t n) { simd::StoreBf16N(p, x, n); }
};

RVASCEND_SIMD_INLINE VF Silu(VF x) { return x / (simd::Exp(-x) + 1.0f); }

// kLanes channels of a BF16 conv with 4 taps: windows [channel, 3], weights [channel, 4].
typedef uint16_t VH64 __attribute__((vector_size(128)));  // 64 BF16 values: 3 or 4 per channel

template <size_t Tap, size_t Taps, size_t... I>
RVASCEND_SIMD_INLINE simd::VH TapOf(VH64 v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, (I * Taps + Tap)...);
}

// The window slid by one: channel i's lanes become (s[3i + 1], s[3i + 2], x[i]); x in lanes 0..kLanes-1.
template <size_t... I>
RVASCEND_SIMD_INLINE VH64 Slide(VH64 s, VH64 x, std::index_sequence<I...>) {
  return __builtin_shufflevector(s, x, (I % 3 == 2 ? 64 + I / 3 : I + 1)...);
}

RVASCEND_SIMD_INLINE VF Widen(simd::VH h) { return rvascend::WidenBf16<VF, simd::VU, simd::VH>(h); }

// Channels [0, n - n % kLanes) of ConvSilu<Bf16Elems> with kept = 3; returns how many it did.
size_t ConvSiluBf16Taps4(const uint16_t* x, const uint16_t* in, uint16_t* out, const uint16_t* weight, size_t n,
                         float* y) {
  static_assert(4 * kLanes <= 64, "a vector of 64 BF16 values holds kLanes channels' weights");
  constexpr auto lanes = std::make_index_sequence<kLanes>();
  size_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    VH64 s{}, w{}, xs{};
    std::memcpy(&s, in + 3 * c, 3 * kLanes * sizeof(uint16_t));
    std::memcpy(&w, weight + 4 * c, 4 * kLanes * sizeof(uint16_t));
    std::memcpy(&xs, x + c, kLanes * sizeof(uint16_t));
    // The scalar statement's order: the three kept inputs, then the new one.
    VF sum = Widen(TapOf<0, 3>(s, lanes)) * Widen(TapOf<0, 4>(w, lanes));
    sum += Widen(TapOf<1, 3>(s, lanes)) * Widen(TapOf<1, 4>(w, lanes));
    sum += Widen(TapOf<2, 3>(s, lanes)) * Widen(TapOf<2, 4>(w, lanes));
    sum += Widen(TapOf<0, 1>(xs, lanes)) * Widen(TapOf<3, 4>(w, lanes));
    const VH64 slid = Slide(s, xs, std::make_index_sequence<64>());
    std::memcpy(out + 3 * c, &slid, 3 * kLanes * sizeof(uint16_t));
    simd::StoreF(y + c, simd::RoundBf16(Silu(sum)));
  }
  return c;
}

template <class E>
void ConvSilu(const typename E::T* x, const typename E::T* in, typename E::T* out, const typename E::T* weight,
              size_t n, size_t kept, float* y) {
  using T = typename E::T;
  size_t start = 0;
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (kept == 3) start = ConvSiluBf16Taps4(x, in, out, weight, n, y);
  }
  for (size_t c = start; c < n; c += kLanes) {
    const size_t lanes = n - c < kLanes ? n - c : kLanes;
    float sums[kLanes] = {};
    for (size_t i = 0; i < lanes; ++i) {
      const T* s = in + (c + i) * kept;
      T* o = out + (c + i) * kept;
      const T* w = weight + (c + i) * (kept + 1);
      float sum = 0.0f;
      for (size_t j = 0; j < kept; ++j) sum += ToFloat(s[j]) * ToFloat(w[j]);
      sum += ToFloat(x[c + i]) * ToFloat(w[kept]);
      std::memmove(o, s + 1, (kept - 1) * sizeof(T));
      o[kept - 1] = x[c + i];
      sums[i] = sum;
    }
    simd::StoreFN(y + c, E::Round(Silu(simd::LoadF(sums))), lanes);
  }
}

// sum(x[i]^2) over n values, lane-wise then the fixed-order halving tree.
float SumSquares(const float* x, size_t n) {
  VF acc{};
  for (size_t i = 0; i < n; i += kLanes) {
    const VF v = simd::LoadFN(x + i, n - i < kLanes ? n - i : kLanes);
    acc += v * v;
  }
  return simd::Sum(acc);
}

void L2Norm(float* x, size_t n, float scale) {
  const float r = scale / std::sqrt(SumSquares(x, n) + 1e-6f);
  for (size_t i = 0; i < n; i += kLanes) {
    const size_t lanes = n - i < kLanes ? n - i : kLanes;
    simd::StoreFN(x + i, simd::LoadFN(x + i, lanes) * r, lanes);
  }
}

template <class E>
void GatedNorm(float* o, const typename E::T* z, const typename E::T* weight, size_t n, float eps,
               typename E::T* out) {
  for (size_t i = 0; i < n; i += kLanes) {
    const size_t lanes = n - i < kLanes ? n - i : kLanes;
    simd::StoreFN(o + i, E::Round(simd::LoadFN(o + i, lanes)), lanes);
  }
  const float rms = 1.0f / std::sqrt(SumSquares(o, n) / static_cast<float>(n) + eps);
  for (size_t i = 0; i < n; i += kLanes) {
    const size_t lanes = n - i < kLanes ? n - i : kLanes;
    const VF normed = E::Round(simd::LoadFN(o + i, lanes) * rms);
    const VF scaled = E::Round(E::Load(weight + i, lanes) * normed);
    E::Store(out + i, scaled * Silu(E::Load(z + i, lanes)), lanes);
  }
}

}  // namespace

#define RGDR_STRINGIFY2(x) #x
#define RGDR_STRINGIFY(x) RGDR_STRINGIFY2(x)
// External linkage: the dispatcher (deltanet_pieces_portable.cc) names them.
extern const DeltaNetPieces<float> RGDR_PIECES_F32;
extern const DeltaNetPieces<uint16_t> RGDR_PIECES_BF16;
const DeltaNetPieces<float> RGDR_PIECES_F32{RGDR_STRINGIFY(RGDR_ROWS_NAME), ConvSilu<F32Elems>, L2Norm,
                                            GatedNorm<F32Elems>};
const DeltaNetPieces<uint16_t> RGDR_PIECES_BF16{RGDR_STRINGIFY(RGDR_ROWS_NAME), ConvSilu<Bf16Elems>, L2Norm,
                                                GatedNorm<Bf16Elems>};

}  // namespace rgdr
