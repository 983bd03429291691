// The fused decode step's schema (rvv_kernels/decoder/decoder_step.h) for
// Python: the descriptions are classes with named fields, a buffer field takes a
// tensor (its data pointer, element count, element size and contiguity are read
// from it, so a wrong dtype or a strided view is an error naming the field), an
// (address, elements) pair, or None (empty). LayerKind is exported, so Python
// reads the layer kinds instead of restating them.
#include "python/rvascend/ops/decoder_step_binding.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "rvv_kernels/decoder/decoder_step.h"

namespace pybind11 {
namespace detail {

template <>
struct type_caster<rvascend::Span> {
  PYBIND11_TYPE_CASTER(rvascend::Span, const_name("Span"));

  bool load(handle src, bool) {
    value = rvascend::Span{};
    if (src.is_none()) return true;
    if (isinstance<tuple>(src)) {
      const auto pair = reinterpret_borrow<tuple>(src);
      if (pair.size() != 2) return false;
      value.address = pair[0].cast<uintptr_t>();
      value.elements = pair[1].cast<size_t>();
      return true;
    }
    if (!hasattr(src, "data_ptr")) return false;  // a torch.Tensor, or anything that reads as one
    value.address = src.attr("data_ptr")().cast<uintptr_t>();
    value.elements = src.attr("numel")().cast<size_t>();
    value.element_size = src.attr("element_size")().cast<size_t>();
    value.contiguous = src.attr("is_contiguous")().cast<bool>();
    return true;
  }

  static handle cast(const rvascend::Span& span, return_value_policy, handle) {
    return make_tuple(span.address, span.elements).release();
  }
};

}  // namespace detail
}  // namespace pybind11

