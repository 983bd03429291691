"""The loader's own memory: weights materialized into huge-page-advised buffers."""

from __future__ import annotations

import sys

import pytest
import torch

from rvascend.models.loader import _materialize
from rvascend.ops.testing import thp_advice_recorded, vm_flags
from rvascend.runtime import allocator


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
def test_weights_are_loaded_into_huge_page_advised_memory():
    """A model built on the meta device gets its weights in memory advised for huge pages
    before they are written (as the packers' buffers are: ops/packed_linear_test)."""
    allocator.pin_mmap_threshold()  # each buffer its own mapping, with its own flags (as while loading)
    thp = thp_advice_recorded()
    model = torch.nn.Linear(1024, 4096, bias=False, device="meta")  # 8 MiB: whole huge pages inside
    _materialize(model, torch.bfloat16)
    w = model.weight
    assert ("hg" in vm_flags(w.data_ptr() + w.numel() * w.element_size() // 2)) == thp


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
