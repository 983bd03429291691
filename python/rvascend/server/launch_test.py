"""Server start-up defaults that depend on the machine."""

from __future__ import annotations

import platform

import pytest

from rvascend.engine.random_model import ensure_random_model
from rvascend.server import launch


@pytest.mark.parametrize("machine,chunk", [("riscv64", 64), ("x86_64", 512), ("aarch64", 512)])
def test_chunked_prefill_default_per_machine(monkeypatch, machine, chunk):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert launch.default_chunked_prefill_size() == chunk


@pytest.mark.parametrize("given,want", [(None, 64), (16, 16), (-1, -1)])
def test_the_engine_gets_the_flag_or_the_machine_default(monkeypatch, given, want):
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    engine, _, _ = launch.build_engine(launch.ServeOptions(model_path=ensure_random_model(),
                                                           chunked_prefill_size=given, max_total_tokens=256))
    assert engine.config.chunked_prefill_size == want
