"""A decode step's decoder layers in one native call, when the policy routes all of them.

Op by op, a decode step of a 28-layer model makes about 300 routed calls, and
on an in-order RISC-V core the interpreter, the dispatcher and the allocator
around each call cost as much as the kernels outside the Linears (the
riscv64_step profile: about 1.4 M instructions of Python per layer). The fused
path runs the same kernels in the same order from C++
(rvv_kernels/decoder/decoder_layers.h), the model's final add + RMSNorm
included, so its results are bit-identical to the op-by-op path's. The model's
layers cross once, as named fields (rvv_kernels/decoder/decoder_step.h: a
LayerDesc per layer, checked by name when the native DecoderModel is built);
what remains per step in Python is one staleness check per packed weight and
the step's own arguments (DecoderStepArgs). The logits come out of the same call: the output
projection (lm_head, or the tied embedding) runs after the final norm over the
rows the step samples, when op by op would route it to the same kernel (its
weight packed or quantized and fresh, and, under the measured gate, its rows
timed faster packed); otherwise the call returns the normed rows and the model
projects them itself.

It runs when the policy's kernels are on, the rows pass the projections' row
gate, and every layer's four projections are packed and fresh (the same check
the projection routes make: packed_source.py). A prefill or chunked-prefill
step of up to FUSED_PREFILL_ROWS rows runs fused too, where op by op would take
the same kernels: under the seed's gate every projection whose row-major weight
is kept passes it at the step's rows (the packed copy of record, and a quantized
weight, always take the kernel), and the attention kernel takes the rows
(kernel_routes: on x86, up to 512 keys); a model with DeltaNet layers prefills
op by op (their prompt runs the chunked delta rule). Under the measured gate a
step runs fused, decode or prefill, even where F.linear timed faster for one
call at those rows: the timings are of one call, while the fused step saves
what goes between calls (a third of a SmolLM2-135M prompt's time op by op).
Otherwise the model runs op by op and the reason is counted under the kernel
"decoder_layers". The route counters of the fused step are the op-by-op path's,
added in bulk, so /metrics reads the same.

Layers come in three kinds (decoder_layers.h's LayerKind): attention
(models/decoder.py), and in the hybrid models (models/qwen3_5.py) gated
attention and Gated DeltaNet, whose conv + delta-rule step runs on the
sequence's recurrent-state slot as the op-by-op path's deltanet_decode does.
Each layer class says which kind it is and hands over its parts (its
`describe()`, a LayerParts).
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from typing import Iterator, NamedTuple, Optional

import torch

from rvascend import ops
from rvascend.ops.packed_linear import _native
from rvascend.dispatch import kernel_routes, shape_gate
from rvascend.dispatch.route import PACKED_BUFFER
from rvascend.dispatch.route_context import RouteContext


FUSED_ATTR = "_rvv_fused_decoder"
_data_ptr, _stride = torch.Tensor.data_ptr, torch.Tensor.stride
_version, _source = operator.attrgetter("_version"), operator.attrgetter("source")
# The most rows a fused prefill step takes: a chunk of the server's default
# chunked-prefill size (512 on x86) beside as many decode rows. Its scratch
# (rows x the widest projection) is kept for the next step, so a step with more
# rows runs op by op rather than leave that much behind.
FUSED_PREFILL_ROWS = 1024


@contextlib.contextmanager
def held_off(model: torch.nn.Module) -> Iterator[None]:
    """Runs the model's layers op by op inside (the regional compile's warm-up, and
    tests that compare both paths)."""
    saved = model.__dict__.pop(FUSED_ATTR, None)
    try:
        yield
    finally:
        if saved is not None:
            model.__dict__[FUSED_ATTR] = saved


# decoder_layers.h's LayerKind, as the native module exports it.
ATTENTION, GATED_ATTENTION, DELTANET = (_native.LayerKind.attention, _native.LayerKind.gated_attention,
                                        _native.LayerKind.deltanet)
# Each kind's four projections, by the names the op-by-op routes count them under.
PROJECTIONS = {ATTENTION: ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
               GATED_ATTENTION: ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
               DELTANET: ("in_proj", "out_proj", "gate_up_proj", "down_proj")}


class LayerParts(NamedTuple):
    """A decoder layer as the fused step reads it: each layer class of a fused model says
    what it is made of (its `describe()`), nothing is guessed from its attributes."""
    kind: "_native.LayerKind"
    input_norm: torch.nn.Module
    post_norm: torch.nn.Module
    projections: tuple        # (qkv or in_proj, o or out_proj, gate_up, down) modules
    q_norm: Optional[torch.nn.Module]
    k_norm: Optional[torch.nn.Module]
    index: int                # its K/V layer in the pool, or its recurrent-state layer
    mixer: torch.nn.Module    # the attention or the Gated DeltaNet module


class FusedDecoder:
    """The fused decode path of one model (class attribute `rvv_fused_decoder = True`
    on the model marks the structure of models/decoder.py)."""

    def __init__(self, context: RouteContext, model: torch.nn.Module) -> None:
        self.context = context
        config = model.config
        self.shape = dict(hidden=config.hidden_size, intermediate=config.intermediate_size,
                          heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
                          head_dim=config.head_dim)
        self.norm_eps = float(config.rms_norm_eps)
        self.head = model.lm_head
        self.vocab = int(config.vocab_size)
        self.layers: list[LayerParts] = [layer.describe() for layer in model.model.layers]
        attention = [layer.mixer for layer in self.layers if layer.kind != DELTANET]
        self.scale = float(attention[0].scale) if attention else 1.0
        self.zero_centred = bool(self.layers) and bool(getattr(self.layers[0].input_norm, "zero_centred", False))
        # The final add + norm runs in the call with the layers' eps and scale; a model
        # whose last norm differs runs op by op.
        norm = model.model.norm
        self.final_norm = norm if (float(norm.eps) == self.norm_eps and
                                   bool(getattr(norm, "zero_centred", False)) == self.zero_centred) else None
        recurrent = [layer.mixer for layer in self.layers if layer.kind == DELTANET]
        self.deltanet = recurrent[0] if recurrent else None  # the first DeltaNet mixer: the layers' shape
        self.kinds = [layer.kind for layer in self.layers]
        # What one step adds to the counters, as the op-by-op path would: calls per
        # projection route, then per kernel route.
        self._projection_calls: dict[str, int] = {}
        for kind in self.kinds:
            for projection in PROJECTIONS[kind]:
                self._projection_calls[projection] = self._projection_calls.get(projection, 0) + 1
        attention, gated = sum(k != DELTANET for k in self.kinds), self.kinds.count(GATED_ATTENTION)
        n = len(self.kinds)
        self._kernel_calls = {kind: calls for kind, calls in (
            ("decoder_layers", 1), ("rms_norm", 1), ("add_rms_norm", 2 * n), ("silu_mul", n),
            ("rope", attention), ("kv_pool_attention", attention), ("sigmoid_mul", gated)) if calls}
        self._bulk: dict[int, tuple] = {}  # rows -> _count's keyed counts
        self.stage_markers = False  # the step profiler's region markers inside the call
        self._plan: Optional[_Plan] = None

    def native_shape(self, pool, qk_norm_eps: float) -> "_native.DecoderShape":
        """The layers' shape over `pool` (its K/V slots, and its recurrent-state slots with
        DeltaNet layers), as decoder_layers.h's DecoderShape."""
        shape = _native.DecoderShape()
        for name, value in self.shape.items():
            setattr(shape, name, value)
        shape.num_slots = pool.num_slots
        shape.norm_eps, shape.qk_norm_eps, shape.scale = self.norm_eps, qk_norm_eps, self.scale
        shape.zero_centred = self.zero_centred
        d = self.deltanet
        if d is not None:
            deltanet = _native.DeltaNetShape()
            deltanet.nk, deltanet.nv, deltanet.dk, deltanet.dv, deltanet.kernel = d.nk, d.nv, d.dk, d.dv, d.kernel
            deltanet.num_slots, deltanet.norm_eps = pool.states.num_slots, float(d.norm.eps)
            shape.deltanet = deltanet
        return shape

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch, pool,
                 logit_rows: Optional[torch.Tensor] = None
                 ) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """(the model's final norm of the last layer's output plus the residual stream,
        [tokens, hidden]; the logits of its rows `logit_rows` (None: every row), [rows,
        vocab], or None where the model is to project them); or None: run the layers and
        that norm op by op."""
        context = self.context
        t = h.shape[0]
        why = self._why_not(context, h, t, batch, pool)
        plan = None
        if why is None:
            plan = self._plan if self._plan is not None and self._plan.holds(pool) else None
            if plan is None and self._plan is not None and self._plan.pool_ref() is pool:
                # A parameter, buffer or weight content changed under the same pool: K/V
                # cached from the old weights are stale, declared or not.
                context.weights_changed()
            if plan is None:
                self._plan, why = _Plan.build(self, pool)
                plan = self._plan
        if why is None and batch.prefill:
            why = self._prefill_why_not(context, plan, h, t, batch)
        if why is not None:
            context.kernels.counters.record("decoder_layers", "fallback", t, why)
            return None
        kv_slots, kv_starts, q_starts = batch.flat_index()
        h = h if h.is_contiguous() else h.contiguous()
        cos, sin = cos.contiguous(), sin.contiguous()
        h_out, residual_out = torch.empty_like(h), torch.empty_like(h)
        m = t if logit_rows is None else logit_rows.shape[0]
        head = self._head_route(context, plan, m, logit_rows)
        logits = None if head is None else h.new_empty(m, self.vocab)
        index = batch.recurrent_index() if self.deltanet is not None else None
        plan.model.run(_native.DecoderStepArgs(
            tokens=t, batch=q_starts.shape[0] - 1, rotary_dim=cos.shape[-1], q_starts=q_starts, kv_starts=kv_starts,
            kv_slots=kv_slots, write_slots=batch.write_slots, cos=cos, sin=sin,
            state_slots=index.slots if index else None, state_read_slots=index.read_slots if index else None,
            h=h, h_out=h_out, residual_out=residual_out, project_head=head is not None,
            head_rows=logit_rows if head is not None else None, logits=logits,
            kernel_set=ops.packed_linear._kernel_set, quant_kernel_set=ops.quantized_linear._kernel_set,
            num_threads=torch.get_num_threads(), stage_markers=self.stage_markers))
        self._count(context, t)
        if head is not None:
            context.counters.record(head.projection, "packed", logits.shape[0])
        return h_out, logits

    def _head_route(self, context: RouteContext, plan: "_Plan", m: int, logit_rows: Optional[torch.Tensor]):
        """The output projection's route when it runs in the call: where op by op would send
        these m rows to the same kernel."""
        if plan.head is None or m == 0:
            return None
        if logit_rows is not None and (logit_rows.dtype != torch.int64 or logit_rows.dim() != 1
                                       or not logit_rows.is_contiguous()):
            return None
        route = self.head.__dict__.get("_rvv_route")
        if route is None or getattr(route, "quantized", False) or route.owned is not None:
            return route  # the quantized bytes or the packed copy of record: every BF16 CPU call takes them
        weight = self.head._parameters["weight"]
        which = context.shape_gate
        if shape_gate.rows_gate(route.projection, m, weight.shape[0], weight.shape[1],
                                context.small_batch, which) is not None:
            return None
        return route

    # -- when it runs ------------------------------------------------------------
    def _why_not(self, context: RouteContext, h: torch.Tensor, t: int, batch, pool) -> Optional[str]:
        if not context.kernels.enabled:
            return "kernels_off"
        if not self.layers:
            return "no_layers"
        if batch.keep_hidden:  # a draft head reads every row's final hidden state
            return "keep_hidden"
        if self.final_norm is None:
            return "final_norm"
        why = kernel_routes.bf16_cpu_inference(h)
        if why is not None:
            return why
        if batch.prefill and self.deltanet is not None:
            return "prefill"
        if batch.write_slots.dtype != torch.int64 or batch.write_slots.numel() != t:
            return "write_slots"
        if batch.prefill:
            return "prefill_rows_out_of_range" if t > FUSED_PREFILL_ROWS else None  # the rest once planned
        if t > 1 and not context.small_batch:
            return "small_batch_off"
        if t > shape_gate.PREFILL_BUCKETS[-1]:
            return "rows_out_of_range"
        if self.deltanet is not None:
            if pool.states is None or batch.state_slots is None:
                return "no_state_slots"
            if batch.state_token_slots is not None:  # a verify step keeps per-token states
                return "verify"
            if batch.recurrent_index().lengths is not None:  # a one-token prompt starts its state here
                return "prefill"
        return None

    @staticmethod
    def _prefill_why_not(context: RouteContext, plan: "_Plan", h: torch.Tensor, t: int, batch) -> Optional[str]:
        """Why op by op would take some other path for this prefill's rows, or None."""
        why = context.kernels.gate("kv_pool_attention", h, prefill_keys=batch.prefill_keys)
        if why is not None:
            return why
        if context.shape_gate != "bucketed":
            return None
        for projection, n, k in plan.row_gated:
            why = shape_gate.rows_gate(projection, t, n, k, context.small_batch)
            if why is not None:
                return f"{projection}_{why}"
        return None

    def _count(self, context: RouteContext, t: int) -> None:
        """The op-by-op path's counts, in bulk (one lock per counter set, the keys made once
        per row count)."""
        bulk = self._bulk.get(t)
        if bulk is None:
            bulk = tuple(
                ({(name, route, ""): n for name, n in calls.items()}, {(name, route, t): n for name, n in calls.items()})
                for calls, route in ((self._projection_calls, "packed"), (self._kernel_calls, "kernel")))
            if len(self._bulk) < 64:  # decode batch sizes; a prompt's row counts vary without end
                self._bulk[t] = bulk
        context.counters.record_bulk(*bulk[0])
        context.kernels.counters.record_bulk(*bulk[1])


