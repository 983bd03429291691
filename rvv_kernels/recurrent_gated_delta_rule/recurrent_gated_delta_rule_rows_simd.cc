// The row loop of the CPU op (recurrent_gated_delta_rule_units.h) in GCC/Clang generic vectors (16
// FP32 lanes with AVX-512, 8 below it). Compiled once per ISA level the
// dispatcher may pick (BUILD: baseline, AVX2 + FMA, AVX-512, AVX-512 with
// BF16), each object defining the RowKernels named by RGDR_ROWS_SYMBOL; with
// AVX-512 BF16 the rows are rounded to BF16 by vcvtneps2bf16 (the same
// round-to-nearest-even and quiet NaNs; inputs below the normal range flush
// to zero).
#include <cmath>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_units.h"
#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/simd_vectors.h"

namespace rgdr {
namespace {

#define RGDR_INLINE RVASCEND_SIMD_INLINE

// One register of FP32 lanes (simd_vectors.h): with 16 lanes on AVX2 (two
// registers per value) the row loop spilled to the stack and ran slower than
// the SSE2 build; SSE2 runs 8 lanes as two registers.
using rvascend::simd::kLanes;
using rvascend::simd::LoadF;
using rvascend::simd::MulAdd;
using rvascend::simd::Splat;
using rvascend::simd::StoreF;
using rvascend::simd::Sum;
using rvascend::simd::VF;
using rvascend::simd::VH;
using rvascend::simd::VU;
typedef _Float16 VF16 __attribute__((vector_size(2 * kLanes)));

struct Bf16 {
  uint16_t bits;
};

// Element <-> FP32, kLanes at a time and one at a time (tails).
RGDR_INLINE VF LoadV(const float* p) { return LoadF(p); }
RGDR_INLINE VF LoadV(const Bf16* p) { return rvascend::simd::LoadBf16(&p->bits); }
RGDR_INLINE VF LoadV(const _Float16* p) {
  VF16 h;
  std::memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, VF);
}
RGDR_INLINE void StoreV(float* p, VF v) { StoreF(p, v); }
#if defined(__AVX512BF16__)
RGDR_INLINE void StoreV(Bf16* p, VF v) {
  __m512 x;
  std::memcpy(&x, &v, sizeof(x));
  const __m256bh h = _mm512_cvtneps_pbh(x);
  std::memcpy(p, &h, sizeof(h));
}
#else
RGDR_INLINE void StoreV(Bf16* p, VF v) { rvascend::simd::StoreBf16(&p->bits, v); }
#endif
RGDR_INLINE void StoreV(_Float16* p, VF v) {
  const VF16 h = __builtin_convertvector(v, VF16);
  std::memcpy(p, &h, sizeof(h));
}
RGDR_INLINE float Load1(const float* p) { return *p; }
RGDR_INLINE float Load1(const Bf16* p) { return rvascend::Bf16ToFloat(p->bits); }
RGDR_INLINE float Load1(const _Float16* p) { return static_cast<float>(*p); }
RGDR_INLINE void Store1(float* p, float v) { *p = v; }
RGDR_INLINE void Store1(Bf16* p, float v) { p->bits = rvascend::FloatToBf16(v); }
RGDR_INLINE void Store1(_Float16* p, float v) { *p = static_cast<_Float16>(v); }

// Rows are independent; kRows of them go through each pass together, so the
// k and q chunks are loaded once for all and the reductions of one row
// overlap the other's. The output needs no pass of its own:
// (c r + d k) . q = c (r . q) + d (k . q), with k . q once per token.
constexpr size_t kRows = kMaxRowsAtOnce;

// The token's d and output from the dot products r . k and r . q of its rows.
template <typename T, size_t R>
RGDR_INLINE void Finish(size_t v, const TokenInputs& tok, const VF acc_k[R], const VF acc_q[R], const float kv[R],
                        const float rq[R], float d[R]) {
  for (size_t r = 0; r < R; ++r) {
    d[r] = (Load1(static_cast<const T*>(tok.value) + v + r) - tok.c * (Sum(acc_k[r]) + kv[r])) * tok.beta;
    // out = (c r + d k) . q, from the old row's products: the update has no reduction.
    Store1(static_cast<T*>(tok.out) + v + r, tok.c * (Sum(acc_q[r]) + rq[r]) + d[r] * tok.kq);
  }
}

// The first token's dot products over R rows read from the read slot (converted,
// decayed per dimension when kEgk) and kept in FP32 in `row`: the update reads
// them from there, never again from the slot (loads from a line the update has
// just stored to stall the in-place decode step).
template <typename T, size_t R, bool kEgk>
RGDR_INLINE void FirstDots(size_t dk, const T* in, size_t v, const TokenInputs& tok, float* __restrict row,
                           float d[R]) {
  const size_t body = dk / kLanes * kLanes;
  const float* __restrict tk = tok.k;
  const float* __restrict tq = tok.q;
  const float* __restrict egk = tok.egk;
  VF acc_k[R] = {}, acc_q[R] = {};
  float kv[R] = {}, rq[R] = {};
  for (size_t i = 0; i < body; i += kLanes) {
    const VF k = LoadF(tk + i), q = LoadF(tq + i);
    for (size_t r = 0; r < R; ++r) {
      VF x = LoadV(in + r * dk + i);
      if (kEgk) x *= LoadF(egk + i);
      StoreF(row + r * dk + i, x);
      acc_k[r] = MulAdd(x, k, acc_k[r]);
      acc_q[r] = MulAdd(x, q, acc_q[r]);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    for (size_t i = body; i < dk; ++i) {
      float x = Load1(in + r * dk + i);
      if (kEgk) x *= egk[i];
      row[r * dk + i] = x;
      kv[r] = std::fma(x, tk[i], kv[r]);
      rq[r] = std::fma(x, tq[i], rq[r]);
    }
  }
  Finish<T, R>(v, tok, acc_k, acc_q, kv, rq, d);
}

// Token `tok`'s update r = c r + d k of the R rows in `row`, stored to its slot.
// With kNext (a later token follows), the same pass goes on with that token:
// its decay per dimension, the FP32 rows kept, and its dot products, so each
// row is read from scratch once per token, not twice; `d` becomes next's.
template <typename T, size_t R, bool kEgk, bool kNext>
RGDR_INLINE void Update(size_t dk, size_t v, const TokenInputs& tok, const TokenInputs* next, float* __restrict row,
                        float d[R]) {
  const size_t body = dk / kLanes * kLanes;
  const float* __restrict tk = tok.k;
  const float c = tok.c;
  const float* __restrict nk = kNext ? next->k : nullptr;
  const float* __restrict nq = kNext ? next->q : nullptr;
  const float* __restrict egk = kNext && kEgk ? next->egk : nullptr;
  T* dst = tok.state_row0 != nullptr ? static_cast<T*>(tok.state_row0) + v * dk : nullptr;  // null: no store
  VF acc_k[R] = {}, acc_q[R] = {};
  float kv[R] = {}, rq[R] = {};
  for (size_t i = 0; i < body; i += kLanes) {
    const VF k = LoadF(tk + i);
    for (size_t r = 0; r < R; ++r) {
      VF x = MulAdd(Splat(d[r]), k, c * LoadF(row + r * dk + i));
      if (dst != nullptr) StoreV(dst + r * dk + i, x);
      if (kNext) {
        if (kEgk) x *= LoadF(egk + i);
        StoreF(row + r * dk + i, x);
        acc_k[r] = MulAdd(x, LoadF(nk + i), acc_k[r]);
        acc_q[r] = MulAdd(x, LoadF(nq + i), acc_q[r]);
      }
    }
  }
  for (size_t r = 0; r < R; ++r) {
    for (size_t i = body; i < dk; ++i) {
      float x = std::fma(d[r], tk[i], c * row[r * dk + i]);
      if (dst != nullptr) Store1(dst + r * dk + i, x);
      if (kNext) {
        if (kEgk) x *= egk[i];
        row[r * dk + i] = x;
        kv[r] = std::fma(x, nk[i], kv[r]);
        rq[r] = std::fma(x, nq[i], rq[r]);
      }
    }
  }
  if (kNext) Finish<T, R>(v, *next, acc_k, acc_q, kv, rq, d);
}

template <typename T, size_t R, bool kEgk>
RGDR_INLINE void RunRowBlock(size_t dk, const T* in, size_t v, const TokenInputs* tokens, uint32_t len, float* row) {
  float d[R];
  FirstDots<T, R, kEgk>(dk, in, v, tokens[0], row, d);
  for (uint32_t t = 0; t + 1 < len; ++t) Update<T, R, kEgk, true>(dk, v, tokens[t], &tokens[t + 1], row, d);
  Update<T, R, kEgk, false>(dk, v, tokens[len - 1], nullptr, row, d);
}

#if defined(__AVX512F__)
// Rows of kChunks * 16 elements held in registers through all of the
// sequence's tokens (2 rows of 128: 16 of the 32 vector registers): per token
// one pass of FMAs for r . k and r . q, and one of the update, conversion and
// store; no FP32 row goes through memory. Used for Dk = 64 and 128.
template <typename T, size_t kChunks, bool kEgk>
RGDR_INLINE void RowBlockInRegisters(const T* in, size_t v, const TokenInputs* tokens, uint32_t len) {
  constexpr size_t R = kRows, dk = kChunks * kLanes;
  VF r[R][kChunks];
  for (size_t j = 0; j < R; ++j) {
    for (size_t i = 0; i < kChunks; ++i) r[j][i] = LoadV(in + j * dk + i * kLanes);
  }
  for (uint32_t t = 0; t < len; ++t) {
    const TokenInputs& tok = tokens[t];
    const float* __restrict tk = tok.k;
    const float* __restrict tq = tok.q;
    const float c = tok.c;
    VF acc_k[R] = {}, acc_q[R] = {};
    for (size_t i = 0; i < kChunks; ++i) {
      const VF k = LoadF(tk + i * kLanes), q = LoadF(tq + i * kLanes);
      const VF e = kEgk ? LoadF(tok.egk + i * kLanes) : VF{};
      for (size_t j = 0; j < R; ++j) {
        if (kEgk) r[j][i] *= e;
        acc_k[j] = MulAdd(r[j][i], k, acc_k[j]);
        acc_q[j] = MulAdd(r[j][i], q, acc_q[j]);
      }
    }
    float d[R];
    for (size_t j = 0; j < R; ++j) {
      d[j] = (Load1(static_cast<const T*>(tok.value) + v + j) - c * Sum(acc_k[j])) * tok.beta;
      Store1(static_cast<T*>(tok.out) + v + j, c * Sum(acc_q[j]) + d[j] * tok.kq);
    }
    T* dst = tok.state_row0 != nullptr ? static_cast<T*>(tok.state_row0) + v * dk : nullptr;
    for (size_t i = 0; i < kChunks; ++i) {
      const VF k = LoadF(tk + i * kLanes);
      for (size_t j = 0; j < R; ++j) {
        r[j][i] = MulAdd(Splat(d[j]), k, c * r[j][i]);
        if (dst != nullptr) StoreV(dst + j * dk + i * kLanes, r[j][i]);
      }
    }
  }
}
#endif

template <typename T, bool kEgk>
RGDR_INLINE void RunRowsT(size_t dk, size_t dv, const T* src, const TokenInputs* tokens, uint32_t len, float* row) {
  size_t v = 0;
#if defined(__AVX512F__)
  if (dk == 128) {
    for (; v + kRows <= dv; v += kRows) RowBlockInRegisters<T, 8, kEgk>(src + v * dk, v, tokens, len);
  } else if (dk == 64) {
    for (; v + kRows <= dv; v += kRows) RowBlockInRegisters<T, 4, kEgk>(src + v * dk, v, tokens, len);
  }
#endif
  for (; v + kRows <= dv; v += kRows) RunRowBlock<T, kRows, kEgk>(dk, src + v * dk, v, tokens, len, row);
  for (; v < dv; ++v) RunRowBlock<T, 1, kEgk>(dk, src + v * dk, v, tokens, len, row);
}

template <typename T>
RGDR_INLINE void RunRowsT(size_t dk, size_t dv, const T* src, const TokenInputs* tokens, uint32_t len, float* row) {
  if (tokens[0].egk != nullptr) {
    RunRowsT<T, true>(dk, dv, src, tokens, len, row);
  } else {
    RunRowsT<T, false>(dk, dv, src, tokens, len, row);
  }
}

void RunRows(Elem elem, size_t dk, size_t dv, const void* src, const TokenInputs* tokens, uint32_t len,
             float* row) {
  switch (elem) {
    case Elem::kFloat32: RunRowsT(dk, dv, static_cast<const float*>(src), tokens, len, row); break;
    case Elem::kFloat16: RunRowsT(dk, dv, static_cast<const _Float16*>(src), tokens, len, row); break;
    default: RunRowsT(dk, dv, static_cast<const Bf16*>(src), tokens, len, row); break;
  }
}

template <typename T>
RGDR_INLINE float PrepareT(const T* query, const T* key, size_t dk, float scale, float* q, float* k) {
  const size_t body = dk / kLanes * kLanes;
  VF acc = {};
  for (size_t i = 0; i < body; i += kLanes) {
    const VF qq = LoadV(query + i) * scale, kk = LoadV(key + i);
    StoreF(q + i, qq);
    StoreF(k + i, kk);
    acc += qq * kk;
  }
  float tail = 0.0f;
  for (size_t i = body; i < dk; ++i) {
    q[i] = Load1(query + i) * scale;
    k[i] = Load1(key + i);
    tail += q[i] * k[i];
  }
  return Sum(acc) + tail;
}

float Prepare(Elem elem, const void* query, const void* key, size_t offset, size_t dk, float scale, float* q,
              float* k) {
  switch (elem) {
    case Elem::kFloat32:
      return PrepareT(static_cast<const float*>(query) + offset, static_cast<const float*>(key) + offset, dk, scale,
                      q, k);
    case Elem::kFloat16:
      return PrepareT(static_cast<const _Float16*>(query) + offset, static_cast<const _Float16*>(key) + offset, dk,
                      scale, q, k);
    default:
      return PrepareT(static_cast<const Bf16*>(query) + offset, static_cast<const Bf16*>(key) + offset, dk, scale,
                      q, k);
  }
}

}  // namespace

#define RGDR_STRINGIFY2(x) #x
#define RGDR_STRINGIFY(x) RGDR_STRINGIFY2(x)
extern const RowKernels RGDR_ROWS_SYMBOL;  // external linkage: the dispatcher names it
const RowKernels RGDR_ROWS_SYMBOL{RGDR_STRINGIFY(RGDR_ROWS_NAME), RunRows, Prepare};

}  // namespace rgdr
