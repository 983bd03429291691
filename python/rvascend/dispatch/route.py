"""One projection module's call path: gate, staleness check, bucket, packed or row-major.

Eagerly, a routed module's forward calls its `ProjectionRoute` directly. While
torch.compile traces (the policy's regional compile, or a user's own compile of
the model) the forward emits one opaque op, `rvascend::routed_linear`, whose
arguments are the input, the weight and bias as the module holds them, and the
route's id as a one-element buffer of the module. Buffers and parameters are
graph inputs, not constants, so one graph serves every layer; the op looks the
route up by id when the graph runs and makes the whole decision there, on the
real weight: a stale packed copy can never be baked into a graph.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import types
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from rvascend import ops
from rvascend.dispatch import shape_gate
from rvascend.dispatch.packed_source import PackedWeightSource
from rvascend.dispatch.route_context import RouteContext


PACKED_BUFFER = "_rvv_packed_weight"
SHAPE_BUFFER = "_rvv_weight_shape"  # while the packed copy is the weight (take_weight)
ROUTE_ID_BUFFER = "_rvv_route_id"
ROUTE_ATTR = "_rvv_route"

# Reasons a routed call runs the row-major callable by design (nothing stale).
_ROW_MAJOR_REASONS = ("not_packed", "packing_off", "not_packed_budget", "not_packable", "fp32_kernel")

_ids = itertools.count()
_routes: "weakref.WeakValueDictionary[int, ProjectionRoute]" = weakref.WeakValueDictionary()


class ProjectionRoute:
    """Routes `module`'s linear calls; holds the module by weak reference only,
    so a model with the policy installed is freed like any other."""

    def __init__(self, context: RouteContext, module: nn.Module, name: str, projection: str) -> None:
        self.context = context
        self._module = weakref.ref(module)
        self.name = name
        self.projection = projection
        self.source: Optional[PackedWeightSource] = None
        self.unpacked_reason: Optional[str] = "not_packed"
        self.tied = False  # the module is the embedding, doubling as a tied lm_head
        self.shares_embedding_weight = False  # an lm_head module holding the embedding's weight object
        # Set while the packed buffer is the weight of record (take_weight): the row-major
        # weight's shape, requires_grad, the packed layout, the hooks' handles.
        self.owned: Optional[_OwnedWeight] = None
        self.stale_reported = False  # this packing's staleness has retired the model's cached K/V
        self.id = next(_ids)
        _routes[self.id] = self

    # -- installation -----------------------------------------------------------
    def attach(self, forward: bool) -> None:
        """Makes the module reach this route: by id (for traced calls) and, when
        `forward`, as its forward (an embedding doubling as a tied lm_head keeps
        its lookup and is reached through projection_linear)."""
        module = self._module()
        module.register_buffer(ROUTE_ID_BUFFER, torch.tensor(self.id, dtype=torch.int64), persistent=False)
        module.__dict__[ROUTE_ATTR] = self
        if forward:
            module.forward = types.MethodType(_routed_forward, module)
        self.tied = not forward

    def detach(self) -> None:
        if self.owned is not None:
            self.give_back_weight()
        self.drop("uninstalled")
        module = self._module()
        if module is None:
            return
        if getattr(module.__dict__.get("forward"), "__func__", None) is _routed_forward:
            del module.__dict__["forward"]
        module.__dict__.pop(ROUTE_ATTR, None)
        module._buffers.pop(ROUTE_ID_BUFFER, None)

    # -- packed state -----------------------------------------------------------
    def pack(self) -> int:
        """Packs the module's current weight into its non-persistent buffer; returns bytes."""
        module = self._module()
        weight = module.weight
        with torch.inference_mode(False), torch.no_grad():
            packed = ops.pack_bf16_weight(weight.detach())
        module.register_buffer(PACKED_BUFFER, packed, persistent=False)
        self.source = PackedWeightSource.capture(weight, ops.LAYOUT_VERSION)
        self.unpacked_reason = None
        self.stale_reported = False
        return packed.numel() * packed.element_size()

    def drop(self, reason: str) -> None:
        """Frees the packed buffer; calls run row-major until an explicit repack.
        A packed buffer that is the weight of record is kept: there is nothing to re-derive."""
        if self.owned is not None:
            return
        module = self._module()
        if module is not None and PACKED_BUFFER in module._buffers:
            del module._buffers[PACKED_BUFFER]
        self.source = None
        self.unpacked_reason = reason

    def packed_bytes(self) -> int:
        packed = self._module()._buffers[PACKED_BUFFER]
        return packed.numel() * packed.element_size()

    # -- the packed copy as the weight (KernelPolicyConfig.drop_unpacked) ------------
    def take_weight(self) -> None:
        """Frees the module's row-major weight: the fresh packed buffer becomes the weight of
        record. `module.weight` is gone (reading it raises, writing through it cannot
        happen), state_dict() unpacks it exactly, and load_state_dict() packs what it is
        given in its place; invalidate_packed_weights and repack keep it."""
        module = self._module()
        weight = module._parameters["weight"]
        if not self.can_take_weight() or self.source is None or self.source.mismatch(weight) is not None:
            raise RuntimeError(f"{self.name}: only a freshly packed weight no other module reads can be dropped")
        self._own(module, tuple(weight.shape), weight.requires_grad, self.source.layout_version)

    def pack_in_place(self) -> Optional[int]:
        """pack() and take_weight() at once, the packed copy written over the weight's own
        storage: no moment with both copies (Qwen3-0.6B's tied embedding is 297 MiB). None,
        and nothing done, unless the module's parameter is the only reader of that storage
        (then pack() and take_weight() serve)."""
        module = self._module()
        weight = module._parameters.get("weight")
        use_count = getattr(torch._C, "_storage_Use_Count", None)
        if (weight is None or not self.can_take_weight() or use_count is None or not weight.is_contiguous()
                or weight.dtype != torch.bfloat16 or weight.shape[0] % ops.packed_linear.block_n() or weight.storage_offset()
                or weight.untyped_storage().nbytes() != weight.numel() * weight.element_size()):
            return None
        # References: the module's parameter dict, `weight`, getrefcount's argument; the
        # storage: the parameter and the storage object asked.
        if sys.getrefcount(weight) > 3 or use_count(weight.untyped_storage()._cdata) > 2:
            return None
        shape, requires_grad = tuple(weight.shape), weight.requires_grad
        with torch.inference_mode(False), torch.no_grad():
            packed = ops.pack_bf16_weight_in_place(weight.detach(), ops.LAYOUT_VERSION)
        del weight
        module.register_buffer(PACKED_BUFFER, packed, persistent=False)
        self.unpacked_reason = None
        try:
            self._own(module, shape, requires_grad, ops.LAYOUT_VERSION)
        except BaseException:
            # The parameter's storage holds the packed layout now: never leave it so.
            if self.owned is not None:
                self.give_back_weight()
            else:
                with torch.inference_mode(False), torch.no_grad():
                    module._parameters["weight"].detach().copy_(
                        ops.unpack_bf16_weight(packed, shape[0], ops.LAYOUT_VERSION))
            raise
        return packed.numel() * packed.element_size()

    def _own(self, module: nn.Module, shape: tuple[int, int], requires_grad: bool, layout_version: int) -> None:
        n, k = shape
        self.owned = _OwnedWeight(
            (n, k), requires_grad, layout_version,
            (module.register_state_dict_post_hook(_owned_state_dict),
             module.register_load_state_dict_pre_hook(_owned_load_state_dict)))
        # A CPU BF16 tensor of the weight's shape with one element behind it: what the gate
        # reads, and what a traced call hands rvascend::routed_linear for its output shape.
        module.register_buffer(SHAPE_BUFFER, torch.zeros((), dtype=torch.bfloat16).expand(n, k), persistent=False)
        del module._parameters["weight"]
        self.source = None
        if self.tied:  # the embedding's lookups read their rows from the packed copy
            module.forward = types.MethodType(_packed_embedding_forward, module)

    def can_take_weight(self) -> bool:
        """Whether the packed copy can be the only weight: not when another module reads
        the same weight object (a Hugging Face lm_head tied to its embedding by weight),
        nor for an embedding whose lookups write to it (max_norm)."""
        if self.shares_embedding_weight:
            return False
        module = self._module()
        return not self.tied or (isinstance(module, nn.Embedding) and module.max_norm is None)

    def give_back_weight(self) -> None:
        """Undoes take_weight: the module gets a row-major weight (unpacked) again."""
        module, owned = self._module(), self.owned
        for handle in owned.hooks:
            handle.remove()
        self.owned = None
        if module is None:
            return
        module._buffers.pop(SHAPE_BUFFER, None)
        if getattr(module.__dict__.get("forward"), "__func__", None) is _packed_embedding_forward:
            del module.__dict__["forward"]
        weight = nn.Parameter(self.unpacked_weight(module, owned), requires_grad=owned.requires_grad)
        module._parameters["weight"] = weight
        self.source = PackedWeightSource.capture(weight, owned.layout_version)

    @staticmethod
    def unpacked_weight(module: nn.Module, owned: "_OwnedWeight") -> torch.Tensor:
        return ops.unpack_bf16_weight(module._buffers[PACKED_BUFFER], owned.shape[0], owned.layout_version)

    def load_owned(self, value: torch.Tensor) -> None:
        """Packs a loaded weight as the new weight of record (load_state_dict)."""
        with torch.inference_mode(False), torch.no_grad():
            packed = ops.pack_bf16_weight(value.detach().to(torch.bfloat16), ops.LAYOUT_VERSION)
        self._module().register_buffer(PACKED_BUFFER, packed, persistent=False)
        self.owned = dataclasses.replace(self.owned, layout_version=ops.LAYOUT_VERSION)

    def embedding_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The weight's rows `ids` (an embedding lookup), gathered from the packed copy."""
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{self.name}: token ids must be int64 or int32, got {ids.dtype}")
        n, k = self.owned.shape
        packed = self.owned_packed()
        flat = ids.reshape(-1)
        if flat.dtype != torch.int64 or not flat.is_contiguous():
            flat = flat.to(torch.int64).contiguous()
        out = torch.empty(*ids.shape, k, dtype=packed.dtype)
        try:
            ops.packed_linear._native.packed_rows(packed.data_ptr(), packed.numel(), n, k, packed.shape[2],
                                                  flat.data_ptr(), flat.numel(), out.data_ptr(), out.numel())
        except IndexError as e:
            raise IndexError(f"{self.name}: {e}") from None
        return out

    def owned_packed(self) -> torch.Tensor:
        """The weight of record, in this machine's packed layout."""
        module = self._module()
        if self.owned.layout_version != ops.LAYOUT_VERSION:
            self.load_owned(self.unpacked_weight(module, self.owned))
        return module._buffers[PACKED_BUFFER]

    def packed_weight(self, weight: torch.Tensor) -> tuple[Optional[torch.Tensor], Optional[str]]:
        """The packed buffer if it still matches `weight`, else (None, why not)."""
        if self.source is None:
            return None, self.unpacked_reason
        why = self.source.mismatch(weight)
        if why is not None and not self.stale_reported:
            self.stale_reported = True
            self.context.weights_changed()
        if why is None and self.source.layout_version != ops.LAYOUT_VERSION:
            why = "layout_version_changed"
        if why is not None:
            return None, why
        return self._module()._buffers[PACKED_BUFFER], None

    # -- calls ----------------------------------------------------------------
    # Never traced: the staleness check reads the weight's storage pointer,
    # version and content, which are only real when the call runs. Traced calls
    # go through rvascend::routed_linear, which lands here at run time (so this
    # needs no torch.compiler.disable, whose import of torch._dynamo alone is
    # 70 MiB of RSS in a process that never compiles).
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.owned is not None:
            return self._call_owned(x)
        module, context = self._module(), self.context
        weight = module.weight
        bias = getattr(module, "bias", None)
        k = weight.shape[-1]
        rows = x.numel() // k if k and x.shape[-1] == k else 0
        which = context.shape_gate
        if which == "invariant" and _fp32_inference(x, weight, bias):
            context.counters.record(self.projection, "fp32_invariant", rows)
            return ops.f32_linear(x, weight, bias)
        # Under the invariant gate a BF16 bias is added after the packed product.
        added = bias if which == "invariant" and bias is not None and invariant_bias(bias, weight.shape[0]) \
            and not _grad_needed(bias) else None
        why = shape_gate.gate(self.projection, x, weight, bias if added is None else None, context.small_batch, which)
        if why is not None:
            context.counters.record(self.projection, "fallback", rows, why)
            return F.linear(x, weight, bias)
        packed, unpacked = self.packed_weight(weight) if context.packed_weights else (None, "packing_off")
        if packed is None and unpacked not in _ROW_MAJOR_REASONS:
            # The packed copy is stale (or was invalidated): never use it.
            context.counters.record(self.projection, "fallback", rows, unpacked)
            return F.linear(x, weight, bias)
        if packed is None:
            context.counters.record(self.projection, "row_major", rows, unpacked)
            return F.linear(x, weight, bias)
        context.counters.record(self.projection, "packed", rows)
        return _packed_call(x, packed, weight.shape[0], shape_gate.bucket_rows(rows, context.small_batch, which), added)

    def _call_owned(self, x: torch.Tensor) -> torch.Tensor:
        """A call whose only weight is the packed one: every call the packed kernel can take
        runs it, whatever rows the shape gate would send to F.linear; the others (input not
        BF16 or not on the CPU, autograd) take F.linear over a transient unpacked copy."""
        module, context, owned = self._module(), self.context, self.owned
        n, k = owned.shape
        rows = x.numel() // k if k and x.shape[-1] == k else 0
        # The seed's gate: cheap, and where it passes the rows fit its buckets (the measured
        # gate buckets nothing).
        why = shape_gate.gate(self.projection, x, module._buffers[SHAPE_BUFFER], None, context.small_batch, "bucketed")
        bias = getattr(module, "bias", None)  # packed with one only under the invariant gate
        if why is None and _grad_needed(bias):
            why = "grad_required"
        if why in shape_gate.UNSUPPORTED:
            context.counters.record(self.projection, "fallback", rows, why)
            return F.linear(x, self.unpacked_weight(module, owned), bias)
        context.counters.record(self.projection, "packed", rows)
        return _packed_call(x, self.owned_packed(), n,
                            shape_gate.bucket_rows(rows, context.small_batch, context.shape_gate) if why is None else rows,
                            bias)


