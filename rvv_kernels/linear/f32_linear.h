// The batch-invariant FP32 Linear: output[M, N] = input[M, K] x W[N, K]^T (+ bias) over
// the row-major weight, for FP32 models under deterministic inference.
//
// Every output is one dot product computed the same way whatever M is, where the row
// sits in the batch, or how the call is split over threads: lane partial sums over K in
// k order, a fixed halving tree over the lanes, then the bias. So a row's result is bit
// for bit what it is alone (ATen's GEMMs pick their kernels and blockings by M, and a
// row's sums change with its batch). Weights stay as the model holds them: no packed copy.
#ifndef RVV_KERNELS_LINEAR_F32_LINEAR_H_
#define RVV_KERNELS_LINEAR_F32_LINEAR_H_

#include <cstddef>
#include <string>
#include <vector>

namespace rvascend {

struct F32LinearArgs {
  size_t m = 0, n = 0, k = 0;
  const float* input = nullptr;  // rows input_stride elements apart
  size_t input_stride = 0;
  const float* weight = nullptr;  // [N, K], rows weight_stride elements apart
  size_t weight_stride = 0;
  const float* bias = nullptr;  // [N] or nullptr
  float* output = nullptr;      // rows output_stride elements apart
  size_t output_stride = 0;
};

// kernel: "" picks the best set this CPU runs. Throws std::invalid_argument for a
// stride shorter than its row or an unknown kernel set.
void F32Linear(const F32LinearArgs& args, size_t num_threads, const std::string& kernel = "");

// Sets this build has and this CPU runs, best first.
std::vector<std::string> AvailableF32LinearKernels();

}  // namespace rvascend

#endif  // RVV_KERNELS_LINEAR_F32_LINEAR_H_
