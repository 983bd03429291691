// Binds the pure tiling function to CANN's tiling context (built only with CANN).
#include "recurrent_gated_delta_rule_tiling.h"
#include "register/op_impl_registry.h"
#include "tiling/platform/platform_ascendc.h"

namespace ops {
namespace {

uint32_t Dim(const gert::StorageShape* s, size_t i) { return static_cast<uint32_t>(s->GetStorageShape().GetDim(i)); }

rgdr::DType ToDType(ge::DataType t) {
  switch (t) {
    case ge::DT_FLOAT16: return rgdr::DType::kFloat16;
    case ge::DT_BF16: return rgdr::DType::kBFloat16;
    case ge::DT_INT64: return rgdr::DType::kInt64;
    case ge::DT_INT32: return rgdr::DType::kInt32;
    default: return rgdr::DType::kFloat32;
  }
}

ge::graphStatus TilingFunc(gert::TilingContext* context) {
  rgdr::Shapes s;
  const gert::StorageShape* q = context->GetInputShape(0);
  const gert::StorageShape* v = context->GetInputShape(2);
  const gert::StorageShape* state = context->GetInputShape(4);
  const gert::StorageShape* lens = context->GetInputShape(5);
  s.t = Dim(q, 0);
  s.nk = Dim(q, 1);
  s.dk = Dim(q, 2);
  s.nv = Dim(v, 1);
  s.dv = Dim(v, 2);
  s.numSlots = Dim(state, 0);
  s.b = Dim(lens, 0);
  s.inType = ToDType(context->GetInputDesc(0)->GetDataType());
  s.seqLensType = ToDType(context->GetInputDesc(5)->GetDataType());
  s.indicesType = ToDType(context->GetInputDesc(6)->GetDataType());
  s.hasG = context->GetOptionalInputShape(7) != nullptr;
  const gert::StorageShape* gk = context->GetOptionalInputShape(8);
  s.hasGk = gk != nullptr;
  s.gkPerDim = gk != nullptr && gk->GetStorageShape().GetDimNum() == 3;
  s.hasAcceptedTokens = context->GetOptionalInputShape(9) != nullptr;
  s.scale = *context->GetAttrs()->GetAttrPointer<float>(0);

  auto platform = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
  uint64_t ub = 0;
  platform.GetCoreMemSize(platform_ascendc::CoreMemType::UB, ub);
  const rgdr::TilingResult r = rgdr::ComputeTiling(s, rgdr::Platform{static_cast<uint32_t>(ub),
                                                                     platform.GetCoreNumAiv()});
  if (!r.ok) {
    return ge::GRAPH_FAILED;  // the torch op and aclnn wrapper report r.error before launching
  }
  context->SetBlockDim(r.data.blockDim);
  // A plain C++ tiling struct (CANN: "using standard C++ syntax to define the
  // tiling structure"): the host fills the framework's copy; the kernel
  // registers the type with REGISTER_TILING_DEFAULT.
  *context->GetTilingData<rgdr::RecurrentGatedDeltaRuleTilingData>() = r.data;
  size_t* workspace = context->GetWorkspaceSizes(1);
  workspace[0] = platform.GetLibApiWorkSpaceSize();
  return ge::GRAPH_SUCCESS;
}

}  // namespace

IMPL_OP_OPTILING(RecurrentGatedDeltaRule).Tiling(TilingFunc);

}  // namespace ops
