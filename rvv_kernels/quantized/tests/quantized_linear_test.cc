// The quantized-linear kernels against an FP64 reference written here from the
// GGML block formats: the weights dequantized exactly from their GGML blocks,
// times the activations as quantized (checked against their own specification),
// summed in FP64. Every kernel set must stay within the FP32 bound of its
// per-block scale products and accumulation, and every vector set must equal the
// portable set bit for bit. Also: the repack round trip (row dequantization),
// tails in N, M from 1 to 9, integer sums at their bounds, K not a whole number
// of blocks, NaN or infinite scales, a tile width the set cannot read, NaN
// activations.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/cpu_features.h"
#include "rvv_kernels/base/kernel_testing.h"
#include "rvv_kernels/quantized/quant_activations.h"
#include "rvv_kernels/quantized/quant_format.h"
#include "rvv_kernels/quantized/quant_kernel_sets.h"
#include "rvv_kernels/quantized/quant_layout.h"
#include "rvv_kernels/quantized/quantized_linear.h"

namespace rvascend {
namespace {

// Every format of the registry (quant_formats.inc): a new one is tested without a line here.
std::vector<QuantFormat> AllFormats() {
  std::vector<QuantFormat> all;
  for (size_t i = 0; i < kQuantFormatCount; ++i) all.push_back(static_cast<QuantFormat>(i));
  return all;
}
const std::vector<QuantFormat> kFormats = AllFormats();

uint16_t Half(std::mt19937& rng) {
  // Scales of both signs, normal and subnormal, now and then zero.
  std::uniform_int_distribution<int> pick(0, 19);
  const int kind = pick(rng);
  if (kind == 0) return 0;
  std::uniform_int_distribution<int> mant(0, 1023);
  std::uniform_int_distribution<int> exp(kind == 1 ? 0 : 3, kind == 1 ? 0 : 14);  // |d| up to 0.5
  const uint16_t sign = (rng() & 1) ? 0x8000 : 0;
  return static_cast<uint16_t>(sign | (exp(rng) << 10) | mant(rng));
}

uint16_t U16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The byte offsets of a GGML block's f16 scales.
std::vector<size_t> ScaleOffsets(QuantFormat f) {
  switch (f) {
    case QuantFormat::kQ8_0:
    case QuantFormat::kQ4_0:
    case QuantFormat::kQ5_0:
    case QuantFormat::kIQ4_NL:
    case QuantFormat::kIQ4_XS: return {0};
    case QuantFormat::kQ4_1:
    case QuantFormat::kQ5_1:
    case QuantFormat::kQ4_K:
    case QuantFormat::kQ5_K: return {0, 2};
    case QuantFormat::kQ6_K: return {208};
    case QuantFormat::kQ3_K: return {108};
    case QuantFormat::kQ2_K: return {80, 82};
  }
  return {};
}

void RandomScales(QuantFormat f, uint8_t* block, std::mt19937& rng) {
  for (size_t off : ScaleOffsets(f)) {
    const uint16_t h = Half(rng);
    std::memcpy(block + off, &h, 2);
  }
}

// Random GGML weight [n, k]: random quant bytes, random finite scales.
std::vector<uint8_t> RandomGgml(QuantFormat f, size_t n, size_t k, std::mt19937& rng) {
  const QuantFormatInfo& info = FormatInfo(f);
  std::vector<uint8_t> w(GgmlWeightBytes(f, n, k));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  for (size_t blk = 0; blk < n * (k / info.block_k); ++blk) {
    uint8_t* p = w.data() + blk * info.ggml_block_bytes;
    RandomScales(f, p, rng);
    if (f == QuantFormat::kQ8_0) {
      for (size_t i = 0; i < 32; ++i) {
        if (p[2 + i] == 0x80) p[2 + i] = 0x81;  // quantizers emit -127..127
      }
    }
  }
  return w;
}

// The FP64 values of one GGML block (the formats' definitions, quant_format.h).
void DequantizeGgmlBlock(QuantFormat f, const uint8_t* p, double* y) {
  switch (f) {
    case QuantFormat::kQ8_0: {
      const double d = HalfToFloat(U16(p));
      for (int i = 0; i < 32; ++i) y[i] = d * static_cast<int8_t>(p[2 + i]);
      return;
    }
    case QuantFormat::kQ4_0:
    case QuantFormat::kQ4_1: {
      const bool q41 = f == QuantFormat::kQ4_1;
      const double d = HalfToFloat(U16(p)), m = q41 ? HalfToFloat(U16(p + 2)) : 0.0;
      const uint8_t* qs = p + (q41 ? 4 : 2);
      for (int i = 0; i < 16; ++i) {
        y[i] = q41 ? d * (qs[i] & 0xF) + m : d * ((qs[i] & 0xF) - 8);
        y[i + 16] = q41 ? d * (qs[i] >> 4) + m : d * ((qs[i] >> 4) - 8);
      }
      return;
    }
    case QuantFormat::kQ4_K:
    case QuantFormat::kQ5_K: {
      // d, dmin, 12 bytes of 6-bit scales and mins, (Q5_K: qh[32], the fifth bits), qs.
      const bool q5 = f == QuantFormat::kQ5_K;
      const double d = HalfToFloat(U16(p)), dmin = HalfToFloat(U16(p + 2));
      const uint8_t* sc = p + 4;
      const uint8_t* qh = p + 16;
      const uint8_t* qs = p + (q5 ? 48 : 16);
      for (int j = 0; j < 8; ++j) {
        int s, m;
        if (j < 4) {
          s = sc[j] & 63;
          m = sc[j + 4] & 63;
        } else {
          s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
          m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        }
        // Sub-block j: values 32j..32j+31 are nibbles of bytes 32(j/2) .. : low for even j, high
        // for odd; Q5_K's fifth bit of value 32j + l is bit j of qh[l].
        for (int l = 0; l < 32; ++l) {
          const uint8_t b = qs[32 * (j / 2) + l];
          const int q = ((j % 2 == 0) ? (b & 0xF) : (b >> 4)) | (q5 ? ((qh[l] >> j) & 1) << 4 : 0);
          y[32 * j + l] = d * s * q - dmin * m;
        }
      }
      return;
    }
    case QuantFormat::kQ6_K: {
      const uint8_t* ql = p;
      const uint8_t* qh = p + 128;
      const auto* sc = reinterpret_cast<const int8_t*>(p + 192);
      const double d = HalfToFloat(U16(p + 208));
      for (int v = 0; v < 256; ++v) {
        const int half = v / 128, r = v % 128, quarter = r / 32, l = r % 32;
        const uint8_t lbyte = ql[64 * half + l + (quarter % 2) * 32];
        const int lo = quarter < 2 ? (lbyte & 0xF) : (lbyte >> 4);
        const int hi = (qh[32 * half + l] >> (2 * quarter)) & 3;
        y[v] = d * sc[v / 16] * ((lo | (hi << 4)) - 32);
      }
      return;
    }
    case QuantFormat::kQ5_0:
    case QuantFormat::kQ5_1: {
      const bool q51 = f == QuantFormat::kQ5_1;
      const double d = HalfToFloat(U16(p)), m = q51 ? HalfToFloat(U16(p + 2)) : 0.0;
      const uint8_t* qh = p + (q51 ? 4 : 2);
      const uint8_t* qs = qh + 4;
      for (int v = 0; v < 32; ++v) {
        const int q = ((v < 16 ? qs[v] & 0xF : qs[v - 16] >> 4)) | (((qh[v / 8] >> (v % 8)) & 1) << 4);
        y[v] = q51 ? d * q + m : d * (q - 16);
      }
      return;
    }
    case QuantFormat::kIQ4_NL: {
      const double d = HalfToFloat(U16(p));
      for (int v = 0; v < 32; ++v) y[v] = d * kIq4NlValues[v < 16 ? p[2 + v] & 0xF : p[2 + v - 16] >> 4];
      return;
    }
    case QuantFormat::kIQ4_XS: {
      const double d = HalfToFloat(U16(p));
      const int scales_h = U16(p + 2);
      for (int v = 0; v < 256; ++v) {
        const int j = v / 32, l = v % 32;
        const int ls = ((p[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((scales_h >> (2 * j)) & 3) << 4);
        const uint8_t b = p[8 + 16 * j + l % 16];
        y[v] = d * (ls - 32) * kIq4NlValues[l < 16 ? b & 0xF : b >> 4];
      }
      return;
    }
    case QuantFormat::kQ3_K: {
      // hmask[32], qs[64], scales[12] (sub-block j's 6 bits: the low 4 from byte j % 8, nibble
      // j / 8, the high 2 from byte 8 + j % 4, bits 2 (j / 4)), d.
      const double d = HalfToFloat(U16(p + 108));
      for (int v = 0; v < 256; ++v) {
        const int n = v / 128, j = (v % 128) / 32, l = v % 32, sub = v / 16;
        const int lo4 = (p[96 + sub % 8] >> (4 * (sub / 8))) & 0xF;
        const int hi2 = (p[104 + sub % 4] >> (2 * (sub / 4))) & 3;
        const int q = (p[32 + 32 * n + l] >> (2 * j)) & 3;
        const int h = (p[l] >> (4 * n + j)) & 1;
        y[v] = d * ((lo4 | (hi2 << 4)) - 32) * (q - (h ? 0 : 4));
      }
      return;
    }
    case QuantFormat::kQ2_K: {
      const double d = HalfToFloat(U16(p + 80)), dmin = HalfToFloat(U16(p + 82));
      for (int v = 0; v < 256; ++v) {
        const int n = v / 128, j = (v % 128) / 32, l = v % 32, sub = v / 16;
        const int q = (p[16 + 32 * n + l] >> (2 * j)) & 3;
        y[v] = d * (p[sub] & 0xF) * q - dmin * (p[sub] >> 4);
      }
      return;
    }
  }
}

std::vector<double> DequantizeGgml(QuantFormat f, const std::vector<uint8_t>& w, size_t n, size_t k) {
  const QuantFormatInfo& info = FormatInfo(f);
  std::vector<double> out(n * k);
  for (size_t b = 0; b < n * (k / info.block_k); ++b) {
    DequantizeGgmlBlock(f, w.data() + b * info.ggml_block_bytes, out.data() + b * info.block_k);
  }
  return out;
}

std::vector<uint16_t> RandomActivations(size_t m, size_t k, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(m * k);
  for (auto& v : x) v = FloatToBf16(normal(rng) * (rng() % 7 == 0 ? 30.0f : 1.0f));
  return x;
}

// The activations' specification: llama.cpp's q8_0 and q8_K with round-to-nearest-even.
void TestActivationQuantization(std::mt19937& rng) {
  for (size_t block : {32, 256}) {
    const size_t m = 3, k = 512;
    const auto x = RandomActivations(m, k, rng);
    const QuantizedActivations acts(x.data(), m, k, k, block);
    const QuantActs& a = acts.view();
    int bad = 0;
    for (size_t r = 0; r < m; ++r) {
      for (size_t b = 0; b < k / block; ++b) {
        float amax = 0, max = 0;
        for (size_t i = 0; i < block; ++i) {
          const float v = Bf16ToFloat(x[r * k + b * block + i]);
          if (std::fabs(v) > amax) { amax = std::fabs(v); max = v; }
        }
        const float scale = block == 32 ? amax / 127.0f : -127.0f / max;
        const float d = block == 32 ? scale : 1.0f / scale;
        bad += a.d[r * (k / block) + b] != d;
        for (size_t i = 0; i < block; ++i) {
          const float v = Bf16ToFloat(x[r * k + b * block + i]);
          const float want = std::nearbyint(block == 32 ? v * (1.0f / scale) : scale * v);
          bad += a.q[r * k + b * block + i] != static_cast<int8_t>(std::fmin(127.0f, std::fmax(-127.0f, want)));
        }
      }
      for (size_t b = 0; b < k / 32; ++b) {
        int32_t s = 0;
        for (size_t i = 0; i < 32; ++i) s += a.q[r * k + 32 * b + i];
        bad += a.sum32[r * (k / 32) + b] != s;
      }
    }
    EXPECT(bad == 0, "activation quantization (block %zu): %d values differ from llama.cpp's definition", block, bad);
  }
  std::vector<uint16_t> x(64, FloatToBf16(1.0f));
  x[40] = FloatToBf16(NAN);
  const QuantizedActivations acts(x.data(), 1, 64, 64, 32);
  EXPECT(std::isnan(acts.view().d[1]) && acts.view().d[0] == 1.0f / 127.0f,
         "a block with a NaN gets a NaN scale, the others stay finite");
}

// Every set's activation quantization gives the portable definition's bytes,
// also for zero, NaN and infinite blocks and for values that round on a tie.
void TestSetQuantization(const QuantKernelSet& set, std::mt19937& rng) {
  for (size_t block : {32, 256}) {
    const size_t k = 1024;
    auto x = RandomActivations(1, k, rng);
    for (size_t i = 0; i < 32; ++i) x[i] = 0;                     // an all-zero block
    x[40] = FloatToBf16(NAN);                                      // a NaN block
    x[300] = FloatToBf16(INFINITY);                                // an infinite block
    for (size_t i = 512; i < 544; ++i) x[i] = FloatToBf16(i % 2 ? 2.5f : -1.5f);  // ties
    x[600] = FloatToBf16(-40.0f);
    x[601] = FloatToBf16(40.0f);                                   // the same magnitude twice
    std::vector<int8_t> q1(k), q2(k);
    std::vector<float> d1(k / block), d2(k / block);
    std::vector<int32_t> s1(k / 32), s2(k / 32);
    QuantizeRowPortable(x.data(), k, block, q1.data(), d1.data(), s1.data());
    set.quantize_row(x.data(), k, block, q2.data(), d2.data(), s2.data());
    EXPECT(q1 == q2 && s1 == s2 && std::memcmp(d1.data(), d2.data(), d1.size() * 4) == 0,
           "%s: activation quantization (block %zu) differs from the portable definition", set.name, block);
  }
}

// Batch invariance (deterministic inference): every row of an M-row call, M = 1 ... 17, is
// bit for bit what it gives alone, whichever tile, row grouping or thread split computes it.
void TestRowsAreTheirRowsAlone(const QuantKernelSet& set, QuantFormat f, std::mt19937& rng) {
  const size_t t = QuantKernelSetTile(set), n = 2 * t + 3, k = FormatInfo(f).block_k == 32 ? 96 : 256;
  const auto ggml = RandomGgml(f, n, k, rng);
  std::vector<uint8_t> packed(QuantLayoutBytes(f, n, k, t));
  RepackGgmlWeight(f, ggml.data(), n, k, t, packed.data(), 2);
  const size_t rows = 17;
  const auto x = RandomActivations(rows, k, rng);
  auto run = [&](size_t row0, size_t m, size_t threads) {
    QuantizedLinearArgs args;
    args.format = f;
    args.m = m;
    args.n = n;
    args.k = k;
    args.input = x.data() + row0 * k;
    args.input_stride = k;
    args.weight = packed.data();
    args.tile = t;
    std::vector<float> out(m * n);
    QuantizedLinearF32(set, args, out.data(), n, threads);
    return out;
  };
  std::vector<std::vector<float>> alone;
  for (size_t r = 0; r < rows; ++r) alone.push_back(run(r, 1, 1));
  size_t differ = 0;
  for (size_t m = 1; m <= rows; ++m) {
    for (size_t threads : {1, 3}) {
      const auto out = run(0, m, threads);
      for (size_t r = 0; r < m; ++r) differ += std::memcmp(alone[r].data(), out.data() + r * n, n * sizeof(float)) != 0;
    }
  }
  EXPECT(differ == 0, "%s %s: %zu rows of M = 1..17 calls differ from the row alone", set.name, FormatInfo(f).name,
         differ);
}

// The product of GGML weight `ggml` [n, k] and BF16 activations `x` [m, k] through `set`.
void CheckProduct(const QuantKernelSet& set, QuantFormat f, const std::vector<uint8_t>& ggml,
                  const std::vector<uint16_t>& x, size_t m, size_t n, size_t k) {
  const QuantFormatInfo& info = FormatInfo(f);
  const size_t t = QuantKernelSetTile(set);
  CheckGgmlWeight(f, ggml.data(), n, k, t);
  std::vector<uint8_t> packed(QuantLayoutBytes(f, n, k, t));
  RepackGgmlWeight(f, ggml.data(), n, k, t, packed.data(), 2);
  const QuantizedActivations acts(x.data(), m, k, k, info.act_block);
  const QuantActs& a = acts.view();
  const auto w = DequantizeGgml(f, ggml, n, k);

  QuantizedLinearArgs args;
  args.format = f;
  args.m = m;
  args.n = n;
  args.k = k;
  args.input = x.data();
  args.input_stride = k;
  args.weight = packed.data();
  args.tile = t;
  std::vector<float> out(m * n, -1.0f);
  QuantizedLinearF32(set, args, out.data(), n, 2);
  // Per output: #scale products (2 per block for Q4_1 and Q4_K) and FP32 accumulation.
  const bool mins = f == QuantFormat::kQ4_1 || f == QuantFormat::kQ5_1 || f == QuantFormat::kQ4_K ||
                    f == QuantFormat::kQ5_K || f == QuantFormat::kQ2_K;
  const size_t terms = (k / info.block_k) * (mins ? 2 : 1);
  int bad = 0;
  double worst = 0;
  for (size_t r = 0; r < m; ++r) {
    for (size_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (size_t kk = 0; kk < k; ++kk) {
        const double av = static_cast<double>(a.q[r * k + kk]) * a.d[r * (k / info.act_block) + kk / info.act_block];
        ref += w[j * k + kk] * av;
        mag += std::fabs(w[j * k + kk] * av);
      }
      const double bound = (2.0 * terms + 2.0) * std::ldexp(1.0, -24) * mag + 1e-30;
      const double err = std::fabs(out[r * n + j] - ref);
      if (!(err <= bound)) ++bad;
      if (mag > 0) worst = std::fmax(worst, err / bound);
    }
  }
  EXPECT(bad == 0, "%s %s m=%zu n=%zu k=%zu: %d outputs outside the FP32 bound of the FP64 reference (worst %.2f)",
         set.name, info.name, m, n, k, bad, worst);

  if (std::string(set.name) != "portable") {
    std::vector<float> twin(m * n);
    QuantizedLinearF32(kPortableQuantKernels, args, twin.data(), n, 1);
    EXPECT(std::memcmp(twin.data(), out.data(), out.size() * sizeof(float)) == 0,
           "%s %s m=%zu n=%zu k=%zu: differs from the portable twin", set.name, info.name, m, n, k);
  }
  std::vector<uint16_t> bf16(m * (n + 3), 0xABCD);
  args.output = bf16.data();
  args.output_stride = n + 3;
  QuantizedLinear(set, args, 2);
  int bad16 = 0;
  for (size_t r = 0; r < m; ++r) {
    for (size_t j = 0; j < n + 3; ++j) {
      const uint16_t want = j < n ? FloatToBf16(out[r * n + j]) : 0xABCD;  // nothing past N written
      bad16 += bf16[r * (n + 3) + j] != want;
    }
  }
  EXPECT(bad16 == 0, "%s %s m=%zu n=%zu: %d BF16 outputs are not the FP32 result rounded to nearest even",
         set.name, info.name, m, n, bad16);
  std::vector<float> row(k);
  int bad_rows = 0;
  for (size_t j : {size_t{0}, n / 2, n - 1}) {
    DequantizeQuantRow(f, packed.data(), n, k, t, j, row.data());
    for (size_t kk = 0; kk < k; ++kk) {
      bad_rows += !(std::fabs(row[kk] - w[j * k + kk]) <= 1e-6 * std::fabs(w[j * k + kk]) + 1e-30);
    }
  }
  EXPECT(bad_rows == 0, "%s: %d values of rows dequantized from the runtime layout differ from GGML's", info.name,
         bad_rows);
  std::vector<float> all(n * k);
  DequantizeGgmlRows(f, ggml.data(), n, k, all.data(), 2);
  int bad_ggml = 0;
  for (size_t i = 0; i < n * k; ++i) bad_ggml += !(std::fabs(all[i] - w[i]) <= 1e-6 * std::fabs(w[i]) + 1e-30);
  EXPECT(bad_ggml == 0, "%s: %d values dequantized from the GGML blocks differ from the reference", info.name,
         bad_ggml);
}

void TestShape(const QuantKernelSet& set, QuantFormat f, size_t m, size_t n, size_t k, std::mt19937& rng) {
  const auto ggml = RandomGgml(f, n, k, rng);
  CheckProduct(set, f, ggml, RandomActivations(m, k, rng), m, n, k);
}

// Blocks whose integer sums reach the formats' bounds: every activation at +-127 (rows of
// +1, of -1, and alternating), every quant at its extremes (4-bit 0 and 15, 8-bit +-127,
// 5-bit 0 and 31, table indices 0 and 15; the super-blocks' sub-scales and mins at 0 and
// at their largest), the columns in each combination. The RVV Q4_0 kernel sums a block's
// nibbles in int16 lanes that wrap (32 x 15 x 127 > 2^15) and relies on sum(a x (q - 8))
// fitting them.
void TestExtremeSums(const QuantKernelSet& set, QuantFormat f, std::mt19937& rng) {
  const QuantFormatInfo& info = FormatInfo(f);
  const size_t n = QuantKernelSetTile(set) + 5, k = info.block_k == 32 ? 128 : 512, m = set.max_rows + 3;
  auto ggml = RandomGgml(f, n, k, rng);
  const uint8_t q8[] = {0x81, 0x7F, 0x81, 0x7F}, bytes[] = {0x00, 0xFF, 0x0F, 0xF0};
  for (size_t j = 0; j < n; ++j) {
    for (size_t b = 0; b < k / info.block_k; ++b) {
      uint8_t* p = ggml.data() + (j * (k / info.block_k) + b) * info.ggml_block_bytes;
      std::memset(p, f == QuantFormat::kQ8_0 ? q8[(j + (j / 4)) % 4] : bytes[j % 4], info.ggml_block_bytes);
      RandomScales(f, p, rng);
      // Q8_0's columns 2 and 3 mod 4 alternate sign along k, so the row's signs meet both.
      if (f == QuantFormat::kQ8_0 && j % 4 >= 2) {
        for (size_t i = 2; i < 34; i += 2) p[i] = 0x81 + 0x7F - p[i];
      }
    }
  }
  std::vector<uint16_t> x(m * k);
  for (size_t r = 0; r < m; ++r) {
    for (size_t i = 0; i < k; ++i) {
      const float v = r % 3 == 0 ? 1.0f : r % 3 == 1 ? -1.0f : (i % 2 ? 1.0f : -1.0f);
      x[r * k + i] = FloatToBf16(v);
    }
  }
  CheckProduct(set, f, ggml, x, m, n, k);
}

template <typename F>
bool Throws(F f, const char* needle) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return std::strstr(e.what(), needle) != nullptr;
  }
  return false;
}

void TestErrors(const QuantKernelSet& set, std::mt19937& rng) {
  const size_t t = QuantKernelSetTile(set);
  auto ggml = RandomGgml(QuantFormat::kQ4_0, 4, 64, rng);
  EXPECT(Throws([&] { CheckGgmlWeight(QuantFormat::kQ4_0, ggml.data(), 4, 48, t); }, "not a whole number"),
         "K = 48 is refused for Q4_0");
  EXPECT(Throws([&] { CheckGgmlWeight(QuantFormat::kQ4_K, ggml.data(), 1, 128, t); }, "256-value blocks"),
         "K = 128 is refused for Q4_K");
  const uint16_t nan = 0x7e00, inf = 0xfc00;
  std::memcpy(ggml.data() + 3 * 18, &nan, 2);  // row 1, block 1
  EXPECT(Throws([&] { CheckGgmlWeight(QuantFormat::kQ4_0, ggml.data(), 4, 64, t); }, "row 1, block 1 has a NaN"),
         "a NaN scale is refused, naming its row and block");
  std::memcpy(ggml.data() + 3 * 18, &inf, 2);
  EXPECT(Throws([&] { CheckGgmlWeight(QuantFormat::kQ4_0, ggml.data(), 4, 64, t); }, "infinite"),
         "an infinite scale is refused");
  if (set.tile == 0) {
    const size_t other = t > 16 ? t - 16 : 32;
    std::vector<uint8_t> packed(QuantLayoutBytes(QuantFormat::kQ4_0, 4, 64, other));
    std::vector<uint16_t> x(64, 0), y(4);
    QuantizedLinearArgs args;
    args.format = QuantFormat::kQ4_0;
    args.m = 1;
    args.n = 4;
    args.k = 64;
    args.input = x.data();
    args.input_stride = 64;
    args.weight = packed.data();
    args.tile = other;
    args.output = y.data();
    args.output_stride = 4;
    EXPECT(Throws([&] { QuantizedLinear(set, args, 1); }, "repack it on this machine"),
           "%s refuses a weight repacked for another tile width", set.name);
  }
  // NaN activations give NaN outputs, never silently finite ones.
  ggml = RandomGgml(QuantFormat::kQ8_0, 3, 64, rng);
  std::vector<uint8_t> packed(QuantLayoutBytes(QuantFormat::kQ8_0, 3, 64, t));
  RepackGgmlWeight(QuantFormat::kQ8_0, ggml.data(), 3, 64, t, packed.data(), 1);
  std::vector<uint16_t> x(64, FloatToBf16(0.5f));
  x[7] = FloatToBf16(NAN);
  std::vector<float> out(3);
  QuantizedLinearArgs args;
  args.format = QuantFormat::kQ8_0;
  args.m = 1;
  args.n = 3;
  args.k = 64;
  args.input = x.data();
  args.input_stride = 64;
  args.weight = packed.data();
  args.tile = t;
  QuantizedLinearF32(set, args, out.data(), 3, 1);
  EXPECT(std::isnan(out[0]) && std::isnan(out[1]) && std::isnan(out[2]), "%s: a NaN activation gives NaN outputs",
         set.name);
}

}  // namespace
}  // namespace rvascend

