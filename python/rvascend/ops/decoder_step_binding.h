// The fused decode step's schema bound into the `_rvv_kernels` module.
#ifndef PYTHON_RVASCEND_OPS_DECODER_STEP_BINDING_H_
#define PYTHON_RVASCEND_OPS_DECODER_STEP_BINDING_H_

#include <pybind11/pybind11.h>

namespace rvascend {

// Adds LayerKind, decoder_stage_names, the description classes and DecoderModel to
// `m`; `stage_marker` is what DecoderStepArgs(stage_markers=True) calls at every stage.
void BindDecoderStep(pybind11::module_& m, void (*stage_marker)(int));

}  // namespace rvascend

#endif  // PYTHON_RVASCEND_OPS_DECODER_STEP_BINDING_H_
