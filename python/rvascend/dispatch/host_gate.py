"""The measured shape gate on hosts other than riscv64: timed on the host, per weight shape.

On riscv64 the gate reads instruction counts measured in the image
(gate_riscv64.json). On an x86 host which side wins depends on the machine:
ATen's BF16 Linear is oneDNN with AVX-512 BF16 on one host and a slow AVX2
path on another, and the packed kernel set differs with them. So each weight
shape (N, K) the policy meets is timed here, F.linear against the packed
kernel at M = 1, 4, 16 and 64, when the policy is installed (well under a
second per shape), and kept in the project cache in a file named by the
host's features, torch, the kernel set and the thread count; later starts
read it. A call of M rows follows the nearest timed M (in log space).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from typing import Callable

import torch
import torch.nn.functional as F
from absl import logging

from rvascend import ops
from rvascend.runtime import model_cache

GRID_M = (1, 4, 16, 64)
MAX_TIMED_MACS = 1 << 28  # larger M of a large shape are not timed: the nearest smaller M decides
_MIN_SECONDS = 0.002      # one timing lasts at least this long, so the clock's granularity does not decide
_lock = threading.Lock()
_tables: dict[str, dict[str, dict]] = {}  # path -> "NxK" -> {"m": [...], "f_linear_seconds": [...], ...}


def table_path() -> str:
    kernel_set = ops.packed_linear._kernel_set or ops.available_kernel_sets()[0]
    # What F.linear may use is part of the host too: ATen's vector level and oneDNN's ISA cap.
    aten = torch.backends.cpu.get_cpu_capability()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA")
    key = "-".join((ops.cpu_features(), f"torch{torch.__version__.split('+')[0]}", f"aten_{aten}",
                    *([f"onednn_{onednn}"] if onednn else []), kernel_set, f"layout{ops.LAYOUT_VERSION}",
                    f"t{torch.get_num_threads()}", f"team_{ops.packed_linear.thread_team()}"))
    return os.path.join(model_cache.cache_root(), "shape_gate", re.sub(r"[^\w.=-]+", "_", key) + ".json")


def _race(a: Callable[[], object], b: Callable[[], object], rounds: int = 5) -> tuple[float, float]:
    """Seconds per call of `a` and of `b`: the fastest of `rounds` alternating timings each
    (each repeated to last _MIN_SECONDS), so both meet the same load and a busy moment
    spoils one round, not the answer."""
    a(), b()
    t0 = time.perf_counter()
    a()
    reps = max(1, int(_MIN_SECONDS / max(time.perf_counter() - t0, 1e-7)))
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, call in enumerate((a, b)):
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
            best[i] = min(best[i], (time.perf_counter() - t0) / reps)
    return best[0], best[1]


def time_shape(n: int, k: int) -> dict:
    """F.linear against the packed kernel for an [n, k] weight at the grid's M, on this host."""
    g = torch.Generator().manual_seed(0)
    entry: dict[str, list] = {"m": [], "f_linear_seconds": [], "packed_seconds": []}
    with torch.inference_mode():
        w = torch.randn(n, k, generator=g).to(torch.bfloat16)
        packed = ops.pack_bf16_weight(w)
        for m in GRID_M:
            if m > 1 and m * n * k > MAX_TIMED_MACS:
                break
            x = torch.randn(m, k, generator=g).to(torch.bfloat16)
            f_linear, packed_s = _race(lambda: F.linear(x, w), lambda: ops.packed_bf16_linear(x, packed, n))
            entry["m"].append(m)
            entry["f_linear_seconds"].append(f_linear)
            entry["packed_seconds"].append(packed_s)
    return entry


def _load(path: str) -> dict[str, dict]:
    """The valid entries of the table at `path` ({} if none): an entry is read in the
    middle of a step, so one that is malformed (hand-edited, another version's, cut
    short) is dropped here and timed again, never a KeyError then."""
    try:
        with open(path, encoding="utf-8") as f:
            shapes = json.load(f)["shapes"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(shapes, dict):
        return {}
    valid = {name: entry for name, entry in shapes.items() if valid_entry(name, entry)}
    if len(valid) < len(shapes):
        logging.warning("shape gate: %d malformed entries of %s dropped (timed again when needed)",
                        len(shapes) - len(valid), path)
    return valid


def valid_entry(name: object, entry: object) -> bool:
    """Whether `entry` is a timing of shape `name` ("NxK") as time_shape writes it."""
    if not isinstance(name, str) or not re.fullmatch(r"[1-9]\d{0,6}x[1-9]\d{0,6}", name) or \
            not isinstance(entry, dict):
        return False
    m, f_linear, packed = (entry.get(k) for k in ("m", "f_linear_seconds", "packed_seconds"))
    if not all(isinstance(v, list) for v in (m, f_linear, packed)) or not m or not len(m) == len(f_linear) == \
            len(packed):
        return False
    if not all(type(x) is int and x >= 1 for x in m) or m != sorted(set(m)):
        return False
    return all(type(t) in (int, float) and math.isfinite(t) and t > 0 for t in (*f_linear, *packed))


def _save(path: str, shapes: dict[str, dict]) -> None:
    """Written whole, by a rename: a reader never sees half a file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"comment": "Seconds of one BF16 Linear call on this host, F.linear against the packed "
                              "kernel, per weight shape and M (rvascend.dispatch.host_gate).",
                   "cpu_features": ops.cpu_features(), "threads": torch.get_num_threads(),
                   "torch": torch.__version__, "shapes": shapes}, f, indent=1)
    os.replace(tmp, path)


def shape_entry(n: int, k: int) -> dict:
    """This host's timings of an [n, k] weight: cached, else timed now and added to the cache."""
    path = table_path()
    name = f"{n}x{k}"
    with _lock:
        shapes = _tables.get(path)
        if shapes is None:
            shapes = _tables[path] = _load(path)
        if name not in shapes:
            t0 = time.perf_counter()
            shapes[name] = time_shape(n, k)
            logging.info("shape gate: timed a %s weight on this host in %.2f s (cached in %s)", name,
                         time.perf_counter() - t0, path)
            _save(path, {**_load(path), **shapes})  # keeps shapes another process added meanwhile
        return shapes[name]


def packed_wins(m: int, n: int, k: int) -> bool:
    """Whether the packed kernel was faster than F.linear here at the timed M nearest m."""
    entry = shape_entry(n, k)
    i = min(range(len(entry["m"])), key=lambda j: abs(math.log(entry["m"][j]) - math.log(m)))
    return entry["packed_seconds"][i] < entry["f_linear_seconds"][i]


def forget() -> None:
    """Drops the in-memory tables (tests; a changed cache directory or thread count)."""
    with _lock:
        _tables.clear()
