"""Per-layer elementwise torch ops over BF16 rows (the elementwise kernel family).

- `rms_norm(x, weight, eps)` and `add_rms_norm(x, residual, weight, eps) -> (normed, x + residual)`;
  with `zero_centred=True` they scale by (1 + weight) in FP32 and round once (Qwen3.5's norms)
- `silu_mul(x[..., 2d]) -> silu(x[..., :d]) * x[..., d:]`
- `rope(x[T, heads * S] (rows may be a slice of a wider row), heads, norm_weight, eps, cos, sin,
  zero_centred=False, head_dim=0)` -> [T, heads, D]: per-head RMSNorm (optional, Qwen3's q/k norm;
  zero-centred for Qwen3.5) then rotate-half RoPE on the first cos.shape[1] values of each head
  (partial RoPE), the rest passed through. D = head_dim, or S when 0; heads sit S apart
  (Qwen3.5's gated query: S = 2D, each head beside its gate)
- `sigmoid_mul(x[T, heads * D], gate, heads, gate_head_stride)` -> [T, heads * D]: x times
  sigmoid(gate) per head, head h's gate at gate[:, h * gate_head_stride :][:D] (Qwen3.5's
  attention output gate, read in place from the gated query)
- `argmax(x[M, V]) -> int64[M]`, -1 for a row holding a NaN

Each reproduces the intermediate BF16 roundings of the torch code it replaces
(RMSNorm: normalise, round, scale, round; RoPE: round each product and the sum;
SiLU: round, multiply, round), with FP32 inside.
"""

from __future__ import annotations

from typing import Optional

import torch

from rvascend.ops.packed_linear import _native, eager_call, readable_elements, register_fake, row_major

for schema in (
        "rms_norm(Tensor x, Tensor weight, float eps, bool zero_centred=False) -> Tensor",
        "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, bool zero_centred=False) -> (Tensor, Tensor)",
        "silu_mul(Tensor x) -> Tensor",
        "rope(Tensor x, int heads, Tensor? norm_weight, float eps, Tensor cos, Tensor sin, bool zero_centred=False, "
        "int head_dim=0) -> Tensor",
        "sigmoid_mul(Tensor x, Tensor gate, int heads, int gate_head_stride) -> Tensor",
        "argmax(Tensor x) -> Tensor"):
    torch.library.define("rvascend::" + schema.split("(")[0], "(" + schema.split("(", 1)[1])


def available_elementwise_kernels() -> list[str]:
    return list(_native.available_elementwise_kernels())


def _bf16(name: str, **tensors: torch.Tensor) -> None:
    for what, t in tensors.items():
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name}: {what} must be bfloat16, got {t.dtype}")
        if t.device.type != "cpu":
            raise RuntimeError(f"{name}: {what} must be on the CPU, got {t.device}")


def _rows(name: str, x: torch.Tensor, width: int) -> torch.Tensor:
    """x as [rows, width] with unit column stride (a copy only if it is not already)."""
    if x.dim() == 2:  # the decode path: no reshape, no copy
        x2 = x
    else:
        x2 = x.reshape(-1, width) if x.numel() else x.reshape(0, width)
    return row_major(x2)


def _check_norm(name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    if weight.dim() != 1 or x.dim() < 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"{name}: weight {tuple(weight.shape)} does not match the last dim of x {tuple(x.shape)}")
    if x.shape[-1] == 0:
        raise ValueError(f"{name}: rows must not be empty")


def _norm(name: str, x, residual, weight, eps, zero_centred):
    """rms_norm of x (after adding residual when given): (normed, x + residual or None)."""
    _bf16(name, x=x, weight=weight, **({"residual": residual} if residual is not None else {}))
    _check_norm(name, x, weight)
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"{name}: residual {tuple(residual.shape)} differs from x {tuple(x.shape)}")
    d = weight.shape[0]
    x2, w = _rows(name, x, d), weight.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, d), dtype=torch.bfloat16)
    r2 = res_out = None
    if residual is not None:
        r2 = _rows(name, residual, d)
        res_out = torch.empty((rows, d), dtype=torch.bfloat16)
    _native.rms_norm(rows, d, x2.data_ptr(), x2.stride(0) if rows > 1 else d, readable_elements(x2),
                     r2.data_ptr() if r2 is not None else 0, r2.stride(0) if r2 is not None and rows > 1 else d,
                     readable_elements(r2) if r2 is not None else 0, w.data_ptr(), readable_elements(w), float(eps),
                     bool(zero_centred), out.data_ptr(), out.numel(), res_out.data_ptr() if res_out is not None else 0,
                     res_out.numel() if res_out is not None else 0, torch.get_num_threads())
    if x.dim() == 2:
        return out, res_out
    return out.reshape(x.shape), res_out.reshape(x.shape) if res_out is not None else None