@dataclasses.dataclass(frozen=True)
class _OwnedWeight:
    shape: tuple[int, int]
    requires_grad: bool
    layout_version: int
    hooks: tuple


def _fp32_inference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """An FP32 CPU call without autograd, which the batch-invariant FP32 kernel takes under
    deterministic inference (FP32 weights are never packed)."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    return (all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors) and weight.dim() == 2
            and x.dim() >= 1 and x.shape[-1] == weight.shape[1] and not any(map(_grad_needed, tensors)))


def invariant_bias(bias: torch.Tensor, n: int) -> bool:
    """A bias the invariant gate adds after the packed product: BF16, CPU, [N]. Added to
    each output by itself, it keeps a row's result independent of its batch (one more BF16
    rounding than F.linear's fused bias: within one ulp of it)."""
    return bias.dtype == torch.bfloat16 and bias.device.type == "cpu" and tuple(bias.shape) == (n,)


def _grad_needed(t: Optional[torch.Tensor]) -> bool:
    return t is not None and torch.is_grad_enabled() and t.requires_grad


def _packed_call(x: torch.Tensor, packed: torch.Tensor, n: int, bucket: int,
                 bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    k = packed.shape[1]
    rows = x.numel() // k
    x2 = x.reshape(rows, k)
    if bucket != rows:
        x2 = F.pad(x2, (0, 0, 0, bucket - rows))
    out = ops.packed_bf16_linear(x2, packed, n)
    if bucket != rows:
        out = out[:rows]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], n)


