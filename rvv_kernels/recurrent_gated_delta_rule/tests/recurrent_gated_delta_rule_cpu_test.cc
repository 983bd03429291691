// The CPU op against an FP64 statement of recurrent_gated_delta_rule, for
// every row kernel set this build has and the CPU runs (portable, AVX2,
// AVX-512 on x86-64; portable and RVV on riscv64, under QEMU at four VLENs).
//
// Tolerances: the state is stored in the element type once per token, so a
// stored state element may differ from the FP64 state by 2 of its ulps plus
// the FP32 work's error; outputs are compared to the FP64 output relative to
// the output row's largest magnitude. Slots nothing writes must stay
// bit-identical.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_cpu.h"
#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/base/cpu_features.h"
#include "rvv_kernels/base/kernel_testing.h"

namespace rgdr {
namespace {

struct Case {
  const char* name;
  uint32_t nk, nv, dk, dv;
  std::vector<int32_t> lens;       // per sequence
  std::vector<int32_t> accepted;   // empty: none
  bool g, gk, gk_per_dim;
  uint32_t slots;
  bool last_state_only = false;  // a prompt: only each sequence's last token writes its slot
};

double ToD(Elem e, const std::vector<uint16_t>& h, const std::vector<float>& f, size_t i) {
  if (e == Elem::kFloat32) return f[i];
  if (e == Elem::kFloat16) {
    _Float16 x;
    std::memcpy(&x, &h[i], 2);
    return static_cast<double>(x);
  }
  return rvascend::Bf16ToFloat(h[i]);
}

// Buffers of one element type: 16-bit patterns or FP32.
struct Tensor {
  Elem e;
  std::vector<uint16_t> h;
  std::vector<float> f;
  Tensor(Elem elem, size_t n) : e(elem), h(elem == Elem::kFloat32 ? 0 : n), f(elem == Elem::kFloat32 ? n : 0) {}
  void Set(size_t i, double x) {
    if (e == Elem::kFloat32) {
      f[i] = static_cast<float>(x);
    } else if (e == Elem::kFloat16) {
      const _Float16 v = static_cast<_Float16>(static_cast<float>(x));
      std::memcpy(&h[i], &v, 2);
    } else {
      h[i] = rvascend::FloatToBf16(static_cast<float>(x));
    }
  }
  double Get(size_t i) const { return ToD(e, h, f, i); }
  void* data() { return e == Elem::kFloat32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  double Ulp(double x) const {
    if (e == Elem::kFloat32) return std::fabs(x) * 1.2e-7 + 1e-30;
    if (e == Elem::kFloat16) return std::max(std::fabs(x) * 9.8e-4, 6e-8);
    return rvascend::testing::Bf16Ulp(x);
  }
};

void Run(const Case& c, Elem e, const std::string& rows, std::mt19937& rng) {
  const uint32_t b = static_cast<uint32_t>(c.lens.size());
  uint32_t t = 0;
  for (int32_t n : c.lens) t += static_cast<uint32_t>(n);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const size_t qn = static_cast<size_t>(t) * c.nk * c.dk, vn = static_cast<size_t>(t) * c.nv * c.dv;
  const size_t sn = static_cast<size_t>(c.slots) * c.nv * c.dv * c.dk;
  Tensor q(e, qn), k(e, qn), v(e, vn), beta(e, static_cast<size_t>(t) * c.nv), state(e, sn), out(e, vn);
  for (size_t i = 0; i < qn; ++i) q.Set(i, normal(rng) * 0.3);
  for (size_t i = 0; i < qn; ++i) k.Set(i, normal(rng) * 0.3);
  for (size_t i = 0; i < vn; ++i) v.Set(i, normal(rng));
  for (size_t i = 0; i < beta.h.size() + beta.f.size(); ++i) beta.Set(i, unit(rng));
  for (size_t i = 0; i < sn; ++i) state.Set(i, normal(rng) * 0.2);
  std::vector<float> g(static_cast<size_t>(t) * c.nv), gk(static_cast<size_t>(t) * c.nv * (c.gk_per_dim ? c.dk : 1));
  for (auto& x : g) x = static_cast<float>(-unit(rng));
  for (auto& x : gk) x = static_cast<float>(-0.5 * unit(rng));
  // Slots: sequence i's tokens get distinct slots from the end of the pool down.
  std::vector<int32_t> idx(t);
  for (uint32_t i = 0; i < t; ++i) idx[i] = static_cast<int32_t>(c.slots - 1 - i);
  const Tensor before = state;

  // FP64 reference.
  std::vector<double> ref_state(sn), ref_out(vn);
  for (size_t i = 0; i < sn; ++i) ref_state[i] = before.Get(i);
  std::vector<bool> written(c.slots, false);
  const size_t row = static_cast<size_t>(c.dv) * c.dk;
  int32_t seq0 = 0;
  for (uint32_t s = 0; s < b; ++s) {
    const int32_t len = c.lens[s];
    if (len <= 0) continue;
    int32_t read = idx[seq0];
    if (!c.accepted.empty() && c.accepted[s] > 0 && c.accepted[s] <= len) read = idx[seq0 + c.accepted[s] - 1];
    for (uint32_t h = 0; h < c.nv; ++h) {
      const uint32_t hk = h / (c.nv / c.nk);
      std::vector<double> S(row);
      for (size_t i = 0; i < row; ++i) S[i] = before.Get((static_cast<size_t>(read) * c.nv + h) * row + i);
      for (int32_t tt = 0; tt < len; ++tt) {
        const size_t tok = static_cast<size_t>(seq0 + tt), th = tok * c.nv + h;
        for (uint32_t r = 0; r < c.dv; ++r) {
          double kv = 0;
          for (uint32_t i = 0; i < c.dk; ++i) {
            double decay = c.g ? std::exp(static_cast<double>(g[th])) : 1.0;
            if (c.gk) decay *= std::exp(static_cast<double>(c.gk_per_dim ? gk[th * c.dk + i] : gk[th]));
            S[r * c.dk + i] *= decay;
            kv += S[r * c.dk + i] * k.Get((tok * c.nk + hk) * c.dk + i);
          }
          const double d = (v.Get(th * c.dv + r) - kv) * beta.Get(th);
          double o = 0;
          for (uint32_t i = 0; i < c.dk; ++i) {
            S[r * c.dk + i] += d * k.Get((tok * c.nk + hk) * c.dk + i);
            o += S[r * c.dk + i] * q.Get((tok * c.nk + hk) * c.dk + i) / std::sqrt(static_cast<double>(c.dk));
          }
          ref_out[th * c.dv + r] = o;
        }
        if (c.last_state_only && tt + 1 < len) continue;
        for (size_t i = 0; i < row; ++i) ref_state[(static_cast<size_t>(idx[tok]) * c.nv + h) * row + i] = S[i];
        written[idx[tok]] = true;
      }
    }
    seq0 += len;
  }

  RgdrArgs a;
  a.elem = e;
  a.t = t, a.b = b, a.nk = c.nk, a.nv = c.nv, a.dk = c.dk, a.dv = c.dv, a.num_slots = c.slots;
  a.query = q.data(), a.key = k.data(), a.value = v.data(), a.beta = beta.data();
  a.g = c.g ? g.data() : nullptr;
  a.gk = c.gk ? gk.data() : nullptr;
  a.gk_per_dim = c.gk_per_dim;
  a.state = state.data();
  a.seq_lens = c.lens.data();
  a.indices = idx.data();
  a.accepted = c.accepted.empty() ? nullptr : c.accepted.data();
  a.out = out.data();
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dk)));
  a.last_state_only = c.last_state_only;
  RecurrentGatedDeltaRuleCpu(a, 2, rows);

