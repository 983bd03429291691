"""A model's weights generation: a counter that moves whenever its weights are
declared changed (load_state_dict, invalidate_packed_weights, repack).

Whatever was computed from the old weights and kept (the engine's prefix cache
of K/V) compares the generation it was made with against the current one.
"""

from __future__ import annotations

from torch import nn

_GENERATION = "_rvascend_weights_generation"
_HOOK = "_rvascend_weights_generation_hook"


def current(model: nn.Module) -> int:
    return model.__dict__.get(_GENERATION, 0)


def bump(model: nn.Module) -> None:
    model.__dict__[_GENERATION] = current(model) + 1


def watch(model: nn.Module) -> None:
    """Makes every load_state_dict of `model` bump its generation (once per model)."""
    if _HOOK not in model.__dict__:
        model.__dict__[_HOOK] = model.register_load_state_dict_post_hook(lambda m, keys: bump(m))
