// The GGUF quantization formats kept quantized (llama.cpp's block formats) and the
// runtime layout the kernels read.
//
// GGML stores a weight [N, K] row by row, each row a run of blocks:
//   Q8_0  (34 B / 32):  f16 d, int8 q[32]                      w = d q
//   Q4_0  (18 B / 32):  f16 d, u8 qs[16] (lo nibble: q[i], hi: q[i+16])   w = d (q - 8)
//   Q4_1  (20 B / 32):  f16 d, f16 m, u8 qs[16] (as Q4_0)      w = d q + m
//   Q4_K  (144 B / 256): f16 d, f16 dmin, 12 B of 6-bit scales and mins for 8
//                        sub-blocks of 32, u8 qs[128]          w = d sc_j q - dmin m_j
//   Q6_K  (210 B / 256): u8 ql[128], u8 qh[64], int8 sc[16] (16 sub-blocks of 16),
//                        f16 d                                  w = d sc_j (q - 32), q 6-bit
//   Q5_0  (22 B / 32):  f16 d, u32 qh (bit i: q[i]'s fifth bit), u8 qs[16] (as Q4_0)  w = d (q - 16)
//   Q5_1  (24 B / 32):  f16 d, f16 m, u32 qh, u8 qs[16]       w = d q + m
//   IQ4_NL (18 B / 32): f16 d, u8 qs[16] (as Q4_0)            w = d kIq4NlValues[q]
//   Q2_K  (84 B / 256): u8 sc[16] (lo nibble scale, hi nibble min of 16 sub-blocks of 16),
//                       u8 qs[64] (2-bit q), f16 d, f16 dmin   w = d sc_j q - dmin m_j
//   Q3_K  (110 B / 256): u8 hmask[32], u8 qs[64], 12 B of 6-bit scales, f16 d
//                                                              w = d (sc_j - 32) (q - 4), q 3-bit
//   Q5_K  (176 B / 256): as Q4_K plus u8 qh[32] (the fifth bits) before qs
//   IQ4_XS (136 B / 256): f16 d, 6-bit scales of 8 sub-blocks of 32 (u16 hi bits, u8 lo[4]),
//                        u8 qs[128]                           w = d (ls_j - 32) kIq4NlValues[q]
//
// Quantized layout version 1 (the runtime layout; never written to a file):
// columns (output features) in tiles of T, T a multiple of 16 chosen for the
// machine (the RVV kernels read T = VLEN/4: one e8 m2 register group); a tile
// holds every K block of its T columns, block after block, and inside a block
// each field is stored for the T columns side by side, so one vector load
// gives one field (or one k of the quants) for every column of the tile:
//   Q8_0: d[T] f16 | q[32][T] int8                                   34 T bytes
//   Q4_0: d[T] f16 | qs[16][T] (qs[i]: lo nibble k = i, hi k = i+16) 18 T
//   Q4_1: d[T] | m[T] f16 | qs[16][T] as Q4_0                        20 T
//   Q4_K: d[T] | dmin[T] f16 | sc[8][T] u8 | mn[8][T] u8 |
//         qs[8][16][T] (sub-block j: lo nibble k = 32j+i, hi 32j+16+i) 148 T per 256
//   Q6_K: d[T] f16 | sc[16][T] int8 | ql[8][16][T] (pair p: lo nibble low 4 bits of
//         k = 32p+i, hi of 32p+16+i) | qh[8][8][T] (pair p: bits 2s..2s+1 hold the high
//         2 bits of k = 32p+8s+i)                                      210 T per 256
// The formats added with the planes of 32 values below (a kernel's step i, 0..15, reads the
// values i and 16 + i of a 32 from one row of each plane):
//   nibbles[16][T]: byte i holds value i (lo nibble) and 16 + i (hi)
//   bits[4][T]:     byte g, bit s holds value g + 4s's bit, bit 4 + s value 16 + g + 4s's
//   crumbs[8][T]:   byte i, bits 2s..2s+1 hold value 8s + i's two bits (Q6_K's qh plane)
//   Q5_0:   d[T] | nibbles | bits (the fifth bits)                         22 T
//   Q5_1:   d[T] | m[T] | nibbles | bits                                   24 T
//   IQ4_NL: d[T] | nibbles (table indices)                                 18 T
//   Q2_K:   d[T] | dmin[T] f16 | scm[16][T] (GGML's scale | min << 4) | crumbs[8]  84 T per 256
//   Q3_K:   d[T] f16 | sc[16][T] int8 (sc - 32) | crumbs[8] | bits[8] (the third bits)
//                                                                         114 T per 256
//   Q5_K:   Q4_K's layout | bits[8] (the fifth bits)                     180 T per 256
//   IQ4_XS: d[T] f16 | sc[8][T] int8 (ls - 32) | nibbles[8] (table indices)  138 T per 256
// The scales stay f16 (bytes are the decode step's budget); Q4_K's 6-bit scales
// are unpacked to bytes (+4 bytes per 256 weights) so no bit-twiddling is left
// in the inner loop. Columns past N in the last tile are zero.
#ifndef RVV_KERNELS_QUANTIZED_QUANT_FORMAT_H_
#define RVV_KERNELS_QUANTIZED_QUANT_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace rvascend {

// kQ8_0, kQ4_0, ... in quant_formats.inc's order.
enum class QuantFormat {
#define QUANT_FORMAT(name, ...) k##name,
#include "rvv_kernels/quantized/quant_formats.inc"
#undef QUANT_FORMAT
};

constexpr size_t kQuantFormatCount = 0
#define QUANT_FORMAT(...) +1
#include "rvv_kernels/quantized/quant_formats.inc"
#undef QUANT_FORMAT
    ;

constexpr int kQuantLayoutVersion = 1;

// Bytes per column of one block in the runtime layout, by format (the registry's column),
// for the kernels that need it at compile time.
constexpr size_t kTileBlockBytes[kQuantFormatCount] = {
#define QUANT_FORMAT(name, ggml_type, block_k, ggml_bytes, tile_bytes, act_block) tile_bytes,
#include "rvv_kernels/quantized/quant_formats.inc"
#undef QUANT_FORMAT
};

struct QuantFormatInfo {
  const char* name;
  int ggml_type;            // GGML's type id (gguf)
  size_t block_k;           // weights per block along K
  size_t ggml_block_bytes;  // bytes of one GGML block
  size_t tile_block_bytes;  // bytes per column of one block in the runtime layout
  size_t act_block;         // activation quantization block (q8_0: 32, q8_K: 256)
};

const QuantFormatInfo& FormatInfo(QuantFormat format);

// The format of a GGML type id or name; throws std::invalid_argument naming it if
// it is not one of the kept formats.
QuantFormat FormatFromGgmlType(int ggml_type);
QuantFormat FormatFromName(const std::string& name);

// IQ4_NL's and IQ4_XS's 16 weight values (GGML's kvalues_iq4nl): a 4-bit code indexes them.
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// IEEE half -> float, exact for every finite half.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = static_cast<float>(mant) * (1.0f / 16777216.0f);  // subnormal: mant * 2^-24
    return sign ? -f : f;
  }
  const uint32_t bits = sign | ((exp == 31 ? 255u : exp + 112u) << 23) | (mant << 13);
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace rvascend

#endif  // RVV_KERNELS_QUANTIZED_QUANT_FORMAT_H_
