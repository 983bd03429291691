// pybind11 module `_rvv_kernels`: the BF16 packed-linear kernels for Python.
//
// Tensors cross as (data pointer, sizes, strides) so the module needs no
// torch headers and loads beside torch 2.13 on the host and Debian's torch
// 2.6 in the riscv64 image alike. The torch ops in packed_linear.py check
// every dtype, shape and device before calling in; the checks here guard the
// memory contract once more so that a bypassed check fails loudly, not wildly.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "rvv_kernels/bf16_packed_kernel_sets.h"
#include "rvv_kernels/cpu_features.h"
#include "rvv_kernels/packed_layout.h"
#include "rvv_kernels/packed_linear.h"

namespace py = pybind11;

namespace rvascend {
namespace {

template <typename T>
T* Pointer(uintptr_t address, const char* what) {
  if (address == 0) throw std::invalid_argument(std::string(what) + " is a null pointer");
  if (address % alignof(T) != 0) throw std::invalid_argument(std::string(what) + " is misaligned");
  return reinterpret_cast<T*>(address);
}

const Bf16PackedKernelSet& KernelSet(const std::string& name) {
  if (name.empty()) return DefaultKernelSet();
  const Bf16PackedKernelSet* set = FindKernelSet(name);
  if (set == nullptr) {
    std::string available;
    for (const auto* s : AvailableKernelSets()) available += std::string(available.empty() ? "" : ", ") + s->name;
    throw std::invalid_argument("kernel set '" + name + "' is not available on this CPU/build (available: " +
                                available + ")");
  }
  return *set;
}

void Pack(uintptr_t weight, size_t n, size_t k, size_t row_stride, uintptr_t packed) {
  if (row_stride < k) throw std::invalid_argument("weight row stride is smaller than K");
  py::gil_scoped_release release;
  PackBf16Weight(Pointer<const uint16_t>(weight, "weight"), n, k, row_stride,
                 Pointer<uint16_t>(packed, "packed"));
}

void Linear(const std::string& kernel_set, size_t m, size_t n, size_t k, uintptr_t input,
            size_t input_stride, uintptr_t packed, uintptr_t output, size_t output_stride,
            size_t num_threads) {
  if (input_stride < k) throw std::invalid_argument("input row stride is smaller than K");
  if (output_stride < n) throw std::invalid_argument("output row stride is smaller than N");
  const Bf16PackedKernelSet& set = KernelSet(kernel_set);
  PackedLinearArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  args.input = Pointer<const uint16_t>(input, "input");
  args.input_stride = input_stride;
  args.packed = Pointer<const uint16_t>(packed, "packed weight");
  args.output = Pointer<uint16_t>(output, "output");
  args.output_stride = output_stride;
  py::gil_scoped_release release;
  PackedBf16Linear(set, args, num_threads == 0 ? 1 : num_threads);
}

std::vector<std::string> Names(const std::vector<const Bf16PackedKernelSet*>& sets) {
  std::vector<std::string> names;
  for (const auto* s : sets) names.emplace_back(s->name);
  return names;
}

}  // namespace

// A function whose first instruction marks a region in a QEMU execution log
// (image_instruction_count.py): its address is found from the symbol table.
extern "C" __attribute__((noinline, used, visibility("default"))) int rvascend_count_marker(int id) {
  asm volatile("" : : "r"(id) : "memory");
  return id;
}

}  // namespace rvascend

PYBIND11_MODULE(_rvv_kernels, m) {
  using namespace rvascend;
  m.doc() = "RVV BF16 packed-linear kernels (layout version 1: [ceil(N/32), K, 32])";
  m.attr("LAYOUT_VERSION") = kPackedLayoutVersion;
  m.attr("BLOCK_N") = kPackedBlockN;
  m.def("pack_bf16_weight", &Pack, py::arg("weight"), py::arg("n"), py::arg("k"),
        py::arg("row_stride"), py::arg("packed"),
        "Packs a row-major BF16 [N, K] weight (data pointers) into layout version 1.");
  m.def("packed_bf16_linear", &Linear, py::arg("kernel_set"), py::arg("m"), py::arg("n"),
        py::arg("k"), py::arg("input"), py::arg("input_stride"), py::arg("packed"),
        py::arg("output"), py::arg("output_stride"), py::arg("num_threads"),
        "output[M, N] = input[M, K] x W^T over a packed weight; kernel_set '' picks the best.");
  m.def("available_kernel_sets", [] { return Names(AvailableKernelSets()); },
        "Kernel sets this build has and this CPU supports, best first.");
  m.def("compiled_kernel_sets", [] { return Names(CompiledKernelSets()); },
        "Every kernel set compiled into this build.");
  m.def("count_marker", &rvascend_count_marker, "Marks a region for instruction counting under QEMU.");
  m.def("cpu_features", [] { return GetCpuFeatures().Describe(); },
        "What the CPU reported at first use.");
}
