"""The hierarchical cache in the engine: pages the pool evicted come back from host memory,
pages on disk survive a restart, and either way the answer is the cache-less engine's
(BF16 under deterministic inference bit for bit, logprobs included; FP32 tokens equal),
for a dense model and a hybrid one (whose pages carry recurrent-state snapshots). Another
model's, dtype's or weights' entries, and corrupt files, are misses with the right answer."""

from __future__ import annotations

import os

import pytest
import torch

from rvascend.engine import Engine, EngineConfig, SamplingParams, hierarchical_cache
from rvascend.models import random_checkpoint
from rvascend.engine.testing import load_exact_or_fp32
from rvascend.models.testing import TINY_QWEN3_5, write_random_checkpoint
from rvascend.models.loader import load_model

TINY_QWEN3 = dict(random_checkpoint.SHAPES["qwen3-0.6b"], hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512,
                  max_position_embeddings=1024)
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
PAGE = 32  # tokens per page: the dense page in these tests, and the hybrid's snapshot interval


@pytest.fixture(autouse=True)
def small_dense_pages(monkeypatch):
    monkeypatch.setattr(hierarchical_cache, "DENSE_PAGE_TOKENS", PAGE)


@pytest.fixture(scope="module", params=["qwen3", "qwen3.5"])
def path(request):
    return write_random_checkpoint(TINY_QWEN3 if request.param == "qwen3" else TINY_QWEN3_5)


@pytest.fixture(scope="module", params=["float32", "bf16_deterministic"])
def model(request, path):
    return load_exact_or_fp32(path, request.param)


def _engine(model, **config) -> Engine:
    return Engine(model, None, EngineConfig(**{"max_total_tokens": 1024, "chunked_prefill_size": 48,
                                               "mamba_track_interval": PAGE, **config}))


def _tiered(model, tmp_path, **config) -> Engine:
    return _engine(model, enable_hierarchical_cache=True, hicache_size=0.05, hicache_storage_backend="file",
                   hicache_storage_dir=str(tmp_path / "tiers"), hicache_storage_size=0.1, **config)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(2, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _answer(engine: Engine, prompt: list[int]):
    outputs = []
    (seq,) = [engine.add_request(prompt, GREEDY, on_output=lambda s, o: outputs.append(o))]
    while not seq.finish_reason:
        engine.step()
    assert seq.error is None, seq.error
    return seq.output_ids, [o.logprob for o in outputs if o.token_id is not None], \
        [o.top_logprobs for o in outputs if o.token_id is not None]


def _same(model, got, want) -> bool:
    if model.exact or got == want:
        return got == want
    return got[0] == want[0] and torch.allclose(torch.tensor(got[1]), torch.tensor(want[1]), atol=1e-4)


def _reference(model, prompt):
    return _answer(_engine(model, disable_radix_cache=True), prompt)


def _assert_nothing_held(engine: Engine) -> None:
    stats = engine.stats()
    assert stats["kv_used_tokens"] == 0 and stats["kv_reserved_tokens"] == 0
    assert stats["state_slots_free"] == stats["state_slots_total"]
    cache = engine.cache
    if cache.hybrid:
        assert len(cache.free_states) + cache.snapshots == cache.state_slots


def test_a_restart_loads_the_prompt_from_disk_and_answers_as_without_a_cache(model, tmp_path):
    system = _tokens(5 * PAGE + 7, seed=1)
    first, second = system + _tokens(9, seed=2), system + _tokens(11, seed=3)
    before = _tiered(model, tmp_path)
    assert _same(model, _answer(before, first), _reference(model, first))
    before.close()  # the queued disk writes land
    assert before.stats()["hicache_disk_entries"] >= 5
    after = _tiered(model, tmp_path)  # a new process's engine: empty pool, empty host tier
    got = _answer(after, second)
    stats = after.stats()
    assert stats["hicache_loaded_tokens"] == 5 * PAGE and stats["hicache_disk_hits"] >= 5
    assert stats["cache_hit_rate"] > 0
    assert _same(model, got, _reference(model, second))
    _assert_nothing_held(after)
    after.close()


def test_pages_the_pool_evicted_come_back_from_host_memory(model, tmp_path):
    prompt = _tokens(4 * PAGE + 3, seed=4)
    engine = _engine(model, max_total_tokens=4 * PAGE + 40, enable_hierarchical_cache=True, hicache_size=0.05)
    want = _answer(engine, prompt)
    for seed in (5, 6):  # each fills the pool: the first prompt's K/V (and snapshots) are evicted
        _answer(engine, _tokens(4 * PAGE + 3, seed=seed))
    have = len(engine.cache.match(prompt)[0])
    assert have < PAGE
    loaded = engine.stats()["hicache_loaded_tokens"]
    got = _answer(engine, prompt)
    assert engine.stats()["hicache_loaded_tokens"] - loaded == 4 * PAGE - have
    assert engine.stats()["hicache_host_hits"] > 0
    assert _same(model, got, want)
    _assert_nothing_held(engine)


def test_another_models_or_dtypes_entries_are_misses(path, tmp_path):
    prompt = _tokens(3 * PAGE + 5, seed=7)
    fp32 = load_exact_or_fp32(path, "float32")
    writer = _tiered(fp32, tmp_path)
    _answer(writer, prompt)
    writer.close()
    bf16 = load_exact_or_fp32(path, "bf16_deterministic")
    reader = _tiered(bf16, tmp_path)  # same directory, other dtype and route: another context
    assert _same(bf16, _answer(reader, prompt), _reference(bf16, prompt))
    assert reader.stats()["hicache_loaded_tokens"] == 0
    reader.close()
    other = load_model(write_random_checkpoint({**(TINY_QWEN3_5 if fp32.config.linear_attention else TINY_QWEN3),
                                                "rms_norm_eps": 1e-5}), torch.float32)
    other.exact = False
    reader = _tiered(other, tmp_path)
    assert _same(other, _answer(reader, prompt), _reference(other, prompt))
    assert reader.stats()["hicache_loaded_tokens"] == 0
    reader.close()


def test_new_weights_miss_the_old_entries(path, tmp_path):
    model = load_exact_or_fp32(path, "float32")
    prompt = _tokens(3 * PAGE + 5, seed=8)
    engine = _tiered(model, tmp_path, max_total_tokens=3 * PAGE + 40)
    _answer(engine, prompt)
    with torch.no_grad():
        next(model.parameters()).mul_(1.5)
    model.load_state_dict(model.state_dict())  # the weights changed: their generation moves
    got = _answer(engine, prompt)
    assert engine.stats()["hicache_loaded_tokens"] == 0
    assert _same(model, got, _reference(model, prompt))
    engine.close()


def test_a_corrupt_file_is_removed_and_the_prompt_prefilled(path, tmp_path):
    model = load_exact_or_fp32(path, "float32")
    prompt = _tokens(3 * PAGE + 5, seed=9)
    writer = _tiered(model, tmp_path)
    want = _answer(writer, prompt)
    writer.close()
    directory = tmp_path / "tiers"
    files = sorted(f for f in os.listdir(directory) if f.endswith(".kv"))
    for name in files:  # one flipped byte in each entry's payload
        with open(directory / name, "r+b") as f:
            f.seek(os.path.getsize(directory / name) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x40]))
    reader = _tiered(model, tmp_path)
    got = _answer(reader, prompt)
    stats = reader.stats()
    assert stats["hicache_loaded_tokens"] == 0 and stats["hicache_disk_rejected"] >= 1
    assert _same(model, got, want)
    reader.close()


