// The RVV quantized kernels over the runtime layout: one tile is T = VLEN/4
// columns, one e8 m2 register group, so every instruction of the inner loop
// covers the whole tile at any VLEN.
//
// Per k of a block: one scalar load of the activation and one widening
// multiply-accumulate `vwmacc.vx` (int8 weights x int8 activation into int16
// lanes); 4-bit weights come two k to a byte (one load, then `vand` / `vsrl`
// for the low and high nibble). int16 lanes hold at most 16 products of a
// 4-bit weight (|15 x 127| x 16 < 2^15) or 2 of an 8-bit one, then widen into
// int32; Q4_0's whole block fits one int16 lane by its offset (ChunkQ4_0).
// The scales are applied once per block in FP32: the f16 scale is widened by
// integer ops (no Zvfh needed: the K1 has it, QEMU 7.2 does not), multiplied by
// the activation scale, and one FMA adds the block.
// The operations and their order are the portable kernels' (quant_gemm_portable.h),
// so both give bit-identical results; the tests check that at every VLEN.
//
// Multi-row calls of the first five formats process the tile in two halves of VLEN/8
// columns with e8 m1 groups (the formats added later take one row at a time, GemmByRow), so the int16 accumulators of up to 8 rows (Q4_0) or 4 rows (the
// other formats, two accumulators a row) fit the register file.
#include <riscv_vector.h>

#include <cmath>
#include <cstring>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/rvv_lmul.h"
#include "rvv_kernels/base/unroll.h"
#include "rvv_kernels/quantized/quant_gemm_portable.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"

