#include "cpu/deltanet_decode.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/elem_values.h"
#include "cpu/rgdr_cpu.h"

namespace rgdr {
namespace {

// x * rsqrt(sum(x^2) + 1e-6) * scale over n values.
void L2Norm(float* x, size_t n, float scale) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float r = scale / std::sqrt(sum + 1e-6f);
  for (size_t i = 0; i < n; ++i) x[i] *= r;
}

}  // namespace

void DeltaNetDecodeCpu(const DeltaNetDecodeArgs& a, size_t num_threads) {
  const size_t key = static_cast<size_t>(a.nk) * a.dk, value = static_cast<size_t>(a.nv) * a.dv;
  const size_t c_dim = 2 * key + value, taps = a.kernel, kept = taps - 1;
  if (taps < 2) throw std::invalid_argument("deltanet_decode: the conv kernel needs at least 2 taps");
  std::vector<bool> used(a.num_slots, false);
  for (uint32_t t = 0; t < a.t; ++t) {
    const int64_t s = a.slots[t];
    if (s < 0 || s >= static_cast<int64_t>(a.num_slots)) {
      throw std::invalid_argument("deltanet_decode: slot " + std::to_string(s) + " of token " + std::to_string(t) +
                                  " is outside the state pool of " + std::to_string(a.num_slots) + " slots");
    }
    if (used[static_cast<size_t>(s)]) {
      throw std::invalid_argument("deltanet_decode: slot " + std::to_string(s) + " is used by two sequences");
    }
    used[static_cast<size_t>(s)] = true;
  }
  std::vector<float> q(a.t * key), k(a.t * key), v(a.t * value), beta(a.t * a.nv), g(a.t * a.nv);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(a.dk));
  for (uint32_t t = 0; t < a.t; ++t) {
    const size_t row = t * a.mixed_stride, conv0 = static_cast<size_t>(a.slots[t]) * c_dim * kept;
    for (size_t c = 0; c < c_dim; ++c) {
      const size_t s0 = conv0 + c * kept, w0 = c * taps;
      const float x = LoadElem(a.elem, a.mixed, row + c);
      float sum = 0.0f;
      for (size_t j = 0; j < kept; ++j) sum += LoadElem(a.elem, a.conv_state, s0 + j) * LoadElem(a.elem, a.conv_weight, w0 + j);
      sum += x * LoadElem(a.elem, a.conv_weight, w0 + kept);
      // The window slides by one: the oldest input leaves, this token's enters.
      for (size_t j = 0; j + 1 < kept; ++j) StoreElem(a.elem, a.conv_state, s0 + j, LoadElem(a.elem, a.conv_state, s0 + j + 1));
      StoreElem(a.elem, a.conv_state, s0 + kept - 1, x);
      const float y = RoundToElem(a.elem, sum / (1.0f + std::exp(-sum)));
      if (c < key) {
        q[t * key + c] = y;
      } else if (c < 2 * key) {
        k[t * key + c - key] = y;
      } else {
        v[t * value + c - 2 * key] = y;
      }
    }
    for (uint32_t h = 0; h < a.nk; ++h) {
      L2Norm(&q[t * key + h * a.dk], a.dk, q_scale);
      L2Norm(&k[t * key + h * a.dk], a.dk, 1.0f);
    }
    for (uint32_t h = 0; h < a.nv; ++h) {
      const size_t i = t * a.gate_stride + h;
      beta[t * a.nv + h] = RoundToElem(a.elem, 1.0f / (1.0f + std::exp(-LoadElem(a.elem, a.b, i))));
      const float x = LoadElem(a.elem, a.a, i) + LoadElem(a.elem, a.dt_bias, h);
      const float softplus = x > 20.0f ? x : std::log1p(std::exp(x));
      g[t * a.nv + h] = -std::exp(LoadElem(a.elem, a.a_log, h)) * softplus;
    }
  }
  std::vector<float> o(a.t * value);
  std::vector<int64_t> lens(a.t, 1);
  RgdrArgs r;
  r.elem = Elem::kFloat32;
  r.t = r.b = a.t;
  r.nk = a.nk;
  r.nv = a.nv;
  r.dk = a.dk;
  r.dv = a.dv;
  r.num_slots = a.num_slots;
  r.query = q.data();
  r.key = k.data();
  r.value = v.data();
  r.beta = beta.data();
  r.g = g.data();
  r.state = a.ssm_state;
  r.seq_lens = lens.data();
  r.seq_lens_int64 = true;
  r.indices = a.slots;
  r.indices_int64 = true;
  r.out = o.data();
  r.scale = 1.0f;
  RecurrentGatedDeltaRuleCpu(r, num_threads);
  for (uint32_t t = 0; t < a.t; ++t) {
    for (uint32_t h = 0; h < a.nv; ++h) {
      float* x = &o[t * value + h * a.dv];
      float squares = 0.0f;
      for (size_t i = 0; i < a.dv; ++i) {
        x[i] = RoundToElem(a.elem, x[i]);
        squares += x[i] * x[i];
      }
      const float rms = 1.0f / std::sqrt(squares / static_cast<float>(a.dv) + a.norm_eps);
      for (size_t i = 0; i < a.dv; ++i) {
        const float n = RoundToElem(a.elem, x[i] * rms);
        const float w = RoundToElem(a.elem, LoadElem(a.elem, a.norm_weight, i) * n);
        const float z = LoadElem(a.elem, a.z, t * a.z_stride + h * a.dv + i);
        StoreElem(a.elem, a.out, t * value + h * a.dv + i, w * (z / (1.0f + std::exp(-z))));
      }
    }
  }
}

}  // namespace rgdr
