"""Building blocks shared by the families: RMSNorm, rotary embedding (with llama3
scaling), fused projections that load their shards, and SiLU-and-multiply."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from rvascend import ops
from rvascend.models.config import ModelConfig
from rvascend.dispatch.kernel_routes import routes_of


def constant_parameter(size: int, value: float) -> nn.Parameter:
    """A parameter of `size` elements all equal to `value`. Models are built on the meta device
    (models/loader.py), where torch 2.6's ones() and zeros() run PyTorch's Python reference
    kernels, whose size check imports sympy: 43 s of each board process's start under QEMU.
    empty() and fill_() have native meta kernels."""
    return nn.Parameter(torch.empty(size).fill_(value))


class RMSNorm(nn.Module):
    rvv_kernels = ("rms_norm", "add_rms_norm")
    zero_centred = False  # the kernels' scale: weight, or 1 + weight (ZeroCenteredRMSNorm)

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = constant_parameter(dim, 1.0)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routes = routes_of(self)
        if routes is not None and routes.use("rms_norm", x, self.weight, rows=x.numel() // x.shape[-1]):
            return ops.elementwise.rms_norm(x, self.weight, self.eps, self.zero_centred)
        return self.torch_forward(x)

    def torch_forward(self, x: torch.Tensor) -> torch.Tensor:
        # FP32 statistics, as the reference implementations compute them.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def add_forward(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); without a residual (norm(x), x). The
        residual stream of SGLang's decoder layers: one fused add + norm."""
        if residual is None:
            return self(x), x
        routes = routes_of(self)
        if routes is not None and routes.use("add_rms_norm", x, residual, self.weight,
                                             rows=x.numel() // x.shape[-1]):
            return ops.elementwise.add_rms_norm(x, residual, self.weight, self.eps, self.zero_centred)
        h = x + residual
        return self(h), h


class FusedLinear(nn.Linear):
    """A Linear whose rows are the concatenation of several checkpoint tensors
    (q/k/v or gate/up). `shard_rows` gives each shard's row count, in order."""

    def __init__(self, in_features: int, shard_rows: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(shard_rows.values()), bias=bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, rows in shard_rows.items():
            self.shard_offsets[name] = (offset, rows)
            offset += rows

    def load_shard(self, param: str, shard: str, tensor: torch.Tensor) -> None:
        offset, rows = self.shard_offsets[shard]
        target = getattr(self, param)
        expected = (rows,) + tuple(target.shape[1:])
        if tuple(tensor.shape) != expected:
            raise ValueError(f"shard {shard!r} of {param} has shape {tuple(tensor.shape)}, expected {expected}")
        with torch.no_grad():
            target[offset:offset + rows].copy_(tensor)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    """silu(x[..., :d]) * x[..., d:], through the RVV kernel when routed."""

    rvv_kernels = ("silu_mul",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routes = routes_of(self)
        if routes is not None and routes.use("silu_mul", x, rows=x.numel() // x.shape[-1]):
            return ops.elementwise.silu_mul(x)
        return silu_and_mul(x)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE over the first config.rotary_dim dims of a head (all of them but
    for partial RoPE); cos/sin computed in FP32 and cast to the activation dtype."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        dim = config.rotary_dim
        # On the CPU even while the model is built on meta (models/loader.py): math on meta
        # tensors runs PyTorch's Python reference kernels, which import torch._dynamo.
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
        if config.rope_scaling is not None:
            inv_freq = _llama3_inv_freq(inv_freq, config.rope_scaling)
        if config.rope_freq_factors is not None:
            factors = torch.tensor(config.rope_freq_factors, dtype=torch.float32, device="cpu")
            if factors.shape != inv_freq.shape:
                raise ValueError(f"{factors.numel()} rope frequency factors for {inv_freq.numel()} frequencies")
            inv_freq = inv_freq / factors
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # dtype -> (cos, sin) [positions, dim] of positions 0..n-1, grown on demand: a
        # decode step gathers its rows (two ops) instead of computing them (seven).
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        tables = self._tables.get(dtype)
        if tables is not None:
            try:
                return tables[0][positions], tables[1][positions]
            except IndexError:  # a position past the table: grow it
                pass
        seen = 0 if tables is None else tables[0].shape[0]
        need = int(positions.max()) + 1 if positions.numel() else 1
        if need > seen:
            tables = self._tables[dtype] = self.cos_sin(torch.arange(max(need, 2 * seen, 256)), dtype)
        return tables[0][positions], tables[1][positions]

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def maybe_norm(norm: Optional[RMSNorm], x: torch.Tensor) -> torch.Tensor:
    return norm(x) if norm is not None else x
