#include "rvv_kernels/quantized/quant_format.h"

#include <stdexcept>

namespace rvascend {
namespace {

const QuantFormatInfo kFormats[] = {
#define QUANT_FORMAT(name, ggml_type, block_k, ggml_bytes, tile_bytes, act_block) \
  {#name, ggml_type, block_k, ggml_bytes, tile_bytes, act_block},
#include "rvv_kernels/quantized/quant_formats.inc"
#undef QUANT_FORMAT
};
static_assert(std::size(kFormats) == kQuantFormatCount);

std::string KeptNames() {
  std::string names;
  for (const QuantFormatInfo& info : kFormats) names += std::string(names.empty() ? "" : ", ") + info.name;
  return names;
}

}  // namespace

const QuantFormatInfo& FormatInfo(QuantFormat format) { return kFormats[static_cast<int>(format)]; }

QuantFormat FormatFromGgmlType(int ggml_type) {
  for (size_t i = 0; i < kQuantFormatCount; ++i) {
    if (kFormats[i].ggml_type == ggml_type) return static_cast<QuantFormat>(i);
  }
  throw std::invalid_argument("GGML type " + std::to_string(ggml_type) + " is not a quantized format kept quantized (" +
                              KeptNames() + ")");
}

QuantFormat FormatFromName(const std::string& name) {
  for (size_t i = 0; i < kQuantFormatCount; ++i) {
    if (name == kFormats[i].name) return static_cast<QuantFormat>(i);
  }
  throw std::invalid_argument("quantized format '" + name + "' is not kept quantized (" + KeptNames() + ")");
}

}  // namespace rvascend
