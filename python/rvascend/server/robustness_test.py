"""Regression tests for hostile-but-realistic clients: each defect found from outside."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch

from rvascend.engine import SamplingParams, sampler
from rvascend.models.random_model import ensure_random_model
from rvascend.server import responses
from rvascend.server.loopback import free_port
from rvascend.server.testing import API_KEY, Server, slow_steps


@pytest.fixture(scope="module")
def server():
    s = Server(app_options={"watchdog_timeout": 1.0})
    yield s
    s.stop()


def _post(server, path, body, **kw):
    return server.http.post(path, content=body, headers={"content-type": "application/json"}, **kw)


# -- 1. sampling never fails; a failing step fails only its own requests ------------
@pytest.mark.parametrize("kw", [dict(top_p=1e-50), dict(top_p=1e-45, temperature=1e-5), dict(top_k=1, min_p=1.0),
                                dict(temperature=100.0, top_p=1e-30), dict(min_p=1.0)])
def test_sampling_always_keeps_the_most_probable_token(kw):
    logits = torch.randn(1000) * 30
    logits[123] = logits.max() + 1e-3
    params = SamplingParams(temperature=kw.pop("temperature", 1.0), **kw)
    for seed in range(5):
        assert sampler.sample(logits, params, torch.Generator().manual_seed(seed)).token == 123


def test_nan_logits_fail_the_request_not_the_sampler():
    with pytest.raises(sampler.SamplingError, match="NaN"):
        sampler.sample(torch.full((10,), float("nan")), SamplingParams(), None)


def test_tiny_top_p_is_served_and_leaks_nothing(server):
    body = {"prompt": "tiny top p", "max_tokens": 64, "top_p": 1e-50, "temperature": 1.0, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: server.http.post("/v1/completions", json=body), range(8)))
    assert all(r.status_code == 200 for r in results), [r.text for r in results]
    assert all(r.json()["usage"]["completion_tokens"] == 64 for r in results)
    stats = server.wait_idle(10)
    assert stats["kv_reserved_tokens"] == 0
    assert server.http.get("/health").status_code == 200


def test_a_failing_step_fails_exactly_its_requests(server):
    """A request whose prefill step raises gets a JSON 500; a running stream goes on; nothing leaks."""
    model = server.engine.model
    forward = model.forward

    def poisoned(batch, pool):
        # Only the prefill of a prompt that starts with 1999: the sampled stream may itself
        # produce token 1999, and must not be poisoned by it.
        ids, start = batch.input_ids.tolist(), 0
        for n, prefix in zip(batch.new_lens, batch.prefix_lens):
            if prefix == 0 and n and ids[start] == 1999:
                raise RuntimeError("poisoned batch")
            start += n
        return forward(batch, pool)
    model.forward = poisoned
    try:
        results = {}

        def stream():
            with server.http.stream("POST", "/v1/completions", json={
                    "prompt": [5, 6, 7], "max_tokens": 40, "stream": True, "ignore_eos": True}) as r:
                results["stream"] = [line for line in r.iter_lines() if line.startswith("data: ")]
        t = threading.Thread(target=stream)
        t.start()
        time.sleep(0.3)
        bad = server.http.post("/v1/completions", json={"prompt": [1999, 3], "max_tokens": 4})
        t.join(60)
    finally:
        del model.forward
    assert bad.status_code == 500 and "poisoned batch" in bad.json()["error"]["message"]
    lines = results["stream"]
    assert lines[-1] == "data: [DONE]" and '"finish_reason": "length"' in lines[-2], lines[-3:]
    assert server.wait_idle(10)["kv_reserved_tokens"] == 0
    ok = server.http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
    assert ok.status_code == 200


def test_health_reports_a_stuck_engine(server):
    undo = slow_steps(server.engine, 2.0)
    try:
        t = threading.Thread(target=lambda: server.http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}))
        t.start()
        time.sleep(1.5)
        stuck = server.http.get("/health")
        t.join(30)
    finally:
        undo()
    assert stuck.status_code == 503 and "watchdog" in stuck.json()["error"]["message"]
    # Healthy again once the step is over (the client may get its answer a moment before the step ends).
    deadline = time.time() + 10
    while server.http.get("/health").status_code != 200:
        assert time.time() < deadline, "the engine did not become healthy again after the slow step"
        time.sleep(0.05)


def test_sigterm_stops_a_busy_server_within_seconds(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rvascend.server", f"--port={port}", "--max-total-tokens=2048",
                             f"--model-path={ensure_random_model()}",
                             "--graceful-shutdown-timeout=2"], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "log", "w"))
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "log").read_text()
            time.sleep(0.2)

        def hog():
            try:
                with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", timeout=120, json={
                        "prompt": "forever", "max_tokens": 2000, "stream": True, "ignore_eos": True}) as r:
                    for _ in r.iter_lines():
                        pass
            except httpx.HTTPError:
                pass
        threads = [threading.Thread(target=hog, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        assert time.time() - start < 15
    finally:
        if proc.poll() is None:
            proc.kill()


# -- 2. every error is JSON in one shape; the connection survives ------------------------
@pytest.mark.parametrize("body,match", [
    ('{"prompt": "x", "seed": 100000000000000000000000}', "seed"),
    ('{"prompt": "x", "seed": -9223372036854775809}', "seed"),
    ('{"prompt": "x", "n": 0}', "n"),
    ('{"prompt": "x", "n": 1000}', "n"),
    ('{"prompt": "x", "logprobs": 21}', "logprobs"),
    ('{"prompt": "x", "top_k": -5}', "top_k"),
    ('{"prompt": "x", "min_p": 1.5}', "min_p"),
    ('{"prompt": "x", "frequency_penalty": 3}', "frequency_penalty"),
    ('{"prompt": "x", "logit_bias": {"abc": 1}}', "logit_bias"),
    ('{"prompt": "x", "logit_bias": {"999999": 1}}', "outside the vocabulary"),
    ('{"prompt": "x", "stop_token_ids": [999999]}', "stop_token_ids"),
    ('{"prompt": "x", "max_tokens": 4, "min_tokens": 5}', "min_tokens"),
    ('{"prompt": "x", "tools": [{"type": "function"}]}', "tools"),
    ('{"prompt": "x", "suffix": "y"}', "suffix"),
    ('{"prompt": "x", "echo": true, "logprobs": 1}', "echo"),
    # Every token scans every stop: 20,000 stops of 1,000 characters once made a step 8x slower.
    ('{"prompt": "x", "stop": ' + json.dumps(["s%d" % i for i in range(65)]) + '}', "stop has 65 strings"),
    ('{"prompt": "x", "stop": ["' + "y" * 1025 + '"]}', "stop[0] is 1025 characters"),
    ('{"prompt": "x", "stop_token_ids": ' + json.dumps(list(range(1025))) + '}', "stop_token_ids has 1025"),
    # Output constraints: a grammar llguidance refuses, or one too large, is named.
    ('{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a"}}}', "needs a 'schema'"),
    ('{"prompt": "x", "response_format": {"type": "yaml"}}', "response_format type 'yaml'"),
    ('{"prompt": "x", "guided_regex": "(unclosed"}', "regex is not served"),
    ('{"prompt": "x", "guided_json": {"type": "object"}, "regex": "a+"}', "give one output constraint"),
    ('{"prompt": "x", "structured_outputs": {"structural_tag": "t"}}', "structured_outputs.structural_tag"),
    ('{"prompt": "x", "guided_choice": []}', "choices must be"),
    ('{"prompt": "x", "guided_json": "{not json"}', "not JSON"),
    ('{"prompt": "x", "guided_json": {"type": "object", "properties": {"a": {"type": "frob"}}}}',
     "json_schema is not served"),
    ('{"prompt": "x", "guided_regex": "' + "a" * (129 * 1024) + '"}', "at most 131072"),
])
def test_out_of_range_fields_are_a_json_400(server, body, match):
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 400, r.text
    assert match in r.json()["error"]["message"]


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "temperature": None, "top_p": None, "n": None,
                         "stream": None, "logprobs": None, "frequency_penalty": None, "presence_penalty": None,
                         "echo": None, "stop": None, "seed": None, "user": None}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi", "name": None}], "max_tokens": 2,
                              "temperature": None, "top_p": None, "n": None, "stream": None, "logprobs": None,
                              "top_logprobs": None, "stream_options": None, "tools": None, "response_format": None}),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": None, "stop": None, "temperature": 0},
                   "return_logprob": None, "logprob_start_len": None, "stream": None}),
])
def test_null_means_the_default(server, path, body):
    """OpenAI types these fields "X or null" and clients send the nulls; SGLang's
    clients do the same in /generate. A null once was a 400."""
    r = server.http.post(path, json=body)
    assert r.status_code == 200, r.text


def test_internal_errors_are_json_and_keep_alive_survives(server, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("tokenizer exploded")
    monkeypatch.setattr(server.engine.tokenizer, "encode", broken)
    r = server.http.post("/v1/completions", json={"prompt": "boom"})
    assert r.status_code == 500 and r.json()["error"]["message"].endswith("tokenizer exploded")
    monkeypatch.undo()
    assert server.http.post("/v1/completions", json={"prompt": "fine", "max_tokens": 1}).status_code == 200


def test_an_idle_keep_alive_connection_outlives_the_clients_pool_expiry(server):
    """uvicorn's default closes an idle connection after 5 s, the moment httpx (the
    openai and anthropic SDKs' transport) still counts it as reusable: a request sent
    then met a closing socket ("Server disconnected without sending a response"), as
    the soak test's clients saw one run in a few. The server now waits longer than the
    clients' pools do."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        for pause in (0.0, 5.5, 5.5):
            time.sleep(pause)
            connection.request("GET", "/health")  # raises RemoteDisconnected on a closed connection
            reply = connection.getresponse()
            assert reply.status == 200 and reply.read() == b'{"status":"ok"}'
            assert reply.getheader("connection") != "close"
    finally:
        connection.close()