def _packed_embedding_forward(module: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The forward of an embedding whose packed copy (as a tied lm_head) is its weight."""
    return module.__dict__[ROUTE_ATTR].embedding_rows(ids)


def _owned_state_dict(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    del local_metadata
    route = module.__dict__[ROUTE_ATTR]
    state_dict[prefix + "weight"] = route.unpacked_weight(module, route.owned)


def _owned_load_state_dict(module: nn.Module, state_dict: dict, prefix: str, local_metadata, strict: bool,
                           missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    del local_metadata, unexpected_keys
    route = module.__dict__[ROUTE_ATTR]
    key = prefix + "weight"
    if key not in state_dict:
        if strict:
            missing_keys.append(key)
        return
    value = state_dict.pop(key)  # the module has no parameter to copy it into
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != route.owned.shape:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        error_msgs.append(f"size mismatch for {key}: copying a param with shape {shape} from checkpoint, the "
                          f"packed weight of record has shape {route.owned.shape}")
        return
    route.load_owned(value)


@torch.library.custom_op("rvascend::routed_linear", mutates_args=())
def _routed_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   route_id: torch.Tensor) -> torch.Tensor:
    route = _routes.get(int(route_id))
    module = route._module() if route is not None else None
    held = module._buffers.get(SHAPE_BUFFER) if route is not None and route.owned is not None else \
        module._parameters.get("weight") if module is not None else None
    if module is None or held is not weight or getattr(module, "bias", None) is not bias:
        # The graph was handed another weight than the route's module holds
        # (the policy was uninstalled, or the module's weight swapped while a
        # compiled graph still runs): the plain product of what it was given.
        if weight.dim() == 2 and weight.numel() > 1 and weight.stride() == (0, 0):
            raise RuntimeError("rvascend::routed_linear was handed the shape buffer of a weight the packed copy "
                               "replaced (--cpu-kernels-drop-unpacked), but its route no longer holds it: recompile")
        return F.linear(x, weight, bias)
    return route(x)


@_routed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], route_id: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _routed_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The forward of a routed module."""
    if torch.compiler.is_compiling():
        # A route whose packed copy is the weight hands the op its shape buffer instead.
        weight = module._buffers.get(SHAPE_BUFFER)
        return torch.ops.rvascend.routed_linear(x, module.weight if weight is None else weight,
                                                getattr(module, "bias", None), module._buffers[ROUTE_ID_BUFFER])
    return module.__dict__[ROUTE_ATTR](x)


def projection_linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x @ module.weight.T (+ bias) through the module's route when the policy is installed.

    Engines call this for projections that are not plain nn.Linear modules,
    e.g. a tied lm_head that is the embedding module itself.
    """
    route = module.__dict__.get(ROUTE_ATTR)
    if getattr(route, "quantized", False):
        return route(x)
    if route is None:
        quantized = getattr(module, "quantized_linear", None)  # a quantized module (models/quantized_layers.py)
        if quantized is not None:
            return quantized(x)
        return F.linear(x, module.weight, getattr(module, "bias", None))
    return _routed_forward(module, x)