def _rms_norm_cpu(x, weight, eps, zero_centred=False):
    return _norm("rms_norm", x, None, weight, eps, zero_centred)[0]


def _add_rms_norm_cpu(x, residual, weight, eps, zero_centred=False):
    return _norm("add_rms_norm", x, residual, weight, eps, zero_centred)


def _silu_mul_cpu(x):
    _bf16("silu_mul", x=x)
    if x.dim() < 1 or x.shape[-1] % 2 or x.shape[-1] == 0:
        raise ValueError(f"silu_mul: the last dim of x must be even and positive, got {tuple(x.shape)}")
    d = x.shape[-1] // 2
    x2 = _rows("silu_mul", x, 2 * d)
    out = torch.empty((x2.shape[0], d), dtype=torch.bfloat16)
    _native.silu_mul(x2.shape[0], d, x2.data_ptr(), x2.stride(0) if x2.shape[0] > 1 else 2 * d,
                     readable_elements(x2), out.data_ptr(), out.numel(), torch.get_num_threads())
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], d)


def _rope_cpu(x, heads, norm_weight, eps, cos, sin, zero_centred=False, head_dim=0):
    _bf16("rope", x=x, cos=cos, sin=sin, **({"norm_weight": norm_weight} if norm_weight is not None else {}))
    if x.dim() != 2 or heads < 1 or x.shape[1] % heads:
        raise ValueError(f"rope: x must be [tokens, heads * head stride], got {tuple(x.shape)} for {heads} heads")
    t, stride = x.shape[0], x.shape[1] // heads
    d = head_dim or stride
    if not 0 < d <= stride:
        raise ValueError(f"rope: head_dim {head_dim} must be in [1, {stride}] (x's row holds {heads} heads of {stride})")
    r = cos.shape[-1] if cos.dim() == 2 else -1
    if cos.dim() != 2 or cos.shape != (t, r) or sin.shape != (t, r) or not (0 < r <= d and r % 2 == 0):
        raise ValueError(f"rope: cos/sin must be [{t}, rotary_dim] with rotary_dim even and at most head_dim {d}, "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if norm_weight is not None and norm_weight.shape != (d,):
        raise ValueError(f"rope: norm_weight must be [{d}], got {tuple(norm_weight.shape)}")
    if x.stride(1) != 1 or (t > 1 and x.stride(0) < heads * stride):
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    w = norm_weight.contiguous() if norm_weight is not None else None
    out = torch.empty((t, heads, d), dtype=torch.bfloat16)
    _native.rope(t, heads, d, stride, r, x.data_ptr(), x.stride(0) if t > 1 else heads * stride, readable_elements(x),
                 w.data_ptr() if w is not None else 0, readable_elements(w) if w is not None else 0, float(eps),
                 bool(zero_centred), cos.data_ptr(), sin.data_ptr(),
                 min(readable_elements(cos), readable_elements(sin)), out.data_ptr(), out.numel(),
                 torch.get_num_threads())
    return out


def _sigmoid_mul_cpu(x, gate, heads, gate_head_stride):
    _bf16("sigmoid_mul", x=x, gate=gate)
    if x.dim() != 2 or heads < 1 or x.shape[1] % heads or x.shape[1] == 0:
        raise ValueError(f"sigmoid_mul: x must be [tokens, heads * head_dim], got {tuple(x.shape)} for {heads} heads")
    t, d = x.shape[0], x.shape[1] // heads
    need = (heads - 1) * gate_head_stride + d
    if gate.dim() != 2 or gate.shape[0] != t or gate.shape[1] < need or gate_head_stride < d:
        raise ValueError(f"sigmoid_mul: gate must be [{t}, >= {need}] with heads at least head_dim {d} apart, got "
                         f"{tuple(gate.shape)} and head stride {gate_head_stride}")
    x = _rows("sigmoid_mul", x, heads * d)
    if gate.stride(1) != 1 or (t > 1 and gate.stride(0) < need):
        gate = gate.contiguous()
    out = torch.empty((t, heads * d), dtype=torch.bfloat16)
    _native.sigmoid_mul(t, heads, d, x.data_ptr(), x.stride(0) if t > 1 else heads * d, readable_elements(x),
                        gate.data_ptr(), gate.stride(0) if t > 1 else need, gate_head_stride, readable_elements(gate),
                        out.data_ptr(), out.numel(), torch.get_num_threads())
    return out


def _argmax_cpu(x):
    _bf16("argmax", x=x)
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax: x must be [rows, n] with n > 0, got {tuple(x.shape)}")
    x2 = _rows("argmax", x, x.shape[1])
    out = torch.empty(x2.shape[0], dtype=torch.int64)
    _native.argmax(x2.shape[0], x2.shape[1], x2.data_ptr(), x2.stride(0) if x2.shape[0] > 1 else x2.shape[1],
                   readable_elements(x2), out.data_ptr(), out.numel(), torch.get_num_threads())
    return out


torch.library.impl("rvascend::rms_norm", "CPU")(_rms_norm_cpu)
torch.library.impl("rvascend::add_rms_norm", "CPU")(_add_rms_norm_cpu)
torch.library.impl("rvascend::silu_mul", "CPU")(_silu_mul_cpu)
torch.library.impl("rvascend::rope", "CPU")(_rope_cpu)
torch.library.impl("rvascend::sigmoid_mul", "CPU")(_sigmoid_mul_cpu)
torch.library.impl("rvascend::argmax", "CPU")(_argmax_cpu)


@register_fake("rvascend::rms_norm")
def _rms_norm_fake(x, weight, eps, zero_centred=False):
    return torch.empty_like(x)


@register_fake("rvascend::add_rms_norm")
def _add_rms_norm_fake(x, residual, weight, eps, zero_centred=False):
    return torch.empty_like(x), torch.empty_like(x)


@register_fake("rvascend::silu_mul")
def _silu_mul_fake(x):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@register_fake("rvascend::rope")
def _rope_fake(x, heads, norm_weight, eps, cos, sin, zero_centred=False, head_dim=0):
    return x.new_empty((x.shape[0], heads, head_dim or x.shape[1] // heads))


@register_fake("rvascend::sigmoid_mul")
def _sigmoid_mul_fake(x, gate, heads, gate_head_stride):
    return torch.empty_like(x)


@register_fake("rvascend::argmax")
def _argmax_fake(x):
    return x.new_empty((x.shape[0],), dtype=torch.int64)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool = False) -> torch.Tensor:
    return eager_call(torch.ops.rvascend.rms_norm, _rms_norm_cpu, x, weight, eps, zero_centred)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centred: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), the sum rounded to BF16 once."""
    return eager_call(torch.ops.rvascend.add_rms_norm, _add_rms_norm_cpu, x, residual, weight, eps, zero_centred)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    return eager_call(torch.ops.rvascend.silu_mul, _silu_mul_cpu, x)


def rope(x: torch.Tensor, heads: int, norm_weight: Optional[torch.Tensor], eps: float, cos: torch.Tensor,
         sin: torch.Tensor, zero_centred: bool = False, head_dim: int = 0) -> torch.Tensor:
    return eager_call(torch.ops.rvascend.rope, _rope_cpu, x, heads, norm_weight, eps, cos, sin, zero_centred,
                      head_dim)


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor, heads: int, gate_head_stride: int) -> torch.Tensor:
    return eager_call(torch.ops.rvascend.sigmoid_mul, _sigmoid_mul_cpu, x, gate, heads, gate_head_stride)


def argmax(x: torch.Tensor) -> torch.Tensor:
    return eager_call(torch.ops.rvascend.argmax, _argmax_cpu, x)
