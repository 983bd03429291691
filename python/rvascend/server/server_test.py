"""The server over real HTTP: the `openai` client, raw requests, bad input, concurrency, load."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import shutil
import sys
import time

import httpx
import openai
import psutil
import pytest
import torch
import transformers

from rvascend.models.random_model import ensure_random_model
from rvascend.models.testing import tiny_qwen3_5_config
from rvascend.engine.standalone_draft_test import copy_tokenizer
from rvascend.policy import get_policy
from rvascend.server.launch import build_engine
from rvascend.server.server_args import ServerArgs
from rvascend.server.testing import API_KEY, Server


@pytest.fixture(scope="module")
def server():
    s = Server(max_queued_requests=6)
    yield s
    s.stop()


def test_completion_with_the_openai_client(server):
    r = server.client.completions.create(model=server.name, prompt="The quick brown fox", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 5 and r.usage.prompt_tokens > 0
    again = server.client.completions.create(model=server.name, prompt="The quick brown fox", max_tokens=5,
                                             temperature=0)
    assert again.choices[0].text == r.choices[0].text  # greedy is deterministic


def test_chat_with_the_openai_client(server):
    r = server.client.chat.completions.create(model=server.name, messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=4, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens <= 4


@pytest.mark.parametrize("chat", [False, True])
def test_streaming_equals_non_streaming(server, chat):
    kwargs = dict(model=server.name, max_tokens=6, temperature=0)
    if chat:
        msgs = [{"role": "user", "content": "stream please"}]
        whole = server.client.chat.completions.create(messages=msgs, **kwargs).choices[0].message.content
        parts = [c.choices[0].delta.content or "" for c in
                 server.client.chat.completions.create(messages=msgs, stream=True, **kwargs)]
    else:
        whole = server.client.completions.create(prompt="stream please", **kwargs).choices[0].text
        parts = [c.choices[0].text for c in server.client.completions.create(prompt="stream please", stream=True,
                                                                            **kwargs)]
    assert "".join(parts) == whole


def test_seeded_sampling_is_reproducible(server):
    kw = dict(model=server.name, prompt="seeded", max_tokens=8, temperature=1.0, top_p=0.9, seed=7)
    texts = []
    for _ in range(2):
        # From the same cache state: a prompt whose prefix is cached runs its last token
        # in a one-row step, whose BF16 logits may differ in the last bits (docs/serving.md).
        server.wait_idle()
        assert server.http.post("/flush_cache").status_code == 200
        texts.append(server.client.completions.create(**kw).choices[0].text)
    assert texts[0] == texts[1]


def test_stop_strings_end_the_text(server):
    base = server.client.completions.create(model=server.name, prompt="stop here", max_tokens=8, temperature=0)
    text = base.choices[0].text
    if len(text) >= 3:
        cut = text[1:3]
        r = server.client.completions.create(model=server.name, prompt="stop here", max_tokens=8, temperature=0,
                                             stop=[cut])
        assert r.choices[0].text == text[:text.find(cut)] and r.choices[0].finish_reason == "stop"


def test_models_health_and_metrics(server):
    assert server.http.get("/v1/models").json()["data"][0]["id"] == server.name
    assert server.http.get("/health").json() == {"status": "ok"}
    metrics = server.http.get("/metrics").text
    assert "rvascend_time_to_first_token_seconds_bucket" in metrics
    assert 'rvascend_projection_calls_total{projection="qkv_proj",reason="",route="packed"}' in metrics
    assert 'rvascend_kernel_calls_total{kernel="kv_pool_attention",reason="",route="kernel"}' in metrics


def test_api_key_is_required(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]


@pytest.mark.parametrize("body,match", [
    ('{"prompt": "x", "max_tokens": ', "JSON decode error"),
    ('{"prompt": "x", "max_tokens": "ten"}', "max_tokens"),
    ('{"prompt": 5}', "prompt"),
    ('{"prompt": ""}', "empty"),
    ('{"prompt": "x", "max_tokens": 0}', "at least 1"),
    ('{"prompt": "x", "max_tokens": 100000000}', "context length"),
    ('{"prompt": "' + "word " * 5000 + '"}', "context length"),
    ('{"prompt": [999999]}', "vocabulary"),
    ('{"prompt": "x", "temperature": -1}', "temperature"),
    ('{"messages": []}', "messages"),
])
def test_bad_input_is_a_clear_400(server, body, match):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = server.http.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert match in r.json()["error"]["message"]
    assert server.http.get("/health").status_code == 200


def test_client_disconnect_mid_stream_frees_the_kv_pool(server):
    with server.http.stream("POST", "/v1/completions", json={"prompt": "long", "max_tokens": 200, "stream": True,
                                                              "ignore_eos": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then hang up
    stats = server.wait_idle()
    assert stats["kv_reserved_tokens"] == 0
    assert server.client.completions.create(model=server.name, prompt="still alive", max_tokens=2).choices


def test_concurrency_two_gives_m2_and_the_same_answers(server):
    prompts = ["first prompt here", "second, different prompt"]
    alone = [server.client.completions.create(model=server.name, prompt=p, max_tokens=8, temperature=0,
                                              extra_body={"ignore_eos": True}).choices[0].text for p in prompts]
    server.policy.counters.reset()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda p: server.client.completions.create(
            model=server.name, prompt=p, max_tokens=8, temperature=0,
            extra_body={"ignore_eos": True}).choices[0].text, prompts))
    assert together == alone
    assert server.policy.counters.rows_seen("o_proj", "packed").get(2, 0) > 0


def test_too_many_requests_get_503(server):
    body = {"prompt": "busy", "max_tokens": 64, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(lambda _: server.http.post("/v1/completions", json=body).status_code, range(10)))
    assert 503 in codes and 200 in codes and set(codes) <= {200, 503}
    server.wait_idle()


def test_soak_sixteen_hostile_clients_for_a_minute():
    """16 clients for 60 s mixing streams, plain requests, hang-ups mid-stream and
    mid-request, and bad requests: no 5xx, the KV pool and its reservations back to
    zero, and RSS after the first quarter grows by less than 5 %."""
    server = Server(max_queued_requests=64, max_running_requests=8)
    process = psutil.Process()
    try:
        start = time.time()
        deadline, warm = start + 60, start + 15
        rss_warm: list[int] = []
        errors, counts = [], {"ok": 0, "hangup": 0, "bad": 0}

        def client(i: int) -> None:
            http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
            c = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
            n = 0
            while time.time() < deadline:
                n += 1
                kind = (i + n) % 5
                try:
                    if kind == 0:
                        list(c.completions.create(model=server.name, prompt=f"soak {i} {n}", max_tokens=12,
                                                  stream=True))
                    elif kind == 1:
                        c.chat.completions.create(model=server.name, messages=[{"role": "user", "content": f"{n}"}],
                                                  max_tokens=12, n=2, logprobs=True, top_logprobs=2)
                    elif kind == 2:  # hang up mid-stream
                        with http.stream("POST", "/v1/completions", json={"prompt": "hang", "max_tokens": 64,
                                                                          "stream": True, "ignore_eos": True}) as r:
                            for line in r.iter_lines():
                                if line.startswith("data: {"):
                                    break
                        counts["hangup"] += 1
                        continue
                    elif kind == 3:  # give up on a plain request
                        try:
                            http.post("/v1/completions", json={"prompt": "slow", "max_tokens": 200,
                                                               "ignore_eos": True}, timeout=0.3)
                        except httpx.TimeoutException:
                            counts["hangup"] += 1
                            continue
                    else:  # bad requests must be 400s, never 5xx
                        bad = [{"prompt": "x", "top_p": 1e-60, "temperature": 1.0, "max_tokens": 2},
                               {"prompt": "x\ud800"}, {"prompt": "x", "seed": 2**70}, {"prompt": [10**9]}]
                        body = bad[n % len(bad)]
                        r = http.post("/v1/completions", content=json.dumps(body),
                                      headers={"content-type": "application/json"})
                        if r.status_code >= 500:
                            errors.append(f"{r.status_code} for {body}: {r.text[:200]}")
                        counts["bad"] += 1
                        continue
                    counts["ok"] += 1
                except openai.APIStatusError as e:
                    if e.status_code != 503:  # a full queue may refuse; nothing else may
                        errors.append(repr(e))
                except Exception as e:  # noqa: BLE001 - any other failure is the finding
                    errors.append(repr(e))
                if not rss_warm and time.time() > warm:
                    rss_warm.append(process.memory_info().rss)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(client, range(16)))
        stats = server.wait_idle()
        assert not errors, errors[:3]
        assert counts["ok"] > 16 and counts["hangup"] > 4 and counts["bad"] > 4, counts
        assert stats["kv_reserved_tokens"] == 0 and stats["kv_used_tokens"] == 0
        growth = process.memory_info().rss / rss_warm[0] - 1
        assert growth < 0.05, f"RSS grew {growth:.1%} after warm-up"
        assert server.http.get("/health").status_code == 200
    finally:
        server.stop()



def test_a_restarted_server_loads_its_prompts_from_the_hierarchical_caches_files(tmp_path):
    """--enable-hierarchical-cache with the file backend: a server's pages land in the
    directory at shutdown, the next server on it answers the same prompt from them (the
    same answer: deterministic inference), and /metrics and /flush_cache cover the tiers."""
    tiers = dict(enable_hierarchical_cache=True, hicache_size=0.05, hicache_storage_backend="file",
                 hicache_storage_dir=str(tmp_path / "hicache"), hicache_storage_size=0.1,
                 enable_deterministic_inference=True, cpu_kernels_shape_gate=None)
    prompt = [(7 * i) % 200 + 3 for i in range(600)]  # two whole pages of 256 tokens
    answers = []
    for _ in range(2):
        s = Server(**tiers)
        try:
            r = s.http.post("/v1/completions", json={"model": s.name, "prompt": prompt, "max_tokens": 8,
                                                     "temperature": 0})
            assert r.status_code == 200, r.text
            answers.append((r.json()["choices"][0]["text"], r.json()["usage"]))
            metrics = s.http.get("/metrics").text
        finally:
            s.stop()
    (cold, cold_usage), (warm, warm_usage) = answers
    assert (cold_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
    assert warm_usage["prompt_tokens_details"]["cached_tokens"] == 512
    assert warm == cold
    assert "rvascend_hicache_loaded_tokens_total 512.0" in metrics
    assert 'rvascend_hicache_hits_total{tier="disk"}' in metrics and "rvascend_hicache_load_seconds_total" in metrics
    s = Server(**tiers)
    try:
        assert s.engine.stats()["hicache_disk_entries"] == 2
        assert s.http.post("/flush_cache").status_code == 200
        assert s.engine.stats()["hicache_disk_entries"] == 0
    finally:
        s.stop()


def test_suffix_drafts_are_kept_per_api_key():
    """--speculative-algorithm SUFFIX: a finished request's text joins the corpus of the key
    it was admitted with (a digest, never the key itself)."""
    s = Server(speculative_algorithm="SUFFIX")
    try:
        r = s.http.post("/v1/completions", json={"model": s.name, "prompt": [5, 6, 7, 8] * 8, "max_tokens": 8,
                                                 "temperature": 0})
        assert r.status_code == 200, r.text
        s.wait_idle()
        ((owner, tokens),) = s.engine.speculator.corpus.docs.values()
        assert owner == hashlib.sha256(API_KEY.encode()).hexdigest() and tokens[:32] == [5, 6, 7, 8] * 8
    finally:
        s.stop()


def test_a_draft_model_drafts_for_the_target(tmp_path):
    """--speculative-algorithm STANDALONE --speculative-draft-model-path: the target's own
    checkpoint as its draft (the policy installed on both): the answer is the target's, every
    draft taken; so with --speculative-draft-model-quantization; a draft without the
    algorithm, two drafts, or a tokenizer not the target's, is refused."""
    plain = Server()
    try:
        body = {"model": plain.name, "prompt": [5, 9, 300, 41], "max_tokens": 12, "temperature": 0,
                "ignore_eos": True}
        want = plain.http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    finally:
        plain.stop()
    s = Server(speculative_algorithm="STANDALONE", speculative_draft_model_path=ensure_random_model())
    try:
        r = s.http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
        spec = s.engine.speculator
        assert spec.drafted > 0 and spec.accepted == spec.drafted
        assert get_policy(spec.draft_model.model) is not None
    finally:
        s.stop()
    # The target's own weights quantized in memory as the draft: the answer is still the target's.
    s = Server(speculative_algorithm="STANDALONE", speculative_draft_model_quantization="q8_0")
    try:
        r = s.http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
        draft = s.engine.speculator.draft_model.model
        assert s.engine.speculator.drafted > 0 and get_policy(draft) is not None
        assert draft.model.norm.weight is s.engine.model.model.norm.weight  # shared; the matrices quantized
        assert draft.lm_head.parts[0].fmt == "Q8_0"
    finally:
        s.stop()
    with pytest.raises(ValueError, match="give the algorithm with one"):
        build_engine(ServerArgs(model_path=ensure_random_model(), speculative_draft_model_path=ensure_random_model()))
    with pytest.raises(ValueError, match="give the algorithm with one"):
        build_engine(ServerArgs(model_path=ensure_random_model(), speculative_draft_model_quantization="q4_0"))
    with pytest.raises(ValueError, match="name two draft models"):
        build_engine(ServerArgs(model_path=ensure_random_model(), speculative_algorithm="STANDALONE",
                                speculative_draft_model_path=ensure_random_model(),
                                speculative_draft_model_quantization="q4_0"))
    other = copy_tokenizer(tmp_path, rename=("<|begin_of_text|>", "<|begin|>"))
    with pytest.raises(ValueError, match="tokenizer is not the target's"):
        build_engine(ServerArgs(model_path=ensure_random_model(), speculative_algorithm="STANDALONE",
                                speculative_draft_model_path=other))