@pytest.mark.parametrize("method,path,status", [("GET", "/nope", 404), ("GET", "/v1/completions", 405),
                                                ("DELETE", "/health", 405)])
def test_framework_errors_share_the_error_shape(server, method, path, status):
    r = server.http.request(method, path)
    assert r.status_code == status and set(r.json()["error"]) >= {"message", "type", "code"}


# -- 3. lone surrogates ------------------------------------------------------------------
@pytest.mark.parametrize("path,body", [
    ("/v1/completions", '{"prompt": "a\\ud800"}'),
    ("/v1/completions", '{"prompt": ["ok", "b\\udfff"]}'),
    ("/v1/completions", '{"prompt": "x", "stop": ["\\ud800"]}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\ud800"}]}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}'),
])
def test_lone_surrogates_are_a_400(server, path, body):
    r = _post(server, path, body)
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text


# -- 4. a non-streaming client that leaves stops its generation --------------------------
def test_non_streaming_disconnect_aborts_and_frees(server):
    undo = slow_steps(server.engine, 0.05)
    try:
        with pytest.raises(httpx.TimeoutException):
            server.http.post("/v1/completions", json={"prompt": "leave", "max_tokens": 1000, "ignore_eos": True},
                             timeout=0.6)
        start = time.time()
        server.wait_idle(5)
        assert time.time() - start < 3
    finally:
        undo()
    metrics = server.http.get("/metrics").text
    assert 'rvascend_requests_total{endpoint="completions",status="aborted"}' in metrics


