"""What a packed buffer was made from, so a stale one is never used.

The seed records identity, storage pointer, shape, stride, dtype and device;
an in-place write keeps all of those, so the tensor's version counter
(`_version`, bumped by every in-place op) is recorded too.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Optional

import torch


@dataclasses.dataclass(frozen=True)
class PackedWeightSource:
    tensor_ref: weakref.ReferenceType
    data_ptr: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    version: int
    layout_version: int

    @classmethod
    def capture(cls, weight: torch.Tensor, layout_version: int) -> "PackedWeightSource":
        return cls(weakref.ref(weight), weight.untyped_storage().data_ptr(), tuple(weight.shape),
                   tuple(weight.stride()), weight.dtype, weight.device, weight._version,
                   layout_version)

    def mismatch(self, weight: torch.Tensor) -> Optional[str]:
        """None if `weight` is still exactly what was packed, else why not."""
        if self.tensor_ref() is not weight:
            return "weight_replaced"
        if self.dtype != weight.dtype:
            return "weight_dtype_changed"
        if self.device != weight.device:
            return "weight_device_changed"
        if self.shape != tuple(weight.shape) or self.stride != tuple(weight.stride()):
            return "weight_shape_changed"
        if self.data_ptr != weight.untyped_storage().data_ptr():
            return "weight_storage_changed"
        if self.version != weight._version:
            return "weight_mutated_in_place"
        return None
