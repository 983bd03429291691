"""A decode step's decoder layers in one native call, when the policy routes all of them.

Op by op, a decode step of a 28-layer model makes about 300 routed calls, and
on an in-order RISC-V core the interpreter, the dispatcher and the allocator
around each call cost as much as the kernels outside the Linears (the
riscv64_step profile: about 1.4 M instructions of Python per layer). The fused
path runs the same kernels in the same order from C++
(rvv_kernels/decoder/decoder_layers.h), the model's final add + RMSNorm
included, so its results are bit-identical to the op-by-op path's; what remains
per step in Python is one staleness check per packed weight and building the
layers' pointer table. The logits come out of the same call: the output
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
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from typing import TYPE_CHECKING, Iterator, NamedTuple, Optional

import torch

from rvascend import ops
from rvascend.ops.packed_linear import _native
from rvascend.dispatch import kernel_routes, shape_gate
from rvascend.dispatch.route import PACKED_BUFFER

if TYPE_CHECKING:
    from rvascend.policy.install import RvvPolicy

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


ATTENTION, GATED_ATTENTION, DELTANET = 0, 1, 2  # decoder_layers.h's LayerKind
# Each kind's four projections, by the names the op-by-op routes count them under.
PROJECTIONS = {ATTENTION: ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
               GATED_ATTENTION: ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
               DELTANET: ("in_proj", "out_proj", "gate_up_proj", "down_proj")}


class _Layer(NamedTuple):
    kind: int
    input_norm: torch.nn.Module
    post_norm: torch.nn.Module
    projections: tuple        # (qkv or in_proj, o or out_proj, gate_up, down) modules
    q_norm: Optional[torch.nn.Module]
    k_norm: Optional[torch.nn.Module]
    index: int                # its K/V layer in the pool, or its recurrent-state layer
    deltanet: Optional[torch.nn.Module]


def _layer(layer: torch.nn.Module) -> _Layer:
    mlp = (layer.mlp.gate_up_proj, layer.mlp.down_proj)
    mixer = getattr(layer, "linear_attn", None)
    if mixer is not None:
        return _Layer(DELTANET, layer.input_layernorm, layer.post_attention_layernorm,
                      (mixer.in_proj, mixer.out_proj) + mlp, None, None, mixer.index, mixer)
    attn = layer.self_attn
    kind = GATED_ATTENTION if getattr(attn, "output_gate", False) else ATTENTION
    return _Layer(kind, layer.input_layernorm, layer.post_attention_layernorm, (attn.qkv_proj, attn.o_proj) + mlp,
                  attn.q_norm, attn.k_norm, attn.layer, None)


class FusedDecoder:
    """The fused decode path of one model (class attribute `rvv_fused_decoder = True`
    on the model marks the structure of models/decoder.py)."""

    def __init__(self, policy: "RvvPolicy", model: torch.nn.Module) -> None:
        self._policy = weakref.ref(policy)
        config = model.config
        self.shape = dict(hidden=config.hidden_size, intermediate=config.intermediate_size,
                          heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
                          head_dim=config.head_dim)
        self.norm_eps = float(config.rms_norm_eps)
        self.head = model.lm_head
        self.vocab = int(config.vocab_size)
        self.layers = [_layer(layer) for layer in model.model.layers]
        attention = [layer for layer in model.model.layers if hasattr(layer, "self_attn")]
        self.scale = float(attention[0].self_attn.scale) if attention else 1.0
        self.zero_centred = bool(self.layers) and bool(getattr(self.layers[0].input_norm, "zero_centred", False))
        # The final add + norm runs in the call with the layers' eps and scale; a model
        # whose last norm differs runs op by op.
        norm = model.model.norm
        self.final_norm = norm if (float(norm.eps) == self.norm_eps and
                                   bool(getattr(norm, "zero_centred", False)) == self.zero_centred) else None
        self.deltanet: list[int] = []  # (NK, NV, Dk, Dv, conv taps) with DeltaNet layers
        self.deltanet_eps = 0.0
        recurrent = [layer.deltanet for layer in self.layers if layer.kind == DELTANET]
        if recurrent:
            d = recurrent[0]
            self.deltanet = [d.nk, d.nv, d.dk, d.dv, d.kernel]
            self.deltanet_eps = float(d.norm.eps)
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

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch, pool,
                 logit_rows: Optional[torch.Tensor] = None
                 ) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """(the model's final norm of the last layer's output plus the residual stream,
        [tokens, hidden]; the logits of its rows `logit_rows` (None: every row), [rows,
        vocab], or None where the model is to project them); or None: run the layers and
        that norm op by op."""
        policy = self._policy()
        t = h.shape[0]
        why = self._why_not(policy, h, t, batch, pool)
        plan = None
        if why is None:
            plan = self._plan if self._plan is not None and self._plan.holds(pool) else None
            if plan is None and self._plan is not None and self._plan.pool_ref() is pool:
                # A parameter, buffer or weight content changed under the same pool: K/V
                # cached from the old weights are stale, declared or not.
                policy.weights_changed()
            if plan is None:
                self._plan, why = _Plan.build(self.layers, self.final_norm, pool, self.head)
                plan = self._plan
        if why is None and batch.prefill:
            why = self._prefill_why_not(policy, plan, h, t, batch)
        if why is not None:
            policy.kernels.counters.record("decoder_layers", "fallback", t, why)
            return None
        kv_slots, kv_starts, q_starts = batch.flat_index()
        h = h if h.is_contiguous() else h.contiguous()
        cos, sin = cos.contiguous(), sin.contiguous()
        h_out, residual_out = torch.empty_like(h), torch.empty_like(h)
        m = t if logit_rows is None else logit_rows.shape[0]
        head = self._head_route(policy, plan, m, logit_rows)
        logits = None if head is None else h.new_empty(m, self.vocab)
        head_args = (-1, 0, 0, 0, 0, 0, 0, 0) if head is None else (
            *plan.head, self.vocab, 0 if logit_rows is None else logit_rows.data_ptr(),
            0 if logit_rows is None else m, logits.data_ptr(), logits.numel())
        s = self.shape
        n = len(self.layers)
        index = batch.recurrent_index() if self.deltanet else None
        _native.decoder_layers(
            ops.packed_linear._kernel_set, ops.quantized_linear._kernel_set, plan.quant_tile, plan.table.data_ptr(), plan.table.numel(), n, plan.block_n, s["hidden"],
            s["intermediate"], s["heads"], s["kv_heads"], s["head_dim"], pool.num_slots, self.norm_eps, plan.qk_eps,
            self.scale, t, q_starts.shape[0] - 1, q_starts.data_ptr(), q_starts.numel(), kv_starts.data_ptr(),
            kv_starts.numel(), kv_slots.data_ptr(), kv_slots.shape[0], batch.write_slots.data_ptr(),
            batch.write_slots.numel(), cos.data_ptr(), sin.data_ptr(), min(cos.numel(), sin.numel()), h.data_ptr(),
            h_out.data_ptr(), residual_out.data_ptr(), h.numel(), torch.get_num_threads(), self.stage_markers,
            cos.shape[-1], self.zero_centred, self.deltanet + [pool.states.num_slots] if self.deltanet else [],
            self.deltanet_eps, index.slots.data_ptr() if index else 0, index.slots.numel() if index else 0,
            index.read_slots.data_ptr() if index and index.read_slots is not None else 0, *plan.final_norm,
            *head_args)
        self._count(policy, t)
        if head is not None:
            policy.counters.record(head.projection, "packed", logits.shape[0])
        return h_out, logits

    def _head_route(self, policy: "RvvPolicy", plan: "_Plan", m: int, logit_rows: Optional[torch.Tensor]):
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
        which = policy.shape_gate
        if shape_gate.rows_gate(route.projection, m, weight.shape[0], weight.shape[1],
                                policy.config.small_batch, which) is not None:
            return None
        return route

    # -- when it runs ------------------------------------------------------------
    def _why_not(self, policy: "RvvPolicy", h: torch.Tensor, t: int, batch, pool) -> Optional[str]:
        if not policy.kernels.enabled:
            return "kernels_off"
        if not self.layers:
            return "no_layers"
        if self.final_norm is None:
            return "final_norm"
        why = kernel_routes.bf16_cpu_inference(h)
        if why is not None:
            return why
        if batch.prefill and self.deltanet:
            return "prefill"
        if batch.write_slots.dtype != torch.int64 or batch.write_slots.numel() != t:
            return "write_slots"
        if batch.prefill:
            return "prefill_rows_out_of_range" if t > FUSED_PREFILL_ROWS else None  # the rest once planned
        if t > 1 and not policy.config.small_batch:
            return "small_batch_off"
        if t > shape_gate.PREFILL_BUCKETS[-1]:
            return "rows_out_of_range"
        if self.deltanet:
            if pool.states is None or batch.state_slots is None:
                return "no_state_slots"
            if batch.recurrent_index().lengths is not None:  # a one-token prompt starts its state here
                return "prefill"
        return None

    @staticmethod
    def _prefill_why_not(policy: "RvvPolicy", plan: "_Plan", h: torch.Tensor, t: int, batch) -> Optional[str]:
        """Why op by op would take some other path for this prefill's rows, or None."""
        why = kernel_routes.KERNELS["kv_pool_attention"].gate(h, prefill_keys=batch.prefill_keys)
        if why is not None:
            return why
        if policy.shape_gate != "bucketed":
            return None
        for projection, n, k in plan.row_gated:
            why = shape_gate.rows_gate(projection, t, n, k, policy.config.small_batch)
            if why is not None:
                return f"{projection}_{why}"
        return None

    def _count(self, policy: "RvvPolicy", t: int) -> None:
        """The op-by-op path's counts, in bulk (one lock per counter set, the keys made once
        per row count)."""
        bulk = self._bulk.get(t)
        if bulk is None:
            bulk = tuple(
                ({(name, route, ""): n for name, n in calls.items()}, {(name, route, t): n for name, n in calls.items()})
                for calls, route in ((self._projection_calls, "packed"), (self._kernel_calls, "kernel")))
            if len(self._bulk) < 64:  # decode batch sizes; a prompt's row counts vary without end
                self._bulk[t] = bulk
        policy.counters.record_bulk(*bulk[0])
        policy.kernels.counters.record_bulk(*bulk[1])


