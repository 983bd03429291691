"""Projections and embeddings whose weights stay quantized (a GGUF format of
ops/quantized_linear.FORMATS), in the runtime layout of ops/quantized_linear.py.

The quantized bytes are the weight of record: there is no BF16 copy. A fused
projection (q/k/v, gate/up) whose shards share a format is one weight (the GGML
rows concatenated before repacking); shards of different formats (a Q4_K_M file's
Q4_K q and k beside a Q6_K v) are one part each, run one after the other into
their columns of the output.

The weights live in non-persistent buffers: the layout depends on the machine
(its tile width), so it is never written to a checkpoint; models with quantized
weights are loaded from their GGUF file (models/loader.py).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from rvascend.ops import quantized_linear as qops
from rvascend.models.layers import constant_parameter

ROUTE_ATTR = "_rvv_route"  # the policy's route, as for nn.Linear projections (dispatch/route.py)


@dataclasses.dataclass(frozen=True)
class QuantPart:
    fmt: str    # one of ops/quantized_linear.FORMATS
    rows: int   # output features of this part
    tile: int   # the runtime layout's tile width


class QuantizedLinear(nn.Module):
    """y = x W^T (+ bias) with W quantized; `parts` cover W's rows in order."""

    def __init__(self, in_features: int, parts: list[QuantPart], bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.parts = list(parts)
        self.out_features = sum(p.rows for p in parts)
        for i in range(len(parts)):
            self.register_buffer(self.qweight_key(i), torch.empty(0, dtype=torch.uint8), persistent=False)
        self.bias = constant_parameter(self.out_features, 0.0) if bias else None

    @staticmethod
    def qweight_key(i: int) -> str:
        return f"qweight{i}"

    def qweight(self, i: int) -> torch.Tensor:
        return self._buffers[self.qweight_key(i)]

    def set_part(self, i: int, data: torch.Tensor) -> None:
        """Installs part i's weight in the runtime layout (checked against its shape)."""
        p = self.parts[i]
        want = qops.layout_bytes(p.fmt, p.rows, self.in_features, p.tile)
        if data.dtype != torch.uint8 or data.dim() != 1 or data.numel() != want:
            raise ValueError(f"part {i} ({p.fmt} [{p.rows}, {self.in_features}], tiles of {p.tile}) takes {want} "
                             f"bytes of uint8, got {data.dtype} {tuple(data.shape)}")
        self._buffers[self.qweight_key(i)] = data

    @property
    def packed_bytes(self) -> int:
        return sum(self.qweight(i).numel() for i in range(len(self.parts)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        route = self.__dict__.get(ROUTE_ATTR)
        return route(x) if route is not None else self.quantized_linear(x)

    def quantized_linear(self, x: torch.Tensor) -> torch.Tensor:
        """The product on the quantized kernels (BF16 or FP32 input), else on the dequantized weight."""
        if x.dtype not in (torch.bfloat16, torch.float32) or (torch.is_grad_enabled() and x.requires_grad):
            return self.dequantized_linear(x)
        outs = [qops.quantized_linear(x, self.qweight(i), p.fmt, p.rows, p.tile) for i, p in enumerate(self.parts)]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y + self.bias.to(y.dtype) if self.bias is not None else y

    def dequantized_weight(self, dtype: torch.dtype = torch.float32, start: int = 0,
                           end: Optional[int] = None) -> torch.Tensor:
        """W [out_features, in_features] in `dtype` (the slow path: non-BF16 input, autograd), or
        its rows start .. end - 1."""
        end = self.out_features if end is None else end
        parts, first = [], 0
        for i, p in enumerate(self.parts):  # the parts cover the rows in order
            lo, hi = max(start, first), min(end, first + p.rows)
            if lo < hi:
                ids = torch.arange(lo - first, hi - first)
                parts.append(qops.dequantize_rows(self.qweight(i), p.fmt, p.rows, self.in_features, p.tile, ids))
            first += p.rows
        return torch.cat(parts).to(dtype)

    def dequantized_linear(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"parts={[(p.fmt, p.rows) for p in self.parts]}, tile={self.parts[0].tile}")


class QuantizedEmbedding(QuantizedLinear):
    """Token embedding with a quantized table [vocab, hidden]: a lookup dequantizes
    only the rows it reads. As a tied lm_head it is the same module, and its
    product runs on the same quantized table (`quantized_linear`)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, fmt: str, tile: int,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(embedding_dim, [QuantPart(fmt, num_embeddings, tile)])
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        p = self.parts[0]
        return qops.dequantize_rows(self.qweight(0), p.fmt, p.rows, self.in_features, p.tile, ids).to(self.dtype)


def quantized_modules(model: nn.Module) -> list[tuple[str, QuantizedLinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QuantizedLinear)]
