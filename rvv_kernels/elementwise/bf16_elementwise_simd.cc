// Host row kernels for the contracts in elementwise_ukernels.h, in one-register
// generic vectors (base/simd_vectors.h). Compiled once per x86 ISA level the
// dispatcher may pick (BUILD), each object defining the ElementwiseKernels
// named by RVASCEND_ELEMENTWISE_SYMBOL. The statements are the RVV kernels'
// (same exp, same BF16 roundings); a row's last partial chunk runs through the
// same vector code on lanes padded with a neutral value.
#include <cmath>
#include <cstring>

#include "rvv_kernels/base/simd_vectors.h"
#include "rvv_kernels/elementwise/elementwise_ukernels.h"

#if !defined(RVASCEND_ELEMENTWISE_SYMBOL) || !defined(RVASCEND_ELEMENTWISE_NAME)
#error "define RVASCEND_ELEMENTWISE_SYMBOL and RVASCEND_ELEMENTWISE_NAME"
#endif
#define RVASCEND_STR_(x) #x
#define RVASCEND_STR(x) RVASCEND_STR_(x)

namespace rvascend {
namespace {

using simd::kLanes;
using simd::VF;

// f(i, lanes) for each chunk of a row of n: lanes == kLanes except for the last.
template <typename F>
RVASCEND_SIMD_INLINE void Chunks(size_t n, F f) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) f(i, kLanes);
  if (i < n) f(i, n - i);
}

using simd::LoadBf16N;
using simd::StoreBf16N;

float SumSquares(const uint16_t* h, size_t d) {
  VF acc{};
  Chunks(d, [&](size_t i, size_t n) {
    const VF v = LoadBf16N(h + i, n);
    acc += v * v;
  });
  return simd::Sum(acc);
}

float Rinv(float sum_squares, size_t d, float eps) {
  return 1.0f / std::sqrt(sum_squares / static_cast<float>(d) + eps);
}

// out = bf16(w * bf16(h * rinv)).
void Scale(const uint16_t* h, const uint16_t* weight, size_t d, float rinv, uint16_t* out) {
  Chunks(d, [&](size_t i, size_t n) {
    const VF t = simd::RoundBf16(LoadBf16N(h + i, n) * rinv);
    StoreBf16N(out + i, LoadBf16N(weight + i, n) * t, n);
  });
}

// out = bf16(h * rinv * (1 + w)), one rounding (Qwen3.5's zero-centred norms).
void ScaleZeroCentred(const uint16_t* h, const uint16_t* weight, size_t d, float rinv, uint16_t* out) {
  Chunks(d, [&](size_t i, size_t n) {
    StoreBf16N(out + i, LoadBf16N(h + i, n) * rinv * (LoadBf16N(weight + i, n) + 1.0f), n);
  });
}

void RmsNorm(const uint16_t* x, const uint16_t* residual, const uint16_t* weight, size_t d, float eps,
             bool zero_centred, uint16_t* out, uint16_t* residual_out) {
  const uint16_t* h = x;
  if (residual) {
    // The BF16 sum is the residual stream's next value and the norm's input: stored once, read back.
    Chunks(d, [&](size_t i, size_t n) {
      StoreBf16N(residual_out + i, LoadBf16N(x + i, n) + LoadBf16N(residual + i, n), n);
    });
    h = residual_out;
  }
  (zero_centred ? ScaleZeroCentred : Scale)(h, weight, d, Rinv(SumSquares(h, d), d, eps), out);
}

void SiluMul(const uint16_t* gate_up, size_t d, uint16_t* out) {
  Chunks(d, [&](size_t i, size_t n) {
    const VF g = LoadBf16N(gate_up + i, n);
    const VF silu = simd::RoundBf16(g / (simd::Exp(-g) + 1.0f));
    StoreBf16N(out + i, silu * LoadBf16N(gate_up + d + i, n), n);
  });
}

// out[lo..] = bf16(bf16(x_lo * c) + bf16(sign * x_hi * s)) over n values.
void RotateHalf(const uint16_t* x_lo, const uint16_t* x_hi, float sign, const uint16_t* cos, const uint16_t* sin,
                size_t n, uint16_t* out) {
  Chunks(n, [&](size_t i, size_t lanes) {
    const VF a = simd::RoundBf16(LoadBf16N(x_lo + i, lanes) * LoadBf16N(cos + i, lanes));
    const VF b = simd::RoundBf16(LoadBf16N(x_hi + i, lanes) * sign * LoadBf16N(sin + i, lanes));
    StoreBf16N(out + i, a + b, lanes);
  });
}

void Rope(const uint16_t* x, const RopeHeads& p, const uint16_t* cos, const uint16_t* sin, uint16_t* out) {
  const size_t d = p.d, r = p.rotary_dim, half = r / 2;
  uint16_t normed[1024];
  for (size_t h = 0; h < p.heads; ++h) {
    const uint16_t* row = x + h * p.stride;
    if (p.norm_weight) {
      (p.zero_centred ? ScaleZeroCentred : Scale)(row, p.norm_weight, d, Rinv(SumSquares(row, d), d, p.eps), normed);
      row = normed;
    }
    uint16_t* o = out + h * d;
    RotateHalf(row, row + half, -1.0f, cos, sin, half, o);
    RotateHalf(row + half, row, 1.0f, cos + half, sin + half, r - half, o + half);
    if (r < d) std::memcpy(o + r, row + r, (d - r) * sizeof(uint16_t));  // partial RoPE: the rest as is
  }
}

void SigmoidMul(const uint16_t* x, const uint16_t* gate, size_t n, uint16_t* out) {
  Chunks(n, [&](size_t i, size_t lanes) {
    const VF s = simd::RoundBf16(1.0f / (simd::Exp(-LoadBf16N(gate + i, lanes)) + 1.0f));
    StoreBf16N(out + i, LoadBf16N(x + i, lanes) * s, lanes);
  });
}

int64_t Argmax(const uint16_t* row, size_t n) {
  // One pass: each lane keeps its largest value and that value's first index
  // (strictly greater replaces), then the smallest index among the lanes that
  // hold the maximum. Tail lanes are -inf, which never replaces a row value.
  constexpr uint16_t kMinusInf = 0xff80;
  VF m = simd::Splat(-__builtin_inff());
  simd::VI index{}, lane{}, nan{};
  for (size_t l = 0; l < kLanes; ++l) lane[l] = static_cast<int32_t>(l);
  Chunks(n, [&](size_t i, size_t lanes) {
    const VF v = LoadBf16N(row + i, lanes, kMinusInf);
    nan |= (v != v);
    const simd::VI greater = v > m;
    index = greater ? lane + static_cast<int32_t>(i) : index;
    m = simd::Max(m, v);
  });
  int64_t best = -1;
  const float top = simd::MaxOf(m);
  for (size_t l = 0; l < kLanes; ++l) {
    if (nan[l]) return -1;
    if (m[l] == top && (best < 0 || index[l] < best)) best = index[l];
  }
  return best;
}

}  // namespace

extern const ElementwiseKernels RVASCEND_ELEMENTWISE_SYMBOL = {RVASCEND_STR(RVASCEND_ELEMENTWISE_NAME), RmsNorm,
                                                              SiluMul, Rope, SigmoidMul, Argmax};

}  // namespace rvascend