  const char* en = e == Elem::kFloat32 ? "f32" : e == Elem::kFloat16 ? "f16" : "bf16";
  size_t bad_state = 0, bad_out = 0, touched = 0;
  double worst_state = 0, worst_out = 0;
  for (uint32_t slot = 0; slot < c.slots; ++slot) {
    for (size_t i = 0; i < static_cast<size_t>(c.nv) * row; ++i) {
      const size_t at = static_cast<size_t>(slot) * c.nv * row + i;
      if (!written[slot]) {
        const bool same = e == Elem::kFloat32 ? std::memcmp(&state.f[at], &before.f[at], 4) == 0
                                              : state.h[at] == before.h[at];
        if (!same) ++touched;
        continue;
      }
      const double want = ref_state[at], got = state.Get(at);
      const double err = std::fabs(got - want) / (2 * state.Ulp(want) + 1e-5 * (1 + std::fabs(want)));
      worst_state = std::max(worst_state, err);
      if (err > 1.0) ++bad_state;
    }
  }
  for (size_t r = 0; r < vn / c.dv; ++r) {
    double scale = 0;
    for (uint32_t i = 0; i < c.dv; ++i) scale = std::max(scale, std::fabs(ref_out[r * c.dv + i]));
    for (uint32_t i = 0; i < c.dv; ++i) {
      const double want = ref_out[r * c.dv + i], got = out.Get(r * c.dv + i);
      const double err = std::fabs(got - want) / (2 * out.Ulp(scale) + 1e-5 * (1 + scale));
      worst_out = std::max(worst_out, err);
      if (err > 1.0) ++bad_out;
    }
  }
  EXPECT(bad_state == 0, "%s %s %s: %zu state elements off (worst %.2f of tolerance)", c.name, en, rows.c_str(),
         bad_state, worst_state);
  EXPECT(bad_out == 0, "%s %s %s: %zu outputs off (worst %.2f of tolerance)", c.name, en, rows.c_str(), bad_out,
         worst_out);
  EXPECT(touched == 0, "%s %s %s: %zu elements of unwritten slots changed", c.name, en, rows.c_str(), touched);
}


