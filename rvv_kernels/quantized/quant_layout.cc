#include "rvv_kernels/quantized/quant_layout.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "rvv_kernels/base/checked_size.h"
#include "rvv_kernels/base/huge_pages.h"
#include "rvv_kernels/base/thread_pool.h"

namespace rvascend {
namespace {

uint16_t U16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void PutU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

size_t CeilDiv(size_t a, size_t b) { return a / b + (a % b != 0); }

// Q4_K's 6-bit scale and min of sub-block j (GGML's packing of 12 bytes).
void ScaleMinK4(size_t j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The f16 fields of a GGML block (their byte offsets).
struct HalfFields {
  size_t offsets[2];
  size_t count;
};

HalfFields ScaleFields(QuantFormat f) {
  switch (f) {
    case QuantFormat::kQ8_0:
    case QuantFormat::kQ4_0:
      return {{0, 0}, 1};
    case QuantFormat::kQ4_1:
    case QuantFormat::kQ4_K:
      return {{0, 2}, 2};
    case QuantFormat::kQ6_K:
      return {{208, 0}, 1};
    case QuantFormat::kQ5_0:
    case QuantFormat::kIQ4_NL:
    case QuantFormat::kIQ4_XS:
      return {{0, 0}, 1};
    case QuantFormat::kQ5_1:
    case QuantFormat::kQ5_K:
      return {{0, 2}, 2};
    case QuantFormat::kQ2_K:
      return {{80, 82}, 2};
    case QuantFormat::kQ3_K:
      return {{108, 0}, 1};
  }
  return {{0, 0}, 0};
}

// The planes of 32 values the runtime layout stores (quant_format.h), written for column c of
// a tile of width t; a kernel's step i (0..15) reads values i and 16 + i of each.
// Nibbles: byte i = v[i] | v[16 + i] << 4.
void PutNibbles32(const uint8_t* v, uint8_t* dst, size_t t, size_t c) {
  for (size_t i = 0; i < 16; ++i) dst[i * t + c] = static_cast<uint8_t>((v[i] & 0xF) | ((v[16 + i] & 0xF) << 4));
}
// One bit a value: byte g (0..3), bit s holds value g + 4s, bit 4 + s value 16 + g + 4s.
void PutBits32(const uint8_t* v, uint8_t* dst, size_t t, size_t c) {
  for (size_t g = 0; g < 4; ++g) {
    uint8_t b = 0;
    for (size_t s = 0; s < 4; ++s) b |= static_cast<uint8_t>(((v[g + 4 * s] & 1) << s) | ((v[16 + g + 4 * s] & 1) << (4 + s)));
    dst[g * t + c] = b;
  }
}
// Two bits a value: byte i (0..7), bits 2s..2s+1 hold value 8s + i.
void PutCrumbs32(const uint8_t* v, uint8_t* dst, size_t t, size_t c) {
  for (size_t i = 0; i < 8; ++i) {
    uint8_t b = 0;
    for (size_t s = 0; s < 4; ++s) b |= static_cast<uint8_t>((v[8 * s + i] & 3) << (2 * s));
    dst[i * t + c] = b;
  }
}
uint8_t Nibble32(const uint8_t* src, size_t t, size_t c, size_t k) {
  const uint8_t b = src[(k % 16) * t + c];
  return k < 16 ? (b & 0xF) : (b >> 4);
}
uint8_t Bit32(const uint8_t* src, size_t t, size_t c, size_t k) {
  const size_t i = k % 16;
  return (src[(i % 4) * t + c] >> ((k < 16 ? 0 : 4) + i / 4)) & 1;
}
uint8_t Crumb32(const uint8_t* src, size_t t, size_t c, size_t k) {
  return (src[(k % 8) * t + c] >> (2 * (k / 8))) & 3;
}

// Q5_0 / Q5_1's 5-bit codes of one GGML block (qh: 4 bytes, little-endian; qs: 16 bytes).
void Codes5(const uint8_t* qh_bytes, const uint8_t* qs, uint8_t* v) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (size_t j = 0; j < 16; ++j) {
    v[j] = static_cast<uint8_t>((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
    v[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

// The 256 2-bit fields of Q2_K / Q3_K's qs: value 128n + 32j + l is bits 2j of qs[32n + l].
void Crumbs256(const uint8_t* qs, uint8_t* v) {
  for (size_t n = 0; n < 2; ++n) {
    for (size_t j = 0; j < 4; ++j) {
      for (size_t l = 0; l < 32; ++l) v[128 * n + 32 * j + l] = (qs[32 * n + l] >> (2 * j)) & 3;
    }
  }
}

// Q3_K's 16 6-bit scales (12 bytes), as signed values sc - 32.
void ScalesK3(const uint8_t* p, int8_t* sc) {
  for (size_t j = 0; j < 16; ++j) {
    const uint8_t lo = j < 8 ? (p[j] & 0xF) : (p[j - 8] >> 4);
    const uint8_t hi = (p[8 + j % 4] >> (2 * (j / 4))) & 3;
    sc[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

// IQ4_XS's 8 6-bit scales (scales_h u16, scales_l[4]), as signed values ls - 32.
void ScalesIq4Xs(const uint8_t* p, int8_t* sc) {
  const uint16_t h = U16(p + 2);
  for (size_t j = 0; j < 8; ++j) {
    const int ls = ((p[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((h >> (2 * j)) & 3) << 4);
    sc[j] = static_cast<int8_t>(ls - 32);
  }
}

// Writes GGML block `src` of column c (of a tile of width t) into that tile's block record `dst`.
void RepackBlock(QuantFormat f, const uint8_t* src, size_t t, size_t c, uint8_t* dst) {
  switch (f) {
    case QuantFormat::kQ8_0:
      PutU16(dst + 2 * c, U16(src));
      for (size_t i = 0; i < 32; ++i) dst[2 * t + i * t + c] = src[2 + i];
      return;
    case QuantFormat::kQ4_0:
      PutU16(dst + 2 * c, U16(src));
      for (size_t i = 0; i < 16; ++i) dst[2 * t + i * t + c] = src[2 + i];
      return;
    case QuantFormat::kQ4_1:
      PutU16(dst + 2 * c, U16(src));
      PutU16(dst + 2 * t + 2 * c, U16(src + 2));
      for (size_t i = 0; i < 16; ++i) dst[4 * t + i * t + c] = src[4 + i];
      return;
    case QuantFormat::kQ4_K: {
      PutU16(dst + 2 * c, U16(src));
      PutU16(dst + 2 * t + 2 * c, U16(src + 2));
      for (size_t j = 0; j < 8; ++j) ScaleMinK4(j, src + 4, &dst[4 * t + j * t + c], &dst[12 * t + j * t + c]);
      // GGML: byte 32g + l holds value 64g + l (lo) and 64g + 32 + l (hi).
      uint8_t v[256];
      const uint8_t* qs = src + 16;
      for (size_t g = 0; g < 4; ++g) {
        for (size_t l = 0; l < 32; ++l) {
          v[64 * g + l] = qs[32 * g + l] & 0xF;
          v[64 * g + 32 + l] = qs[32 * g + l] >> 4;
        }
      }
      for (size_t j = 0; j < 8; ++j) {
        for (size_t i = 0; i < 16; ++i) {
          dst[20 * t + (16 * j + i) * t + c] = static_cast<uint8_t>(v[32 * j + i] | (v[32 * j + 16 + i] << 4));
        }
      }
      return;
    }
    case QuantFormat::kQ6_K: {
      const uint8_t* ql = src;
      const uint8_t* qh = src + 128;
      const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
      PutU16(dst + 2 * c, U16(src + 208));
      for (size_t s = 0; s < 16; ++s) dst[2 * t + s * t + c] = static_cast<uint8_t>(sc[s]);
      // GGML: per half n of 128 values, l < 32: ql[64n + l] lo/hi nibbles and
      // qh[32n + l] bit pairs 0..3 hold values 128n + l, +32, +64, +96.
      uint8_t v[256];
      for (size_t n = 0; n < 2; ++n) {
        for (size_t l = 0; l < 32; ++l) {
          const uint8_t h = qh[32 * n + l];
          v[128 * n + l] = (ql[64 * n + l] & 0xF) | (((h >> 0) & 3) << 4);
          v[128 * n + l + 32] = (ql[64 * n + l + 32] & 0xF) | (((h >> 2) & 3) << 4);
          v[128 * n + l + 64] = (ql[64 * n + l] >> 4) | (((h >> 4) & 3) << 4);
          v[128 * n + l + 96] = (ql[64 * n + l + 32] >> 4) | (((h >> 6) & 3) << 4);
        }
      }
      for (size_t p = 0; p < 8; ++p) {
        for (size_t i = 0; i < 16; ++i) {
          dst[18 * t + (16 * p + i) * t + c] =
              static_cast<uint8_t>((v[32 * p + i] & 0xF) | ((v[32 * p + 16 + i] & 0xF) << 4));
        }
        for (size_t i = 0; i < 8; ++i) {
          uint8_t h = 0;
          for (size_t s = 0; s < 4; ++s) h |= static_cast<uint8_t>((v[32 * p + 8 * s + i] >> 4) << (2 * s));
          dst[146 * t + (8 * p + i) * t + c] = h;
        }
      }
      return;
    }
    case QuantFormat::kQ5_0:
    case QuantFormat::kQ5_1: {
      const bool q51 = f == QuantFormat::kQ5_1;
      PutU16(dst + 2 * c, U16(src));
      if (q51) PutU16(dst + 2 * t + 2 * c, U16(src + 2));
      uint8_t v[32];
      Codes5(src + (q51 ? 4 : 2), src + (q51 ? 8 : 6), v);
      uint8_t* qs = dst + (q51 ? 4 : 2) * t;
      PutNibbles32(v, qs, t, c);
      uint8_t high[32];
      for (size_t i = 0; i < 32; ++i) high[i] = v[i] >> 4;
      PutBits32(high, qs + 16 * t, t, c);
      return;
    }
    case QuantFormat::kIQ4_NL: {
      PutU16(dst + 2 * c, U16(src));
      for (size_t i = 0; i < 16; ++i) dst[2 * t + i * t + c] = src[2 + i];
      return;
    }
    case QuantFormat::kIQ4_XS: {
      PutU16(dst + 2 * c, U16(src));
      int8_t sc[8];
      ScalesIq4Xs(src, sc);
      for (size_t j = 0; j < 8; ++j) dst[2 * t + j * t + c] = static_cast<uint8_t>(sc[j]);
      // GGML: sub-block j's 16 bytes hold value 32j + i (lo nibble) and 32j + 16 + i (hi): the layout's.
      for (size_t j = 0; j < 8; ++j) {
        for (size_t i = 0; i < 16; ++i) dst[10 * t + (16 * j + i) * t + c] = src[8 + 16 * j + i];
      }
      return;
    }
    case QuantFormat::kQ5_K: {
      PutU16(dst + 2 * c, U16(src));
      PutU16(dst + 2 * t + 2 * c, U16(src + 2));
      for (size_t j = 0; j < 8; ++j) ScaleMinK4(j, src + 4, &dst[4 * t + j * t + c], &dst[12 * t + j * t + c]);
      // GGML: value 64g + l is the lo nibble of qs[32g + l], 64g + 32 + l its hi nibble; the
      // fifth bit of value 32j + l is bit j of qh[l].
      const uint8_t* qh = src + 16;
      const uint8_t* qs = src + 48;
      for (size_t j = 0; j < 8; ++j) {
        uint8_t lo[32], hi[32];
        for (size_t l = 0; l < 32; ++l) {
          const uint8_t b = qs[32 * (j / 2) + l];
          lo[l] = j % 2 ? (b >> 4) : (b & 0xF);
          hi[l] = (qh[l] >> j) & 1;
        }
        PutNibbles32(lo, dst + 20 * t + 16 * j * t, t, c);
        PutBits32(hi, dst + 148 * t + 4 * j * t, t, c);
      }
      return;
    }
    case QuantFormat::kQ3_K: {
      PutU16(dst + 2 * c, U16(src + 108));
      int8_t sc[16];
      ScalesK3(src + 96, sc);
      for (size_t s = 0; s < 16; ++s) dst[2 * t + s * t + c] = static_cast<uint8_t>(sc[s]);
      // GGML: hmask bit 4n + j of byte l is value 128n + 32j + l's third bit.
      uint8_t low[256], high[256];
      Crumbs256(src + 32, low);
      for (size_t v = 0; v < 256; ++v) high[v] = (src[v % 32] >> (v / 32)) & 1;
      for (size_t p = 0; p < 8; ++p) {
        PutCrumbs32(low + 32 * p, dst + 18 * t + 8 * p * t, t, c);
        PutBits32(high + 32 * p, dst + 82 * t + 4 * p * t, t, c);
      }
      return;
    }
    case QuantFormat::kQ2_K: {
      PutU16(dst + 2 * c, U16(src + 80));
      PutU16(dst + 2 * t + 2 * c, U16(src + 82));
      for (size_t s = 0; s < 16; ++s) dst[4 * t + s * t + c] = src[s];  // lo nibble scale, hi nibble min
      uint8_t low[256];
      Crumbs256(src + 16, low);
      for (size_t p = 0; p < 8; ++p) PutCrumbs32(low + 32 * p, dst + 20 * t + 8 * p * t, t, c);
      return;
    }
  }
}

}  // namespace

size_t GgmlWeightBytes(QuantFormat format, size_t n, size_t k) {
  const QuantFormatInfo& info = FormatInfo(format);
  return CheckedProduct("GGML weight bytes", n, k / info.block_k, info.ggml_block_bytes);
}

size_t QuantLayoutBytes(QuantFormat format, size_t n, size_t k, size_t tile) {
  const QuantFormatInfo& info = FormatInfo(format);
  if (tile == 0) throw std::invalid_argument("quantized tile width 0");
  return CheckedProduct("quantized layout bytes", CeilDiv(n, tile), tile, k / info.block_k, info.tile_block_bytes);
}

void CheckGgmlShape(QuantFormat format, size_t n, size_t k, size_t tile) {
  const QuantFormatInfo& info = FormatInfo(format);
  if (k == 0 || k % info.block_k) {
    throw std::invalid_argument(std::string(info.name) + " weight rows of " + std::to_string(k) +
                                " values are not a whole number of " + std::to_string(info.block_k) + "-value blocks");
  }
  if (tile == 0 || tile % 16 || tile > 256) {
    throw std::invalid_argument("quantized tile width " + std::to_string(tile) +
                                " is not a multiple of 16 in 16..256");
  }
  GgmlWeightBytes(format, n, k);
  QuantLayoutBytes(format, n, k, tile);
  CheckedProduct("dequantized elements", n, k);
}

void CheckGgmlWeight(QuantFormat format, const uint8_t* ggml, size_t n, size_t k, size_t tile) {
  CheckGgmlShape(format, n, k, tile);
  const QuantFormatInfo& info = FormatInfo(format);
  const HalfFields fields = ScaleFields(format);
  const size_t blocks = k / info.block_k;
  for (size_t r = 0; r < n; ++r) {
    for (size_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = ggml + (r * blocks + b) * info.ggml_block_bytes;
      for (size_t i = 0; i < fields.count; ++i) {
        if ((U16(blk + fields.offsets[i]) & 0x7c00u) == 0x7c00u) {
          throw std::invalid_argument(std::string(info.name) + " weight row " + std::to_string(r) + ", block " +
                                      std::to_string(b) + " has a NaN or infinite scale: the file is corrupt");
        }
      }
    }
  }
}

void RepackGgmlWeight(QuantFormat format, const uint8_t* ggml, size_t n, size_t k, size_t tile, uint8_t* out,
                      size_t num_threads) {
  const QuantFormatInfo& info = FormatInfo(format);
  const size_t blocks = k / info.block_k;
  const size_t tiles = CeilDiv(n, tile);
  const size_t record = info.tile_block_bytes * tile;
  AdviseHugePages(out, tiles * blocks * record);
  ThreadPool::Global().ParallelFor(tiles, num_threads, [&](size_t ti) {
    uint8_t* tile_out = out + ti * blocks * record;
    std::memset(tile_out, 0, blocks * record);  // columns past n stay zero
    for (size_t c = 0; c < tile && ti * tile + c < n; ++c) {
      const uint8_t* row = ggml + (ti * tile + c) * blocks * info.ggml_block_bytes;
      for (size_t b = 0; b < blocks; ++b) {
        RepackBlock(format, row + b * info.ggml_block_bytes, tile, c, tile_out + b * record);
      }
    }
  });
}

namespace {

// The block_k values of column c of one block record (a tile of width t).
void DecodeBlock(QuantFormat f, const uint8_t* blk, size_t t, size_t c, float* y) {
  const float d = HalfToFloat(U16(blk + 2 * c));
  switch (f) {
    case QuantFormat::kQ8_0:
      for (size_t i = 0; i < 32; ++i) y[i] = d * static_cast<int8_t>(blk[2 * t + i * t + c]);
      return;
    case QuantFormat::kQ4_0:
    case QuantFormat::kQ4_1: {
      const bool q41 = f == QuantFormat::kQ4_1;
      const float m = q41 ? HalfToFloat(U16(blk + 2 * t + 2 * c)) : 0.0f;
      const uint8_t* qs = blk + (q41 ? 4 : 2) * t;
      for (size_t i = 0; i < 16; ++i) {
        const uint8_t v = qs[i * t + c];
        y[i] = q41 ? d * (v & 0xF) + m : d * ((v & 0xF) - 8);
        y[i + 16] = q41 ? d * (v >> 4) + m : d * ((v >> 4) - 8);
      }
      return;
    }
    case QuantFormat::kQ4_K: {
      const float dmin = HalfToFloat(U16(blk + 2 * t + 2 * c));
      for (size_t j = 0; j < 8; ++j) {
        const float ds = d * blk[4 * t + j * t + c], dm = dmin * blk[12 * t + j * t + c];
        for (size_t i = 0; i < 16; ++i) {
          const uint8_t v = blk[20 * t + (16 * j + i) * t + c];
          y[32 * j + i] = ds * (v & 0xF) - dm;
          y[32 * j + 16 + i] = ds * (v >> 4) - dm;
        }
      }
      return;
    }
    case QuantFormat::kQ6_K: {
      const auto* sc = reinterpret_cast<const int8_t*>(blk + 2 * t);
      for (size_t p = 0; p < 8; ++p) {
        for (size_t i = 0; i < 16; ++i) {
          const uint8_t l = blk[18 * t + (16 * p + i) * t + c];
          const uint8_t h = blk[146 * t + (8 * p + i % 8) * t + c];
          const int lo = ((l & 0xF) | (((h >> (2 * (i / 8))) & 3) << 4)) - 32;
          const int hi = ((l >> 4) | (((h >> (2 * (2 + i / 8))) & 3) << 4)) - 32;
          y[32 * p + i] = d * sc[(2 * p) * t + c] * lo;
          y[32 * p + 16 + i] = d * sc[(2 * p + 1) * t + c] * hi;
        }
      }
      return;
    }
    case QuantFormat::kQ5_0:
    case QuantFormat::kQ5_1: {
      const bool q51 = f == QuantFormat::kQ5_1;
      const float m = q51 ? HalfToFloat(U16(blk + 2 * t + 2 * c)) : 0.0f;
      const uint8_t* qs = blk + (q51 ? 4 : 2) * t;
      for (size_t k = 0; k < 32; ++k) {
        const int q = Nibble32(qs, t, c, k) | (Bit32(qs + 16 * t, t, c, k) << 4);
        y[k] = q51 ? d * q + m : d * (q - 16);
      }
      return;
    }
    case QuantFormat::kIQ4_NL:
      for (size_t k = 0; k < 32; ++k) y[k] = d * kIq4NlValues[Nibble32(blk + 2 * t, t, c, k)];
      return;
    case QuantFormat::kIQ4_XS:
      for (size_t j = 0; j < 8; ++j) {
        const float ds = d * static_cast<int8_t>(blk[2 * t + j * t + c]);
        for (size_t k = 0; k < 32; ++k) y[32 * j + k] = ds * kIq4NlValues[Nibble32(blk + (10 + 16 * j) * t, t, c, k)];
      }
      return;
    case QuantFormat::kQ5_K: {
      const float dmin = HalfToFloat(U16(blk + 2 * t + 2 * c));
      for (size_t j = 0; j < 8; ++j) {
        const float ds = d * blk[4 * t + j * t + c], dm = dmin * blk[12 * t + j * t + c];
        for (size_t k = 0; k < 32; ++k) {
          const int q = Nibble32(blk + (20 + 16 * j) * t, t, c, k) | (Bit32(blk + (148 + 4 * j) * t, t, c, k) << 4);
          y[32 * j + k] = ds * q - dm;
        }
      }
      return;
    }
    case QuantFormat::kQ3_K:
      for (size_t p = 0; p < 8; ++p) {
        for (size_t k = 0; k < 32; ++k) {
          const int q = (Crumb32(blk + (18 + 8 * p) * t, t, c, k) | (Bit32(blk + (82 + 4 * p) * t, t, c, k) << 2)) - 4;
          y[32 * p + k] = d * static_cast<int8_t>(blk[2 * t + (2 * p + k / 16) * t + c]) * q;
        }
      }
      return;
    case QuantFormat::kQ2_K: {
      const float dmin = HalfToFloat(U16(blk + 2 * t + 2 * c));
      for (size_t p = 0; p < 8; ++p) {
        for (size_t k = 0; k < 32; ++k) {
          const uint8_t scm = blk[4 * t + (2 * p + k / 16) * t + c];
          y[32 * p + k] = d * (scm & 0xF) * Crumb32(blk + (20 + 8 * p) * t, t, c, k) - dmin * (scm >> 4);
        }
      }
      return;
    }
  }
}

}  // namespace

void DequantizeQuantRow(QuantFormat f, const uint8_t* packed, size_t n, size_t k, size_t tile, size_t row,
                        float* out) {
  if (row >= n) throw std::invalid_argument("row " + std::to_string(row) + " of " + std::to_string(n));
  const QuantFormatInfo& info = FormatInfo(f);
  const size_t blocks = k / info.block_k;
  const size_t record = info.tile_block_bytes * tile;
  const uint8_t* tile_base = packed + (row / tile) * blocks * record;
  for (size_t b = 0; b < blocks; ++b) DecodeBlock(f, tile_base + b * record, tile, row % tile, out + b * info.block_k);
}

void DequantizeGgmlRows(QuantFormat f, const uint8_t* ggml, size_t n, size_t k, float* out, size_t num_threads) {
  const QuantFormatInfo& info = FormatInfo(f);
  const size_t blocks = k / info.block_k;
  ThreadPool::Global().ParallelFor(n, num_threads, [&](size_t r) {
    uint8_t record[256];  // one block as a tile of one column
    for (size_t b = 0; b < blocks; ++b) {
      RepackBlock(f, ggml + (r * blocks + b) * info.ggml_block_bytes, 1, 0, record);
      DecodeBlock(f, record, 1, 0, out + r * k + b * info.block_k);
    }
  });
}

}  // namespace rvascend
