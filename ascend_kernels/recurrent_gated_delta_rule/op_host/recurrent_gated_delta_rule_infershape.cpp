// Shape and dtype inference: out is [T, NV, Dv] (value's shape) in query's dtype.
#include "register/op_impl_registry.h"

namespace ops {

static ge::graphStatus InferShape(gert::InferShapeContext* context) {
  const gert::Shape* value = context->GetInputShape(2);
  gert::Shape* out = context->GetOutputShape(0);
  if (value == nullptr || out == nullptr || value->GetDimNum() != 3) {
    return ge::GRAPH_FAILED;
  }
  *out = *value;
  return ge::GRAPH_SUCCESS;
}

static ge::graphStatus InferDataType(gert::InferDataTypeContext* context) {
  context->SetOutputDataType(0, context->GetInputDataType(0));
  return ge::GRAPH_SUCCESS;
}

IMPL_OP_INFERSHAPE(RecurrentGatedDeltaRule).InferShape(InferShape).InferDataType(InferDataType);

}  // namespace ops
