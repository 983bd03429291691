// The scalar statement of the pieces' contracts (deltanet_pieces.h), and the
// choice between them and the vector ones.
#include <cmath>
#include <type_traits>

#include "cpu/deltanet_pieces.h"
#include "cpu/elem_values.h"
#include "rvv_kernels/base/cpu_features.h"

namespace rgdr {
namespace {

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

template <typename T>
void ConvSilu(const T* x, T* state, const T* weight, size_t n, size_t kept, float* y) {
  for (size_t c = 0; c < n; ++c) {
    T* s = state + c * kept;
    const T* w = weight + c * (kept + 1);
    float sum = 0.0f;
    for (size_t j = 0; j < kept; ++j) sum += ToFloat(s[j]) * ToFloat(w[j]);
    sum += ToFloat(x[c]) * ToFloat(w[kept]);
    for (size_t j = 0; j + 1 < kept; ++j) s[j] = s[j + 1];
    s[kept - 1] = x[c];
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
const DeltaNetPieces<T>& ChooseDeltaNetPieces() {
#if defined(RVASCEND_HAVE_RVV)
  if (rvascend::GetCpuFeatures().rvv) {
    if constexpr (std::is_same_v<T, float>) return kDeltaNetPiecesRvvF32;
    if constexpr (std::is_same_v<T, uint16_t>) return kDeltaNetPiecesRvvBf16;
  }
#endif
  return PortableDeltaNetPieces<T>();
}

template const DeltaNetPieces<float>& ChooseDeltaNetPieces<float>();
template const DeltaNetPieces<_Float16>& ChooseDeltaNetPieces<_Float16>();
template const DeltaNetPieces<uint16_t>& ChooseDeltaNetPieces<uint16_t>();

}  // namespace rgdr