def test_a_qwen3_5_checkpoint_served_through_the_openai_client(tmp_path):
    """A random-weight Qwen3.5 checkpoint (the test tokenizer) behind the server, policy on."""
    torch.manual_seed(0)
    config = tiny_qwen3_5_config(2048, tie=True)  # the test tokenizer's vocabulary
    transformers.Qwen3_5ForCausalLM(config).to(torch.bfloat16).save_pretrained(str(tmp_path))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{ensure_random_model()}/{name}", tmp_path / name)
    server = Server(model_path=str(tmp_path))
    try:
        chat = server.client.chat.completions.create(
            model=server.name, messages=[{"role": "user", "content": "hello there"}], max_tokens=8, temperature=0)
        assert chat.usage.completion_tokens == 8 or chat.choices[0].finish_reason == "stop"
        stream = server.client.completions.create(model=server.name, prompt="once upon a time", max_tokens=6,
                                                  temperature=0, stream=True)
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        again = server.client.completions.create(model=server.name, prompt="once upon a time", max_tokens=6,
                                                 temperature=0)
        assert again.choices[0].text == text  # greedy: the stream and the plain answer agree
        server.wait_idle()
        assert server.engine.states_free == server.engine.config.max_running_requests
        assert server.engine.cache.hybrid and server.engine.cache.snapshots > 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
