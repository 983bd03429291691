"""`torch.ops.rvascend.f32_linear`: the batch-invariant FP32 Linear.

input[..., K] x weight[N, K]^T (+ bias) in FP32 over the weight as the model holds it,
each output one dot product computed the same way whatever the number of rows
(rvv_kernels/linear/f32_linear.h): a row's result is bit for bit what it is alone,
which ATen's GEMMs do not promise. Deterministic inference routes FP32 projections here.
"""

from __future__ import annotations

from typing import Optional

import torch

from rvascend.ops.packed_linear import _native, eager_call, readable_elements, register_fake, row_major

torch.library.define("rvascend::f32_linear", "(Tensor input, Tensor weight, Tensor? bias) -> Tensor")


def available_f32_linear_kernels() -> list[str]:
    """The f32_linear sets this build has and this CPU runs, best first (the first runs)."""
    return list(_native.available_f32_linear_kernels())


def _check(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    for what, t in (("input", input), ("weight", weight)) + ((("bias", bias),) if bias is not None else ()):
        if t.dtype != torch.float32:
            raise TypeError(f"f32_linear: {what} must be float32, got {t.dtype}")
        if t.device.type != "cpu":
            raise RuntimeError(f"f32_linear: {what} must be on the CPU, got {t.device}")
    if weight.dim() != 2:
        raise ValueError(f"f32_linear: weight must be 2-D [N, K], got shape {tuple(weight.shape)}")
    if input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        raise ValueError(f"f32_linear: input's last dimension {tuple(input.shape)[-1:]} is not the weight's K = "
                         f"{weight.shape[1]}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"f32_linear: bias has shape {tuple(bias.shape)}, expected ({weight.shape[0]},)")


def _f32_linear_cpu(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    _check(input, weight, bias)
    n, k = weight.shape
    lead = input.shape[:-1]
    x = row_major(input.reshape(-1, k))
    w = row_major(weight)
    m = x.shape[0]
    out = torch.empty((m, n), dtype=torch.float32)
    if m and n:
        b = bias.contiguous() if bias is not None else None
        _native.f32_linear(m, n, k, x.data_ptr(), x.stride(0) if m > 1 else k, readable_elements(x),
                           w.data_ptr(), w.stride(0) if n > 1 else k, readable_elements(w),
                           b.data_ptr() if b is not None else 0, b.numel() if b is not None else 0,
                           out.data_ptr(), n, out.numel(), torch.get_num_threads())
    return out.reshape(*lead, n)


torch.library.impl("rvascend::f32_linear", "CPU")(_f32_linear_cpu)


@register_fake("rvascend::f32_linear")
def _f32_linear_fake(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    _check(input, weight, bias)
    return input.new_empty(*input.shape[:-1], weight.shape[0])


def f32_linear(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear's result, FP32, each row independent of the rows beside it."""
    return eager_call(torch.ops.rvascend.f32_linear, _f32_linear_cpu, input, weight, bias)
