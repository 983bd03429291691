// The portable quantized kernels: plain loops over the runtime layout, the twin
// of every vector kernel (the same integer sums, the same FP32 operations in the
// same order) and the path of CPUs without a vector set. Columns are the inner
// loops (the layout stores a tile's columns side by side), so the compiler can
// vectorise them in the baseline ISA.
#include <cmath>
#include <cstring>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/quantized/quant_activations.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"

namespace rvascend {
namespace {

inline uint16_t U16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// One 32-block of a 32-blocks format for one row: every column's integer sum.
template <QuantFormat F>
void Block32(const uint8_t* blk, size_t t, const int8_t* a, int32_t* isum) {
  for (size_t c = 0; c < t; ++c) isum[c] = 0;
  if constexpr (F == QuantFormat::kQ8_0) {
    const auto* q = reinterpret_cast<const int8_t*>(blk + 2 * t);
    for (size_t i = 0; i < 32; ++i) {
      for (size_t c = 0; c < t; ++c) isum[c] += q[i * t + c] * a[i];
    }
  } else {
    const uint8_t* qs = blk + (F == QuantFormat::kQ4_1 ? 4 : 2) * t;
    for (size_t i = 0; i < 16; ++i) {
      for (size_t c = 0; c < t; ++c) {
        const uint8_t b = qs[i * t + c];
        isum[c] += (b & 0xF) * a[i] + (b >> 4) * a[i + 16];
      }
    }
  }
}

template <QuantFormat F>
void Gemm32(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c, size_t c_stride) {
  const QuantFormatInfo& info = FormatInfo(F);
  const size_t blocks = a.k / 32;
  int32_t isum[256];
  for (size_t r = 0; r < m; ++r) {
    float* acc = c + r * c_stride;
    for (size_t j = 0; j < t; ++j) acc[j] = 0.0f;
    const int8_t* q = a.q + (row0 + r) * a.k;
    const float* ad = a.d + (row0 + r) * blocks;
    const int32_t* asum = a.sum32 + (row0 + r) * blocks;
    for (size_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = tile + b * info.tile_block_bytes * t;
      Block32<F>(blk, t, q + 32 * b, isum);
      const float s = ad[b];
      for (size_t j = 0; j < t; ++j) {
        int32_t v = isum[j];
        if constexpr (F == QuantFormat::kQ4_0) v -= 8 * asum[b];
        acc[j] = std::fma(static_cast<float>(v), ScaleProduct(U16(blk + 2 * j), s), acc[j]);
        if constexpr (F == QuantFormat::kQ4_1) {
          acc[j] = std::fma(HalfToFloat(U16(blk + 2 * t + 2 * j)), s * static_cast<float>(asum[b]), acc[j]);
        }
      }
    }
  }
}

void GemmQ4K(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c, size_t c_stride) {
  const size_t supers = a.k / 256;
  int32_t isum[256], total[256], msum[256];
  for (size_t r = 0; r < m; ++r) {
    float* acc = c + r * c_stride;
    for (size_t j = 0; j < t; ++j) acc[j] = 0.0f;
    const int8_t* q = a.q + (row0 + r) * a.k;
    const float* ad = a.d + (row0 + r) * supers;
    const int32_t* asum = a.sum32 + (row0 + r) * (a.k / 32);
    for (size_t s = 0; s < supers; ++s) {
      const uint8_t* blk = tile + s * 148 * t;
      const uint8_t* sc = blk + 4 * t;
      const uint8_t* mn = blk + 12 * t;
      const uint8_t* qs = blk + 20 * t;
      const int8_t* qa = q + 256 * s;
      // Columns innermost: the tile's bytes are column-contiguous, so the loops vectorise.
      for (size_t j = 0; j < t; ++j) total[j] = msum[j] = 0;
      for (size_t sub = 0; sub < 8; ++sub) {
        for (size_t j = 0; j < t; ++j) isum[j] = 0;
        for (size_t i = 0; i < 16; ++i) {
          const uint8_t* row = qs + (16 * sub + i) * t;
          const int32_t lo = qa[32 * sub + i], hi = qa[32 * sub + 16 + i];
          for (size_t j = 0; j < t; ++j) isum[j] += (row[j] & 0xF) * lo + (row[j] >> 4) * hi;
        }
        for (size_t j = 0; j < t; ++j) {
          total[j] += sc[sub * t + j] * isum[j];
          msum[j] += mn[sub * t + j] * asum[8 * s + sub];
        }
      }
      for (size_t j = 0; j < t; ++j) {
        acc[j] = std::fma(static_cast<float>(total[j]), ScaleProduct(U16(blk + 2 * j), ad[s]), acc[j]);
        acc[j] = std::fma(static_cast<float>(msum[j]), ScaleProduct(U16(blk + 2 * t + 2 * j), -ad[s]), acc[j]);
      }
    }
  }
}

void GemmQ6K(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c, size_t c_stride) {
  const size_t supers = a.k / 256;
  int32_t sub_lo[256], sub_hi[256], total[256];
  for (size_t r = 0; r < m; ++r) {
    float* acc = c + r * c_stride;
    for (size_t j = 0; j < t; ++j) acc[j] = 0.0f;
    const int8_t* q = a.q + (row0 + r) * a.k;
    const float* ad = a.d + (row0 + r) * supers;
    for (size_t s = 0; s < supers; ++s) {
      const uint8_t* blk = tile + s * 210 * t;
      const auto* sc = reinterpret_cast<const int8_t*>(blk + 2 * t);
      const uint8_t* ql = blk + 18 * t;
      const uint8_t* qh = blk + 146 * t;
      const int8_t* qa = q + 256 * s;
      for (size_t j = 0; j < t; ++j) total[j] = 0;
      for (size_t p = 0; p < 8; ++p) {
        // Sub-blocks 2p (k 32p..32p+15) and 2p+1, columns innermost.
        for (size_t j = 0; j < t; ++j) sub_lo[j] = sub_hi[j] = 0;
        for (size_t i = 0; i < 16; ++i) {
          const uint8_t* lrow = ql + (16 * p + i) * t;
          const uint8_t* hrow = qh + (8 * p + i % 8) * t;
          const int shift_lo = 2 * (i / 8), shift_hi = 2 * (2 + i / 8);
          const int32_t alo = qa[32 * p + i], ahi = qa[32 * p + 16 + i];
          for (size_t j = 0; j < t; ++j) {
            const int lo = ((lrow[j] & 0xF) | (((hrow[j] >> shift_lo) & 3) << 4)) - 32;
            const int hi = ((lrow[j] >> 4) | (((hrow[j] >> shift_hi) & 3) << 4)) - 32;
            sub_lo[j] += lo * alo;
            sub_hi[j] += hi * ahi;
          }
        }
        for (size_t j = 0; j < t; ++j) total[j] += sc[(2 * p) * t + j] * sub_lo[j] + sc[(2 * p + 1) * t + j] * sub_hi[j];
      }
      for (size_t j = 0; j < t; ++j) {
        acc[j] = std::fma(static_cast<float>(total[j]), ScaleProduct(U16(blk + 2 * j), ad[s]), acc[j]);
      }
    }
  }
}

void StoreBf16(const float* c, size_t n, uint16_t* out) {
  for (size_t j = 0; j < n; ++j) out[j] = FloatToBf16(c[j]);
}

}  // namespace

const QuantKernelSet kPortableQuantKernels = {
    "portable", 64, true, 4,
    {Gemm32<QuantFormat::kQ8_0>, Gemm32<QuantFormat::kQ4_0>, Gemm32<QuantFormat::kQ4_1>, GemmQ4K, GemmQ6K},
    QuantizeRowPortable, StoreBf16};

}  // namespace rvascend