// Token-count invariance: the state after token j of a run of n tokens, and the
// outputs up to it, are bit for bit those of a run of the first j + 1 tokens alone.
// A speculative verify step keeps the state after each drafted token and the next
// step goes on from the last accepted one; decoding would have run them one by one.
void RunPrefixes(const Case& c, Elem e, const std::string& rows, std::mt19937& rng) {
  const uint32_t n = static_cast<uint32_t>(c.lens[0]);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const size_t qn = static_cast<size_t>(n) * c.nk * c.dk, vn = static_cast<size_t>(n) * c.nv * c.dv;
  const size_t row = static_cast<size_t>(c.nv) * c.dv * c.dk, sn = (n + 1) * row;
  Tensor q(e, qn), k(e, qn), v(e, vn), beta(e, static_cast<size_t>(n) * c.nv), init(e, sn);
  for (size_t i = 0; i < qn; ++i) q.Set(i, normal(rng) * 0.3);
  for (size_t i = 0; i < qn; ++i) k.Set(i, normal(rng) * 0.3);
  for (size_t i = 0; i < vn; ++i) v.Set(i, normal(rng));
  for (size_t i = 0; i < static_cast<size_t>(n) * c.nv; ++i) beta.Set(i, unit(rng));
  for (size_t i = 0; i < sn; ++i) init.Set(i, normal(rng) * 0.2);
  std::vector<float> g(static_cast<size_t>(n) * c.nv), gk(static_cast<size_t>(n) * c.nv * (c.gk_per_dim ? c.dk : 1));
  for (auto& x : g) x = static_cast<float>(-unit(rng));
  for (auto& x : gk) x = static_cast<float>(-0.5 * unit(rng));
  std::vector<int32_t> idx(n), len(1);
  for (uint32_t i = 0; i < n; ++i) idx[i] = static_cast<int32_t>(i);
  auto run = [&](uint32_t tokens, Tensor& state, Tensor& out) {
    RgdrArgs a;
    a.elem = e;
    a.t = tokens, a.b = 1, a.nk = c.nk, a.nv = c.nv, a.dk = c.dk, a.dv = c.dv, a.num_slots = n + 1;
    a.query = q.data(), a.key = k.data(), a.value = v.data(), a.beta = beta.data();
    a.g = c.g ? g.data() : nullptr;
    a.gk = c.gk ? gk.data() : nullptr;
    a.gk_per_dim = c.gk_per_dim;
    a.state = state.data();
    len[0] = static_cast<int32_t>(tokens);
    a.seq_lens = len.data();
    a.indices = idx.data();
    a.out = out.data();
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dk)));
    RecurrentGatedDeltaRuleCpu(a, 2, rows);
  };
  Tensor whole = init, whole_out(e, vn);
  run(n, whole, whole_out);
  const char* en = e == Elem::kFloat32 ? "f32" : e == Elem::kFloat16 ? "f16" : "bf16";
  const size_t es = e == Elem::kFloat32 ? 4 : 2;
  const auto bytes = [&](const Tensor& x, size_t at) {
    return static_cast<const char*>(e == Elem::kFloat32 ? static_cast<const void*>(x.f.data())
                                                        : static_cast<const void*>(x.h.data())) + at * es;
  };
  for (uint32_t j = 0; j + 1 < n; ++j) {
    Tensor part = init, part_out(e, vn);
    run(j + 1, part, part_out);
    const size_t out_n = static_cast<size_t>(j + 1) * c.nv * c.dv;
    EXPECT(std::memcmp(bytes(part, j * row), bytes(whole, j * row), row * es) == 0,
           "%s %s %s: the state after token %u of %u differs from a run of %u tokens", c.name, en, rows.c_str(), j,
           n, j + 1);
    EXPECT(std::memcmp(bytes(part_out, 0), bytes(whole_out, 0), out_n * es) == 0,
           "%s %s %s: outputs up to token %u of %u differ from a run of %u tokens", c.name, en, rows.c_str(), j, n,
           j + 1);
  }
}

}  // namespace
}  // namespace rgdr

