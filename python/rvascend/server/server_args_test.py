"""Every flag is defined once (server_args.ServerArgs): the absl flags, the engine's
config and the docs' flag table come from it and cannot drift apart."""

from __future__ import annotations

import dataclasses
import os

import pytest
from absl import flags

from rvascend import checkout
from rvascend.engine import EngineConfig
from rvascend.server import server_args
from rvascend.server.server_args import ServerArgs


def _parsed(argv: list[str]) -> ServerArgs:
    values = flags.FlagValues()
    server_args.define_flags(values)
    values(["serve", *argv])
    return server_args.from_flags(values)


def test_flags_parse_into_the_arguments_with_their_types_and_defaults():
    assert _parsed([]) == ServerArgs()
    args = _parsed(["--model-path=/m", "--port=31000", "--enable-cpu-rvv-inductor", "--allowed-hosts=a,b",
                    "--speculative-algorithm=NGRAM", "--watchdog-timeout=2.5", "--noenable-deterministic-inference",
                    "--cpu-kernels-shape-gate=invariant"])
    assert (args.model_path, args.port, args.enable_cpu_kernels, args.allowed_hosts) == ("/m", 31000, True, ["a", "b"])
    assert (args.speculative_algorithm, args.watchdog_timeout, args.enable_deterministic_inference) == ("NGRAM", 2.5, False)
    assert args.cpu_kernels_shape_gate == "invariant"
    with pytest.raises(flags.IllegalFlagValueError):
        _parsed(["--speculative-algorithm=EAGLE"])
    with pytest.raises(flags.IllegalFlagValueError):
        _parsed(["--port=many"])


def test_the_kernels_flags_earlier_names_still_parse():
    args = _parsed(["--enable-cpu-rvv-kernels", "--cpu-rvv-shape-gate=bucketed", "--cpu-rvv-drop-unpacked",
                    "--cpu-rvv-memory-budget-mib=512"])
    assert (args.enable_cpu_kernels, args.cpu_kernels_shape_gate, args.cpu_kernels_drop_unpacked,
            args.cpu_kernels_memory_budget_mib) == (True, "bucketed", True, 512)


def test_the_engine_config_takes_every_shared_field_and_its_defaults_come_from_the_engine():
    engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
    shared = engine_fields & {f.name for f in dataclasses.fields(ServerArgs)}
    assert {"max_running_requests", "speculative_num_draft_tokens", "disable_radix_cache"} <= shared
    for name in shared - {"max_total_tokens", "chunked_prefill_size", "context_length"}:
        assert getattr(ServerArgs(), name) == getattr(EngineConfig(), name), name
    args = ServerArgs(max_running_requests=3, speculative_algorithm="NGRAM", speculative_num_draft_tokens=2)
    config = server_args.engine_config(args, max_total_tokens=512, chunked_prefill_size=64)
    assert (config.max_running_requests, config.speculative_algorithm, config.speculative_num_draft_tokens,
            config.max_total_tokens, config.chunked_prefill_size) == (3, "NGRAM", 2, 512, 64)


def test_the_docs_flag_table_is_the_flags():
    with open(os.path.join(checkout.root(), "docs", "serving.md"), encoding="utf-8") as f:
        docs = f.read()
    begin = docs.index("\n", docs.index("<!-- flags:")) + 1
    end = docs.index("<!-- end of flags -->")
    assert docs[begin:end] == server_args.flag_table(), (
        "docs/serving.md's flag table differs from server_args.ServerArgs: paste flag_table()'s output there")
    assert docs[begin:end].count("\n| `--") == len(dataclasses.fields(ServerArgs))
