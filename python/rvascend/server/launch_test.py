"""Server start-up defaults that depend on the machine."""

from __future__ import annotations

import json
import os
import platform
import shutil

import pytest

from rvascend.models.random_model import ensure_random_model
from rvascend.models.testing import write_qwen3_5_mtp_checkpoint
from rvascend.engine.testing import greedy
from rvascend.server import launch
from rvascend.server.server_args import ServerArgs


@pytest.mark.parametrize("machine,chunk", [("riscv64", 64), ("x86_64", 512), ("aarch64", 512)])
def test_chunked_prefill_default_per_machine(monkeypatch, machine, chunk):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert launch.default_chunked_prefill_size() == chunk


@pytest.mark.parametrize("given,want", [(None, 64), (16, 16), (-1, -1)])
def test_the_engine_gets_the_flag_or_the_machine_default(monkeypatch, given, want):
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    engine, _, _ = launch.build_engine(ServerArgs(model_path=ensure_random_model(),
                                                           chunked_prefill_size=given, max_total_tokens=256))
    assert engine.config.chunked_prefill_size == want


def test_drop_unpacked_serves_the_same_tokens_from_the_packed_weights_alone():
    opts = dict(model_path=ensure_random_model(), enable_cpu_kernels=True, cpu_compile_mode="eager",
                cpu_kernels_shape_gate="bucketed", max_total_tokens=256)
    keep, _, _ = launch.build_engine(ServerArgs(**opts))
    drop, _, policy = launch.build_engine(ServerArgs(**opts, cpu_kernels_drop_unpacked=True))
    assert policy.config.drop_unpacked
    layer = drop.model.model.layers[0]
    assert "weight" not in layer.mlp.down_proj._parameters and "weight" not in layer.self_attn.qkv_proj._parameters
    prompt = list(range(5, 40))
    assert greedy(drop.model, prompt, 8) == greedy(keep.model, prompt, 8)
    with pytest.raises(ValueError, match="--cpu-kernels-drop-unpacked .* needs --enable-cpu-kernels"):
        launch.build_engine(ServerArgs(model_path=ensure_random_model(), cpu_kernels_drop_unpacked=True))


def test_a_model_whose_chat_template_cannot_render_is_refused_at_start(tmp_path):
    """The template is probed once at start-up, within its budget: a model file whose
    template loops is refused by name then, not at every chat request."""
    model = tmp_path / "looping"
    shutil.copytree(ensure_random_model(), model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="looping's chat template cannot serve a chat: .* went over its budget"):
        launch.build_engine(ServerArgs(model_path=str(model), max_total_tokens=256))



@pytest.mark.parametrize("flag", ["--enable-cpu-kernels", "--enable-cpu-rvv-inductor"])
def test_the_kernels_flag_and_its_sglang_name_turn_on_the_same_option(flag):
    from absl import flags

    from rvascend.server import __main__ as serve  # defines the server's flags

    try:
        flags.FLAGS(["serve", flag])
        assert flags.FLAGS["enable-cpu-kernels"].value is True
        assert "--enable-cpu-kernels" in serve.__doc__
    finally:
        flags.FLAGS.unparse_flags()


def test_deterministic_inference_installs_the_invariant_policy():
    engine, _, policy = launch.build_engine(ServerArgs(model_path=ensure_random_model(), max_total_tokens=256,
                                                                enable_deterministic_inference=True))
    assert policy is not None and policy.shape_gate == "invariant" and policy.config.deterministic
    assert policy.kernels.batch_invariant and policy.compile_mode == "eager"
    # FP32: no projection is packed; each runs the FP32 Linear kernel as the model holds it.
    _, _, policy = launch.build_engine(ServerArgs(model_path=ensure_random_model(), max_total_tokens=256,
                                                           dtype="float32", enable_deterministic_inference=True))
    assert policy.shape_gate == "invariant" and not policy.report.packed
    assert {reason for _, _, reason in policy.report.not_packed} == {"fp32_kernel"}
    with pytest.raises(ValueError, match="routes by row count"):
        launch.build_engine(ServerArgs(model_path=ensure_random_model(), max_total_tokens=256,
                                                cpu_kernels_shape_gate="bucketed", enable_deterministic_inference=True))
    with pytest.raises(ValueError, match="--cpu-compile-mode regional contradicts it"):
        launch.build_engine(ServerArgs(model_path=ensure_random_model(), max_total_tokens=256,
                                                cpu_compile_mode="regional", enable_deterministic_inference=True))


