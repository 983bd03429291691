// Shape and dtype inference: out is [T, NV, Dv] (value's shape) in query's
// dtype; the in-place state output is the state input, shape and dtype.
#include "register/op_impl_registry.h"

namespace ops {

static ge::graphStatus InferShape(gert::InferShapeContext* context) {
  const gert::Shape* value = context->GetInputShape(2);
  const gert::Shape* state = context->GetInputShape(4);
  gert::Shape* out = context->GetOutputShape(0);
  gert::Shape* stateOut = context->GetOutputShape(1);
  if (value == nullptr || state == nullptr || out == nullptr || stateOut == nullptr || value->GetDimNum() != 3) {
    return ge::GRAPH_FAILED;
  }
  *out = *value;
  *stateOut = *state;
  return ge::GRAPH_SUCCESS;
}

static ge::graphStatus InferDataType(gert::InferDataTypeContext* context) {
  context->SetOutputDataType(0, context->GetInputDataType(0));
  context->SetOutputDataType(1, context->GetInputDataType(4));
  return ge::GRAPH_SUCCESS;
}

IMPL_OP_INFERSHAPE(RecurrentGatedDeltaRule).InferShape(InferShape).InferDataType(InferDataType);

}  // namespace ops
