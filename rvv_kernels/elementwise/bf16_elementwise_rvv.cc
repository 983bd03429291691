// RVV 1.0 row kernels (VLEN-agnostic, e32m4, BF16 widened by zero-extend and
// shift) for the contracts in elementwise_ukernels.h. Streaming loops set vl
// every iteration; the sums of squares accumulate tail-undisturbed and are
// reduced over VLMAX, so a short last chunk adds only its own lanes.
#include <riscv_vector.h>

#include <cmath>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/rvv_lmul.h"
#include "rvv_kernels/base/rvv_math.h"
#include "rvv_kernels/elementwise/elementwise_ukernels.h"

namespace rvascend {
namespace {

using V = rvv::Lmul<4>;

float SumSquares(const uint16_t* h, size_t d) {
  const size_t vlmax = V::VlMax();
  vfloat32m4_t acc = V::Zero(vlmax);
  for (size_t i = 0; i < d;) {
    const size_t vl = V::SetVl(d - i);
    const vfloat32m4_t v = V::LoadBf16(h + i, vl);
    acc = __riscv_vfmacc_vv_f32m4_tu(acc, v, v, vl);
    i += vl;
  }
  return __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m4_f32m1(acc, __riscv_vfmv_v_f_f32m1(0.0f, 1), vlmax));
}

// out = bf16(w * bf16(h * rinv)).
void Scale(const uint16_t* h, const uint16_t* weight, size_t d, float rinv, uint16_t* out) {
  for (size_t i = 0; i < d;) {
    const size_t vl = V::SetVl(d - i);
    const vfloat32m4_t t = rvv::RoundBf16(__riscv_vfmul_vf_f32m4(V::LoadBf16(h + i, vl), rinv, vl), vl);
    V::StoreBf16(out + i, __riscv_vfmul_vv_f32m4(V::LoadBf16(weight + i, vl), t, vl), vl);
    i += vl;
  }
}

// out = bf16(h * rinv * (1 + w)), one rounding (Qwen3.5's zero-centred norms).
void ScaleZeroCentred(const uint16_t* h, const uint16_t* weight, size_t d, float rinv, uint16_t* out) {
  for (size_t i = 0; i < d;) {
    const size_t vl = V::SetVl(d - i);
    const vfloat32m4_t t = __riscv_vfmul_vf_f32m4(V::LoadBf16(h + i, vl), rinv, vl);
    V::StoreBf16(out + i, __riscv_vfmul_vv_f32m4(t, __riscv_vfadd_vf_f32m4(V::LoadBf16(weight + i, vl), 1.0f, vl), vl),
                 vl);
    i += vl;
  }
}

float Rinv(float sum_squares, size_t d, float eps) {
  return 1.0f / std::sqrt(sum_squares / static_cast<float>(d) + eps);
}

void RmsNorm(const uint16_t* x, const uint16_t* residual, const uint16_t* weight, size_t d, float eps,
             bool zero_centred, uint16_t* out, uint16_t* residual_out) {
  const uint16_t* h = x;
  if (residual) {
    for (size_t i = 0; i < d;) {
      const size_t vl = V::SetVl(d - i);
      V::StoreBf16(residual_out + i, __riscv_vfadd_vv_f32m4(V::LoadBf16(x + i, vl), V::LoadBf16(residual + i, vl), vl),
                   vl);
      i += vl;
    }
    h = residual_out;
  }
  (zero_centred ? ScaleZeroCentred : Scale)(h, weight, d, Rinv(SumSquares(h, d), d, eps), out);
}

void SiluMul(const uint16_t* gate_up, size_t d, uint16_t* out) {
  for (size_t i = 0; i < d;) {
    const size_t vl = V::SetVl(d - i);
    const vfloat32m4_t g = V::LoadBf16(gate_up + i, vl);
    const vfloat32m4_t e = rvv::Exp(__riscv_vfneg_v_f32m4(g, vl), vl);
    const vfloat32m4_t silu = rvv::RoundBf16(__riscv_vfdiv_vv_f32m4(g, __riscv_vfadd_vf_f32m4(e, 1.0f, vl), vl), vl);
    V::StoreBf16(out + i, __riscv_vfmul_vv_f32m4(silu, V::LoadBf16(gate_up + d + i, vl), vl), vl);
    i += vl;
  }
}

// Bytes at e8m8: one load and one store per 8 x VLENB bytes, whatever the
// alignment (the riscv64 image's libc memcpy takes about 4 instructions per
// byte under QEMU).
void Copy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < bytes;) {
    const size_t vl = __riscv_vsetvl_e8m8(bytes - i);
    __riscv_vse8_v_u8m8(d + i, __riscv_vle8_v_u8m8(s + i, vl), vl);
    i += vl;
  }
}

