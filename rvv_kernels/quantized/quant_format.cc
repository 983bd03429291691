#include "rvv_kernels/quantized/quant_format.h"

#include <stdexcept>

namespace rvascend {
namespace {

const QuantFormatInfo kFormats[] = {
    {"Q8_0", 8, 32, 34, 34, 32},
    {"Q4_0", 2, 32, 18, 18, 32},
    {"Q4_1", 3, 32, 20, 20, 32},
    {"Q4_K", 12, 256, 144, 148, 256},
    {"Q6_K", 14, 256, 210, 210, 256},
};

constexpr QuantFormat kAll[] = {QuantFormat::kQ8_0, QuantFormat::kQ4_0, QuantFormat::kQ4_1, QuantFormat::kQ4_K,
                                QuantFormat::kQ6_K};

}  // namespace

const QuantFormatInfo& FormatInfo(QuantFormat format) { return kFormats[static_cast<int>(format)]; }

QuantFormat FormatFromGgmlType(int ggml_type) {
  for (QuantFormat f : kAll) {
    if (FormatInfo(f).ggml_type == ggml_type) return f;
  }
  throw std::invalid_argument("GGML type " + std::to_string(ggml_type) +
                              " is not a quantized format kept quantized (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)");
}

QuantFormat FormatFromName(const std::string& name) {
  for (QuantFormat f : kAll) {
    if (name == FormatInfo(f).name) return f;
  }
  throw std::invalid_argument("quantized format '" + name +
                              "' is not kept quantized (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)");
}

}  // namespace rvascend
