"""The server over real HTTP: the `openai` client, raw requests, bad input, concurrency, load."""

from __future__ import annotations

import concurrent.futures
import sys
import time

import httpx
import openai
import psutil
import pytest

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
    assert server.client.completions.create(**kw).choices[0].text == server.client.completions.create(**kw).choices[0].text


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
    assert 'rvascend_rvv_projection_calls_total{projection="qkv_proj",reason="",route="packed"}' in metrics
    assert 'rvascend_rvv_kernel_calls_total{kernel="kv_pool_attention",reason="",route="kernel"}' in metrics


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


def test_load_eight_clients_for_thirty_seconds():
    server = Server(max_queued_requests=16)
    process = psutil.Process()
    try:
        rss_before = process.memory_info().rss
        deadline = time.time() + 30
        errors, done = [], [0]

        def client(i: int) -> None:
            c = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
            while time.time() < deadline:
                try:
                    if i % 2:
                        list(c.completions.create(model=server.name, prompt=f"load {i}", max_tokens=16, stream=True))
                    else:
                        c.chat.completions.create(model=server.name, messages=[{"role": "user", "content": f"{i}"}],
                                                  max_tokens=16)
                    done[0] += 1
                except Exception as e:  # noqa: BLE001 - any failure is the finding
                    errors.append(repr(e))

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(client, range(8)))
        stats = server.wait_idle()
        assert not errors, errors[:3]
        assert done[0] > 8
        assert stats["kv_reserved_tokens"] == 0
        assert process.memory_info().rss - rss_before < 512 * 2**20
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