# -- 5. huge prompts are refused early, off the event loop ----------------------------------
def test_huge_prompts_are_refused_fast_and_do_not_block_health(server):
    big = "word " * 1_000_000  # 5 MB
    health_times = []
    done = threading.Event()

    def probe():
        while not done.is_set():
            start = time.time()
            server.http.get("/health")
            health_times.append(time.time() - start)
            time.sleep(0.05)
    t = threading.Thread(target=probe)
    t.start()
    try:
        start = time.time()
        r = server.http.post("/v1/completions", json={"prompt": big})
        elapsed = time.time() - start
        limit = server.engine.context_length * server.engine.tokenizer.max_token_bytes
        mid = server.http.post("/v1/completions", json={"prompt": "x" * (limit + 1)})
    finally:
        done.set()
        t.join()
    assert r.status_code in (400, 413) and elapsed < 3, (r.status_code, elapsed)
    assert mid.status_code == 400 and "bytes" in mid.json()["error"]["message"]
    assert max(health_times) < 1.0


@pytest.mark.parametrize("key", ["right", "wrong"])
def test_a_client_still_sending_a_refused_body_reads_the_answer(server, key):
    """An announced 12 MB body, sent in pieces while the server has already refused it
    (413, or 401 for a wrong key): the server reads the rest before it answers and
    closes, so the client reads the answer instead of a reset connection."""
    import socket

    size, piece = 12 << 20, 1 << 16
    token = API_KEY if key == "right" else "nope"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode())
        for i in range(size // piece):
            conn.sendall(b"x" * piece)
            if i % 32 == 0:
                time.sleep(0.01)  # the server answers long before the last byte is sent
        answer = b""
        while chunk := conn.recv(1 << 16):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    assert status == (413 if key == "right" else 401), answer[:200]
    assert (b"exceeds the limit" if key == "right" else b"API key") in answer


@pytest.mark.parametrize("key", ["right", "wrong"])
def test_a_client_waiting_for_100_continue_is_refused_before_it_sends(server, key):
    """curl sends `Expect: 100-continue` with a large body and waits: a refused request
    (413 on its announced length, 401) is answered at once, never asked for its body."""
    import socket

    token = API_KEY if key == "right" else "nope"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {50 << 20}\r\n"
                     "Expect: 100-continue\r\n\r\n".encode())
        start = time.time()
        conn.settimeout(3)
        answer = conn.recv(1 << 16)
    assert time.time() - start < 2 and not answer.startswith(b"HTTP/1.1 100"), answer[:100]
    assert int(answer.split(b" ", 2)[1]) == (413 if key == "right" else 401)


