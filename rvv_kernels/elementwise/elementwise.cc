#include "rvv_kernels/elementwise/elementwise.h"

#include <stdexcept>

#include "rvv_kernels/base/kernel_set_selection.h"
#include "rvv_kernels/base/thread_pool.h"

namespace rvascend {
namespace {

// Best first.
const KernelSetEntry<ElementwiseKernels> kSets[] = {
#if defined(RVASCEND_HAVE_RVV)
    {&kElementwiseRvv, {Isa::kRvv}},
#endif
#if defined(RVASCEND_HAVE_X86_VARIANTS)
    {&kElementwiseAvx512, {Isa::kAvx512}},
    {&kElementwiseAvx2, {Isa::kAvx2}},
#endif
    {&kElementwisePortable, {Isa::kAny}},
};

constexpr size_t kMaxRopeDim = 1024;

void Require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

const std::vector<const ElementwiseKernels*>& Supported() {
  static const std::vector<const ElementwiseKernels*> supported = SupportedKernelSets(kSets);
  return supported;
}

}  // namespace

const ElementwiseKernels& ChooseElementwiseKernels(const std::string& name) {
  return SelectKernelSet(Supported(), name, "elementwise");
}

std::vector<std::string> AvailableElementwiseKernels() { return KernelSetNames(Supported()); }

void RmsNormRows(const ElementwiseKernels& k, size_t rows, size_t d, const uint16_t* x, size_t x_stride,
                 const uint16_t* residual, size_t residual_stride, const uint16_t* weight, float eps,
                 bool zero_centred, uint16_t* out, uint16_t* residual_out, size_t num_threads) {
  Require(d > 0, "rms_norm: the row length must be positive");
  ThreadPool::Global().ParallelFor(rows, num_threads, [&](size_t r) {
    k.rms_norm(x + r * x_stride, residual ? residual + r * residual_stride : nullptr, weight, d, eps, zero_centred,
               out + r * d, residual ? residual_out + r * d : nullptr);
  });
}

void SiluMulRows(const ElementwiseKernels& k, size_t rows, size_t d, const uint16_t* x, size_t x_stride,
                 uint16_t* out, size_t num_threads) {
  Require(d > 0, "silu_mul: the row length must be positive");
  ThreadPool::Global().ParallelFor(rows, num_threads,
                                   [&](size_t r) { k.silu_mul(x + r * x_stride, d, out + r * d); });
}

void RopeRows(const ElementwiseKernels& k, size_t tokens, const RopeHeads& h, const uint16_t* x, size_t x_stride,
              const uint16_t* cos, const uint16_t* sin, uint16_t* out, size_t num_threads) {
  Require(h.d > 0 && h.d <= kMaxRopeDim,
          "rope: head_dim must be positive and at most " + std::to_string(kMaxRopeDim) + ", got " + std::to_string(h.d));
  Require(h.rotary_dim > 0 && h.rotary_dim % 2 == 0 && h.rotary_dim <= h.d,
          "rope: rotary_dim must be even and in [2, head_dim = " + std::to_string(h.d) + "], got " +
              std::to_string(h.rotary_dim));
  Require(h.heads < 2 || h.stride >= h.d,
          "rope: heads overlap (stride " + std::to_string(h.stride) + " < head_dim " + std::to_string(h.d) + ")");
  const size_t r = h.rotary_dim;
  ThreadPool::Global().ParallelFor(tokens, num_threads, [&](size_t t) {
    k.rope(x + t * x_stride, h, cos + t * r, sin + t * r, out + t * h.heads * h.d);
  });
}

void SigmoidMulRows(const ElementwiseKernels& k, size_t tokens, size_t heads, size_t d, const uint16_t* x,
                    size_t x_stride, const uint16_t* gate, size_t gate_stride, size_t gate_head_stride, uint16_t* out,
                    size_t num_threads) {
  Require(d > 0, "sigmoid_mul: head_dim must be positive");
  Require(heads < 2 || gate_head_stride >= d, "sigmoid_mul: gate heads overlap (head stride " +
                                                  std::to_string(gate_head_stride) + " < head_dim " + std::to_string(d) + ")");
  ThreadPool::Global().ParallelFor(tokens, num_threads, [&](size_t t) {
    for (size_t h = 0; h < heads; ++h) {
      k.sigmoid_mul(x + t * x_stride + h * d, gate + t * gate_stride + h * gate_head_stride, d,
                    out + (t * heads + h) * d);
    }
  });
}

void ArgmaxRows(const ElementwiseKernels& k, size_t rows, size_t n, const uint16_t* x, size_t x_stride, int64_t* out,
                size_t num_threads) {
  Require(n > 0, "argmax: rows must not be empty");
  ThreadPool::Global().ParallelFor(rows, num_threads, [&](size_t r) { out[r] = k.argmax(x + r * x_stride, n); });
}

}  // namespace rvascend
