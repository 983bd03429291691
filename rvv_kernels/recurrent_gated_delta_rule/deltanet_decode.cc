#include "rvv_kernels/recurrent_gated_delta_rule/deltanet_decode.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "rvv_kernels/recurrent_gated_delta_rule/deltanet_pieces.h"
#include "rvv_kernels/recurrent_gated_delta_rule/elem_values.h"
#include "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_cpu.h"
#include "rvv_kernels/base/thread_pool.h"

namespace rgdr {
namespace {

template <typename T>
void Run(const DeltaNetDecodeArgs& a, size_t num_threads) {
  const size_t key = static_cast<size_t>(a.nk) * a.dk, value = static_cast<size_t>(a.nv) * a.dv;
  const size_t c_dim = 2 * key + value, kept = a.kernel - 1;
  const T* mixed = static_cast<const T*>(a.mixed);
  const T* weight = static_cast<const T*>(a.conv_weight);
  T* conv = static_cast<T*>(a.conv_state);
  std::vector<float> q(a.t * key), k(a.t * key), v(a.t * value), beta(a.t * a.nv), g(a.t * a.nv);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(a.dk));
  const DeltaNetPieces<T>& pieces = ChooseDeltaNetPieces<T>();
  // Token t's slots: the conv window it reads (a sequence's first token its read slot,
  // the others the window the token before wrote), the one it writes (its token slot,
  // else its sequence's), and the delta rule's index: where the state after it is kept,
  // -1 for none (a prompt's state is written once, after its last token).
  std::vector<int64_t> lens(a.sequences), reads(a.sequences), conv_writes(a.t), conv_reads(a.t), kept_at(a.t);
  for (uint32_t s = 0, t = 0; s < a.sequences; ++s) {
    lens[s] = a.lens != nullptr ? a.lens[s] : 1;
    reads[s] = a.read_slots != nullptr ? a.read_slots[s] : a.slots[s];
    for (int64_t j = 0; j < lens[s]; ++j, ++t) {
      const bool last = j + 1 == lens[s];
      const int64_t own = a.token_slots != nullptr ? a.token_slots[t] : -1;
      conv_writes[t] = own >= 0 ? own : a.slots[s];
      conv_reads[t] = j == 0 ? reads[s] : conv_writes[t - 1];
      kept_at[t] = last ? a.slots[s] : own;
    }
  }
  // The conv in chunks of channels over threads, each chunk through every token in
  // order (channels are independent; a channel's window slides token by token).
  struct Chunk {
    size_t c, n;    // channels [c, c + n) of mixed
    float* y;       // q, k or v, rows of `width`, the chunk at `offset`
    size_t width, offset;
  };
  constexpr size_t kChunk = 512;
  std::vector<Chunk> chunks;
  float* parts[3] = {q.data(), k.data(), v.data()};
  const size_t widths[3] = {key, key, value};
  for (size_t part = 0, start = 0; part < 3; start += widths[part++]) {
    for (size_t off = 0; off < widths[part]; off += kChunk) {
      chunks.push_back({start + off, std::min(kChunk, widths[part] - off), parts[part], widths[part], off});
    }
  }
  rvascend::ThreadPool::Global().ParallelFor(chunks.size(), num_threads, [&](size_t i) {
    const Chunk& ch = chunks[i];
    for (uint32_t t = 0; t < a.t; ++t) {
      const T* in = conv + static_cast<size_t>(conv_reads[t]) * c_dim * kept + ch.c * kept;
      T* out = conv + static_cast<size_t>(conv_writes[t]) * c_dim * kept + ch.c * kept;
      pieces.conv_silu(mixed + t * a.mixed_stride + ch.c, in, out, weight + ch.c * a.kernel, ch.n, kept,
                       ch.y + t * ch.width + ch.offset);
    }
  });
  for (uint32_t t = 0; t < a.t; ++t) {
    for (uint32_t h = 0; h < a.nk; ++h) {
      pieces.l2norm(&q[t * key + h * a.dk], a.dk, q_scale);
      pieces.l2norm(&k[t * key + h * a.dk], a.dk, 1.0f);
    }
    const T* b = static_cast<const T*>(a.b) + t * a.gate_stride;
    const T* gate_a = static_cast<const T*>(a.a) + t * a.gate_stride;
    for (uint32_t h = 0; h < a.nv; ++h) {
      beta[t * a.nv + h] = RoundTo<T>(1.0f / (1.0f + std::exp(-ToFloat(b[h]))));
      const float s = ToFloat(gate_a[h]) + ToFloat(static_cast<const T*>(a.dt_bias)[h]);
      const float softplus = s > 20.0f ? s : std::log1p(std::exp(s));
      g[t * a.nv + h] = -std::exp(ToFloat(static_cast<const T*>(a.a_log)[h])) * softplus;
    }
  }
  std::vector<float> o(a.t * value);
  RgdrArgs r;
  r.elem = Elem::kFloat32;
  r.t = a.t;
  r.b = a.sequences;
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
  r.indices = kept_at.data();
  r.indices_int64 = true;
  r.read_slots = reads.data();
  r.out = o.data();
  r.scale = 1.0f;
  RecurrentGatedDeltaRuleCpu(r, num_threads);
  // The gated norm per (token, head), over threads.
  rvascend::ThreadPool::Global().ParallelFor(a.t, num_threads, [&](size_t t) {
    for (uint32_t h = 0; h < a.nv; ++h) {
      const size_t head = t * value + h * a.dv;
      pieces.gated_norm(&o[head], static_cast<const T*>(a.z) + t * a.z_stride + h * a.dv,
                        static_cast<const T*>(a.norm_weight), a.dv, a.norm_eps, static_cast<T*>(a.out) + head);
    }
  });
}

}  // namespace