namespace rvascend {
namespace {

// 2^56: the f16 -> f32 widening below yields d * 2^-112 exactly (subnormal halves
// included); two exact multiplications by 2^56 restore the scale.
constexpr float kTwo56 = 72057594037927936.0f;

// e8 m(L), e16 m(2L), e32 m(4L) views of one column chunk.
template <int L>
struct QV;

#define RVASCEND_DEFINE_QV(L, M8, M16, M32)                                                          \
  template <>                                                                                        \
  struct QV<L> {                                                                                     \
    using U8 = vuint8##M8##_t;                                                                       \
    using I8 = vint8##M8##_t;                                                                        \
    using I16 = vint16##M16##_t;                                                                     \
    using I32 = vint32##M32##_t;                                                                     \
    using F32 = vfloat32##M32##_t;                                                                   \
    static size_t SetVl(size_t n) { return __riscv_vsetvl_e8##M8(n); }                            \
    static U8 LoadU8(const uint8_t* p, size_t vl) { return __riscv_vle8_v_u8##M8(p, vl); }         \
    static I8 LoadI8(const uint8_t* p, size_t vl) {                                                 \
      return __riscv_vle8_v_i8##M8(reinterpret_cast<const int8_t*>(p), vl);                        \
    }                                                                                                \
    static I8 Lo(U8 b, size_t vl) { return __riscv_vreinterpret_v_u8##M8##_i8##M8(__riscv_vand_vx_u8##M8(b, 0xF, vl)); } \
    static I8 Hi(U8 b, size_t vl) { return __riscv_vreinterpret_v_u8##M8##_i8##M8(__riscv_vsrl_vx_u8##M8(b, 4, vl)); }  \
    static U8 AndX(U8 v, uint8_t x, size_t vl) { return __riscv_vand_vx_u8##M8(v, x, vl); }         \
    static U8 SrlX(U8 v, size_t n, size_t vl) { return __riscv_vsrl_vx_u8##M8(v, n, vl); }          \
    static U8 SllX(U8 v, size_t n, size_t vl) { return __riscv_vsll_vx_u8##M8(v, n, vl); }          \
    static U8 Or(U8 a, U8 b, size_t vl) { return __riscv_vor_vv_u8##M8(a, b, vl); }                 \
    static I8 Minus32(U8 v, size_t vl) {                                                             \
      return __riscv_vsub_vx_i8##M8(__riscv_vreinterpret_v_u8##M8##_i8##M8(v), 32, vl);              \
    }                                                                                                \
    static I8 SubX(U8 v, int8_t x, size_t vl) {                                                      \
      return __riscv_vsub_vx_i8##M8(__riscv_vreinterpret_v_u8##M8##_i8##M8(v), x, vl);               \
    }                                                                                                \
    static I8 AsI8(U8 v) { return __riscv_vreinterpret_v_u8##M8##_i8##M8(v); }                        \
    static I8 Gather(I8 table, U8 index, size_t vl) { return __riscv_vrgather_vv_i8##M8(table, index, vl); } \
    static I8 LoadTable(const int8_t* p) { return __riscv_vle8_v_i8##M8(p, 16); }                    \
    static I32 ZextV(U8 v, size_t vl) {                                                              \
      return __riscv_vreinterpret_v_u32##M32##_i32##M32(__riscv_vzext_vf4_u32##M32(v, vl));           \
    }                                                                                                \
    static I32 AddX(I32 v, int32_t x, size_t vl) { return __riscv_vadd_vx_i32##M32(v, x, vl); }      \
    static I16 Zero16(size_t vl) { return __riscv_vmv_v_x_i16##M16(0, vl); }                        \
    static I32 Zero32(size_t vl) { return __riscv_vmv_v_x_i32##M32(0, vl); }                        \
    static I16 Wmacc(I16 acc, int8_t a, I8 w, size_t vl) { return __riscv_vwmacc_vx_i16##M16(acc, a, w, vl); } \
    static I16 Wmul(I8 w, int8_t a, size_t vl) { return __riscv_vwmul_vx_i16##M16(w, a, vl); }     \
    static I32 Wadd(I16 a, I16 b, size_t vl) { return __riscv_vwadd_vv_i32##M32(a, b, vl); }        \
    static I32 WaddW(I32 acc, I16 b, size_t vl) { return __riscv_vwadd_wv_i32##M32(acc, b, vl); }   \
    static I16 Sub16X(I16 a, int16_t b, size_t vl) { return __riscv_vsub_vx_i16##M16(a, b, vl); }   \
    static I32 Sext16(I16 v, size_t vl) { return __riscv_vsext_vf2_i32##M32(v, vl); }               \
    static I32 Macc(I32 acc, I32 a, I32 b, size_t vl) { return __riscv_vmacc_vv_i32##M32(acc, a, b, vl); } \
    static I32 MaccX(I32 acc, int32_t a, I32 b, size_t vl) { return __riscv_vmacc_vx_i32##M32(acc, a, b, vl); } \
    static I32 ZextU8(const uint8_t* p, size_t vl) {                                                \
      return __riscv_vreinterpret_v_u32##M32##_i32##M32(__riscv_vzext_vf4_u32##M32(__riscv_vle8_v_u8##M8(p, vl), vl)); \
    }                                                                                                \
    static I32 SextI8(const uint8_t* p, size_t vl) {                                                \
      return __riscv_vsext_vf4_i32##M32(LoadI8(p, vl), vl);                                          \
    }                                                                                                \
    static F32 Cvt(I32 v, size_t vl) { return __riscv_vfcvt_f_x_v_f32##M32(v, vl); }                \
    /* f16 scales * 2^56, exact: the rows of a multi-row call share it. */                           \
    static F32 WeightScales(const uint8_t* p, size_t vl) {                                           \
      vuint32##M32##_t u = __riscv_vzext_vf2_u32##M32(                                              \
          __riscv_vle16_v_u16##M16(reinterpret_cast<const uint16_t*>(p), vl), vl);                   \
      vuint32##M32##_t mag = __riscv_vsll_vx_u32##M32(__riscv_vand_vx_u32##M32(u, 0x7fffu, vl), 13, vl); \
      vuint32##M32##_t sign = __riscv_vsll_vx_u32##M32(__riscv_vand_vx_u32##M32(u, 0x8000u, vl), 16, vl); \
      F32 d = __riscv_vreinterpret_v_u32##M32##_f32##M32(__riscv_vor_vv_u32##M32(mag, sign, vl));     \
      return __riscv_vfmul_vf_f32##M32(d, kTwo56, vl);                                              \
    }                                                                                                \
    /* WeightScales * s, rounded once (the portable ScaleProduct). */                                 \
    static F32 Times(F32 weight_scales, float s, size_t vl) {                                        \
      return __riscv_vfmul_vf_f32##M32(weight_scales, s * kTwo56, vl);                               \
    }                                                                                                \
    static F32 Scales(const uint8_t* p, float s, size_t vl) { return Times(WeightScales(p, vl), s, vl); } \
    static F32 FmaccVv(F32 acc, F32 a, F32 b, size_t vl) { return __riscv_vfmacc_vv_f32##M32(acc, a, b, vl); } \
    static F32 FmaccVf(F32 acc, float a, F32 b, size_t vl) { return __riscv_vfmacc_vf_f32##M32(acc, a, b, vl); } \
    static F32 ZeroF(size_t vl) { return __riscv_vfmv_v_f_f32##M32(0.0f, vl); }                     \
    static F32 LoadF(const float* p, size_t vl) { return __riscv_vle32_v_f32##M32(p, vl); }         \
    static void StoreF(float* p, F32 v, size_t vl) { __riscv_vse32_v_f32##M32(p, v, vl); }          \
  };

RVASCEND_DEFINE_QV(1, m1, m2, m4)
RVASCEND_DEFINE_QV(2, m2, m4, m8)
#undef RVASCEND_DEFINE_QV

// Rows of one call: activation pointers and scales, by row index 0..7.
constexpr size_t kMaxRows = 8;
struct Rows {
  const int8_t* q[kMaxRows];
  const float* d[kMaxRows];
  const int32_t* sum32[kMaxRows];
  float* c[kMaxRows];
};

// X(i) for each row index of Rows: the per-row accumulators are vector registers,
// which C++ cannot index, so the rows are spelled out.
#define RVASCEND_EACH_ROW(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

Rows RowsOf(size_t m, const QuantActs& a, size_t row0, float* c, size_t c_stride) {
  Rows r{};
  const size_t dblocks = a.k / a.block, sblocks = a.k / 32;
  for (size_t i = 0; i < m; ++i) {
    r.q[i] = a.q + (row0 + i) * a.k;
    r.d[i] = a.d + (row0 + i) * dblocks;
    r.sum32[i] = a.sum32 + (row0 + i) * sblocks;
    r.c[i] = c + i * c_stride;
  }
  return r;
}

// How far each k loop unrolls, by compiler. Counted at VLEN 256, 2048 x 2048, in K1 cycles
// per MAC under k1_model.CALIBRATED (64 rows; 1 row):
//   Q4_0    clang  15: 0.106; 0.124   rolled 0.115                GCC 14  1: 0.133; 0.140   15: 0.354
//   Q8_0    clang   8: 0.195; 0.216   16: 0.242; 0.213            GCC 14  1: 0.231; 0.229   16: 0.597; 0.349
//   Q4_1    clang  16: 0.156; 0.134   8: 0.170                    GCC 14  1: 0.185; 0.152   16: 0.505; 0.213
//   Q4_K    clang  16 for 1 row (0.147), 8 for more (0.163; 16: 0.318)   GCC 14  16: 0.174
// Unrolled whole, GCC schedules the loads early and spills the accumulators (Q4_0, 8 rows:
// 445 vector spills and reloads in a call); clang does the same where a format's rows hold
// more registers than there are (Q8_0's int32 sums, Q4_K's).
#if defined(__clang__)
#define RVASCEND_UNROLL_Q4_0 RVASCEND_UNROLL(15)
#define RVASCEND_UNROLL_Q8_0 RVASCEND_UNROLL(8)
#define RVASCEND_UNROLL_Q4_1 RVASCEND_UNROLL(16)
#define RVASCEND_UNROLL_Q4_K_ROWS RVASCEND_UNROLL(8)
#else
#define RVASCEND_UNROLL_Q4_0 RVASCEND_UNROLL(1)
#define RVASCEND_UNROLL_Q8_0 RVASCEND_UNROLL(1)
#define RVASCEND_UNROLL_Q4_1 RVASCEND_UNROLL(1)
#define RVASCEND_UNROLL_Q4_K_ROWS RVASCEND_UNROLL(16)
#endif

// The FP32 accumulators live in the output rows between blocks (a load, an FMA
// and a store per block, next to 32 k-steps), which frees the register file.
// One chunk [off, off + vl) of a tile, kRows rows, Q8_0 or Q4_1.
template <QuantFormat F, int L, int kRows>
void Chunk32(const Rows& r, size_t blocks, const uint8_t* tile, size_t t, size_t off, size_t vl) {
  using V = QV<L>;
  const size_t record = FormatInfo(F).tile_block_bytes * t;
  for (int i = 0; i < kRows; ++i) V::StoreF(r.c[i] + off, V::ZeroF(vl), vl);
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = tile + b * record;
    const int8_t* a0 = r.q[0] + 32 * b;
    const int8_t* a1 = r.q[kRows > 1 ? 1 : 0] + 32 * b;
    const int8_t* a2 = r.q[kRows > 2 ? 2 : 0] + 32 * b;
    const int8_t* a3 = r.q[kRows > 3 ? 3 : 0] + 32 * b;
    typename V::I32 s0, s1, s2, s3;
    if constexpr (F == QuantFormat::kQ8_0) {
      const uint8_t* q = blk + 2 * t + off;
      s0 = s1 = s2 = s3 = V::Zero32(vl);
      // Every row's pair of products first (e8 sources), then every row's widening add
      // (e16): one vtype change each way per k pair, not two per row (counted at VLEN 256,
      // clang, 64 rows: 1.98 M vset{i}vl{i} per 64 M MACs before).
      RVASCEND_UNROLL_Q8_0
      for (size_t i = 0; i < 32; i += 2) {
        const auto w0 = V::LoadI8(q + i * t, vl), w1 = V::LoadI8(q + (i + 1) * t, vl);
        const auto p0 = V::Wmacc(V::Wmul(w0, a0[i], vl), a0[i + 1], w1, vl);
        [[maybe_unused]] typename V::I16 p1, p2, p3;
        if constexpr (kRows > 1) p1 = V::Wmacc(V::Wmul(w0, a1[i], vl), a1[i + 1], w1, vl);
        if constexpr (kRows > 2) p2 = V::Wmacc(V::Wmul(w0, a2[i], vl), a2[i + 1], w1, vl);
        if constexpr (kRows > 3) p3 = V::Wmacc(V::Wmul(w0, a3[i], vl), a3[i + 1], w1, vl);
        s0 = V::WaddW(s0, p0, vl);
        if constexpr (kRows > 1) s1 = V::WaddW(s1, p1, vl);
        if constexpr (kRows > 2) s2 = V::WaddW(s2, p2, vl);
        if constexpr (kRows > 3) s3 = V::WaddW(s3, p3, vl);
      }
    } else {
      const uint8_t* qs = blk + 4 * t + off;  // past the tile's two f16 per column, d and m
      auto l0 = V::Zero16(vl), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
      RVASCEND_UNROLL_Q4_1
      for (size_t i = 0; i < 16; ++i) {
        const auto bytes = V::LoadU8(qs + i * t, vl);
        const auto lo = V::Lo(bytes, vl), hi = V::Hi(bytes, vl);
        l0 = V::Wmacc(l0, a0[i], lo, vl);
        h0 = V::Wmacc(h0, a0[i + 16], hi, vl);
        if constexpr (kRows > 1) { l1 = V::Wmacc(l1, a1[i], lo, vl); h1 = V::Wmacc(h1, a1[i + 16], hi, vl); }
        if constexpr (kRows > 2) { l2 = V::Wmacc(l2, a2[i], lo, vl); h2 = V::Wmacc(h2, a2[i + 16], hi, vl); }
        if constexpr (kRows > 3) { l3 = V::Wmacc(l3, a3[i], lo, vl); h3 = V::Wmacc(h3, a3[i + 16], hi, vl); }
      }
      s0 = V::Wadd(l0, h0, vl);
      if constexpr (kRows > 1) s1 = V::Wadd(l1, h1, vl);
      if constexpr (kRows > 2) s2 = V::Wadd(l2, h2, vl);
      if constexpr (kRows > 3) s3 = V::Wadd(l3, h3, vl);
    }
    // The block's FP32 accumulators, each row's sum times its scales (f16 weight scale x
    // activation scale, rounded once). The weight scales are widened again for each row:
    // kept across the rows, they spilled (Q8_0 1.25x, Q4_1 2.2x the cycles).
    auto finish = [&](int i, typename V::I32 s) {
      const float ad = r.d[i][b];
      auto acc = V::FmaccVv(V::LoadF(r.c[i] + off, vl), V::Cvt(s, vl), V::Scales(blk + 2 * off, ad, vl), vl);
      if constexpr (F == QuantFormat::kQ4_1) {
        acc = V::FmaccVf(acc, ad * static_cast<float>(r.sum32[i][b]), V::Scales(blk + 2 * t + 2 * off, 1.0f, vl), vl);
      }
      V::StoreF(r.c[i] + off, acc, vl);
    };
    finish(0, s0);
    if constexpr (kRows > 1) finish(1, s1);
    if constexpr (kRows > 2) finish(2, s2);
    if constexpr (kRows > 3) finish(3, s3);
  }
}

// Q4_0, one chunk, kRows (1..8) rows, one int16 accumulator per row for both nibbles of
// a block. Its 32 products of unsigned nibbles can overflow int16 (32 x 15 x 127), but the
// block's value, sum(a x (nibble - 8)), lies within 32 x 8 x 127 = 32512: the lanes add
// modulo 2^16 and the offset 8 x sum(a) is taken off in the same arithmetic, so the
// result is that value exactly, the portable kernel's integer. Half the accumulators of
// separate low and high sums let eight rows share each weight load and unpack (counted
// at VLEN 256, clang, 64 rows of a 2048 x 2048 product: 0.106 K1 cycles per MAC under
// k1_model.CALIBRATED, against 0.131 for four rows with two accumulators each).
template <int L, int kRows>
void ChunkQ4_0(const Rows& r, size_t blocks, const uint8_t* tile, size_t t, size_t off, size_t vl) {
  using V = QV<L>;
  const size_t record = FormatInfo(QuantFormat::kQ4_0).tile_block_bytes * t;
  for (int i = 0; i < kRows; ++i) V::StoreF(r.c[i] + off, V::ZeroF(vl), vl);
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = tile + b * record;
    const uint8_t* qs = blk + 2 * t + off;
#define RVASCEND_ROW_ACTS(i) [[maybe_unused]] const int8_t* a##i = r.q[kRows > i ? i : 0] + 32 * b;
    RVASCEND_EACH_ROW(RVASCEND_ROW_ACTS)
#undef RVASCEND_ROW_ACTS
    [[maybe_unused]] typename V::I16 s0, s1, s2, s3, s4, s5, s6, s7;
    {
      const auto bytes = V::LoadU8(qs, vl);
      const auto lo = V::Lo(bytes, vl), hi = V::Hi(bytes, vl);
#define RVASCEND_ROW_FIRST(i) \
  if constexpr (kRows > i) s##i = V::Wmacc(V::Wmul(lo, a##i[0], vl), a##i[16], hi, vl);
      RVASCEND_EACH_ROW(RVASCEND_ROW_FIRST)
#undef RVASCEND_ROW_FIRST
    }
    RVASCEND_UNROLL_Q4_0
    for (size_t k = 1; k < 16; ++k) {
      const auto bytes = V::LoadU8(qs + k * t, vl);
      const auto lo = V::Lo(bytes, vl), hi = V::Hi(bytes, vl);
#define RVASCEND_ROW_STEP(i) \
  if constexpr (kRows > i) s##i = V::Wmacc(V::Wmacc(s##i, a##i[k], lo, vl), a##i[k + 16], hi, vl);
      RVASCEND_EACH_ROW(RVASCEND_ROW_STEP)
#undef RVASCEND_ROW_STEP
    }
    // Every row's offset first (e16), then every row's FP32 finish (e32): two vtype
    // changes per block, not two per row. |8 x sum(a)| <= 8 x 32 x 127 fits int16.
#define RVASCEND_ROW_OFFSET(i) \
  if constexpr (kRows > i) s##i = V::Sub16X(s##i, static_cast<int16_t>(8 * r.sum32[i][b]), vl);
    RVASCEND_EACH_ROW(RVASCEND_ROW_OFFSET)
#undef RVASCEND_ROW_OFFSET
    const auto weight_scales = V::WeightScales(blk + 2 * off, vl);
#define RVASCEND_ROW_FINISH(i)                                                                            \
  if constexpr (kRows > i) {                                                                             \
    V::StoreF(r.c[i] + off,                                                                              \
              V::FmaccVv(V::LoadF(r.c[i] + off, vl), V::Cvt(V::Sext16(s##i, vl), vl),                    \
                         V::Times(weight_scales, r.d[i][b], vl), vl),                                    \
              vl);                                                                                       \
  }
    RVASCEND_EACH_ROW(RVASCEND_ROW_FINISH)
#undef RVASCEND_ROW_FINISH
  }
}

// Q4_K, one chunk, kRows rows: per sub-block of 32 the integer sum, scaled by the
// sub-block's 6-bit scale (and its min by the activation sum) in int32.
// With more than one row its sums outgrow the register file (8 int16 and 8 int32 groups at
// 4 rows), which is why its multi-row loop unrolls less (the table above Chunk32).
template <int L, int kRows>
void ChunkQ4K(const Rows& r, size_t supers, const uint8_t* tile, size_t t, size_t off, size_t vl) {
  using V = QV<L>;
  for (int i = 0; i < kRows; ++i) V::StoreF(r.c[i] + off, V::ZeroF(vl), vl);
  for (size_t s = 0; s < supers; ++s) {
    const uint8_t* blk = tile + s * 148 * t;
    auto tot0 = V::Zero32(vl), tot1 = tot0, tot2 = tot0, tot3 = tot0;
    auto min0 = tot0, min1 = tot0, min2 = tot0, min3 = tot0;
    for (size_t j = 0; j < 8; ++j) {
      const uint8_t* qs = blk + 20 * t + 16 * j * t + off;
      const size_t k0 = 256 * s + 32 * j;
      const int8_t* a0 = r.q[0] + k0;
      const int8_t* a1 = r.q[kRows > 1 ? 1 : 0] + k0;
      const int8_t* a2 = r.q[kRows > 2 ? 2 : 0] + k0;
      const int8_t* a3 = r.q[kRows > 3 ? 3 : 0] + k0;
      auto l0 = V::Zero16(vl), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
      auto step = [&](size_t i) {
        const auto bytes = V::LoadU8(qs + i * t, vl);
        const auto lo = V::Lo(bytes, vl), hi = V::Hi(bytes, vl);
        l0 = V::Wmacc(l0, a0[i], lo, vl);
        h0 = V::Wmacc(h0, a0[i + 16], hi, vl);
        if constexpr (kRows > 1) { l1 = V::Wmacc(l1, a1[i], lo, vl); h1 = V::Wmacc(h1, a1[i + 16], hi, vl); }
        if constexpr (kRows > 2) { l2 = V::Wmacc(l2, a2[i], lo, vl); h2 = V::Wmacc(h2, a2[i + 16], hi, vl); }
        if constexpr (kRows > 3) { l3 = V::Wmacc(l3, a3[i], lo, vl); h3 = V::Wmacc(h3, a3[i + 16], hi, vl); }
      };
      if constexpr (kRows == 1) {
        RVASCEND_UNROLL(16)
        for (size_t i = 0; i < 16; ++i) step(i);
      } else {
        RVASCEND_UNROLL_Q4_K_ROWS
        for (size_t i = 0; i < 16; ++i) step(i);
      }
      const auto sc = V::ZextU8(blk + 4 * t + j * t + off, vl);
      const auto mn = V::ZextU8(blk + 12 * t + j * t + off, vl);
      const size_t sb = 8 * s + j;
      tot0 = V::Macc(tot0, sc, V::Wadd(l0, h0, vl), vl);
      min0 = V::MaccX(min0, r.sum32[0][sb], mn, vl);
      if constexpr (kRows > 1) { tot1 = V::Macc(tot1, sc, V::Wadd(l1, h1, vl), vl); min1 = V::MaccX(min1, r.sum32[1][sb], mn, vl); }
      if constexpr (kRows > 2) { tot2 = V::Macc(tot2, sc, V::Wadd(l2, h2, vl), vl); min2 = V::MaccX(min2, r.sum32[2][sb], mn, vl); }
      if constexpr (kRows > 3) { tot3 = V::Macc(tot3, sc, V::Wadd(l3, h3, vl), vl); min3 = V::MaccX(min3, r.sum32[3][sb], mn, vl); }
    }
    auto finish = [&](int i, typename V::I32 tot, typename V::I32 mins) {
      const float ad = r.d[i][s];
      auto acc = V::FmaccVv(V::LoadF(r.c[i] + off, vl), V::Cvt(tot, vl), V::Scales(blk + 2 * off, ad, vl), vl);
      acc = V::FmaccVv(acc, V::Cvt(mins, vl), V::Scales(blk + 2 * t + 2 * off, -ad, vl), vl);
      V::StoreF(r.c[i] + off, acc, vl);
    };
    finish(0, tot0, min0);
    if constexpr (kRows > 1) finish(1, tot1, min1);
    if constexpr (kRows > 2) finish(2, tot2, min2);
    if constexpr (kRows > 3) finish(3, tot3, min3);
  }
}

// Q6_K, one chunk, one row at a time (its 6-bit unpacking dominates; rows share little).
template <int L>
void ChunkQ6K(const int8_t* q, const float* ad, float* c, size_t supers, const uint8_t* tile, size_t t, size_t off,
              size_t vl) {
  using V = QV<L>;
  auto acc = V::ZeroF(vl);
  for (size_t s = 0; s < supers; ++s) {
    const uint8_t* blk = tile + s * 210 * t;
    auto total = V::Zero32(vl);
    for (size_t p = 0; p < 8; ++p) {
      const uint8_t* ql = blk + 18 * t + 16 * p * t + off;
      const uint8_t* qh = blk + 146 * t + 8 * p * t + off;
      const int8_t* a = q + 256 * s + 32 * p;
      // Four int16 sums of 8 products of (6-bit value - 32) (|32 x 127| x 8 < 2^15):
      // k = 32p+i (s0), 32p+8+i (s1), 32p+16+i (s2), 32p+24+i (s3), i < 8.
      auto s0 = V::Zero16(vl), s1 = s0, s2 = s0, s3 = s0;
      RVASCEND_UNROLL(2)
      for (size_t i = 0; i < 8; ++i) {
        const auto h = V::LoadU8(qh + i * t, vl);
        const auto la = V::LoadU8(ql + i * t, vl), lb = V::LoadU8(ql + (i + 8) * t, vl);
        const auto v0 = V::Or(V::AndX(la, 0xF, vl), V::AndX(V::SllX(h, 4, vl), 0x30, vl), vl);
        const auto v1 = V::Or(V::AndX(lb, 0xF, vl), V::AndX(V::SllX(h, 2, vl), 0x30, vl), vl);
        const auto v2 = V::Or(V::SrlX(la, 4, vl), V::AndX(h, 0x30, vl), vl);
        const auto v3 = V::Or(V::SrlX(lb, 4, vl), V::AndX(V::SrlX(h, 2, vl), 0x30, vl), vl);
        s0 = V::Wmacc(s0, a[i], V::Minus32(v0, vl), vl);
        s1 = V::Wmacc(s1, a[i + 8], V::Minus32(v1, vl), vl);
        s2 = V::Wmacc(s2, a[i + 16], V::Minus32(v2, vl), vl);
        s3 = V::Wmacc(s3, a[i + 24], V::Minus32(v3, vl), vl);
      }
      total = V::Macc(total, V::SextI8(blk + 2 * t + (2 * p) * t + off, vl), V::Wadd(s0, s1, vl), vl);
      total = V::Macc(total, V::SextI8(blk + 2 * t + (2 * p + 1) * t + off, vl), V::Wadd(s2, s3, vl), vl);
    }
    acc = V::FmaccVv(acc, V::Cvt(total, vl), V::Scales(blk + 2 * off, ad[s], vl), vl);
  }
  V::StoreF(c + off, acc, vl);
}

// The formats added after the first five (Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS):
// one row at a time over the whole tile (one e8 m2 group), the decode step's shape; a
// prompt's rows run one after the other. Their planes (quant_format.h): step i (0..15)
// reads value i and 16 + i of a 32 from one row of each plane. A bit plane's bit
// for value i is bit i / 4 of row i % 4, for 16 + i bit 4 + i / 4: moved to bit `to`.
template <int kTo, class V>
inline typename V::U8 LowBit(typename V::U8 h, size_t i, size_t vl) {
  return V::AndX(V::SllX(V::SrlX(h, i / 4, vl), kTo, vl), 1 << kTo, vl);
}
template <int kTo, class V>
inline typename V::U8 HighBit(typename V::U8 h, size_t i, size_t vl) {
  return V::AndX(V::SllX(V::SrlX(h, 4 + i / 4, vl), kTo, vl), 1 << kTo, vl);
}

// Q5_0's and Q5_1's 5-bit codes of one 32-block minus 16 (in -16..15: 16 products of a
// step's side fit int16, 16 x 16 x 127 < 2^15), summed against a[0..31] into int32.
template <class V>
inline typename V::I32 Sum5Minus16(const uint8_t* qs, const uint8_t* qh, size_t t, const int8_t* a, size_t vl) {
  auto l = V::Zero16(vl), h = l;
  RVASCEND_UNROLL(4)
  for (size_t i = 0; i < 16; ++i) {
    const auto bytes = V::LoadU8(qs + i * t, vl), bits = V::LoadU8(qh + (i % 4) * t, vl);
    const auto lo = V::SubX(V::Or(V::AndX(bytes, 0xF, vl), LowBit<4, V>(bits, i, vl), vl), 16, vl);
    const auto hi = V::SubX(V::Or(V::SrlX(bytes, 4, vl), HighBit<4, V>(bits, i, vl), vl), 16, vl);
    l = V::Wmacc(l, a[i], lo, vl);
    h = V::Wmacc(h, a[i + 16], hi, vl);
  }
  return V::Wadd(l, h, vl);
}

// IQ4's table values of one 32-block's nibbles against a[0..31]: two products of 127 x
// 127 fit int16, then widen into int32.
template <class V>
inline typename V::I32 SumIq4(const uint8_t* qs, size_t t, const int8_t* a, typename V::I8 table, size_t vl) {
  auto sum = V::Zero32(vl);
  RVASCEND_UNROLL(4)
  for (size_t i = 0; i < 16; ++i) {
    const auto bytes = V::LoadU8(qs + i * t, vl);
    const auto lo = V::Gather(table, V::AndX(bytes, 0xF, vl), vl), hi = V::Gather(table, V::SrlX(bytes, 4, vl), vl);
    sum = V::WaddW(sum, V::Wmacc(V::Wmul(lo, a[i], vl), a[i + 16], hi, vl), vl);
  }
  return sum;
}

// Q5_0, Q5_1, IQ4_NL: one row, every 32-block.
template <QuantFormat F>
void RowBlock32(const QuantActs& a, size_t row, const uint8_t* tile, size_t t, float* c, size_t vl) {
  using V = QV<2>;
  constexpr bool kQ51 = F == QuantFormat::kQ5_1;
  const size_t record = FormatInfo(F).tile_block_bytes * t, blocks = a.k / 32;
  const int8_t* q = a.q + row * a.k;
  const float* ad = a.d + row * blocks;
  const int32_t* asum = a.sum32 + row * blocks;
  [[maybe_unused]] const auto table = V::LoadTable(kIq4NlValues);
  auto acc = V::ZeroF(vl);
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = tile + b * record;
    typename V::I32 sum;
    if constexpr (F == QuantFormat::kIQ4_NL) {
      sum = SumIq4<V>(blk + 2 * t, t, q + 32 * b, table, vl);
    } else {
      const uint8_t* qs = blk + (kQ51 ? 4 : 2) * t;
      sum = Sum5Minus16<V>(qs, qs + 16 * t, t, q + 32 * b, vl);
      if constexpr (kQ51) sum = V::AddX(sum, 16 * asum[b], vl);  // the codes' own sum: the portable isum
    }
    acc = V::FmaccVv(acc, V::Cvt(sum, vl), V::Scales(blk, ad[b], vl), vl);
    if constexpr (kQ51) acc = V::FmaccVf(acc, ad[b] * static_cast<float>(asum[b]), V::Scales(blk + 2 * t, 1.0f, vl), vl);
  }
  V::StoreF(c, acc, vl);
}

// One row's end of a super-block, RowSub32's and RowSub16's: the portable FinishSuper's
// operations in its order (the integer sums times the f16 scales and the activation scale,
// then, with mins, their sums times the second scales and minus that scale), on which the
// two kernels' bit-identical results rest.
template <bool kMins, class V>
inline typename V::F32 RowFinishSuper(typename V::F32 acc, typename V::I32 total, typename V::I32 mins,
                                      const uint8_t* blk, size_t t, float ad, size_t vl) {
  acc = V::FmaccVv(acc, V::Cvt(total, vl), V::Scales(blk, ad, vl), vl);
  if constexpr (kMins) acc = V::FmaccVv(acc, V::Cvt(mins, vl), V::Scales(blk + 2 * t, -ad, vl), vl);
  return acc;
}

// Q5_K, IQ4_XS: one row, super-blocks of 8 sub-blocks of 32.
template <QuantFormat F>
void RowSub32(const QuantActs& a, size_t row, const uint8_t* tile, size_t t, float* c, size_t vl) {
  using V = QV<2>;
  constexpr bool kQ5K = F == QuantFormat::kQ5_K;
  const size_t record = FormatInfo(F).tile_block_bytes * t, supers = a.k / 256;
  const int8_t* q = a.q + row * a.k;
  const float* ad = a.d + row * supers;
  const int32_t* asum = a.sum32 + row * (a.k / 32);
  [[maybe_unused]] const auto table = V::LoadTable(kIq4NlValues);
  auto acc = V::ZeroF(vl);
  for (size_t s = 0; s < supers; ++s) {
    const uint8_t* blk = tile + s * record;
    auto total = V::Zero32(vl), mins = total;
    for (size_t j = 0; j < 8; ++j) {
      const int8_t* qa = q + 256 * s + 32 * j;
      if constexpr (kQ5K) {
        const auto sum = V::AddX(Sum5Minus16<V>(blk + (20 + 16 * j) * t, blk + (148 + 4 * j) * t, t, qa, vl),
                                 16 * asum[8 * s + j], vl);
        total = V::Macc(total, V::ZextU8(blk + (4 + j) * t, vl), sum, vl);
        mins = V::MaccX(mins, asum[8 * s + j], V::ZextU8(blk + (12 + j) * t, vl), vl);
      } else {
        total = V::Macc(total, V::SextI8(blk + (2 + j) * t, vl), SumIq4<V>(blk + (10 + 16 * j) * t, t, qa, table, vl),
                        vl);
      }
    }
    acc = RowFinishSuper<kQ5K, V>(acc, total, mins, blk, t, ad[s], vl);
  }
  V::StoreF(c, acc, vl);
}

// Q3_K, Q2_K: one row, super-blocks of 16 sub-blocks of 16 in pairs p.
template <QuantFormat F>
void RowSub16(const QuantActs& a, size_t row, const uint8_t* tile, size_t t, float* c, size_t vl) {
  using V = QV<2>;
  constexpr bool kQ3K = F == QuantFormat::kQ3_K;
  const size_t record = FormatInfo(F).tile_block_bytes * t, supers = a.k / 256;
  const int8_t* q = a.q + row * a.k;
  const float* ad = a.d + row * supers;
  const int32_t* sum16 = a.sum16 + row * (a.k / 16);
  auto acc = V::ZeroF(vl);
  for (size_t s = 0; s < supers; ++s) {
    const uint8_t* blk = tile + s * record;
    auto total = V::Zero32(vl), mins = total;
    for (size_t p = 0; p < 8; ++p) {
      const int8_t* qa = q + 256 * s + 32 * p;
      const uint8_t* crumbs = blk + ((kQ3K ? 18 : 20) + 8 * p) * t;
      // Values of 2 or 3 bits: 16 products of a sub-block fit int16 (16 x 4 x 127).
      auto l = V::Zero16(vl), h = l;
      RVASCEND_UNROLL(4)
      for (size_t i = 0; i < 16; ++i) {
        const auto cr = V::LoadU8(crumbs + (i % 8) * t, vl);
        auto lo = V::AndX(V::SrlX(cr, 2 * (i / 8), vl), 3, vl), hi = V::AndX(V::SrlX(cr, 2 * (2 + i / 8), vl), 3, vl);
        if constexpr (kQ3K) {
          const auto bits = V::LoadU8(blk + (82 + 4 * p + i % 4) * t, vl);
          l = V::Wmacc(l, qa[i], V::SubX(V::Or(lo, LowBit<2, V>(bits, i, vl), vl), 4, vl), vl);
          h = V::Wmacc(h, qa[i + 16], V::SubX(V::Or(hi, HighBit<2, V>(bits, i, vl), vl), 4, vl), vl);
        } else {
          l = V::Wmacc(l, qa[i], V::AsI8(lo), vl);
          h = V::Wmacc(h, qa[i + 16], V::AsI8(hi), vl);
        }
      }
      if constexpr (kQ3K) {
        total = V::Macc(total, V::SextI8(blk + (2 + 2 * p) * t, vl), V::Sext16(l, vl), vl);
        total = V::Macc(total, V::SextI8(blk + (3 + 2 * p) * t, vl), V::Sext16(h, vl), vl);
      } else {
        const auto sc_lo = V::LoadU8(blk + (4 + 2 * p) * t, vl), sc_hi = V::LoadU8(blk + (5 + 2 * p) * t, vl);
        total = V::Macc(total, V::ZextV(V::AndX(sc_lo, 0xF, vl), vl), V::Sext16(l, vl), vl);
        total = V::Macc(total, V::ZextV(V::AndX(sc_hi, 0xF, vl), vl), V::Sext16(h, vl), vl);
        mins = V::MaccX(mins, sum16[16 * s + 2 * p], V::ZextV(V::SrlX(sc_lo, 4, vl), vl), vl);
        mins = V::MaccX(mins, sum16[16 * s + 2 * p + 1], V::ZextV(V::SrlX(sc_hi, 4, vl), vl), vl);
      }
    }
    acc = RowFinishSuper<!kQ3K, V>(acc, total, mins, blk, t, ad[s], vl);
  }
  V::StoreF(c, acc, vl);
}

// A QuantUkernel of the added formats: each row against the whole tile.
template <QuantFormat F>
void GemmByRow(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c, size_t c_stride) {
  const size_t vl = QV<2>::SetVl(t);
  for (size_t r = 0; r < m; ++r) {
    if constexpr (IsBlock32(F)) {
      RowBlock32<F>(a, row0 + r, tile, t, c + r * c_stride, vl);
    } else if constexpr (HasSub16(F)) {
      RowSub16<F>(a, row0 + r, tile, t, c + r * c_stride, vl);
    } else {
      RowSub32<F>(a, row0 + r, tile, t, c + r * c_stride, vl);
    }
  }
}

// A whole tile: one e8 m2 chunk for one row (the decode step), two e8 m1 halves
// for 2..4 rows.
template <QuantFormat F, int L, int kRows>
void Chunk(const Rows& r, const QuantActs& a, const uint8_t* tile, size_t t, size_t off, size_t vl) {
  if constexpr (F == QuantFormat::kQ4_K) {
    ChunkQ4K<L, kRows>(r, a.k / 256, tile, t, off, vl);
  } else if constexpr (F == QuantFormat::kQ6_K) {
    for (int i = 0; i < kRows; ++i) ChunkQ6K<L>(r.q[i], r.d[i], r.c[i], a.k / 256, tile, t, off, vl);
  } else {
    Chunk32<F, L, kRows>(r, a.k / 32, tile, t, off, vl);
  }
}

// Q4_0: one e8 m2 chunk for one row (the decode step), two e8 m1 halves for 2..8 rows.
void GemmQ4_0(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c, size_t c_stride) {
  const Rows r = RowsOf(m, a, row0, c, c_stride);
  const size_t blocks = a.k / 32;
  if (m == 1) {
    ChunkQ4_0<2, 1>(r, blocks, tile, t, 0, QV<2>::SetVl(t));
    return;
  }
  const size_t half = t / 2;
  for (size_t off = 0; off < t; off += half) {
    const size_t vl = QV<1>::SetVl(half);
    switch (m) {
      case 2: ChunkQ4_0<1, 2>(r, blocks, tile, t, off, vl); break;
      case 3: ChunkQ4_0<1, 3>(r, blocks, tile, t, off, vl); break;
      case 4: ChunkQ4_0<1, 4>(r, blocks, tile, t, off, vl); break;
      case 5: ChunkQ4_0<1, 5>(r, blocks, tile, t, off, vl); break;
      case 6: ChunkQ4_0<1, 6>(r, blocks, tile, t, off, vl); break;
      case 7: ChunkQ4_0<1, 7>(r, blocks, tile, t, off, vl); break;
      default: ChunkQ4_0<1, 8>(r, blocks, tile, t, off, vl); break;
    }
  }
}

// The other formats, up to 4 rows (their accumulators fit no more): one e8 m2 chunk for
// one row, two e8 m1 halves for 2..4 rows.
template <QuantFormat F>
void GemmFourRows(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c,
                  size_t c_stride) {
  const Rows r = RowsOf(m, a, row0, c, c_stride);
  if (m == 1) {
    Chunk<F, 2, 1>(r, a, tile, t, 0, QV<2>::SetVl(t));
    return;
  }
  const size_t half = t / 2;
  for (size_t off = 0; off < t; off += half) {
    const size_t vl = QV<1>::SetVl(half);
    switch (m) {
      case 2: Chunk<F, 1, 2>(r, a, tile, t, off, vl); break;
      case 3: Chunk<F, 1, 3>(r, a, tile, t, off, vl); break;
      default: Chunk<F, 1, 4>(r, a, tile, t, off, vl); break;
    }
  }
}

template <QuantFormat F>
void Gemm(size_t m, const QuantActs& a, size_t row0, const uint8_t* tile, size_t t, float* c, size_t c_stride) {
  if constexpr (F == QuantFormat::kQ4_0) {
    GemmQ4_0(m, a, row0, tile, t, c, c_stride);
  } else {
    for (size_t i = 0; i < m; i += 4) {
      GemmFourRows<F>(m - i < 4 ? m - i : 4, a, row0 + i, tile, t, c + i * c_stride, c_stride);
    }
  }
}

// The activation quantization of quant_activations.h, vectorized: the same
// products, the same rounding (vfcvt under the default round-to-nearest-even
// mode is nearbyint), so the same bytes as QuantizeRowPortable.
void QuantizeRowRvv(const uint16_t* x, size_t k, size_t block, int8_t* q, float* d, int32_t* sum32) {
  using W = rvv::Lmul<8>;
  for (size_t b = 0; b < k / block; ++b) {
    const uint16_t* xb = x + b * block;
    int8_t* qb = q + b * block;
    float amax = 0.0f;
    size_t nans = 0;
    for (size_t i = 0; i < block;) {
      const size_t vl = W::SetVl(block - i);
      const auto v = W::LoadBf16(xb + i, vl);
      nans += __riscv_vcpop_m_b4(__riscv_vmfne_vv_f32m8_b4(v, v, vl), vl);
      const float m = __riscv_vfmv_f_s_f32m1_f32(
          __riscv_vfredmax_vs_f32m8_f32m1(__riscv_vfabs_v_f32m8(v, vl), __riscv_vfmv_s_f_f32m1(0.0f, 1), vl));
      amax = m > amax ? m : amax;
      i += vl;
    }
    float scale = 0.0f;  // what x is multiplied by
    if (nans || amax == INFINITY || amax == 0.0f) {
      for (size_t i = 0; i < block; ++i) qb[i] = 0;
      d[b] = amax == 0.0f && !nans ? 0.0f : NAN;
    } else if (block == 256) {
      // q8_K: the signed value of largest magnitude, its first occurrence.
      float max = 0.0f;
      for (size_t i = 0; i < block;) {
        const size_t vl = W::SetVl(block - i);
        const auto v = W::LoadBf16(xb + i, vl);
        const long at = __riscv_vfirst_m_b4(__riscv_vmfeq_vf_f32m8_b4(__riscv_vfabs_v_f32m8(v, vl), amax, vl), vl);
        if (at >= 0) {
          max = Bf16ToFloat(xb[i + at]);
          break;
        }
        i += vl;
      }
      scale = -127.0f / max;
      d[b] = 1.0f / scale;
    } else {
      d[b] = amax / 127.0f;
      scale = 1.0f / d[b];
    }
    if (scale != 0.0f) {
      for (size_t i = 0; i < block;) {
        const size_t vl = W::SetVl(block - i);
        const auto v = __riscv_vfmul_vf_f32m8(W::LoadBf16(xb + i, vl), scale, vl);
        auto n = __riscv_vfcvt_x_f_v_i32m8(v, vl);
        n = __riscv_vmax_vx_i32m8(__riscv_vmin_vx_i32m8(n, 127, vl), -127, vl);
        __riscv_vse8_v_i8m2(qb + i, __riscv_vncvt_x_x_w_i8m2(__riscv_vncvt_x_x_w_i16m4(n, vl), vl), vl);
        i += vl;
      }
    }
  }
  for (size_t b = 0; b < k / 32; ++b) {
    const size_t vl = __riscv_vsetvl_e8m2(32);  // 32 int8 lanes fit one m2 group at VLEN >= 128
    const auto sum = __riscv_vwredsum_vs_i8m2_i16m1(__riscv_vle8_v_i8m2(q + 32 * b, vl),
                                                     __riscv_vmv_s_x_i16m1(0, 1), vl);
    sum32[b] = __riscv_vmv_x_s_i16m1_i16(sum);
  }
}

void StoreBf16Rvv(const float* c, size_t n, uint16_t* out) {
  using W = rvv::Lmul<8>;
  for (size_t j = 0; j < n;) {
    const size_t vl = W::SetVl(n - j);
    W::StoreBf16(out + j, W::Load(c + j, vl), vl);
    j += vl;
  }
}

}  // namespace

// tile 0: T = VLEN/4, one e8 m2 group (the driver passes it as t).
constexpr QuantKernelSet kRvvQuantKernels = WithPortableUkernels(
    {"rvv", 0, false, kMaxRows,
     {Gemm<QuantFormat::kQ8_0>, Gemm<QuantFormat::kQ4_0>, Gemm<QuantFormat::kQ4_1>, Gemm<QuantFormat::kQ4_K>,
      Gemm<QuantFormat::kQ6_K>, GemmByRow<QuantFormat::kQ5_0>, GemmByRow<QuantFormat::kQ5_1>,
      GemmByRow<QuantFormat::kQ2_K>, GemmByRow<QuantFormat::kQ3_K>, GemmByRow<QuantFormat::kQ5_K>,
      GemmByRow<QuantFormat::kIQ4_NL>, GemmByRow<QuantFormat::kIQ4_XS>},
     QuantizeRowRvv, StoreBf16Rvv});

}  // namespace rvascend