class _Plan:
    """The layers' buffer table for one KV pool (int64 [layers, 37]: a (data pointer,
    elements) pair per buffer in the binding's kLayerBufferNames order, then one kind per
    projection, 0 BF16 packed or 1 quantized, then the layer's kind) and what it was built from.

    Built with the projection routes' own staleness check; kept while every
    packed weight is provably the one packed, checked per step: the same module
    weight object, version, storage pointer and strides, the route's packed copy
    unchanged, and (one native call for all of them) the content fingerprint
    (packed_source.py says which writes that catches). Norm weights, a DeltaNet
    layer's conv weight, A_log and dt_bias are read through their pointer at
    every call, so only their identity and pointer are checked."""

    def __init__(self) -> None:
        self.table: Optional[torch.Tensor] = None
        self.block_n = 0
        self.qk_eps = 0.0
        self.pool_ref: Optional[weakref.ReferenceType] = None
        self.layout_version = ops.LAYOUT_VERSION
        # Every tensor the table points into, as columns: the module dict that holds it
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
        self.quant_tables: list[torch.Tensor] = []
        self.final_norm: list[int] = []  # the model's last norm weight: (data pointer, elements)
        # The output projection: (kind, data pointer, elements) as a descriptor projection, or
        # None when op by op takes another path for it (its route's own reasons).
        self.head: Optional[tuple[int, int, int]] = None
        self.quant_tile = 0
        # (projection, N, K) of each packed projection whose row-major weight is kept, in layer
        # order: op by op its calls pass the seed's gate for their rows (a prefill checks it).
        self.row_gated: dict[tuple[str, int, int], None] = {}

    @classmethod
    def build(cls, layers: list[_Layer], final_norm: torch.nn.Module, pool, head: Optional[torch.nn.Module] = None
              ) -> tuple[Optional["_Plan"], Optional[str]]:
        plan = cls()
        if not plan._add_param(final_norm, "weight", plan.final_norm):
            return None, "norm_weight_layout"
        rows, fingerprints = [], []
        for layer in layers:
            row, kinds = [], []
            for norm in (layer.input_norm, layer.post_norm):
                if not plan._add_param(norm, "weight", row):
                    return None, "norm_weight_layout"
            for module in layer.projections:
                why = plan._add_projection(module, row, kinds, fingerprints, row_gated=True)
                if why is not None:
                    return None, why
            if layer.kind == DELTANET:
                row += [0, 0] * 4  # no q/k norm, no K/V
                d = layer.deltanet
                for module, name in ((d.conv1d, "weight"), (d, "A_log"), (d, "dt_bias"), (d.norm, "weight")):
                    if not plan._add_param(module, name, row):
                        return None, "deltanet_weight_layout"
                states = pool.states
                conv, ssm = states.conv[layer.index], states.ssm[layer.index]
                if conv.dtype != torch.bfloat16 or not (conv.is_contiguous() and ssm.is_contiguous()):
                    return None, "state_pool_layout"
                row += [conv.data_ptr(), conv.numel(), ssm.data_ptr(), ssm.numel()]
            else:
                for norm in (layer.q_norm, layer.k_norm):
                    if norm is None:
                        row += [0, 0]
                        continue
                    if not plan._add_param(norm, "weight", row):
                        return None, "norm_weight_layout"
                    plan.qk_eps = float(norm.eps)
                k, v = pool.k[layer.index], pool.v[layer.index]
                if k.dtype != torch.bfloat16 or not (k.is_contiguous() and v.is_contiguous()):
                    return None, "kv_pool_layout"
                row += [k.data_ptr(), k.numel(), v.data_ptr(), v.numel()] + [0, 0] * 6
            rows.append(row + kinds + [layer.kind])
        if head is not None:
            row, kinds = [], []
            if plan._add_projection(head, row, kinds, fingerprints, row_gated=False) is None:
                plan.head = (kinds[0], row[0], row[1])
        plan.table = torch.tensor(rows, dtype=torch.int64)
        plan.fingerprints = torch.tensor(fingerprints or [[0] * 7], dtype=torch.int64)[:len(fingerprints)]
        plan.pool_ref = weakref.ref(pool)
        return plan, None

    def _add_projection(self, module: torch.nn.Module, row: list[int], kinds: list[int], fingerprints: list,
                        row_gated: bool) -> Optional[str]:
        """Appends a routed projection's (pointer, elements) pair to `row` and its kind to
        `kinds`, and watches what it reads; or says why op by op would not take the kernel."""
        route = module.__dict__.get("_rvv_route")
        if route is None:
            return "not_routed"
        if getattr(route, "quantized", False):
            if module.bias is not None:
                return "bias"
            row += self._add_quantized(module)
            kinds.append(1)
            return None
        if route.owned is not None:
            # The packed buffer is the weight: only its replacement matters.
            packed = route.owned_packed()
            why = self._add_packed(module, packed, row, kinds)
            if why is None:
                self._watch(module._buffers, PACKED_BUFFER, packed)
            return why
        weight = module._parameters["weight"]
        packed, why = route.packed_weight(weight)
        if packed is None:
            return why
        why = self._add_packed(module, packed, row, kinds)
        if why is not None:
            return why
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
        return None

    def _add_packed(self, module, packed: torch.Tensor, row: list[int], kinds: list[int]) -> Optional[str]:
        if module._parameters.get("bias") is not None:
            return "bias"
        if not self.block_n:
            self.block_n = packed.shape[2]
        if packed.shape[2] != self.block_n or not packed.is_contiguous():
            return "packed_layout"
        row += [packed.data_ptr(), packed.numel()]
        kinds.append(0)
        return None

    def _add_quantized(self, module) -> list[int]:
        """The (table pointer, elements) pair of a quantized projection: an int64 table
        of (format id, rows, data pointer, bytes) per part, kept alive by the plan."""
        table = []
        for i, part in enumerate(module.parts):
            data = module.qweight(i)
            table += [ops.quantized_linear.FORMATS.index(part.fmt), part.rows, data.data_ptr(), data.numel()]
            self._watch(module._buffers, module.qweight_key(i), data)
            self.quant_tile = part.tile
        t = torch.tensor(table, dtype=torch.int64)
        self.quant_tables.append(t)
        return [t.data_ptr(), t.numel()]

    def _add_param(self, module: torch.nn.Module, name: str, row: list[int]) -> bool:
        w = module._parameters[name]
        if w.dtype != torch.bfloat16 or not w.is_contiguous() or w.device.type != "cpu":
            return False
        row += [w.data_ptr(), w.numel()]
        self._watch(module._parameters, name, w)
        return True

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


def attach(model: torch.nn.Module, policy: "RvvPolicy") -> Optional[FusedDecoder]:
    if not getattr(type(model), "rvv_fused_decoder", False):
        return None
    fused = FusedDecoder(policy, model)
    model.__dict__[FUSED_ATTR] = fused
    return fused


def detach(model: torch.nn.Module) -> None:
    model.__dict__.pop(FUSED_ATTR, None)


def fused_decoder_of(model: torch.nn.Module) -> Optional[FusedDecoder]:
    return model.__dict__.get(FUSED_ATTR)
