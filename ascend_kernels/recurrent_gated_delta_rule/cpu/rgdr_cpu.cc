#include "cpu/rgdr_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/thread_pool.h"

namespace rgdr {
namespace {

// Element conversions, one type per template instance so the row loops
// vectorise (a per-element switch on the dtype would not).
struct Bf16 {
  uint16_t bits;
};

inline float ToF32(float x) { return x; }
inline float ToF32(_Float16 x) { return static_cast<float>(x); }
inline float ToF32(Bf16 x) { return rvascend::Bf16ToFloat(x.bits); }
template <typename T>
inline T FromF32(float f);
template <>
inline float FromF32<float>(float f) { return f; }
template <>
inline _Float16 FromF32<_Float16>(float f) { return static_cast<_Float16>(f); }
template <>
inline Bf16 FromF32<Bf16>(float f) { return Bf16{rvascend::FloatToBf16(f)}; }

int64_t Index(const void* p, size_t i, bool is64) {
  return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

// Explicit 16-lane vectors: the dot products are reductions, which the
// compiler may not reorder (and so not vectorise) on its own without
// fast-math. Lanes are summed in a fixed order, so results are reproducible.
typedef float V16 __attribute__((vector_size(64)));
constexpr size_t kLanes = 16;

inline V16 LoadV(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreV(float* p, V16 v) { std::memcpy(p, &v, sizeof(v)); }
inline float Sum(V16 v) {
  float s = 0.0f;
  for (size_t i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

inline float DotRow(const float* __restrict a, const float* __restrict b, size_t n) {
  V16 acc = V16{};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc += LoadV(a + i) * LoadV(b + i);
  float s = Sum(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// row = c * row + d * k; returns row . q (after the update).
inline float UpdateRow(float* __restrict row, const float* __restrict k, const float* __restrict q, float c, float d,
                       size_t n) {
  V16 acc = V16{};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V16 r = c * LoadV(row + i) + d * LoadV(k + i);
    StoreV(row + i, r);
    acc += r * LoadV(q + i);
  }
  float s = Sum(acc);
  for (; i < n; ++i) {
    row[i] = c * row[i] + d * k[i];
    s += row[i] * q[i];
  }
  return s;
}

typedef uint32_t U16x __attribute__((vector_size(64)));
typedef uint16_t H16x __attribute__((vector_size(32)));

// Whole-state conversions, 16 lanes at a time (the scalar forms above are
// for the tails and for per-row values).
template <typename T>
inline void LoadState(float* __restrict dst, const T* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = ToF32(src[i]);
}
template <>
inline void LoadState<Bf16>(float* __restrict dst, const Bf16* __restrict src, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    H16x h;
    std::memcpy(&h, src + i, sizeof(h));
    const U16x u = __builtin_convertvector(h, U16x) << 16;
    std::memcpy(dst + i, &u, sizeof(u));
  }
  for (; i < n; ++i) dst[i] = ToF32(src[i]);
}

template <typename T>
inline void StoreState(T* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FromF32<T>(src[i]);
}
template <>
inline void StoreState<Bf16>(Bf16* __restrict dst, const float* __restrict src, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    U16x bits;
    std::memcpy(&bits, src + i, sizeof(bits));
    const U16x rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const U16x nan = (bits & 0x7fffffffu) > 0x7f800000u;
    const H16x h = __builtin_convertvector((rounded & ~nan) | (((bits >> 16) | 0x40u) & nan), H16x);
    std::memcpy(dst + i, &h, sizeof(h));
  }
  for (; i < n; ++i) dst[i] = FromF32<Bf16>(src[i]);
}

struct Unit {
  uint32_t b, h;
  int64_t seq0;
  uint32_t len;
  int64_t read_slot;
};

// One (sequence, value head): per token and state row, the decay, the delta
// update and the read-out are fused into three passes over a row that stays
// in L1: kv = e * (S.k); S = e*S + d*k; o = S.q.
template <typename T>
inline void RunUnit(const RgdrArgs& a, const Unit& u, float* __restrict S, float* __restrict scratch) {
  const size_t dk = a.dk, dv = a.dv;
  const uint32_t hk = u.h / (a.nv / a.nk);
  float* __restrict q = scratch;
  float* __restrict k = q + dk;
  float* __restrict egk = k + dk;
  const T* state = static_cast<const T*>(a.state);
  const T* src = state + (static_cast<size_t>(u.read_slot) * a.nv + u.h) * dv * dk;
  LoadState(S, src, dv * dk);
  for (uint32_t t = 0; t < u.len; ++t) {
    const size_t tok = static_cast<size_t>(u.seq0) + t;
    const T* qs = static_cast<const T*>(a.query) + (tok * a.nk + hk) * dk;
    const T* ks = static_cast<const T*>(a.key) + (tok * a.nk + hk) * dk;
    for (size_t i = 0; i < dk; ++i) {
      q[i] = ToF32(qs[i]) * a.scale;
      k[i] = ToF32(ks[i]);
    }
    const size_t th = tok * a.nv + u.h;
    float e = a.g != nullptr ? std::exp(a.g[th]) : 1.0f;
    const bool per_dim = a.gk != nullptr && a.gk_per_dim;
    if (a.gk != nullptr && !per_dim) e *= std::exp(a.gk[th]);
    if (per_dim) {
      for (size_t i = 0; i < dk; ++i) egk[i] = std::exp(a.gk[th * dk + i]) * e;
    }
    const float beta = ToF32(static_cast<const T*>(a.beta)[th]);
    const T* vs = static_cast<const T*>(a.value) + th * dv;
    T* out = static_cast<T*>(a.out) + th * dv;
    for (size_t v = 0; v < dv; ++v) {
      float* __restrict row = S + v * dk;
      if (per_dim) {
        for (size_t i = 0; i < dk; ++i) row[i] *= egk[i];
      }
      const float c = per_dim ? 1.0f : e;
      const float d = (ToF32(vs[v]) - c * DotRow(row, k, dk)) * beta;
      out[v] = FromF32<T>(UpdateRow(row, k, q, c, d, dk));
    }
    T* dst = static_cast<T*>(a.state) + (static_cast<size_t>(Index(a.indices, tok, a.indices_int64)) * a.nv + u.h) * dv * dk;
    StoreState(dst, S, dv * dk);
  }
}

// On x86-64 compiled once per ISA level; RunUnit is inlined into each so its
// loops use the widest vectors the CPU reports. Elsewhere (riscv64) one build.
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void RunUnits(const RgdrArgs& a, const Unit* units, size_t n, float* S, float* scratch) {
  for (size_t i = 0; i < n; ++i) {
    switch (a.elem) {
      case Elem::kFloat32: RunUnit<float>(a, units[i], S, scratch); break;
      case Elem::kFloat16: RunUnit<_Float16>(a, units[i], S, scratch); break;
      default: RunUnit<Bf16>(a, units[i], S, scratch); break;
    }
  }
}

}  // namespace

void RecurrentGatedDeltaRuleCpu(const RgdrArgs& a, size_t num_threads) {
  std::vector<Unit> units;
  int64_t seq0 = 0;
  for (uint32_t b = 0; b < a.b; ++b) {
    const int64_t len = Index(a.seq_lens, b, a.seq_lens_int64);
    if (len > 0) {
      int64_t read = Index(a.indices, seq0, a.indices_int64);
      if (a.accepted != nullptr && a.accepted[b] > 0 && a.accepted[b] <= len) {
        read = Index(a.indices, seq0 + a.accepted[b] - 1, a.indices_int64);
      }
      for (uint32_t h = 0; h < a.nv; ++h) units.push_back({b, h, seq0, static_cast<uint32_t>(len), read});
      seq0 += len;
    }
  }
  // A thread's scratch lives across its units (no allocation per unit).
  const size_t state_elems = static_cast<size_t>(a.dv) * a.dk;
  const size_t chunk = (units.size() + 4 * num_threads - 1) / (4 * num_threads);
  const size_t tasks = chunk ? (units.size() + chunk - 1) / chunk : 0;
  rvascend::ThreadPool::Global().ParallelFor(tasks, num_threads, [&](size_t task) {
    thread_local std::vector<float> S, scratch;
    S.resize(state_elems);
    scratch.resize(3 * static_cast<size_t>(a.dk));
    const size_t begin = task * chunk;
    const size_t end = begin + chunk < units.size() ? begin + chunk : units.size();
    RunUnits(a, units.data() + begin, end - begin, S.data(), scratch.data());
  });
}

}  // namespace rgdr
