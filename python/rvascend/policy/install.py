"""`install_kernel_policy`, `repack`, `invalidate_packed_weights` and the policy object."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Optional

import torch
from absl import logging
from torch import nn

from rvascend.dispatch import fused_decoder, kernel_routes, shape_gate, weights_generation
from rvascend.dispatch.counters import RouteCounters
from rvascend.dispatch.quantized_route import QuantizedRoute
from rvascend.dispatch.route import PACKED_BUFFER, ProjectionRoute, invariant_bias
from rvascend.dispatch.route_context import RouteContext
from rvascend.policy import adapters, budget, regional_compile
from rvascend.policy.config import KernelPolicyConfig
from rvascend.runtime import allocator

_POLICY_ATTR = "_rvv_policy"


@dataclasses.dataclass
class PolicyReport:
    """What install (or repack) did: bytes are packed-buffer bytes."""

    adapter: str
    budget_bytes: int
    packed: list[tuple[str, str, int]]        # (module, projection, bytes)
    not_packed: list[tuple[str, str, str]]    # (module, projection, reason)
    compile_mode: str = "eager"               # what runs: "regional" (the decoder layer compiled) or "eager"
    shape_gate: str = "bucketed"              # the gate in force: "bucketed" or "measured"

    @property
    def packed_bytes(self) -> int:
        return sum(b for _, _, b in self.packed)

    def summary(self) -> str:
        return (f"RVV policy ({self.adapter} adapter, {self.shape_gate} shape gate): packed {len(self.packed)} "
                f"projections, {self.packed_bytes / 2**20:.1f} MiB of a {self.budget_bytes / 2**20:.1f} MiB budget; "
                f"{len(self.not_packed)} row-major; {self.compile_mode}")


class KernelPolicy:
    """The installed policy of one model: routes, the regional compile, counters."""

    def __init__(self, config: KernelPolicyConfig, adapter: adapters.ModelAdapter) -> None:
        self.config = config
        self.adapter = adapter
        self.counters = RouteCounters()
        self.routes: dict[str, ProjectionRoute | QuantizedRoute] = {}
        self.regional: Optional[regional_compile.RegionalCompile] = None
        self.report: Optional[PolicyReport] = None
        self.hook = None  # the load_state_dict post-hook's handle
        conflict = config.determinism_conflict() if config.deterministic else None
        if conflict:
            raise ValueError("deterministic inference routes every projection packed at every M (the invariant "
                             "shape gate) and runs eagerly (a graph compiled per row bucket could fuse "
                             f"differently); {conflict}")
        # "bucketed", "measured" or "invariant" (shape_gate.py)
        self.shape_gate = shape_gate.resolve("invariant" if config.deterministic else config.shape_gate)
        # Under the invariant gate no kernel route looks at a call's size either.
        self.kernels = kernel_routes.KernelRoutes(config.kernels, batch_invariant=self.shape_gate == "invariant")
        self.kernel_modules: list[nn.Module] = []
        self.model_ref: Optional[weakref.ReferenceType] = None  # set by install_kernel_policy

    def route_context(self, model: nn.Module) -> RouteContext:
        """What the routes of `model` read of this policy (they never hold the policy)."""
        return RouteContext(self.shape_gate, self.config.small_batch, self.config.packed_weights, self.counters,
                            self.kernels, weakref.ref(model))

    @property
    def compile_mode(self) -> str:
        """What runs: "regional" when the repeated block is compiled, else "eager"
        (asked for, or where regional compile cannot run)."""
        return "eager" if self.regional is None else "regional"

    def pack_all(self) -> PolicyReport:
        budget_bytes = budget.derive_budget_bytes(self.config.memory_budget_mib)
        routes = list(self.routes.values())
        packed, not_packed = [], []
        if not self.config.packed_weights:
            for r in routes:
                r.drop("packing_off")
                not_packed.append((r.name, r.projection, "packing_off"))
        else:
            # Quantized weights are already in their kernels' layout, and a packed weight of
            # record (drop_unpacked) has nothing to re-derive: reported, not budgeted.
            for r in routes:
                if isinstance(r, QuantizedRoute):
                    packed.append((r.name, r.projection, r.pack()))
                elif r.owned is not None:
                    packed.append((r.name, r.projection, r.packed_bytes()))
            routes = [r for r in routes if not isinstance(r, QuantizedRoute) and r.owned is None]
            eligible = [r for r in routes if _packable(r, self.shape_gate)]
            fits = budget.plan([tuple(r._module().weight.shape) for r in eligible], budget_bytes)
            for r in routes:
                if r not in eligible:
                    # Under the invariant gate an FP32 weight runs the FP32 Linear kernel as it is.
                    why = "fp32_kernel" if self.shape_gate == "invariant" and \
                        r._module().weight.dtype == torch.float32 else "not_packable"
                    r.drop(why)
                    not_packed.append((r.name, r.projection, why))
            for r, ok in zip(eligible, fits):
                if ok:
                    in_place = r.pack_in_place() if self.config.drop_unpacked else None
                    packed.append((r.name, r.projection, r.pack() if in_place is None else in_place))
                    if in_place is None and self.config.drop_unpacked and r.can_take_weight():
                        r.take_weight()  # one at a time: the peak is the model plus one weight
                else:
                    r.drop("not_packed_budget")
                    not_packed.append((r.name, r.projection, "not_packed_budget"))
        self.report = PolicyReport(self.adapter.name, budget_bytes, packed, not_packed, self.compile_mode,
                                   self.shape_gate)
        return self.report


def _packable(route: ProjectionRoute, which: str) -> bool:
    """Packing pays only for weights the gate can ever route: BF16, CPU, 2-D, and a shape it routes;
    with a bias only under the invariant gate (route.invariant_bias)."""
    module = route._module()
    w = module.weight
    bias = getattr(module, "bias", None)
    return (w.dtype == torch.bfloat16 and w.device.type == "cpu" and w.dim() == 2
            and (bias is None or (which == "invariant" and invariant_bias(bias, w.shape[0])))
            and shape_gate.packable(w.shape[0], w.shape[1], which))


def _check_tied_lm_head(model: nn.Module) -> None:
    if not adapters.ties_word_embeddings(model):
        return
    embed, head = adapters.embed_tokens(model), adapters.lm_head(model)
    if embed is None or head is None:
        raise RuntimeError("tie_word_embeddings is set but the model has no embed_tokens/lm_head to check")
    if head is not embed and head.weight is not embed.weight:
        raise RuntimeError(
            "tie_word_embeddings is set but lm_head and embed_tokens no longer share one module "
            "or one weight object: the tie was broken before the RVV policy was installed")


def get_policy(model: nn.Module) -> Optional[KernelPolicy]:
    return model.__dict__.get(_POLICY_ATTR)


def _validate_config(config: KernelPolicyConfig) -> None:
    if config.compile_mode not in (None, "regional", "eager"):
        raise ValueError(f"compile_mode must be 'regional' or 'eager', got {config.compile_mode!r}")
    shape_gate.resolve(config.shape_gate)  # raises on an unknown gate
    budget.derive_budget_bytes(config.memory_budget_mib)  # raises on a bad budget
    if config.drop_unpacked and not config.packed_weights:
        raise ValueError("drop_unpacked frees the row-major weights the packed copies replace: it needs "
                         "packed_weights")


def install_kernel_policy(model: nn.Module, config: Optional[KernelPolicyConfig] = None,
                       adapter: Optional[str] = None) -> PolicyReport:
    """Installs the RVV policy into a model loaded as usual; returns what was packed.

    Never replaces a weight: packed copies are side buffers and tied
    embeddings keep their single weight object. Everything is validated
    before the model is touched, and a failure part-way undoes what was
    done: a refused install leaves the model exactly as it was.
    """
    if get_policy(model) is not None:
        raise RuntimeError("the RVV policy is already installed on this model")
    config = config or KernelPolicyConfig.from_flag()
    _validate_config(config)
    if adapter is not None and adapter not in adapters.ADAPTERS:
        raise ValueError(f"unknown adapter {adapter!r}; known: {sorted(adapters.ADAPTERS)}")
    chosen = adapters.ADAPTERS[adapter] if adapter else adapters.select_adapter(model)
    _check_tied_lm_head(model)
    projections = list(chosen.projections(model))
    policy = KernelPolicy(config, chosen)
    policy.model_ref = weakref.ref(model)
    context = policy.route_context(model)
    try:
        embed = adapters.embed_tokens(model)
        for name, module, projection in projections:
            kind = QuantizedRoute if hasattr(module, "quantized_linear") else ProjectionRoute
            route = kind(context, module, name, projection)
            policy.routes[name] = route
            route.attach(forward=module is not embed)
            route.shares_embedding_weight = (module is not embed and embed is not None
                                             and getattr(module, "weight", None) is getattr(embed, "weight", False))
        policy.kernel_modules = kernel_routes.attach(model, policy.kernels)
        fused_decoder.attach(model, context)
        _attach_regional_compile(model, policy)
        model.__dict__[_POLICY_ATTR] = policy
        policy.hook = model.register_load_state_dict_post_hook(_invalidate_after_load)
        report = policy.pack_all()
    except BaseException:
        _uninstall(model, policy)
        raise

    # The shape gate's timing weights and the packers' scratch were freed into the heap;
    # a process that did not pin glibc's thresholds (the server does) would keep them.
    allocator.release_free_heap()
    logging.info("%s", report.summary())
    return report


def _uninstall(model: nn.Module, policy: KernelPolicy) -> None:
    """Undoes install_kernel_policy: forwards, routes, buffers, hook, policy attribute."""
    for route in policy.routes.values():
        route.detach()
    kernel_routes.detach(policy.kernel_modules)
    if policy.regional is not None:
        policy.regional.detach()
    fused_decoder.detach(model)
    if policy.hook is not None:
        policy.hook.remove()
    if model.__dict__.get(_POLICY_ATTR) is policy:
        del model.__dict__[_POLICY_ATTR]


def _attach_regional_compile(model: nn.Module, policy: KernelPolicy) -> None:
    """Compiles the model's repeated block (lazily, at its first call) when asked and possible."""
    if not policy.config.compiles_regionally:
        return
    blocks = regional_compile.repeated_blocks(model)
    why = None if blocks else "no_repeated_block"
    if why is None and any(isinstance(r, QuantizedRoute) for r in policy.routes.values()):
        # Their routes count calls in Python, which a fullgraph region cannot trace; the
        # quantized kernels run eagerly, the decode step's layers in one native call.
        why = "quantized_projections"
    if why is None and regional_compile.cxx_compiler() is None:
        why = "no_cxx_compiler"
    if why is not None:
        # Counted and logged: the routes run eagerly, as with --cpu-compile-mode eager.
        policy.counters.record("regional_compile", "fallback", 0, why)
        logging.warning("regional compile unavailable (%s): the policy's routes run eagerly", why)
        return
    policy.regional = regional_compile.RegionalCompile()
    policy.regional.attach(blocks)


def _invalidate_after_load(model: nn.Module, incompatible_keys) -> None:
    del incompatible_keys
    invalidate_packed_weights(model)


def invalidate_packed_weights(model: nn.Module) -> None:
    """Frees every packed buffer; calls run row-major until `repack(model)`. Declares
    the weights changed (anything cached from them, such as K/V, is dropped)."""
    weights_generation.bump(model)
    policy = get_policy(model)
    if policy is None:
        return
    for route in policy.routes.values():
        route.drop("invalidated")


def repack(model: nn.Module) -> PolicyReport:
    """Re-packs every routed projection from its current weight (explicit, never silent).
    Declares the weights changed, as invalidate_packed_weights does."""
    policy = get_policy(model)
    if policy is None:
        raise RuntimeError("the RVV policy is not installed on this model")
    weights_generation.bump(model)
    for route in policy.routes.values():
        route.drop("repacking")
    return policy.pack_all()


def packed_buffer_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if PACKED_BUFFER in m._buffers]
