// The scalar statement of the pieces' contracts (deltanet_pieces.h), and the
// choice between them and the vector ones.
#include <cmath>
#include <type_traits>

#include "rvv_kernels/recurrent_gated_delta_rule/deltanet_pieces.h"
#include "rvv_kernels/recurrent_gated_delta_rule/elem_values.h"
#include "rvv_kernels/base/kernel_set_selection.h"

namespace rgdr {
namespace {

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

template <typename T>
void ConvSilu(const T* x, const T* in, T* out, const T* weight, size_t n, size_t kept, float* y) {
  for (size_t c = 0; c < n; ++c) {
    const T* s = in + c * kept;
    T* o = out + c * kept;
    const T* w = weight + c * (kept + 1);
    float sum = 0.0f;
    for (size_t j = 0; j < kept; ++j) sum += ToFloat(s[j]) * ToFloat(w[j]);
    sum += ToFloat(x[c]) * ToFloat(w[kept]);
    for (size_t j = 0; j + 1 < kept; ++j) o[j] = s[j + 1];
    o[kept - 1] = x[c];
    y[c] = RoundTo<T>(Silu(sum));
  }
}

void L2Norm(float* x, size_t n, float scale) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float r = scale / std::sqrt(sum + 1e-6f);
  for (size_t i = 0; i < n; ++i) x[i] *= r;
}

template <typename T>
void GatedNorm(float* o, const T* z, const T* weight, size_t n, float eps, T* out) {
  float squares = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    o[i] = RoundTo<T>(o[i]);
    squares += o[i] * o[i];
  }
  const float rms = 1.0f / std::sqrt(squares / static_cast<float>(n) + eps);
  for (size_t i = 0; i < n; ++i) {
    const float scaled = RoundTo<T>(ToFloat(weight[i]) * RoundTo<T>(o[i] * rms));
    out[i] = FromFloat<T>(scaled * Silu(ToFloat(z[i])));
  }
}

}  // namespace

template <typename T>
const DeltaNetPieces<T>& PortableDeltaNetPieces() {
  static const DeltaNetPieces<T> pieces{"portable", ConvSilu<T>, L2Norm, GatedNorm<T>};
  return pieces;
}

template const DeltaNetPieces<float>& PortableDeltaNetPieces<float>();
template const DeltaNetPieces<_Float16>& PortableDeltaNetPieces<_Float16>();
template const DeltaNetPieces<uint16_t>& PortableDeltaNetPieces<uint16_t>();

template <typename T>
std::vector<const DeltaNetPieces<T>*> AvailableDeltaNetPieces() {
  using rvascend::Isa;
  using Entry = rvascend::KernelSetEntry<DeltaNetPieces<T>>;
  if constexpr (std::is_same_v<T, float>) {
    static const Entry kSets[] = {
#if defined(RVASCEND_HAVE_RVV)
        {&kDeltaNetPiecesRvvF32, {Isa::kRvv}},
#endif
#if defined(RGDR_HAVE_X86_ROWS)
        {&kDeltaNetPiecesAvx512F32, {Isa::kAvx512}},
        {&kDeltaNetPiecesAvx2F32, {Isa::kAvx2}},
#endif
        {&PortableDeltaNetPieces<T>(), {Isa::kAny}},
    };
    return rvascend::SupportedKernelSets(kSets);
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    static const Entry kSets[] = {
#if defined(RVASCEND_HAVE_RVV)
        {&kDeltaNetPiecesRvvBf16, {Isa::kRvv}},
#endif
#if defined(RGDR_HAVE_X86_ROWS)
        {&kDeltaNetPiecesAvx512Bf16, {Isa::kAvx512}},
        {&kDeltaNetPiecesAvx2Bf16, {Isa::kAvx2}},
#endif
        {&PortableDeltaNetPieces<T>(), {Isa::kAny}},
    };
    return rvascend::SupportedKernelSets(kSets);
  } else {  // FP16: the portable pieces only
    static const Entry kSets[] = {{&PortableDeltaNetPieces<T>(), {Isa::kAny}}};
    return rvascend::SupportedKernelSets(kSets);
  }
}

template std::vector<const DeltaNetPieces<float>*> AvailableDeltaNetPieces<float>();
template std::vector<const DeltaNetPieces<_Float16>*> AvailableDeltaNetPieces<_Float16>();
template std::vector<const DeltaNetPieces<uint16_t>*> AvailableDeltaNetPieces<uint16_t>();

template <typename T>
const DeltaNetPieces<T>& ChooseDeltaNetPieces() {
  static const DeltaNetPieces<T>* best = AvailableDeltaNetPieces<T>().front();
  return *best;
}

template const DeltaNetPieces<float>& ChooseDeltaNetPieces<float>();
template const DeltaNetPieces<_Float16>& ChooseDeltaNetPieces<_Float16>();
template const DeltaNetPieces<uint16_t>& ChooseDeltaNetPieces<uint16_t>();

}  // namespace rgdr
