"""The llama.cpp bench's merge of an engine's rounds (--rounds) and its weight-stream rate."""

from __future__ import annotations

import sys

import gguf
import numpy as np
import pytest

from rvascend.bench import llama_cpp_peer


def test_rounds_merge_to_medians_and_the_largest_peak_rss():
    rounds = [
        {"prefill_throughput": 250.0, "median_decode_throughput": 80.0, "peak_rss_mib": 1900.0, "gguf": "a.gguf",
         "ttft": 1.0, "repeats": 3, "warm": True},
        {"prefill_throughput": 300.0, "median_decode_throughput": 70.0, "peak_rss_mib": 1950.0, "gguf": "a.gguf",
         "ttft": 0.8, "repeats": 3, "warm": False},
        {"prefill_throughput": 280.0, "median_decode_throughput": 90.0, "peak_rss_mib": 1920.0, "gguf": "a.gguf",
         "ttft": 0.9, "repeats": 3, "warm": True},
    ]
    merged = llama_cpp_peer.median_of_rounds(rounds)
    assert merged["prefill_throughput"] == 280.0
    assert merged["median_decode_throughput"] == 80.0
    assert merged["ttft"] == 0.9
    assert merged["peak_rss_mib"] == 1950.0  # the worst round, not a typical one
    assert merged["gguf"] == "a.gguf" and merged["warm"] is True  # not numbers: the last round's
    assert merged["rounds"] == 3
    assert rounds[-1]["prefill_throughput"] == 280.0 and "rounds" not in rounds[-1]  # inputs untouched


def test_one_round_is_that_round():
    record = {"prefill_throughput": 250.0, "peak_rss_mib": 1900.0, "model": "m bf16"}
    assert llama_cpp_peer.median_of_rounds([record]) == {**record, "rounds": 1}


def _gguf(path, tensors: dict[str, np.ndarray]) -> str:
    w = gguf.GGUFWriter(str(path), "llama")
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.mark.parametrize("tied", [True, False])
def test_a_decode_step_reads_every_matrix_and_the_embedding_only_as_the_head(tmp_path, tied):
    tensors = {"token_embd.weight": np.ones((32, 8), np.float32),          # 1024 bytes
               "blk.0.attn_q.weight": np.ones((8, 8), np.float16),         # 128
               "blk.0.ffn_down.weight": np.ones((16, 8), np.float32),      # 512
               "blk.0.attn_norm.weight": np.ones(8, np.float32)}           # a vector: not a matrix read
    if not tied:
        tensors["output.weight"] = np.ones((32, 8), np.float16)            # 512
    expected = 128 + 512 + (1024 if tied else 512)
    assert llama_cpp_peer.decode_step_bytes(_gguf(tmp_path / "m.gguf", tensors)) == expected


def test_weight_rate_is_the_step_bytes_over_the_decode_step():
    record = llama_cpp_peer.with_weight_rate({"median_decode_latency": 0.01, "model": "m"}, 300_000_000, 40.0)
    assert record["weight_gbps"] == pytest.approx(30.0)
    assert record["bandwidth_fraction"] == pytest.approx(0.75)
    assert record["model"] == "m"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
