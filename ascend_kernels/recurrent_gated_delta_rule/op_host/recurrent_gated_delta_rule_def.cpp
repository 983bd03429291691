// CANN op definition of recurrent_gated_delta_rule (built only with CANN; see
// the README). Inputs and attributes follow the public op: bf16 (or fp16)
// query/key/value/beta/state, FP32 g/gk, int32/int64 lengths and indices.
//
// The state pool is updated in place: CANN expresses that by an output with
// the same name as the input it modifies (Ascend Extension for PyTorch,
// TorchAir guide, "In-place operators": every modified input gets a
// same-named output); the generated aclnn API then takes it as a reference
// tensor. Target: Atlas A2 (ascend910b). No 310P: the Atlas inference AI Core
// has no BF16 and no DataCopyPad, which every DMA here uses.
#include "register/op_def_registry.h"

namespace ops {

class RecurrentGatedDeltaRule : public OpDef {
 public:
  explicit RecurrentGatedDeltaRule(const char* name) : OpDef(name) {
    const std::vector<ge::DataType> act = {ge::DT_BF16, ge::DT_FLOAT16, ge::DT_BF16, ge::DT_FLOAT16};
    const std::vector<ge::DataType> f32 = {ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT};
    const std::vector<ge::DataType> idx = {ge::DT_INT32, ge::DT_INT32, ge::DT_INT64, ge::DT_INT64};
    const std::vector<ge::DataType> i32 = {ge::DT_INT32, ge::DT_INT32, ge::DT_INT32, ge::DT_INT32};
    const std::vector<ge::Format> nd(4, ge::FORMAT_ND);
    for (const char* name : {"query", "key", "value", "beta", "state"}) {
      Input(name).ParamType(REQUIRED).DataType(act).Format(nd);
    }
    Input("actual_seq_lengths").ParamType(REQUIRED).DataType(idx).Format(nd);
    Input("ssm_state_indices").ParamType(REQUIRED).DataType(idx).Format(nd);
    Input("g").ParamType(OPTIONAL).DataType(f32).Format(nd);
    Input("gk").ParamType(OPTIONAL).DataType(f32).Format(nd);
    Input("num_accepted_tokens").ParamType(OPTIONAL).DataType(i32).Format(nd);
    Output("out").ParamType(REQUIRED).DataType(act).Format(nd);
    Output("state").ParamType(REQUIRED).DataType(act).Format(nd);
    Attr("scale").AttrType(REQUIRED).Float();
    AICore().AddConfig("ascend910b");
  }
};

OP_ADD(RecurrentGatedDeltaRule);

}  // namespace ops
