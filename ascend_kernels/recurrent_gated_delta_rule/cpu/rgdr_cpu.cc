#include "cpu/rgdr_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "rvv_kernels/thread_pool.h"

namespace rgdr {
namespace {

inline float Load(const void* p, size_t i, Elem e) {
  switch (e) {
    case Elem::kFloat32:
      return static_cast<const float*>(p)[i];
    case Elem::kFloat16:
      return static_cast<float>(static_cast<const _Float16*>(p)[i]);
    default: {
      const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
  }
}

inline void Store(void* p, size_t i, float f, Elem e) {
  switch (e) {
    case Elem::kFloat32:
      static_cast<float*>(p)[i] = f;
      return;
    case Elem::kFloat16:
      static_cast<_Float16*>(p)[i] = static_cast<_Float16>(f);
      return;
    default: {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      const uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((u >> 16) | 0x40)
                                                          : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      static_cast<uint16_t*>(p)[i] = h;
    }
  }
}

int64_t Index(const void* p, size_t i, bool is64) {
  return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

// The hot loops: plain FP32 so GCC/clang vectorise them for the build's ISA.
__attribute__((target_clones("avx512f", "avx2", "default")))
float Dot(const float* __restrict a, const float* __restrict b, size_t n) {
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target_clones("avx512f", "avx2", "default")))
void Axpy(float* __restrict y, const float* __restrict x, float a, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

__attribute__((target_clones("avx512f", "avx2", "default")))
void Scale(float* __restrict y, const float* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] *= s[i];
}

__attribute__((target_clones("avx512f", "avx2", "default")))
void ScaleBy(float* __restrict y, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] *= s;
}

struct Unit {
  uint32_t b, h;
  int64_t seq0;
  uint32_t len;
  int64_t read_slot;
};

void RunUnit(const RgdrArgs& a, const Unit& u, std::vector<float>& S, std::vector<float>& qk) {
  const size_t dk = a.dk, dv = a.dv;
  const uint32_t hk = u.h / (a.nv / a.nk);
  S.resize(dv * dk);
  qk.resize(2 * dk + dk);
  float* q = qk.data();
  float* k = q + dk;
  float* egk = k + dk;
  const size_t state_head = (static_cast<size_t>(u.read_slot) * a.nv + u.h) * dv * dk;
  for (size_t i = 0; i < dv * dk; ++i) S[i] = Load(a.state, state_head + i, a.elem);
  for (uint32_t t = 0; t < u.len; ++t) {
    const size_t tok = static_cast<size_t>(u.seq0) + t;
    const size_t qk_off = (tok * a.nk + hk) * dk;
    for (size_t i = 0; i < dk; ++i) {
      q[i] = Load(a.query, qk_off + i, a.elem) * a.scale;
      k[i] = Load(a.key, qk_off + i, a.elem);
    }
    const size_t th = tok * a.nv + u.h;
    if (a.g != nullptr) ScaleBy(S.data(), std::exp(a.g[th]), dv * dk);
    if (a.gk != nullptr) {
      if (a.gk_per_dim) {
        for (size_t i = 0; i < dk; ++i) egk[i] = std::exp(a.gk[th * dk + i]);
        for (size_t v = 0; v < dv; ++v) Scale(S.data() + v * dk, egk, dk);
      } else {
        ScaleBy(S.data(), std::exp(a.gk[th]), dv * dk);
      }
    }
    const float beta = Load(a.beta, th, a.elem);
    const size_t vo = th * dv;
    for (size_t v = 0; v < dv; ++v) {
      float* row = S.data() + v * dk;
      const float d = (Load(a.value, vo + v, a.elem) - Dot(row, k, dk)) * beta;
      Axpy(row, k, d, dk);
      Store(a.out, vo + v, Dot(row, q, dk), a.elem);
    }
    const int64_t slot = Index(a.indices, tok, a.indices_int64);
    const size_t dst = (static_cast<size_t>(slot) * a.nv + u.h) * dv * dk;
    for (size_t i = 0; i < dv * dk; ++i) Store(a.state, dst + i, S[i], a.elem);
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
  thread_local std::vector<float> S, qk;
  rvascend::ThreadPool::Global().ParallelFor(units.size(), num_threads,
                                             [&](size_t i) { RunUnit(a, units[i], S, qk); });
}

}  // namespace rgdr