// out[lo..] = bf16(bf16(x_lo * c) + bf16(sign * x_hi * s)) over `n` lanes.
void RotateHalf(const uint16_t* x_lo, const uint16_t* x_hi, float sign, const uint16_t* cos, const uint16_t* sin,
                size_t n, uint16_t* out) {
  for (size_t i = 0; i < n;) {
    const size_t vl = V::SetVl(n - i);
    const vfloat32m4_t a = rvv::RoundBf16(__riscv_vfmul_vv_f32m4(V::LoadBf16(x_lo + i, vl), V::LoadBf16(cos + i, vl), vl), vl);
    const vfloat32m4_t rot = __riscv_vfmul_vf_f32m4(V::LoadBf16(x_hi + i, vl), sign, vl);
    const vfloat32m4_t b = rvv::RoundBf16(__riscv_vfmul_vv_f32m4(rot, V::LoadBf16(sin + i, vl), vl), vl);
    V::StoreBf16(out + i, __riscv_vfadd_vv_f32m4(a, b, vl), vl);
    i += vl;
  }
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
    Copy(o + r, row + r, (d - r) * sizeof(uint16_t));  // partial RoPE: the rest as is
  }
}

void SigmoidMul(const uint16_t* x, const uint16_t* gate, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n;) {
    const size_t vl = V::SetVl(n - i);
    const vfloat32m4_t e = rvv::Exp(__riscv_vfneg_v_f32m4(V::LoadBf16(gate + i, vl), vl), vl);
    const vfloat32m4_t s = rvv::RoundBf16(__riscv_vfrdiv_vf_f32m4(__riscv_vfadd_vf_f32m4(e, 1.0f, vl), 1.0f, vl), vl);
    V::StoreBf16(out + i, __riscv_vfmul_vv_f32m4(V::LoadBf16(x + i, vl), s, vl), vl);
    i += vl;
  }
}

int64_t Argmax(const uint16_t* row, size_t n) {
  // Pass 1: the maximum and whether any lane is NaN; pass 2: its first index.
  vfloat32m1_t m1 = __riscv_vfmv_v_f_f32m1(-__builtin_inff(), 1);
  bool nan = false;
  for (size_t i = 0; i < n;) {
    const size_t vl = V::SetVl(n - i);
    const vfloat32m4_t v = V::LoadBf16(row + i, vl);
    nan |= __riscv_vfirst_m_b8(__riscv_vmfne_vv_f32m4_b8(v, v, vl), vl) >= 0;
    m1 = __riscv_vfredmax_vs_f32m4_f32m1(v, m1, vl);
    i += vl;
  }
  if (nan) return -1;
  const float m = __riscv_vfmv_f_s_f32m1_f32(m1);
  for (size_t i = 0; i < n;) {
    const size_t vl = V::SetVl(n - i);
    const long first = __riscv_vfirst_m_b8(__riscv_vmfeq_vf_f32m4_b8(V::LoadBf16(row + i, vl), m, vl), vl);
    if (first >= 0) return static_cast<int64_t>(i + static_cast<size_t>(first));
    i += vl;
  }
  return 0;
}

}  // namespace

const ElementwiseKernels kElementwiseRvv = {"rvv", RmsNorm, SiluMul, Rope, SigmoidMul, Argmax};

}  // namespace rvascend
