// The per-token pieces of a Gated DeltaNet decode step (deltanet_decode.h)
// around the delta rule, for one element type T: float, _Float16, or BF16
// bits in uint16_t. Rounding ("round") is to T, where the PyTorch layer rounds.
//
//   conv_silu:  channels [0, n) of one token, windows `in` [n, kept] and weight
//               [n, kept + 1]: y[c] = round(silu(in[c] . w[c][:kept] + x[c] w[c][kept]))
//               in FP32, and out [n, kept] = each channel's window slid by one (x
//               enters). `out` is `in` (in place) or does not overlap it.
//   l2norm:     x *= scale / sqrt(sum(x^2) + 1e-6) over n values.
//   gated_norm: one head of n: o = round(o); out = round(round(w * round(o * rms)) * silu(z)),
//               rms = 1 / sqrt(mean(o^2) + eps).
//
// The portable pieces are the scalar statement of these contracts; the RVV
// ones and the x86 ones (AVX2, AVX-512; float and BF16) run the same steps over
// channels / values in vectors.
#ifndef RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_DELTANET_PIECES_H_
#define RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_DELTANET_PIECES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rgdr {

template <typename T>
struct DeltaNetPieces {
  const char* name;
  void (*conv_silu)(const T* x, const T* in, T* out, const T* weight, size_t n, size_t kept, float* y);
  void (*l2norm)(float* x, size_t n, float scale);
  void (*gated_norm)(float* o, const T* z, const T* weight, size_t n, float eps, T* out);
};

template <typename T>
const DeltaNetPieces<T>& PortableDeltaNetPieces();

#if defined(RVASCEND_HAVE_RVV)
extern const DeltaNetPieces<float> kDeltaNetPiecesRvvF32;
extern const DeltaNetPieces<uint16_t> kDeltaNetPiecesRvvBf16;
#endif
#if defined(RGDR_HAVE_X86_ROWS)
extern const DeltaNetPieces<float> kDeltaNetPiecesAvx2F32;
extern const DeltaNetPieces<uint16_t> kDeltaNetPiecesAvx2Bf16;
extern const DeltaNetPieces<float> kDeltaNetPiecesAvx512F32;
extern const DeltaNetPieces<uint16_t> kDeltaNetPiecesAvx512Bf16;
#endif

// The piece sets this build has and this CPU runs for T, fastest first (the
// portable set last).
template <typename T>
std::vector<const DeltaNetPieces<T>*> AvailableDeltaNetPieces();

// The fastest pieces this CPU runs for T.
template <typename T>
const DeltaNetPieces<T>& ChooseDeltaNetPieces();

}  // namespace rgdr

#endif  // RVV_KERNELS_RECURRENT_GATED_DELTA_RULE_DELTANET_PIECES_H_
