"""What a packed buffer was made from, so a stale one is never used.

The seed records identity, storage pointer, shape, stride, dtype and device.
Beyond it, two checks catch writes that keep all of those:

- the version counter (`_version`), bumped by every in-place torch op on the
  parameter itself (`w.mul_()`, `w.copy_()` under `no_grad`);
- a content fingerprint (`ops.weight_fingerprint`): 16 runs of 8 neighbouring
  columns, on 16 rows spread evenly from the first to the last. It catches
  writes that bypass the version counter and change most of the weight:
  through `w.data` (`w.data.copy_(new)`, the pattern of SGLang's and vLLM's
  weight loaders), numpy views or raw pointers, and `.data` swaps that restore
  pointer, shape, stride and version.

What the fingerprint cannot see: a write through `.data`, numpy or a pointer
to part of the weight. A write to one row of an N-row weight is seen with
probability at most 16 / N (SmolLM2's 576-row `down_proj`: 2.8 %; a 2048-row
weight: 0.8 %), only if it also changes a sampled column. Reading every row
each step would cost a cache miss per row after the step has streamed the
weights (about 155 k rows a SmolLM2 step). So after a partial write that
bypasses the version counter, call `invalidate_packed_weights(model)` (or
`repack(model)`); an in-place torch op on the parameter itself needs nothing.

Whichever check fires, the packed copy is not used, and the model's weights
generation moves (policy.weights_changed), so the engine's prefix cache
drops K/V computed from the old weights.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Optional

import torch

from rvascend import ops


@dataclasses.dataclass(frozen=True)
class PackedWeightSource:
    tensor_ref: weakref.ReferenceType
    data_ptr: int
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    version: int
    fingerprint: int
    layout_version: int

    @classmethod
    def capture(cls, weight: torch.Tensor, layout_version: int) -> "PackedWeightSource":
        return cls(weakref.ref(weight), weight.untyped_storage().data_ptr(), weight.storage_offset(),
                   tuple(weight.shape), tuple(weight.stride()), weight.dtype, weight.device, weight._version,
                   ops.weight_fingerprint(weight.detach()), layout_version)

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
        if (self.data_ptr != weight.untyped_storage().data_ptr()
                or self.storage_offset != weight.storage_offset()):
            return "weight_storage_changed"
        if self.version != weight._version:
            return "weight_mutated_in_place"
        if self.fingerprint != ops.weight_fingerprint(weight.detach()):
            return "weight_content_changed"
        return None