int main() {
  using rgdr::Case;
  using rgdr::Elem;
  const std::vector<Case> cases = {
      {"decode 128x128, g", 2, 4, 128, 128, {1, 1, 1}, {}, true, false, false, 8},
      {"decode odd dims, scalar gk", 1, 3, 37, 5, {1, 1}, {}, true, true, false, 5},
      {"MTP 3 + 1, per-dim gk", 2, 2, 64, 48, {3, 1}, {}, true, true, true, 9},
      {"MTP 4, accepted 2, no decay", 1, 2, 100, 20, {4, 2}, {2, 1}, false, false, false, 10},
      {"MTP 2 + 3, Dk 128, scalar gk, odd Dv", 2, 4, 128, 33, {2, 3}, {}, true, true, false, 10},
      {"MTP 4, Dk 128, per-dim gk, accepted 3", 1, 2, 128, 16, {4}, {3}, true, true, true, 6},
      {"empty sequence in the batch", 1, 1, 16, 16, {2, 0, 1}, {}, true, false, false, 6},
      // Prompts through the recurrence: longer than kMaxMtp, the state written once at the end
      // (the other tokens' slots stay untouched).
      {"prompts of 20 and 11, last state only", 2, 4, 128, 32, {20, 11}, {}, true, false, false, 33, true},
      {"prompt of 13, per-dim gk, odd dims, last state only", 1, 2, 37, 9, {13, 1}, {}, true, true, true, 15, true},
  };
  // One sequence of up to kMaxMtp tokens each: every row path (rows in registers at Dk 64
  // and 128, in scratch otherwise, vector tails) and every decay form.
  const std::vector<Case> prefix_cases = {
      {"prefixes of 5, Dk 16, g", 2, 4, 16, 24, {5}, {}, true, false, false, 6},
      {"prefixes of 4, odd dims, scalar gk", 1, 3, 37, 5, {4}, {}, true, true, false, 5},
      {"prefixes of 8, Dk 64, per-dim gk", 2, 2, 64, 48, {8}, {}, true, true, true, 9},
      {"prefixes of 5, Dk 128, g", 2, 4, 128, 33, {5}, {}, true, false, false, 6},
  };
  std::mt19937 rng(7);
  std::printf("cpu: %s\n", rvascend::GetCpuFeatures().Describe().c_str());
  for (Elem e : {Elem::kBFloat16, Elem::kFloat16, Elem::kFloat32}) {
    const auto rows = rgdr::AvailableRowKernels(e);
    if (e == Elem::kBFloat16) {
      std::printf("row kernels:");
      for (const auto& r : rows) std::printf(" %s", r.c_str());
      std::printf("\n");
      // The best set must be the CPU's widest: a build that lost its vector path fails here.
      const auto& f = rvascend::GetCpuFeatures();
      const char* widest = f.rvv ? "rvv" : f.avx512bf16 ? "avx512bf16" : f.avx512 ? "avx512" : f.avx2 ? "avx2"
                                                                                            : "portable";
      EXPECT(rows.front() == widest, "best row kernels are %s, the CPU has %s", rows.front().c_str(), widest);
    }
    for (const auto& r : rows) {
      for (const Case& c : cases) rgdr::Run(c, e, r, rng);
      for (const Case& c : prefix_cases) rgdr::RunPrefixes(c, e, r, rng);
    }
  }
  return rvascend::testing::Summary();
}
