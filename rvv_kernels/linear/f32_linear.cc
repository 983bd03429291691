#include "rvv_kernels/linear/f32_linear.h"

#include <algorithm>
#include <stdexcept>

#include "rvv_kernels/base/kernel_set_selection.h"
#include "rvv_kernels/base/thread_pool.h"
#include "rvv_kernels/linear/f32_dot_tiles.h"

namespace rvascend {
namespace {

struct TileSet {
  const char* name;
  F32DotTile tile;
};

#if defined(RVASCEND_HAVE_RVV)
const TileSet kRvv{"rvv", f32_dot_tile__rvv};
#endif
#if defined(RVASCEND_HAVE_X86_VARIANTS)
const TileSet kAvx512{"avx512", f32_dot_tile__avx512};
const TileSet kAvx2{"avx2", f32_dot_tile__avx2};
#endif
const TileSet kPortable{"portable", f32_dot_tile__portable};

// Best first.
const KernelSetEntry<TileSet> kSets[] = {
#if defined(RVASCEND_HAVE_RVV)
    {&kRvv, {Isa::kRvv}},
#endif
#if defined(RVASCEND_HAVE_X86_VARIANTS)
    {&kAvx512, {Isa::kAvx512}},
    {&kAvx2, {Isa::kAvx2}},
#endif
    {&kPortable, {Isa::kAny}},
};

const std::vector<const TileSet*>& Supported() {
  static const std::vector<const TileSet*> supported = SupportedKernelSets(kSets);
  return supported;
}

const TileSet& Choose(const std::string& name) { return SelectKernelSet(Supported(), name, "f32_linear"); }

// Columns per task: a task's weight rows (64 x K floats) stay in cache while every row
// tile of the input passes over them.
constexpr size_t kTaskCols = 64;
// Below this many multiply-adds a call is cheaper on one thread than the wake-up.
constexpr size_t kMinParallelMacs = 1 << 18;

}  // namespace

std::vector<std::string> AvailableF32LinearKernels() { return KernelSetNames(Supported()); }

void F32Linear(const F32LinearArgs& a, size_t num_threads, const std::string& kernel) {
  const TileSet& set = Choose(kernel);
  if (a.m == 0 || a.n == 0) return;
  if ((a.m > 1 && (a.input_stride < a.k || a.output_stride < a.n)) || (a.n > 1 && a.weight_stride < a.k)) {
    throw std::invalid_argument("f32_linear: a row stride is shorter than its row");
  }
  const size_t tasks = (a.n + kTaskCols - 1) / kTaskCols;
  if (a.m * a.n * a.k < kMinParallelMacs) num_threads = 1;
  ThreadPool::Global().ParallelFor(tasks, std::max<size_t>(1, num_threads), [&](size_t task) {
    const size_t n0 = task * kTaskCols, n1 = std::min(a.n, n0 + kTaskCols);
    for (size_t r = 0; r < a.m; r += kF32TileRows) {
      const size_t rows = std::min(kF32TileRows, a.m - r);
      for (size_t j = n0; j < n1; j += kF32TileCols) {
        set.tile(rows, std::min(kF32TileCols, n1 - j), a.k, a.input + r * a.input_stride, a.input_stride,
                 a.weight + j * a.weight_stride, a.weight_stride, a.bias ? a.bias + j : nullptr,
                 a.output + r * a.output_stride + j, a.output_stride);
      }
    }
  });
}

}  // namespace rvascend
