"""Policy configuration: one user-facing flag, finer switches underneath."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

CompileMode = Literal["regional", "eager"]
ShapeGate = Literal["bucketed", "measured", "invariant", "seed"]  # "seed": bucketed's earlier name


@dataclasses.dataclass(frozen=True)
class KernelPolicyConfig:
    """What `install_kernel_policy` turns on.

    `--enable-cpu-kernels` is `KernelPolicyConfig.from_flag()`: regional
    compile, explicit packed weights, small-batch buckets and the kernels
    beyond Linear together; full-graph capture stays off.
    """

    packed_weights: bool = True       # explicit packed BF16 side buffers
    small_batch: bool = True          # route M = 2..15 (buckets 2, 4, 8, 16)
    compile_mode: Optional[CompileMode] = None  # None: regional, eager when deterministic
    memory_budget_mib: Optional[int] = None  # None: derived from available memory
    kernels: bool = True              # the RVV kernels beyond Linear (attention, ...): kernel_routes.KERNELS
    # "bucketed": the seed's contract (N, K >= 1024, row buckets; "seed" is its earlier
    # name); "measured": this ISA's measured table; "invariant": every BF16 projection
    # packed at every M (shape_gate.py). None: measured, or invariant when deterministic.
    shape_gate: Optional[ShapeGate] = None
    # --enable-deterministic-inference: a row's result never depends on its batch (the
    # invariant gate, and the attention kernel at every prompt length).
    deterministic: bool = False
    # --cpu-kernels-drop-unpacked: a packed projection's row-major weight is freed and the packed
    # copy is the weight (route.py, ProjectionRoute.take_weight); a tied lm_head keeps both.
    drop_unpacked: bool = False

    @property
    def compiles_regionally(self) -> bool:
        return self.compile_mode == "regional" or (self.compile_mode is None and not self.deterministic)

    def determinism_conflict(self) -> Optional[str]:
        """What in this config routes or compiles by row count, which deterministic inference
        cannot have; None when nothing does."""
        if self.shape_gate not in (None, "invariant"):
            return f"--cpu-kernels-shape-gate {self.shape_gate} routes by row count"
        if self.compile_mode == "regional":
            return "--cpu-compile-mode regional contradicts it"
        return None

    @classmethod
    def from_flag(cls, memory_budget_mib: Optional[int] = None, compile_mode: Optional[CompileMode] = None,
                  shape_gate: Optional[ShapeGate] = None, drop_unpacked: bool = False,
                  deterministic: bool = False) -> "KernelPolicyConfig":
        return cls(packed_weights=True, small_batch=True, compile_mode=compile_mode,
                   memory_budget_mib=memory_budget_mib, shape_gate=shape_gate, drop_unpacked=drop_unpacked,
                   deterministic=deterministic)