def test_deterministic_inference_is_the_default_where_it_costs_nothing():
    avx512 = "x86-64 avx2=1 avx512=1 avx512bf16=1 avx512vnni=1"
    x86_sets = ["avx512bf16", "portable_avx512", "avx2", "portable", "scalar"]
    capped = "x86-64 avx2=1 avx512=0 avx512bf16=0 avx512vnni=0 RVASCEND_MAX_ISA=avx2"
    generic = "x86-64 avx2=0 avx512=0 avx512bf16=0 avx512vnni=0 RVASCEND_MAX_ISA=generic"
    for dtype in ("bfloat16", "float32"):
        # Measured faster than the stock path on every x86 class from AVX2 up.
        assert launch.deterministic_by_default(dtype, avx512, x86_sets)[0], dtype
        assert launch.deterministic_by_default(dtype, capped, ["avx2", "portable", "scalar"])[0], dtype
        on, why = launch.deterministic_by_default(dtype, generic, ["portable", "scalar"])
        assert not on and "not measured" in why, dtype
    assert launch.deterministic_by_default("bfloat16", "riscv64 v=1", ["rvv", "portable", "scalar"])[0]
    on, why = launch.deterministic_by_default("float32", "riscv64 v=1", ["rvv", "portable", "scalar"])
    assert not on and "not measured" in why
    assert not launch.deterministic_by_default("float16", avx512, x86_sets)[0]
    # An AMX host's stock BF16 prefill is oneDNN's AMX tiles (4.7x the kernels'); FP32 has no AMX path.
    amx = "x86-64 avx2=1 avx512=1 avx512bf16=1 avx512vnni=1 amxbf16=1"
    on, why = launch.deterministic_by_default("bfloat16", amx, x86_sets)
    assert not on and "AMX" in why
    assert launch.deterministic_by_default("float32", amx, x86_sets)[0]
    assert launch.deterministic_by_default("bfloat16", avx512 + " amxbf16=0", x86_sets)[0]
    # Left unset, the option takes the machine's default; a row-count gate turns it off, never fails.
    from rvascend import ops

    for dtype in ("bfloat16", "float32"):
        expected = launch.deterministic_by_default(dtype, ops.cpu_features(), ops.available_kernel_sets())[0]
        _, _, policy = launch.build_engine(ServerArgs(model_path=ensure_random_model(), max_total_tokens=256,
                                                               dtype=dtype))
        assert (policy is not None and policy.config.deterministic) == expected, dtype
    for opts in (dict(cpu_kernels_shape_gate="bucketed", enable_cpu_kernels=True),
                 dict(cpu_compile_mode="regional", enable_cpu_kernels=True)):
        _, _, policy = launch.build_engine(ServerArgs(model_path=ensure_random_model(), max_total_tokens=256,
                                                               **opts))
        assert policy is None or not policy.config.deterministic, opts
    _, _, policy = launch.build_engine(ServerArgs(model_path=ensure_random_model(), max_total_tokens=256,
                                                           enable_deterministic_inference=False))
    assert policy is None


def test_a_host_tier_larger_than_free_memory_is_refused_by_flag_name(tmp_path):
    with pytest.raises(ValueError, match="--hicache-size 100000.0 GiB is more than 50% of the"):
        launch.build_engine(ServerArgs(model_path=ensure_random_model(), max_total_tokens=256,
                                       enable_hierarchical_cache=True, hicache_size=100000.0))


def test_the_server_compiles_before_it_serves():
    """--cpu-compile-mode regional compiles the routes' graphs at start; the warm-up request
    leaves nothing behind: no counts, no cached prefix."""
    import torch

    torch._dynamo.reset()  # a server starts in a fresh process: the other tests' graphs are not its own
    engine, _, policy = launch.build_engine(ServerArgs(model_path=ensure_random_model(), enable_cpu_kernels=True,
                                                       cpu_compile_mode="regional", max_total_tokens=512))
    assert policy.compile_mode == "regional" and policy.regional.graphs
    assert policy.counters.snapshot() == [] and engine.stats()["kv_cached_tokens"] == 0


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_the_server_flags_load_the_mtp_head_and_its_draft_vocabulary(tmp_path, tie):
    """--speculative-algorithm NEXTN loads a Qwen3.5 checkpoint's MTP head;
    --speculative-token-map restricts its drafts (and is refused without NEXTN, or with ids
    the model does not have)."""
    vocab, served = 256, tmp_path / "served"
    served.mkdir()
    write_qwen3_5_mtp_checkpoint(str(served), vocab, tie=tie)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ensure_random_model(), name), served / name)
    token_map = tmp_path / "hot.txt"
    token_map.write_text(" ".join(str(t) for t in range(40)))
    opts = dict(model_path=str(served), max_total_tokens=256, speculative_algorithm="NEXTN",
                speculative_num_draft_tokens=2, speculative_token_map=str(token_map))
    engine, _, _ = launch.build_engine(ServerArgs(**opts))
    assert engine.config.speculative_algorithm == "NEXTN" and engine.model.mtp.draft_ids.tolist() == list(range(40))
    with pytest.raises(ValueError, match="needs --speculative-algorithm NEXTN"):
        launch.build_engine(ServerArgs(**{**opts, "speculative_algorithm": "NGRAM"}))
    token_map.write_text(f"1 2 {vocab + 5}")
    with pytest.raises(ValueError, match=f"token {vocab + 5} is outside"):
        launch.build_engine(ServerArgs(**opts))


@pytest.mark.parametrize("seconds", [0.0, -5.0, float("nan")])
def test_a_keep_alive_that_is_not_a_positive_time_is_refused_by_flag_name(seconds):
    with pytest.raises(ValueError, match="--timeout-keep-alive"):
        launch.uvicorn_options(ServerArgs(timeout_keep_alive=seconds))
    assert launch.uvicorn_options(ServerArgs())["timeout_keep_alive"] == 75.0