namespace rvascend {

void BindDecoderStep(pybind11::module_& m, void (*stage_marker)(int)) {
  namespace py = pybind11;
  py::enum_<LayerKind> kinds(m, "LayerKind", "A decoder layer's mixer (decoder_layer_table.h).");
#define RVASCEND_BIND_KIND(enumerator, name) kinds.value(#name, LayerKind::enumerator);
  RVASCEND_LAYER_KINDS(RVASCEND_BIND_KIND)
#undef RVASCEND_BIND_KIND
  m.def(
      "decoder_stage_names", [](LayerKind kind) { return LayerKindOf(kind).stages; }, py::arg("kind"),
      "The stages a layer of this kind runs, in order (the step profiler's region names).");

  py::class_<DeltaNetShape>(m, "DeltaNetShape")
      .def(py::init<>())
      .def(py::init<const DeltaNetShape&>(), py::arg("other"), "A copy.")
      .def_readwrite("nk", &DeltaNetShape::nk)
      .def_readwrite("nv", &DeltaNetShape::nv)
      .def_readwrite("dk", &DeltaNetShape::dk)
      .def_readwrite("dv", &DeltaNetShape::dv)
      .def_readwrite("kernel", &DeltaNetShape::kernel)
      .def_readwrite("num_slots", &DeltaNetShape::num_slots)
      .def_readwrite("norm_eps", &DeltaNetShape::norm_eps);
  py::class_<DecoderShape>(m, "DecoderShape")
      .def(py::init<>())
      .def(py::init<const DecoderShape&>(), py::arg("other"), "A copy.")
      .def_readwrite("hidden", &DecoderShape::hidden)
      .def_readwrite("intermediate", &DecoderShape::intermediate)
      .def_readwrite("heads", &DecoderShape::heads)
      .def_readwrite("kv_heads", &DecoderShape::kv_heads)
      .def_readwrite("head_dim", &DecoderShape::head_dim)
      .def_readwrite("num_slots", &DecoderShape::num_slots)
      .def_readwrite("zero_centred", &DecoderShape::zero_centred)
      .def_readwrite("norm_eps", &DecoderShape::norm_eps)
      .def_readwrite("qk_norm_eps", &DecoderShape::qk_norm_eps)
      .def_readwrite("scale", &DecoderShape::scale)
      .def_readwrite("deltanet", &DecoderShape::deltanet);
  py::class_<QuantPartDesc>(m, "QuantPartDesc")
      .def(py::init([](std::string format, size_t rows, Span data) { return QuantPartDesc{format, rows, data}; }),
           py::kw_only(), py::arg("format"), py::arg("rows"), py::arg("data"))
      .def_readwrite("format", &QuantPartDesc::format)
      .def_readwrite("rows", &QuantPartDesc::rows)
      .def_readwrite("data", &QuantPartDesc::data);
  py::class_<ProjectionDesc>(m, "ProjectionDesc")
      .def(py::init([](Span packed, std::vector<QuantPartDesc> parts) { return ProjectionDesc{packed, parts}; }),
           py::kw_only(), py::arg("packed") = py::none(), py::arg("parts") = std::vector<QuantPartDesc>())
      .def_readwrite("packed", &ProjectionDesc::packed)
      .def_readwrite("parts", &ProjectionDesc::parts);
  py::class_<LayerDesc> layer(m, "LayerDesc", "One layer: its kind and every field of decoder_layer_table.h.");
  layer.def(py::init<>())
      .def(py::init<const LayerDesc&>(), py::arg("other"), "A copy.")
      .def_readwrite("kind", &LayerDesc::kind);
#define RVASCEND_BIND_PROJECTION(field, n, k) layer.def_readwrite(#field, &LayerDesc::field);
  RVASCEND_LAYER_PROJECTIONS(RVASCEND_BIND_PROJECTION)
#undef RVASCEND_BIND_PROJECTION
#define RVASCEND_BIND_BUFFER(field, type, kinds, need, elements) layer.def_readwrite(#field, &LayerDesc::field);
  RVASCEND_LAYER_BUFFERS(RVASCEND_BIND_BUFFER)
#undef RVASCEND_BIND_BUFFER
  py::class_<DecoderModelDesc>(m, "DecoderModelDesc")
      .def(py::init<>())
      .def(py::init<const DecoderModelDesc&>(), py::arg("other"), "A copy.")
      .def_readwrite("shape", &DecoderModelDesc::shape)
      .def_readwrite("block_n", &DecoderModelDesc::block_n)
      .def_readwrite("quant_tile", &DecoderModelDesc::quant_tile)
      .def_readwrite("layers", &DecoderModelDesc::layers)
      .def_readwrite("final_norm", &DecoderModelDesc::final_norm)
      .def_readwrite("head", &DecoderModelDesc::head)
      .def_readwrite("vocab", &DecoderModelDesc::vocab);
  py::class_<DecoderStepArgs>(m, "DecoderStepArgs")
      .def(py::init([stage_marker](size_t tokens, size_t batch, size_t rotary_dim, Span q_starts, Span kv_starts,
                                   Span kv_slots, Span write_slots, Span cos, Span sin, Span state_slots,
                                   Span state_read_slots, Span h, Span h_out, Span residual_out, bool project_head,
                                   Span head_rows, Span logits, std::string kernel_set, std::string quant_kernel_set,
                                   size_t num_threads, bool stage_markers) {
             DecoderStepArgs a;
             a.tokens = tokens, a.batch = batch, a.rotary_dim = rotary_dim;
             a.q_starts = q_starts, a.kv_starts = kv_starts, a.kv_slots = kv_slots, a.write_slots = write_slots;
             a.cos = cos, a.sin = sin, a.state_slots = state_slots, a.state_read_slots = state_read_slots;
             a.h = h, a.h_out = h_out, a.residual_out = residual_out;
             a.project_head = project_head, a.head_rows = head_rows, a.logits = logits;
             a.kernel_set = kernel_set, a.quant_kernel_set = quant_kernel_set;
             a.num_threads = num_threads;
             a.stage_marker = stage_markers ? stage_marker : nullptr;
             return a;
           }),
           py::kw_only(), py::arg("tokens"), py::arg("batch"), py::arg("rotary_dim"), py::arg("q_starts"),
           py::arg("kv_starts"), py::arg("kv_slots"), py::arg("write_slots"), py::arg("cos"), py::arg("sin"),
           py::arg("state_slots") = py::none(), py::arg("state_read_slots") = py::none(), py::arg("h"),
           py::arg("h_out"), py::arg("residual_out"), py::arg("project_head") = false,
           py::arg("head_rows") = py::none(), py::arg("logits") = py::none(), py::arg("kernel_set") = "",
           py::arg("quant_kernel_set") = "", py::arg("num_threads") = 1, py::arg("stage_markers") = false)
      .def_readwrite("tokens", &DecoderStepArgs::tokens)
      .def_readwrite("batch", &DecoderStepArgs::batch)
      .def_readwrite("q_starts", &DecoderStepArgs::q_starts)
      .def_readwrite("write_slots", &DecoderStepArgs::write_slots)
      .def_readwrite("cos", &DecoderStepArgs::cos)
      .def_readwrite("h", &DecoderStepArgs::h)
      .def_readwrite("head_rows", &DecoderStepArgs::head_rows)
      .def_readwrite("logits", &DecoderStepArgs::logits)
      .def_readwrite("kernel_set", &DecoderStepArgs::kernel_set);
  py::class_<DecoderModel>(m, "DecoderModel",
                           "A model's decoder layers, checked once (decoder_step.h); run() runs one step.")
      .def(py::init<const DecoderModelDesc&>(), py::arg("desc"))
      .def_property_readonly("num_layers", &DecoderModel::num_layers)
      .def(
          "run",
          [](const DecoderModel& model, const DecoderStepArgs& args) {
            py::gil_scoped_release release;
            model.Run(args);
          },
          py::arg("args"), "One step (DecoderStepArgs); nothing is written when a check fails.");
}

}  // namespace rvascend
