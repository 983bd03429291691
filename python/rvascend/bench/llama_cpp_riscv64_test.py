"""llama.cpp counted under QEMU: the plugin's intervals read as prompt and tokens, the
whole model's counts composed from a one-layer model's, and (with the riscv64 build
of `./dev setup`) the driver's count on a tiny GGUF, stable between runs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import pytest

from rvascend import checkout
from rvascend.bench import llama_cpp_riscv64 as bench
from rvascend.bench.llama_cpp_riscv64 import CountedRun


def _write(path, intervals):
    with open(path, "w") as f:
        for i, (n, v, threads) in enumerate(intervals):
            f.write(f"I {i}\n10 {n} {v}\n")
            for t, (tn, tv) in threads.items():
                f.write(f"T {t} {tn} {tv}\n")
            if v:
                f.write(f"K memory {v // 4}\nK multiply {v - v // 4}\n")


def test_parse_run_names_prompt_and_tokens(tmp_path):
    path = str(tmp_path / "c.txt")
    _write(path, [(1000, 0, {0: (1000, 0)}), (640, 300, {0: (400, 150), 1: (240, 150)}), (50, 20, {0: (50, 20)}),
                  (40, 20, {0: (40, 20)}), (7, 0, {0: (7, 0)})])
    run = bench.parse_run(path, prompt=64, generate=2)
    assert run.prompt_counts == (640, 300) and run.token_counts == [(50, 20), (40, 20)]
    assert run.prompt_threads == {0: (400, 150), 1: (240, 150)}
    assert run.prompt_kinds == {"memory": 75, "multiply": 225} and run.token_kinds[-1] == {"memory": 5, "multiply": 15}
    with pytest.raises(RuntimeError, match="5 intervals, expected 6"):
        bench.parse_run(path, prompt=64, generate=3)


def _run(prompt, prefill, tokens, threads=None):
    # Every vector instruction a reduction but one memory access per token.
    return CountedRun(prompt, prefill, tokens, threads or {}, [{} for _ in tokens],
                      {"memory": prompt, "reduction": prefill[1] - prompt},
                      [{"memory": 1, "reduction": v - 1} for _, v in tokens])


def _llama_cpp_like(layers, prompt, generate=2):
    # A count shaped as llama.cpp's graph: the lm_head (fixed), per layer the projections per
    # token and attention growing with the square of the prompt, the feed-forward per token in
    # every layer but the last, which runs it for the output token alone. A token: every layer
    # in full, attention by the cache padded to 256 entries. A tenth of each a memory access.
    n = 500 + layers * (10 * prompt + prompt * prompt // 64) + (layers - 1) * 40 * prompt + 40
    tokens = [500 + layers * (50 + 8 * ((prompt + i + 1 + 255) // 256)) for i in range(generate)]
    return CountedRun(prompt, (n, n // 10), [(t, t // 10) for t in tokens], {}, [{} for _ in tokens],
                      {"memory": n // 10}, [{"memory": t // 10} for t in tokens])


def test_compose_takes_every_layer_but_the_last_from_the_second():
    prompts = (16, 64, 300, 512)
    full = _llama_cpp_like(22, 64)
    one = [_llama_cpp_like(1, p) for p in prompts]
    two = [_llama_cpp_like(2, p) for p in prompts]
    composed = bench.compose(full, one, two, layers=22)
    for p in prompts:  # exact: scaling the one-layer model's fixed part by depth would miss by 21 x 540 (1 - P/64)
        assert composed.prefill[p][0] == _llama_cpp_like(22, p).prompt_counts[0], p
        assert composed.prefill_kinds[p] == {"memory": composed.prefill[p][1]}
    assert composed.prefill_check == 0.0
    # Decode: the whole model's token plus the depth times one layer's growth with the cache.
    for p in prompts:
        assert composed.decode[p + 2][0] == _llama_cpp_like(22, p).token_counts[-1][0], p
    # A run counted before the plugin sorted kinds gives no kinds, not the other run's times the depth.
    bare = [dataclasses.replace(r, prompt_kinds={}, token_kinds=[{} for _ in r.token_counts]) for r in one]
    composed = bench.compose(full, bare, two, layers=22)
    assert composed.prefill_kinds[512] == {} and composed.decode_kinds[514] == {}
    assert composed.prefill[512][0] == _llama_cpp_like(22, 512).prompt_counts[0]
    with pytest.raises(ValueError, match="prompt length 64"):
        bench.compose(full, one, two[:1], layers=22)


def _hybrid_like(periods, prompt, generate=2):
    # A hybrid's count (Qwen3.5): each period of four layers, three Gated DeltaNet layers (a
    # prompt token costs each the same at every length, a generated token too) and one of full
    # attention (growing with the prompt's square, and by the padded cache for a token); the
    # last layer runs its feed-forward for the output token alone.
    n = 500 + periods * (3 * 30 * prompt + 10 * prompt + prompt * prompt // 64) + (4 * periods - 1) * 40 * prompt + 40
    tokens = [500 + periods * (3 * 70 + 50 + 8 * ((prompt + i + 1 + 255) // 256)) for i in range(generate)]
    return CountedRun(prompt, (n, n // 10), [(t, t // 10) for t in tokens], {}, [{} for _ in tokens], {}, [])


def test_compose_takes_a_hybrid_by_whole_periods_of_its_layer_pattern():
    from rvascend.models import random_checkpoint

    assert bench.depth_unit(random_checkpoint.SHAPES["qwen3.5-2b"]) == 4
    assert bench.depth_unit(random_checkpoint.SHAPES["qwen3.5-0.8b"]) == 4
    assert bench.depth_unit(random_checkpoint.SHAPES["tinyllama-1.1b"]) == 1
    assert bench.depth_unit({"layer_types": ["a", "a", "b", "a", "a", "b", "a", "b"]}) == 8
    prompts = (16, 64, 512)
    full = _hybrid_like(6, 64)
    one = [_hybrid_like(1, p) for p in prompts]
    two = [_hybrid_like(2, p) for p in prompts]
    composed = bench.compose(full, one, two, layers=24, unit=4)
    assert composed.layers == 24 and composed.prefill_check == 0.0
    for p in prompts:
        assert composed.prefill[p][0] == _hybrid_like(6, p).prompt_counts[0], p
        assert composed.decode[p + 2][0] == _hybrid_like(6, p).token_counts[-1][0], p
    # Taken layer by layer, a 4- and an 8-layer file would count each period's growth four times over.
    by_layer = bench.compose(full, one, two, layers=24)
    assert by_layer.decode[514][0] > composed.decode[514][0]
    record = {"layers": 24, "unit_layers": 4, "full_runs": {"1": dataclasses.asdict(full)},
              "one_layer_runs": [dataclasses.asdict(r) for r in one], "two_layer_runs": [dataclasses.asdict(r) for r in two]}
    assert bench.composed_record(json.loads(json.dumps(record))).decode == composed.decode
    with pytest.raises(ValueError, match="whole units of 4"):
        bench.compose(full, one, two, layers=22, unit=4)
    # A model that cannot be cut (real weights) is one unit: its own runs at every prompt come out as they are.
    whole = [_hybrid_like(6, p) for p in prompts]
    composed = bench.compose(full, whole, whole, layers=24, unit=24)
    for p, run in zip(prompts, whole):
        assert composed.prefill[p][0] == run.prompt_counts[0] and composed.decode[p + 2][0] == run.token_counts[-1][0]


def test_compose_brings_the_prompts_to_the_whole_models_count():
    # A recipe that varies the type by layer: the whole model does 3 more instructions per
    # prompt token (2 of them vector, all memory) than one and two layers of it compose to.
    prompts = (16, 64, 512)
    shallow = _llama_cpp_like(22, 64)
    n, v = shallow.prompt_counts
    full = dataclasses.replace(shallow, prompt_counts=(n + 3 * 64, v + 2 * 64), prompt_kinds={"memory": v + 2 * 64})
    one = [_llama_cpp_like(1, p) for p in prompts]
    two = [_llama_cpp_like(2, p) for p in prompts]
    composed = bench.compose(full, one, two, layers=22)
    assert composed.prefill_check == pytest.approx(-3 * 64 / (n + 3 * 64))
    for p in prompts:
        want = _llama_cpp_like(22, p).prompt_counts
        assert composed.prefill[p][0] == pytest.approx(want[0] + 3 * p), p
        # Vector counts: each run's is its total // 10, which composes to within those roundings.
        assert composed.prefill[p][1] == pytest.approx(want[1] + 2 * p, rel=5e-3), p
        assert composed.prefill_kinds[p]["memory"] == pytest.approx(want[1] + 2 * p, rel=5e-3), p
    record = {"layers": 22, "full_runs": {"1": dataclasses.asdict(full)},
              "one_layer_runs": [dataclasses.asdict(r) for r in one], "two_layer_runs": [dataclasses.asdict(r) for r in two]}
    assert bench.composed_record(json.loads(json.dumps(record))).prefill == composed.prefill


def test_reusable_runs_match_the_build(tmp_path):
    run = _llama_cpp_like(1, 16)
    build = {"llama_cpp_python": "0.3.36", "build": ["-DGGML_RVV=ON"]}
    record = {"bench": "llama_cpp_riscv64", "model": "m", "type": "q4_0", "variant": "repack", "vlen": 256,
              "generate": 2, "manifest": {"llama_cpp": build}, "full_runs": {"1": dataclasses.asdict(run)},
              "one_layer_runs": [dataclasses.asdict(run)], "two_layer_runs": []}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "vlen": 128}) + "\n")
    runs = bench.reusable_runs(str(path), build, 256, 2)
    assert set(runs) == {("m", "q4_0", "repack", "full", 1, 16), ("m", "q4_0", "repack", 1, 1, 16)}
    assert runs[("m", "q4_0", "repack", 1, 1, 16)] == run
    assert bench.reusable_runs(str(path), {**build, "build": []}, 256, 2) == {}
    # The build's options as the bench holds them (a tuple) match the record's list.
    assert len(bench.reusable_runs(str(path), {**build, "build": ("-DGGML_RVV=ON",)}, 256, 2)) == 2


def test_thread_split_reports_the_added_instructions():
    one = _run(8, (1000, 400), [(100, 40)])
    many = CountedRun(8, (0, 0), [(0, 0)], {0: (700, 200), 1: (600, 200)}, [{0: (90, 30), 1: (50, 10)}])
    split = bench.thread_split(one, many)
    assert split["prefill"]["added_instructions"] == 300 and split["prefill"]["busiest_vector_share"] == 0.5
    assert split["decode"]["vector_instructions"] == 40 and split["decode"]["busiest_vector_share"] == 0.75


def _built() -> tuple[str, str, str] | None:
    """(emulator, plugin, driver) when `./dev setup` built them on this checkout."""
    deps = os.path.join(checkout.root(), ".deps")
    qemu = os.path.join(deps, "qemu_plugins", "bin", "qemu-riscv64")
    driver = os.path.join(deps, "llama_cpp", "riscv64", "llama_cpp_count_driver")
    plugin = os.environ.get("RVASCEND_COUNT_PLUGIN", "")
    return (qemu, plugin, driver) if all(os.path.exists(p) for p in (qemu, plugin, driver)) else None


@pytest.mark.skipif(sys.platform != "linux", reason="QEMU user mode")
def test_driver_count_is_stable_and_sees_attention_grow():
    built = _built()
    if built is None:
        pytest.fail("the plugin-capable QEMU, the count plugin ($RVASCEND_COUNT_PLUGIN) and the riscv64 llama.cpp "
                    "driver are built by `./dev setup`; run the test through Bazel")
    qemu, plugin, driver = built
    from rvascend.testing import llama_cpp
    from rvascend.models.random_model import ensure_random_model
    from rvascend.models import gguf_export

    image = os.path.join(checkout.root(), ".deps", "riscv64_image")
    with tempfile.TemporaryDirectory() as tmp:
        bf16, q4 = os.path.join(tmp, "tiny-bf16.gguf"), os.path.join(tmp, "tiny-q4_0.gguf")
        gguf_export.export(ensure_random_model(), bf16)
        subprocess.run([llama_cpp.python_path(), "-P", os.path.join(os.path.dirname(bench.__file__),
                                                                    "llama_cpp_peer_guest.py"),
                        f"--quantize-from={bf16}", "--ftype=q4_0", f"--model={q4}", "--threads=2"],
                       check=True, capture_output=True)
        first, second = (bench.run_counted(qemu, plugin, image, driver, q4, 1, 16, 2, True, 256, tmp)
                         for _ in range(2))
        for a, b in [(first.prompt_counts, second.prompt_counts), (first.token_counts[-1], second.token_counts[-1])]:
            assert abs(a[0] - b[0]) <= 0.005 * a[0] and a[1] == b[1], (a, b)
        # Every vector instruction has one kind; the kinds are as deterministic as the count.
        assert sum(first.token_kinds[-1].values()) == first.token_counts[-1][1]
        assert first.token_kinds[-1] == second.token_kinds[-1] and first.token_kinds[-1]["config"] > 0
        # The cache holds 300 entries: attention reads 512 (padded to 256) instead of 256.
        long = bench.run_counted(qemu, plugin, image, driver, q4, 1, 298, 2, True, 256, tmp)
        assert long.token_counts[-1][0] > first.token_counts[-1][0] * 1.01
        # Repacking off runs the row-by-row dot products: more instructions for the same product.
        plain = bench.run_counted(qemu, plugin, image, driver, q4, 1, 16, 2, False, 256, tmp)
        assert plain.token_counts[-1][0] > first.token_counts[-1][0] * 1.5
        # The row-by-row dot products end every block in a reduction; the repacked tiles do not.
        assert plain.token_kinds[-1].get("reduction", 0) > 2 * first.token_kinds[-1].get("reduction", 0)
        composed = bench.compose(first, [first, long], [first], layers=4)
        assert composed.decode[300][0] > composed.decode[18][0]
