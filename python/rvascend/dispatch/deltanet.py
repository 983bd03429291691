"""Routes Gated DeltaNet decode of Hugging Face Qwen3-Next through
`torch.ops.rvascend.recurrent_gated_delta_rule`.

transformers' `Qwen3NextGatedDeltaNet.forward` calls the module-level
`torch_recurrent_gated_delta_rule` for cached decode and
`torch_chunk_gated_delta_rule` for prefill. While a routed layer's forward
runs, the recurrent function is swapped for an adapter that maps HF's layout
(q/k [B, T, NK, Dk], state [B, NV, Dk, Dv]) onto the op's (tokens flattened,
state pool [slots, NV, Dv, Dk]); prefill keeps the chunked path. The swap is
scoped to the layer's forward and not thread-safe across concurrent forwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Iterator

import torch
from torch import nn

from rvascend.ops.recurrent_gated_delta_rule import recurrent_gated_delta_rule

_ATTR = "_rvascend_gdn_routed"
_lock = threading.Lock()


@dataclasses.dataclass
class DeltaNetRouteCounters:
    decode_via_op: int = 0
    tokens_via_op: int = 0


def _modeling():
    from transformers.models.qwen3_next import modeling_qwen3_next
    return modeling_qwen3_next


def _adapter(original, counters: DeltaNetRouteCounters):
    modeling = _modeling()

    def decode(query, key, value, g, beta, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, **kwargs: Any):
        if query.device.type != "cpu" or kwargs.get("cu_seqlens") is not None:
            return original(query, key, value, g=g, beta=beta, initial_state=initial_state,
                            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            **kwargs)
        dtype = query.dtype
        B, T, NK, Dk = key.shape
        NV, Dv = value.shape[-2:]
        q, k, v, b, gg = (x.float() for x in (query, key, value, beta, g))
        if use_qk_l2norm_in_kernel:  # the op leaves normalisation to the caller
            q, k = modeling.l2norm(q, dim=-1, eps=1e-6), modeling.l2norm(k, dim=-1, eps=1e-6)
        pool = torch.zeros(B * T, NV, Dv, Dk, dtype=torch.float32)
        if initial_state is not None:
            pool[::T] = initial_state.float().transpose(-1, -2)
        out = recurrent_gated_delta_rule(
            q.reshape(B * T, NK, Dk).contiguous(), k.reshape(B * T, NK, Dk).contiguous(),
            v.reshape(B * T, NV, Dv).contiguous(), pool, b.reshape(B * T, NV).contiguous(), Dk ** -0.5,
            torch.full((B,), T, dtype=torch.int32), torch.arange(B * T, dtype=torch.int32),
            g=gg.reshape(B * T, NV).contiguous())
        counters.decode_via_op += 1
        counters.tokens_via_op += B * T
        final = pool[T - 1::T].transpose(-1, -2).contiguous() if output_final_state else None
        return out.reshape(B, T, NV, Dv).to(dtype), final

    return decode


@contextlib.contextmanager
def _swapped(module, name: str, replacement) -> Iterator[None]:
    with _lock:
        original = getattr(module, name)
        setattr(module, name, replacement)
    try:
        yield
    finally:
        with _lock:
            setattr(module, name, original)


def install_deltanet_decode(model: nn.Module) -> DeltaNetRouteCounters:
    """Routes the decode of every Qwen3-Next Gated DeltaNet layer of `model`
    through the op; returns counters of the routed calls."""
    modeling = _modeling()
    counters = DeltaNetRouteCounters()
    layers = [m for m in model.modules() if isinstance(m, modeling.Qwen3NextGatedDeltaNet)]
    if not layers:
        raise ValueError("the model has no Qwen3NextGatedDeltaNet layers to route")
    original = modeling.torch_recurrent_gated_delta_rule
    decode = _adapter(original, counters)
    for layer in layers:
        if getattr(layer, _ATTR, False):
            raise RuntimeError("Gated DeltaNet decode routing is already installed on this model")
        forward = layer.forward

        def routed(*args, _forward=forward, **kwargs):
            with _swapped(modeling, "torch_recurrent_gated_delta_rule", decode):
                return _forward(*args, **kwargs)

        layer.forward = routed
        setattr(layer, _ATTR, True)
    return counters
