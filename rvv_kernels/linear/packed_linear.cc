#include "rvv_kernels/linear/packed_linear.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "rvv_kernels/base/bf16.h"
#include "rvv_kernels/linear/bf16_packed_kernel_sets.h"
#include "rvv_kernels/linear/packed_layout.h"
#include "rvv_kernels/base/thread_pool.h"

namespace rvascend {
namespace {

// Below this many multiply-adds a call is cheaper on one thread than the wake-up.
constexpr size_t kMinParallelMacs = 1 << 18;

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

void PackedBf16Linear(const Bf16PackedKernelSet& kernels, const PackedLinearArgs& args,
                      size_t num_threads) {
  const size_t m = args.m, n = args.n, k = args.k;
  const size_t block = args.block_n;
  if (block != KernelSetBlockN(kernels)) {
    throw std::invalid_argument("weight packed with block_n " + std::to_string(block) + "; kernel set " +
                                kernels.name + " reads block_n " + std::to_string(KernelSetBlockN(kernels)));
  }
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (size_t r = 0; r < m; ++r) std::fill_n(args.output + r * args.output_stride, n, uint16_t{0});
    return;
  }

  // FP32 activations are converted once per call (M*K values, negligible next
  // to the N*K weight stream) so the inner loops issue one scalar load per k.
  std::vector<float> input_fp32;
  const void* a = args.input;
  size_t a_stride = args.input_stride;
  if (kernels.fp32_activations) {
    input_fp32.resize(m * k);
    for (size_t r = 0; r < m; ++r) {
      const uint16_t* src = args.input + r * args.input_stride;
      for (size_t kk = 0; kk < k; ++kk) input_fp32[r * k + kk] = Bf16ToFloat(src[kk]);
    }
    a = input_fp32.data();
    a_stride = k;
  }
  const size_t element = kernels.fp32_activations ? sizeof(float) : sizeof(uint16_t);
  const auto* a_bytes = static_cast<const uint8_t*>(a);

  const bool gemv = m == 1;
  const Bf16PackedUkernel ukernel = gemv ? kernels.gemv : kernels.gemm;
  const size_t mr = gemv ? 1 : kernels.gemm_mr;
  size_t nr = gemv ? kernels.gemv_nr : kernels.gemm_nr;
  if (nr == 0) nr = block;  // version 2 sets: one block per call
  const size_t n_tiles = CeilDiv(n, nr);
  const size_t m_tiles = CeilDiv(m, mr);

  if (m * n * k < kMinParallelMacs) num_threads = 1;
  // Tasks: contiguous ranges of N tiles, several per thread for balance; M is
  // split too only when N alone cannot keep every thread busy.
  const size_t n_chunks = std::min(n_tiles, std::max<size_t>(1, num_threads) * 4);
  const size_t m_chunks = n_tiles >= num_threads ? 1 : std::min(m_tiles, CeilDiv(num_threads, n_tiles));
  const size_t tiles_per_n_chunk = CeilDiv(n_tiles, n_chunks);
  const size_t tiles_per_m_chunk = CeilDiv(m_tiles, m_chunks);

  auto run = [&](size_t task) {
    const size_t nc_index = task % n_chunks;
    const size_t mc_index = task / n_chunks;
    const size_t nt0 = nc_index * tiles_per_n_chunk;
    const size_t nt1 = std::min(n_tiles, nt0 + tiles_per_n_chunk);
    const size_t mt0 = mc_index * tiles_per_m_chunk;
    const size_t mt1 = std::min(m_tiles, mt0 + tiles_per_m_chunk);
    for (size_t nt = nt0; nt < nt1; ++nt) {
      const size_t j = nt * nr;
      const size_t nc = std::min(nr, n - j);
      const uint16_t* w = args.packed + (j / block) * k * block;
      // Every M tile reuses this weight panel while it is still in cache.
      for (size_t mt = mt0; mt < mt1; ++mt) {
        const size_t r = mt * mr;
        const size_t rows = std::min(mr, m - r);
        ukernel(rows, nc, k, a_bytes + r * a_stride * element, a_stride, w,
                args.output + r * args.output_stride + j, args.output_stride);
      }
    }
  };
  ThreadPool::Global().ParallelFor(n_chunks * m_chunks, num_threads, run);
}

}  // namespace rvascend