int main() {
  using namespace rvascend;
  std::mt19937 rng(1234);
  const auto sets = AvailableQuantKernelSets();
  if (const char* want = std::getenv("RVASCEND_EXPECT_QUANT_KERNEL_SET")) {
    // A CPU without the vector extension runs the portable kernels.
    const std::string expected = GetCpuFeatures().rvv ? want : "portable";
    EXPECT(sets.front()->name == expected, "the best quantized kernel set is %s, expected %s", sets.front()->name,
           expected.c_str());
  }
#if defined(__x86_64__)
  // An AVX2 CPU runs the hand-written AVX2 set, one with AVX-512 VNNI the VNNI set (their
  // absence would fall back silently).
  const char* best = GetCpuFeatures().avx512vnni ? "avx512vnni" : "avx2";
  EXPECT(!GetCpuFeatures().avx2 || std::string(sets.front()->name) == best,
         "the best quantized kernel set on this CPU is %s, expected %s", sets.front()->name, best);
#endif
  TestActivationQuantization(rng);
  for (const QuantKernelSet* set : sets) {
    const size_t t = QuantKernelSetTile(*set);
    std::printf("kernel set %s, tile %zu\n", set->name, t);
    TestSetQuantization(*set, rng);
    for (QuantFormat f : kFormats) {
      const size_t kb = FormatInfo(f).block_k;
      const size_t k1 = kb == 32 ? 96 : 256, k2 = kb == 32 ? 512 : 512;
      TestShape(*set, f, 1, 3 * t + 5, k2, rng);
      TestShape(*set, f, 1, 17, k1, rng);
      TestShape(*set, f, 2, t + 1, k1, rng);
      TestShape(*set, f, 3, 17, k2, rng);
      TestShape(*set, f, 4, t, k1, rng);
      TestShape(*set, f, 5, t - 1, k1, rng);
      TestShape(*set, f, 9, 1, kb == 32 ? 32 : 256, rng);
      // A prompt's rows: more than one call takes (max_rows), and 39 in one call, which
      // the x86 sets run against a tile decoded once (AVX2's Q4_K from 8 rows, Q6_K
      // from 2; the VNNI set's expanded tile from 32 rows: 4 x 9, 2, 1).
      TestShape(*set, f, set->max_rows + 15, t + 3, k2, rng);
      TestShape(*set, f, 39, 2 * t - 3, k1, rng);
      TestRowsAreTheirRowsAlone(*set, f, rng);
      TestExtremeSums(*set, f, rng);
    }
    TestErrors(*set, rng);
    // A set may leave a format out: the portable kernel serves that slot, at the set's tile.
    QuantKernelSet hollow = *set;
    for (QuantUkernel& u : hollow.ukernel) u = nullptr;
    for (QuantFormat f : kFormats) {
      EXPECT(QuantUkernelFor(hollow, f) == kPortableQuantKernels.ukernel[static_cast<int>(f)],
             "%s without its %s kernel does not fall back to the portable one", set->name, FormatInfo(f).name);
      TestShape(hollow, f, 3, t + 1, FormatInfo(f).block_k == 32 ? 96 : 256, rng);
    }
  }
  // A format crosses from Python by name: every kept name reads back as its format.
  for (QuantFormat f : kFormats) {
    EXPECT(FormatFromName(FormatInfo(f).name) == f, "FormatFromName(%s)", FormatInfo(f).name);
  }
  EXPECT(Throws([] { FormatFromName("Q5_9"); }, "Q5_9"), "an unknown format name is refused by name");
  return testing::Summary();
}