def test_flush_cache_empties_every_tier(path, tmp_path):
    model = load_exact_or_fp32(path, "float32")
    engine = _tiered(model, tmp_path)
    _answer(engine, _tokens(2 * PAGE + 1, seed=10))
    engine.hicache.tiers.drain()
    assert engine.stats()["hicache_host_entries"] > 0 and engine.stats()["hicache_disk_entries"] > 0
    assert engine.flush_cache()
    stats = engine.stats()
    assert stats["hicache_host_entries"] == 0 and stats["hicache_disk_entries"] == 0
    engine.close()


def test_bad_flags_are_refused_by_name(path, tmp_path):
    model = load_exact_or_fp32(path, "float32")
    with pytest.raises(ValueError, match="needs the radix cache"):
        _engine(model, enable_hierarchical_cache=True, disable_radix_cache=True)
    with pytest.raises(ValueError, match="needs --enable-hierarchical-cache"):
        _engine(model, hicache_storage_backend="file")
    with pytest.raises(ValueError, match="only 'file'"):
        _engine(model, enable_hierarchical_cache=True, hicache_storage_backend="mooncake")
    with pytest.raises(ValueError, match="--hicache-size must be a positive"):
        _engine(model, enable_hierarchical_cache=True, hicache_size=0)


def test_the_fingerprint_covers_packed_and_quantized_buffers_not_route_ids(path):
    """The context hashes every weight the kernels read, non-persistent buffers included (a
    kept-quantized GGUF's blocks, the packed copies: state_dict() leaves them out), and
    nothing numbered per process (two loads of one file share their entries)."""
    from rvascend.dispatch.route import PACKED_BUFFER

    first, second = (_engine(load_exact_or_fp32(path, "bf16_deterministic")).runner for _ in range(2))
    assert first.fingerprint() == second.fingerprint()
    packed = next(b for name, b in second.model.named_buffers() if name.endswith(PACKED_BUFFER))
    packed.view(torch.uint8).view(-1)[0] ^= 1
    assert first.fingerprint() != second.fingerprint()


def test_the_warm_up_flush_keeps_the_tiers_and_a_lost_file_is_written_again(path, tmp_path):
    model = load_exact_or_fp32(path, "float32")
    prompt = _tokens(3 * PAGE + 5, seed=11)
    engine = _tiered(model, tmp_path)
    _answer(engine, prompt)
    engine.hicache.tiers.drain()
    directory = tmp_path / "tiers"
    files = sorted(f for f in os.listdir(directory) if f.endswith(".kv"))
    assert engine.flush_cache(tiers=False)  # the server's warm-up: the pool only
    assert sorted(f for f in os.listdir(directory) if f.endswith(".kv")) == files
    os.unlink(directory / files[0])  # a write the queue dropped, or a file removed by hand
    _answer(engine, prompt)  # from host memory; its pages are taken again, the lost one rewritten
    engine.hicache.tiers.drain()
    assert sorted(f for f in os.listdir(directory) if f.endswith(".kv")) == files
    engine.close()