def test_an_oversize_chunked_body_is_a_413(server):
    """No content-length: the body is counted as it arrives, and the answer is the same
    413 as for an announced one (it was the framework's 400 for a body cut short)."""
    limit = 8 * server.engine.context_length * server.engine.tokenizer.max_token_bytes + (1 << 20)

    def chunks():
        yield b'{"prompt": "'
        for _ in range(limit // (1 << 16) + 2):
            yield b"x" * (1 << 16)
        yield b'"}'
    r = server.http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert "exceeds the limit" in r.json()["error"]["message"]
    assert server.http.get("/health").status_code == 200


# -- 6/7. n, logprobs, chat content parts -------------------------------------------------------
def test_n_gives_n_choices_and_seeds_differ(server):
    r = server.client.completions.create(model=server.name, prompt="many", max_tokens=6, n=3, temperature=1.0,
                                         seed=5, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 18
    assert len({c.text for c in r.choices}) > 1
    again = server.client.completions.create(model=server.name, prompt="many", max_tokens=6, n=3,
                                             temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    assert [c.text for c in again.choices] == [c.text for c in r.choices]


def test_completion_logprobs(server):
    r = server.client.completions.create(model=server.name, prompt="logprobs", max_tokens=4, temperature=0,
                                         logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and chosen <= 0 and abs(chosen - max(top.values())) < 1e-5  # greedy = best
    # A token holding part of a character is named "bytes:\\xe2..." (OpenAI's form).
    data = b"".join(bytes.fromhex(t[len("bytes:"):].replace("\\x", "")) if t.startswith("bytes:")
                    else t.encode() for t in lp.tokens)
    assert data.decode(errors="replace") == r.choices[0].text


def test_streamed_text_offsets_match_the_whole_response(server):
    body = {"prompt": "offsets", "max_tokens": 5, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    whole = server.http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    streamed = []
    with server.http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: "):])
                lp = chunk["choices"][0]["logprobs"] if chunk["choices"] else None
                streamed += lp["text_offset"] if lp else []
    assert streamed == whole["text_offset"] and streamed[0] == 0 and streamed[-1] > 0


def test_logprobs_name_byte_tokens_apart(server):
    # The byte-level tokens e2 and 80 both decode to U+FFFD alone; keyed by that text, a
    # top-3 dictionary kept two entries (seen on a host whose numbers put both in the top 3).
    tok = server.engine.tokenizer
    e2, x80 = [next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == bytes([b])) for b in (0xE2, 0x80)]
    other = tok.encode("a", add_special_tokens=False)[0]
    top = [(e2, -1.0), (x80, -2.0), (other, -3.0)]
    completions = responses.LogprobFormat(tok, chat=False).format([e2, x80], [-1.0, -2.0], [top, top])
    assert completions["tokens"] == ["bytes:\\xe2", "bytes:\\x80"]
    assert completions["top_logprobs"][0] == {"bytes:\\xe2": -1.0, "bytes:\\x80": -2.0, "a": -3.0}
    chat = responses.LogprobFormat(tok, chat=True).format([e2], [-1.0], [top])["content"][0]
    assert (chat["token"], chat["bytes"]) == ("bytes:\\xe2", [0xE2])
    assert [(t["token"], t["bytes"]) for t in chat["top_logprobs"]] == [
        ("bytes:\\xe2", [0xE2]), ("bytes:\\x80", [0x80]), ("a", [ord("a")])]
    # Offsets count characters: "–" (e2 80 93) is one, complete after its third byte.
    dash = [next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == bytes([0x93]))]
    offsets = responses.LogprobFormat(tok, chat=False).format([other, e2, x80] + dash + [other], [0.0] * 5,
                                                              [None] * 5, responses.TextOffsets(tok, 4))["text_offset"]
    assert offsets == [4, 5, 5, 5, 6]
    # Through the server: tokens forced by logit_bias come back under their byte names.
    r = server.http.post("/v1/completions", json={"prompt": "bytes", "max_tokens": 2, "temperature": 0,
                                                  "ignore_eos": True, "logit_bias": {str(e2): 100},
                                                  "logprobs": 1}).json()
    assert r["choices"][0]["logprobs"]["tokens"] == ["bytes:\\xe2", "bytes:\\xe2"]


def test_chat_logprobs_and_top_logprobs(server):
    r = server.client.chat.completions.create(model=server.name, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=3, temperature=0, logprobs=True, top_logprobs=2,
                                              extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)
    assert abs(content[0].logprob - content[0].top_logprobs[0].logprob) < 1e-5


def test_chat_content_parts_and_null_assistant_content(server):
    as_text = server.client.chat.completions.create(
        model=server.name, messages=[{"role": "user", "content": "hello there"}], max_tokens=4, temperature=0)
    as_parts = server.client.chat.completions.create(
        model=server.name, messages=[{"role": "user", "content": [{"type": "text", "text": "hello "},
                                                                  {"type": "text", "text": "there"}]}],
        max_tokens=4, temperature=0)
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    r = server.http.post("/v1/chat/completions", json={"max_tokens": 2, "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": None}, {"role": "user", "content": "b"}]})
    assert r.status_code == 200, r.text
    r = server.http.post("/v1/chat/completions", json={"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert r.status_code == 400 and "image_url" in r.json()["error"]["message"]


# -- 8. detokenization is incremental -------------------------------------------------------
def test_detokenization_cost_per_token_is_constant(server):
    tok = server.engine.tokenizer
    decoded = [0]
    original = tok.decode

    def counting(ids, **kwargs):
        decoded[0] += len(ids)
        return original(ids, **kwargs)
    tok.decode = counting
    try:
        for n in (32, 512):
            decoded[0] = 0
            seq = server.engine.generate([[1, 2, 3]], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
            assert seq[0].text == original(seq[0].output_ids)
            per_token = decoded[0] / n
            assert per_token < 40, per_token  # whole-output re-decoding would be ~n/2 per token
    finally:
        del tok.decode


# -- 9. deeply nested JSON is a 400 naming its depth --------------------------------------------
def _nested(depth: int) -> str:
    """JSON text of objects nested `depth` deep, written directly (json.dumps recurses)."""
    return '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


def _chat(fields: str, messages: str = '[{"role": "user", "content": "hi"}]') -> str:
    return ", ".join(['{"max_tokens": 1', '"messages": ' + messages] + ([fields] if fields else [])) + "}"


def _tool(parameters: str) -> str:
    return '"tools": [{"type": "function", "function": {"name": "f", "parameters": ' + parameters + "}}]"


def _called(arguments: str) -> str:
    return ('[{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"type": "function", '
            '"function": {"name": "f", "arguments": ' + arguments + '}}]}, {"role": "tool", "content": "4"}]')


@pytest.mark.parametrize("path,body,match", [
    # 600 deep was a 500 (RecursionError converting them for the chat template).
    ("/v1/chat/completions", _chat('"chat_template_kwargs": {"x": ' + _nested(600) + "}"),
     "chat_template_kwargs is nested 601 levels deep (along chat_template_kwargs.x.a.a...); at most 64"),
    ("/v1/chat/completions", _chat(_tool(_nested(600))),
     "tools is nested 603 levels deep (along tools[0].function.parameters...); at most 64"),
    ("/v1/chat/completions", _chat("", _called(_nested(600))),
     "messages[1].tool_calls[0].function.arguments is nested 600 levels deep"),
    ("/v1/chat/completions", _chat("", _called(json.dumps(_nested(600)))),
     "a tool call's function.arguments is nested 600 levels deep"),
    ("/v1/chat/completions", _chat("", _called(json.dumps(_nested(5000)))),
     "a tool call's function.arguments is nested deeper than Python's recursion limit"),
    # Just over the limit: served before, and nothing recursed far enough to fail.
    ("/v1/chat/completions", _chat(_tool(_nested(62))), "tools is nested 65 levels deep"),
    ("/v1/chat/completions", _chat('"chat_template_kwargs": {"x": ' + _nested(64) + "}"),
     "chat_template_kwargs is nested 65 levels deep"),
    ("/v1/completions", '{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n", '
     '"schema": ' + _nested(100) + "}}}", "response_format is nested 102 levels deep"),
    ("/v1/completions", '{"prompt": "x", "guided_json": ' + json.dumps(_nested(5000)) + "}",
     "guided_json is nested deeper than Python's recursion limit"),
    ("/generate", '{"text": "x", "sampling_params": {"json_schema": ' + json.dumps(_nested(600)) + "}}",
     "sampling_params.json_schema is nested 600 levels deep"),
    ("/tokenize", '{"prompt": "x", "deep": ' + _nested(5000) + "}", "the body is nested deeper than"),
])
def test_deeply_nested_json_is_a_400_naming_its_depth(server, path, body, match):
    r = _post(server, path, body)
    assert r.status_code == 400, r.text[:300]
    assert match in r.json()["error"]["message"]


def test_json_nested_within_the_limit_is_served(server):
    r = _post(server, "/v1/chat/completions", _chat(_tool(_nested(61)) + ', "chat_template_kwargs": {"x": '
                                                     + _nested(63) + "}"))
    assert r.status_code == 200, r.text[:300]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