void ValidateDeltaNetDecode(const DeltaNetDecodeArgs& a) {
  if (a.kernel < 2) throw std::invalid_argument("deltanet_decode: the conv kernel needs at least 2 taps");
  if (a.lens == nullptr && a.sequences != a.t) {
    throw std::invalid_argument("deltanet_decode: without lengths every sequence has one token, but there are " +
                                std::to_string(a.sequences) + " sequences for " + std::to_string(a.t) + " tokens");
  }
  std::vector<bool> used(a.num_slots, false);
  int64_t tokens = 0;
  for (uint32_t i = 0; i < a.sequences; ++i) {
    const int64_t s = a.slots[i], n = a.lens != nullptr ? a.lens[i] : 1;
    if (n < 0) throw std::invalid_argument("deltanet_decode: sequence " + std::to_string(i) + " has length " +
                                           std::to_string(n));
    tokens += n;
    if (s < 0 || s >= static_cast<int64_t>(a.num_slots)) {
      throw std::invalid_argument("deltanet_decode: slot " + std::to_string(s) + " of sequence " + std::to_string(i) +
                                  " is outside the state pool of " + std::to_string(a.num_slots) + " slots");
    }
    if (used[static_cast<size_t>(s)]) {
      throw std::invalid_argument("deltanet_decode: slot " + std::to_string(s) + " is used by two sequences");
    }
    used[static_cast<size_t>(s)] = true;
  }
  if (tokens != static_cast<int64_t>(a.t)) {
    throw std::invalid_argument("deltanet_decode: the lengths add up to " + std::to_string(tokens) + " tokens, not " +
                                std::to_string(a.t));
  }
  for (uint32_t i = 0, t = 0; a.token_slots != nullptr && i < a.sequences; ++i) {
    const int64_t n = a.lens != nullptr ? a.lens[i] : 1;
    for (int64_t j = 0; j < n; ++j, ++t) {
      const int64_t s = a.token_slots[t];
      if (s == -1) continue;
      const std::string where = "token slot " + std::to_string(s) + " of token " + std::to_string(t);
      if (j + 1 == n) {
        throw std::invalid_argument("deltanet_decode: " + where +
                                    " is its sequence's last: its states go to the sequence's slot (give -1)");
      }
      if (s < 0 || s >= static_cast<int64_t>(a.num_slots)) {
        throw std::invalid_argument("deltanet_decode: " + where + " is outside the state pool of " +
                                    std::to_string(a.num_slots) + " slots (or -1 for none)");
      }
      if (used[static_cast<size_t>(s)]) {
        throw std::invalid_argument("deltanet_decode: " + where + " is already another token's or sequence's slot");
      }
      used[static_cast<size_t>(s)] = true;
    }
  }
  // Several sequences may read one slot (requests resuming from one cached snapshot): it is
  // only read. None may read a slot the step writes, its own excepted (updated in place).
  for (uint32_t i = 0; a.read_slots != nullptr && i < a.sequences; ++i) {
    const int64_t r = a.read_slots[i];
    if (r < 0 || r >= static_cast<int64_t>(a.num_slots)) {
      throw std::invalid_argument("deltanet_decode: read slot " + std::to_string(r) + " of sequence " +
                                  std::to_string(i) + " is outside the state pool of " +
                                  std::to_string(a.num_slots) + " slots");
    }
    if (r != a.slots[i] && used[static_cast<size_t>(r)]) {
      throw std::invalid_argument("deltanet_decode: read slot " + std::to_string(r) + " of sequence " +
                                  std::to_string(i) + " is a slot or token slot the step writes");
    }
  }
}

void DeltaNetDecodeCpu(const DeltaNetDecodeArgs& a, size_t num_threads) {
  ValidateDeltaNetDecode(a);
  WithElemType(a.elem, [&](auto type) { Run<decltype(type)>(a, num_threads); });
}

}  // namespace rgdr