class _Plan:
    """The native model (decoder_step.h's DecoderModel: every layer's buffers by field name,
    checked once) for one KV pool, and what it was built from.

    Built with the projection routes' own staleness check; kept while every
    packed weight is provably the one packed, checked per step: the same module
    weight object, version, storage pointer and strides, the route's packed copy
    unchanged, and (one native call for all of them) the content fingerprint
    (packed_source.py says which writes that catches). Norm weights, a DeltaNet
    layer's conv weight, A_log and dt_bias are read through their pointer at
    every call, so only their identity and pointer are checked."""

    def __init__(self) -> None:
        self.desc: Optional[_native.DecoderModelDesc] = None  # what the model was built from
        self.model: Optional[_native.DecoderModel] = None
        self.block_n = 0
        self.pool_ref: Optional[weakref.ReferenceType] = None
        self.layout_version = ops.LAYOUT_VERSION
        # Every tensor the model points into, as columns: the module dict that holds it
        # (_parameters or _buffers), its key there, the tensor and its data pointer. The
        # per-step check maps over columns (C loops, no Python frame per tensor): a
        # generator per tuple cost a SmolLM2 BF16 step 0.37 ms, 3 %, on a two-core host.
        self.holders: list[dict] = []
        self.keys: list[str] = []
        self.tensors: list[torch.Tensor] = []
        self.pointers: list[int] = []
        # The projections whose row-major weight is kept, and what their packed copy was made from.
        self.weights: list[torch.Tensor] = []
        self.versions: list[int] = []
        self.strides: list[tuple] = []
        self.routes: list = []
        self.sources: list = []
        self.fingerprints: Optional[torch.Tensor] = None  # int64 [weights, 7] for weight_fingerprints_match
        # The output projection, or None when op by op takes another path for it (its route's own reasons).
        self.head: Optional[_native.ProjectionDesc] = None
        self.quant_tile = 0
        # (projection, N, K) of each packed projection whose row-major weight is kept, in layer
        # order: op by op its calls pass the seed's gate for their rows (a prefill checks it).
        self.row_gated: dict[tuple[str, int, int], None] = {}

    @classmethod
    def build(cls, fused: "FusedDecoder", pool) -> tuple[Optional["_Plan"], Optional[str]]:
        plan = cls()
        desc = _native.DecoderModelDesc()
        desc.final_norm = plan._param(fused.final_norm, "weight")
        if desc.final_norm is None:
            return None, "norm_weight_layout"
        layers, fingerprints = [], []
        qk_norm_eps = 0.0
        for layer in fused.layers:
            d = _native.LayerDesc()
            d.kind = layer.kind
            d.input_norm, d.post_attention_norm = (plan._param(norm, "weight")
                                                   for norm in (layer.input_norm, layer.post_norm))
            if d.input_norm is None or d.post_attention_norm is None:
                return None, "norm_weight_layout"
            projections = []
            for module in layer.projections:
                projection, why = plan._projection(module, fingerprints, row_gated=True)
                if why is not None:
                    return None, why
                projections.append(projection)
            d.qkv, d.o, d.gate_up, d.down = projections
            if layer.kind == DELTANET:
                mixer = layer.mixer
                weights = [plan._param(module, name) for module, name in (
                    (mixer.conv1d, "weight"), (mixer, "A_log"), (mixer, "dt_bias"), (mixer.norm, "weight"))]
                if any(w is None for w in weights):
                    return None, "deltanet_weight_layout"
                d.conv_weight, d.a_log, d.dt_bias, d.deltanet_norm = weights
                states = pool.states
                conv, ssm = states.conv[layer.index], states.ssm[layer.index]
                if conv.dtype != torch.bfloat16 or ssm.dtype != torch.float32 or not (
                        conv.is_contiguous() and ssm.is_contiguous()):
                    return None, "state_pool_layout"
                d.conv_state, d.ssm_state = conv, ssm
            else:
                if layer.q_norm is not None:
                    d.q_norm, d.k_norm = (plan._param(norm, "weight") for norm in (layer.q_norm, layer.k_norm))
                    if d.q_norm is None or d.k_norm is None:
                        return None, "norm_weight_layout"
                    qk_norm_eps = float(layer.q_norm.eps)
                k, v = pool.k[layer.index], pool.v[layer.index]
                if k.dtype != torch.bfloat16 or not (k.is_contiguous() and v.is_contiguous()):
                    return None, "kv_pool_layout"
                d.k_pool, d.v_pool = k, v
            layers.append(d)
        if fused.head is not None:
            head, why = plan._projection(fused.head, fingerprints, row_gated=False)
            if why is None:
                plan.head = desc.head = head
        desc.layers = layers
        desc.shape = fused.native_shape(pool, qk_norm_eps)
        desc.block_n, desc.quant_tile, desc.vocab = plan.block_n, plan.quant_tile, fused.vocab
        plan.desc, plan.model = desc, _native.DecoderModel(desc)
        plan.fingerprints = torch.tensor(fingerprints or [[0] * 7], dtype=torch.int64)[:len(fingerprints)]
        plan.pool_ref = weakref.ref(pool)
        return plan, None

    def _projection(self, module: torch.nn.Module, fingerprints: list, row_gated: bool
                    ) -> tuple[Optional[_native.ProjectionDesc], Optional[str]]:
        """A routed projection's weight as the native model reads it, watched; or why op by op
        would not take the kernel."""
        route = module.__dict__.get("_rvv_route")
        if route is None:
            return None, "not_routed"
        if getattr(route, "quantized", False):
            if module.bias is not None:
                return None, "bias"
            return self._quantized(module), None
        if route.owned is not None:
            # The packed buffer is the weight: only its replacement matters.
            packed = route.owned_packed()
            why = self._packed_layout(module, packed)
            if why is None:
                self._watch(module._buffers, PACKED_BUFFER, packed)
            return (None, why) if why else (_native.ProjectionDesc(packed=packed), None)
        weight = module._parameters["weight"]
        packed, why = route.packed_weight(weight)
        if packed is None:
            return None, why
        why = self._packed_layout(module, packed)
        if why is not None:
            return None, why
        if row_gated:
            self.row_gated[(route.projection, weight.shape[0], weight.shape[1])] = None
        source = route.source
        self._watch(module._parameters, "weight", weight)
        self.weights.append(weight)
        self.versions.append(weight._version)
        self.strides.append(weight.stride())
        self.routes.append(route)
        self.sources.append(source)
        fingerprints.append(ops.packed_linear.fingerprint_descriptor_row(weight, source.fingerprint))
        return _native.ProjectionDesc(packed=packed), None

    def _packed_layout(self, module, packed: torch.Tensor) -> Optional[str]:
        if module._parameters.get("bias") is not None:
            return "bias"
        if not self.block_n:
            self.block_n = packed.shape[2]
        if packed.shape[2] != self.block_n or not packed.is_contiguous():
            return "packed_layout"
        return None

    def _quantized(self, module) -> _native.ProjectionDesc:
        """A quantized projection's parts (format, rows, bytes), watched."""
        parts = []
        for i, part in enumerate(module.parts):
            data = module.qweight(i)
            parts.append(_native.QuantPartDesc(format=part.fmt, rows=part.rows, data=data))
            self._watch(module._buffers, module.qweight_key(i), data)
            self.quant_tile = part.tile
        return _native.ProjectionDesc(parts=parts)

    def _param(self, module: torch.nn.Module, name: str) -> Optional[torch.Tensor]:
        """A BF16 parameter the model reads through its pointer, watched; None if it is not
        a contiguous CPU BF16 tensor."""
        w = module._parameters[name]
        if w.dtype != torch.bfloat16 or not w.is_contiguous() or w.device.type != "cpu":
            return None
        self._watch(module._parameters, name, w)
        return w

    def _watch(self, holder: dict, key: str, tensor: torch.Tensor) -> None:
        self.holders.append(holder)
        self.keys.append(key)
        self.tensors.append(tensor)
        self.pointers.append(tensor.data_ptr())

    def holds(self, pool) -> bool:
        """Whether the table still describes the model and `pool` exactly."""
        if self.pool_ref() is not pool or self.layout_version != ops.LAYOUT_VERSION:
            return False
        # Still held where it was (a replaced parameter or buffer), over the same storage
        # (`.data =` keeps the object). The kernels read the packed copy of record and a
        # quantized buffer themselves, so for those only that matters.
        if not all(map(operator.is_, map(dict.get, self.holders, self.keys), self.tensors)):
            return False
        if list(map(_data_ptr, self.tensors)) != self.pointers:
            return False
        if not self.weights:
            return True
        if (list(map(_version, self.weights)) != self.versions or list(map(_stride, self.weights)) != self.strides
                or not all(map(operator.is_, map(_source, self.routes), self.sources))):
            return False
        return _native.weight_fingerprints_match(self.fingerprints.data_ptr(), self.fingerprints.shape[0],
                                                 ops.packed_linear.FINGERPRINT_SAMPLES, torch.get_num_threads()) < 0


def attach(model: torch.nn.Module, context: RouteContext) -> Optional[FusedDecoder]:
    if not getattr(type(model), "rvv_fused_decoder", False):
        return None
    fused = FusedDecoder(context, model)
    model.__dict__[FUSED_ATTR] = fused
    return fused


def detach(model: torch.nn.Module) -> None:
    model.__dict__.pop(FUSED_ATTR, None)


def fused_decoder_of(model: torch.nn.Module) -> Optional[FusedDecoder]:
    return model.__dict__.get(FUSED_ATTR)
