"""The llama.cpp bench's merge of an engine's rounds (--rounds)."""

from __future__ import annotations

import sys

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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
