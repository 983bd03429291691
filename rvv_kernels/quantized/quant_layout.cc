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
  }
  return {{0, 0}, 0};
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
