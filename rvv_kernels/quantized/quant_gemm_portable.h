// The portable quantized kernels: plain loops over the runtime layout, the twin
// of every vector kernel (the same integer sums, the same FP32 operations in the
// same order) and the path of CPUs without a vector set. Columns are the inner
// loops (the layout stores a tile's columns side by side), so the compiler
// vectorises them for whatever ISA the including file is built for: the
// portable set compiles them for the baseline, and a vector set that has no
// hand-written kernel for a format compiles them with its own flags
// (PortableUkernels below). Their FP32 operations are explicit fmas and single
// products, so every such copy gives the same bits.
//
// Internal linkage on purpose: each file that includes this gets its own copy
// built for its ISA, and the linker can never pick a copy built for an ISA the
// CPU lacks.
#ifndef RVV_KERNELS_QUANTIZED_QUANT_GEMM_PORTABLE_H_
#define RVV_KERNELS_QUANTIZED_QUANT_GEMM_PORTABLE_H_

#include <cmath>
#include <cstring>

#include "rvv_kernels/quantized/quant_format.h"
#include "rvv_kernels/quantized/quant_ukernels.h"

namespace rvascend {
namespace {

inline uint16_t TileU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// How a format's kernel is shaped: one scale per 32 (Q8_0 .. Q5_1, IQ4_NL), 256-value
// super-blocks of 8 sub-blocks of 32 (Q4_K, Q5_K, IQ4_XS) or of 16 sub-blocks of 16
// (Q6_K, Q3_K, Q2_K).
constexpr bool IsBlock32(QuantFormat f) {
  return f == QuantFormat::kQ8_0 || f == QuantFormat::kQ4_0 || f == QuantFormat::kQ4_1 || f == QuantFormat::kQ5_0 ||
         f == QuantFormat::kQ5_1 || f == QuantFormat::kIQ4_NL;
}
constexpr bool HasSub16(QuantFormat f) {
  return f == QuantFormat::kQ6_K || f == QuantFormat::kQ3_K || f == QuantFormat::kQ2_K;
}

// One 32-block of a 32-blocks format for one row: every column's integer sum.
template <QuantFormat F>
void PortableBlock32(const uint8_t* blk, size_t t, const int8_t* a, int32_t* isum) {
  for (size_t c = 0; c < t; ++c) isum[c] = 0;
  if constexpr (F == QuantFormat::kQ8_0) {
    const auto* q = reinterpret_cast<const int8_t*>(blk + 2 * t);
    for (size_t i = 0; i < 32; ++i) {
      for (size_t c = 0; c < t; ++c) isum[c] += q[i * t + c] * a[i];
    }
  } else if constexpr (F == QuantFormat::kQ4_0 || F == QuantFormat::kQ4_1) {
    const uint8_t* qs = blk + (F == QuantFormat::kQ4_1 ? 4 : 2) * t;
    for (size_t i = 0; i < 16; ++i) {
      for (size_t c = 0; c < t; ++c) {
        const uint8_t b = qs[i * t + c];
        isum[c] += (b & 0xF) * a[i] + (b >> 4) * a[i + 16];
      }
    }
  } else if constexpr (F == QuantFormat::kQ5_0 || F == QuantFormat::kQ5_1) {
    const uint8_t* qs = blk + (F == QuantFormat::kQ5_1 ? 4 : 2) * t;
    const uint8_t* qh = qs + 16 * t;
    for (size_t i = 0; i < 16; ++i) {
      const uint8_t* hrow = qh + (i % 4) * t;
      const int shift_lo = static_cast<int>(i / 4), shift_hi = 4 + static_cast<int>(i / 4);
      for (size_t c = 0; c < t; ++c) {
        const uint8_t b = qs[i * t + c];
        const int lo = (b & 0xF) | (((hrow[c] >> shift_lo) & 1) << 4);
        const int hi = (b >> 4) | (((hrow[c] >> shift_hi) & 1) << 4);
        isum[c] += lo * a[i] + hi * a[i + 16];
      }
    }
  } else {
    static_assert(F == QuantFormat::kIQ4_NL);
    const uint8_t* qs = blk + 2 * t;
    for (size_t i = 0; i < 16; ++i) {
      for (size_t c = 0; c < t; ++c) {
        const uint8_t b = qs[i * t + c];
        isum[c] += kIq4NlValues[b & 0xF] * a[i] + kIq4NlValues[b >> 4] * a[i + 16];
      }
    }
  }
}

template <QuantFormat F>
void PortableGemm32(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c,
                    size_t c_stride) {
  constexpr bool kMin = F == QuantFormat::kQ4_1 || F == QuantFormat::kQ5_1;
  constexpr int32_t kOffset = F == QuantFormat::kQ4_0 ? 8 : F == QuantFormat::kQ5_0 ? 16 : 0;
  const size_t record = FormatInfo(F).tile_block_bytes * t;
  const size_t blocks = a.k / 32;
  int32_t isum[256];
  for (size_t r = 0; r < m; ++r) {
    float* acc = c + r * c_stride;
    for (size_t j = 0; j < t; ++j) acc[j] = 0.0f;
    const int8_t* q = a.q + (row0 + r) * a.k;
    const float* ad = a.d + (row0 + r) * blocks;
    const int32_t* asum = a.sum32 + (row0 + r) * blocks;
    for (size_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = tile + b * record;
      PortableBlock32<F>(blk, t, q + 32 * b, isum);
      const float s = ad[b];
      for (size_t j = 0; j < t; ++j) {
        int32_t v = isum[j];
        if constexpr (kOffset != 0) v -= kOffset * asum[b];
        acc[j] = std::fma(static_cast<float>(v), ScaleProduct(TileU16(blk + 2 * j), s), acc[j]);
        if constexpr (kMin) {
          acc[j] = std::fma(HalfToFloat(TileU16(blk + 2 * t + 2 * j)), s * static_cast<float>(asum[b]), acc[j]);
        }
      }
    }
  }
}

// One row's end of a super-block, both super-block shapes: the integer sums times the f16
// scale (the tile's first row of halves) and the activation scale, then, with mins, their sums
// times the second row of halves and minus that scale. One copy keeps the two shapes in the
// vector kernels' FP32 order (RowFinishSuper in quant_gemm_rvv.cc), on which their bits depend.
template <bool kMins>
inline void FinishSuper(const uint8_t* blk, size_t t, float ad, const int32_t* total, const int32_t* msum,
                        float* acc) {
  for (size_t j = 0; j < t; ++j) {
    acc[j] = std::fma(static_cast<float>(total[j]), ScaleProduct(TileU16(blk + 2 * j), ad), acc[j]);
    if constexpr (kMins) {
      acc[j] = std::fma(static_cast<float>(msum[j]), ScaleProduct(TileU16(blk + 2 * t + 2 * j), -ad), acc[j]);
    }
  }
}

// Super-blocks of 8 sub-blocks of 32: Q4_K, Q5_K (scales and mins, u8) and IQ4_XS (int8 scales).
template <QuantFormat F>
void PortableGemmSub32(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c,
                       size_t c_stride) {
  constexpr bool kMins = F != QuantFormat::kIQ4_XS;
  constexpr size_t kQs = kMins ? 20 : 10;  // the nibbles' offset, in tile widths
  const size_t record = FormatInfo(F).tile_block_bytes * t;
  const size_t supers = a.k / 256;
  int32_t isum[256], total[256], msum[256];
  for (size_t r = 0; r < m; ++r) {
    float* acc = c + r * c_stride;
    for (size_t j = 0; j < t; ++j) acc[j] = 0.0f;
    const int8_t* q = a.q + (row0 + r) * a.k;
    const float* ad = a.d + (row0 + r) * supers;
    const int32_t* asum = a.sum32 + (row0 + r) * (a.k / 32);
    for (size_t s = 0; s < supers; ++s) {
      const uint8_t* blk = tile + s * record;
      const uint8_t* sc = blk + (kMins ? 4 : 2) * t;
      const uint8_t* mn = blk + 12 * t;
      const int8_t* qa = q + 256 * s;
      for (size_t j = 0; j < t; ++j) total[j] = msum[j] = 0;
      for (size_t sub = 0; sub < 8; ++sub) {
        for (size_t j = 0; j < t; ++j) isum[j] = 0;
        for (size_t i = 0; i < 16; ++i) {
          const uint8_t* row = blk + (kQs + 16 * sub + i) * t;
          const int32_t lo = qa[32 * sub + i], hi = qa[32 * sub + 16 + i];
          if constexpr (F == QuantFormat::kQ4_K) {
            for (size_t j = 0; j < t; ++j) isum[j] += (row[j] & 0xF) * lo + (row[j] >> 4) * hi;
          } else if constexpr (F == QuantFormat::kQ5_K) {
            const uint8_t* hrow = blk + (148 + 4 * sub + i % 4) * t;
            const int shift_lo = static_cast<int>(i / 4), shift_hi = 4 + static_cast<int>(i / 4);
            for (size_t j = 0; j < t; ++j) {
              isum[j] += ((row[j] & 0xF) | (((hrow[j] >> shift_lo) & 1) << 4)) * lo +
                         ((row[j] >> 4) | (((hrow[j] >> shift_hi) & 1) << 4)) * hi;
            }
          } else {
            for (size_t j = 0; j < t; ++j) isum[j] += kIq4NlValues[row[j] & 0xF] * lo + kIq4NlValues[row[j] >> 4] * hi;
          }
        }
        for (size_t j = 0; j < t; ++j) {
          if constexpr (kMins) {
            total[j] += sc[sub * t + j] * isum[j];
            msum[j] += mn[sub * t + j] * asum[8 * s + sub];
          } else {
            total[j] += static_cast<int8_t>(sc[sub * t + j]) * isum[j];
          }
        }
      }
      FinishSuper<kMins>(blk, t, ad[s], total, msum, acc);
    }
  }
}

// Super-blocks of 16 sub-blocks of 16, taken in pairs p (values 32p .. 32p + 31): Q6_K and
// Q3_K (int8 scales) and Q2_K (4-bit scales and mins).
template <QuantFormat F>
void PortableGemmSub16(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c,
                       size_t c_stride) {
  constexpr bool kMins = F == QuantFormat::kQ2_K;
  const size_t record = FormatInfo(F).tile_block_bytes * t;
  const size_t supers = a.k / 256;
  int32_t sub_lo[256], sub_hi[256], total[256], msum[256];
  for (size_t r = 0; r < m; ++r) {
    float* acc = c + r * c_stride;
    for (size_t j = 0; j < t; ++j) acc[j] = 0.0f;
    const int8_t* q = a.q + (row0 + r) * a.k;
    const float* ad = a.d + (row0 + r) * supers;
    for (size_t s = 0; s < supers; ++s) {
      const uint8_t* blk = tile + s * record;
      const int8_t* qa = q + 256 * s;
      for (size_t j = 0; j < t; ++j) total[j] = msum[j] = 0;
      for (size_t p = 0; p < 8; ++p) {
        for (size_t j = 0; j < t; ++j) sub_lo[j] = sub_hi[j] = 0;
        for (size_t i = 0; i < 16; ++i) {
          const int shift_lo = 2 * static_cast<int>(i / 8), shift_hi = 2 * (2 + static_cast<int>(i / 8));
          const int32_t alo = qa[32 * p + i], ahi = qa[32 * p + 16 + i];
          if constexpr (F == QuantFormat::kQ6_K) {
            const uint8_t* lrow = blk + (18 + 16 * p + i) * t;
            const uint8_t* hrow = blk + (146 + 8 * p + i % 8) * t;
            for (size_t j = 0; j < t; ++j) {
              const int lo = ((lrow[j] & 0xF) | (((hrow[j] >> shift_lo) & 3) << 4)) - 32;
              const int hi = ((lrow[j] >> 4) | (((hrow[j] >> shift_hi) & 3) << 4)) - 32;
              sub_lo[j] += lo * alo;
              sub_hi[j] += hi * ahi;
            }
          } else if constexpr (F == QuantFormat::kQ3_K) {
            const uint8_t* crow = blk + (18 + 8 * p + i % 8) * t;
            const uint8_t* hrow = blk + (82 + 4 * p + i % 4) * t;
            const int bit_lo = static_cast<int>(i / 4), bit_hi = 4 + static_cast<int>(i / 4);
            for (size_t j = 0; j < t; ++j) {
              const int lo = (((crow[j] >> shift_lo) & 3) | (((hrow[j] >> bit_lo) & 1) << 2)) - 4;
              const int hi = (((crow[j] >> shift_hi) & 3) | (((hrow[j] >> bit_hi) & 1) << 2)) - 4;
              sub_lo[j] += lo * alo;
              sub_hi[j] += hi * ahi;
            }
          } else {
            const uint8_t* crow = blk + (20 + 8 * p + i % 8) * t;
            for (size_t j = 0; j < t; ++j) {
              sub_lo[j] += ((crow[j] >> shift_lo) & 3) * alo;
              sub_hi[j] += ((crow[j] >> shift_hi) & 3) * ahi;
            }
          }
        }
        if constexpr (kMins) {
          const uint8_t* scm = blk + 4 * t;
          const int32_t* sums = a.sum16 + (row0 + r) * (a.k / 16) + 16 * s + 2 * p;
          for (size_t j = 0; j < t; ++j) {
            const uint8_t lo = scm[(2 * p) * t + j], hi = scm[(2 * p + 1) * t + j];
            total[j] += (lo & 0xF) * sub_lo[j] + (hi & 0xF) * sub_hi[j];
            msum[j] += (lo >> 4) * sums[0] + (hi >> 4) * sums[1];
          }
        } else {
          const auto* sc = reinterpret_cast<const int8_t*>(blk + 2 * t);
          for (size_t j = 0; j < t; ++j) total[j] += sc[(2 * p) * t + j] * sub_lo[j] + sc[(2 * p + 1) * t + j] * sub_hi[j];
        }
      }
      FinishSuper<kMins>(blk, t, ad[s], total, msum, acc);
    }
  }
}

template <QuantFormat F>
void PortableGemm(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c,
                  size_t c_stride) {
  if constexpr (IsBlock32(F)) {
    PortableGemm32<F>(m, a, row0, tile, t, c, c_stride);
  } else if constexpr (HasSub16(F)) {
    PortableGemmSub16<F>(m, a, row0, tile, t, c, c_stride);
  } else {
    PortableGemmSub32<F>(m, a, row0, tile, t, c, c_stride);
  }
}

// Every format's portable kernel, built for the including file's ISA, in the registry's order.
constexpr QuantUkernel kPortableUkernels[kQuantFormatCount] = {
#define QUANT_FORMAT(name, ...) PortableGemm<QuantFormat::k##name>,
#include "rvv_kernels/quantized/quant_formats.inc"
#undef QUANT_FORMAT
};

// `set` with each empty slot given this file's copy of the portable kernel: a vector set
// without a hand-written kernel for a format still runs it vectorised for its ISA.
// constexpr, and the sets are constexpr: a set's file must run no code of its ISA before
// the CPU was asked (a dynamic initializer built with RVV flags ran vector instructions
// at load on a core without V).
constexpr QuantKernelSet WithPortableUkernels(QuantKernelSet set) {
  for (size_t f = 0; f < kQuantFormatCount; ++f) {
    if (set.ukernel[f] == nullptr) set.ukernel[f] = kPortableUkernels[f];
  }
  return set;
}

}  // namespace
}  // namespace rvascend

#endif  // RVV_KERNELS_QUANTIZED_QUANT_GEMM_PORTABLE_H_
