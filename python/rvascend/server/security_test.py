"""The server against its own users and its own model files: the API key guards every
route but /health and /metrics, a model file's chat template cannot run code, and
request fields that change the answer are honoured or refused by name."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from rvascend.server.testing import API_KEY, Server

# A body each route accepts, so that "with the key" must succeed, not merely pass the guard.
_BODIES = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 1},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 1}},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [5, 6]},
    "/v1/responses": {"input": "hi", "max_output_tokens": 1},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "hi"}]},
}
_OPEN = {"/health", "/metrics"}


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


def _routes(server) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, so a new route cannot go unguarded untested."""
    return [(method.upper(), path) for path, ops in server.app.openapi()["paths"].items() for method in ops]


def test_every_route_needs_the_key_except_health_and_metrics(server):
    routes = _routes(server)
    paths = {p for _, p in routes}
    assert {"/generate", "/flush_cache", "/tokenize", "/detokenize", "/get_server_info", "/get_model_info",
            "/v1/models", "/v1/completions", "/version"} <= paths
    bare = httpx.Client(base_url=server.url, timeout=60)
    for method, path in routes:
        body = _BODIES.get(path)
        kwargs = {"json": body} if method == "POST" else {}
        anonymous = bare.request(method, path, **kwargs)
        wrong = bare.request(method, path, headers={"Authorization": "Bearer not-the-key"}, **kwargs)
        keyed = server.http.request(method, path, **kwargs)
        if path in _OPEN:
            assert anonymous.status_code == 200, (method, path)
            continue
        assert anonymous.status_code == 401 and wrong.status_code == 401, (method, path, anonymous.text)
        assert anonymous.json()["error"]["type"] == "authentication_error"
        # With the key, a route naming an object (/v1/responses/{rid}) finds none of that name.
        assert keyed.status_code == (404 if "{" in path else 200), (method, path, keyed.text)
    server.wait_idle()


def test_a_model_files_template_cannot_run_code_and_its_errors_are_400(server, tmp_path):
    tok = server.engine.tokenizer
    original = tok.chat_template
    marker = tmp_path / "pwned"
    from rvascend.tokenizer.chat_template import ChatTemplate
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    try:
        tok.chat_template = ChatTemplate("{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) +
                                         "').read() }}")
        r = server.http.post("/v1/chat/completions", json=chat)
        assert r.status_code == 400 and "sandbox" in r.json()["error"]["message"], r.text
        assert not marker.exists()
        tok.chat_template = ChatTemplate("{% for m in messages %}{% if m.role == 'user' %}"
                                         "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
                                         "{% break %}{% endfor %}")
        r = server.http.post("/v1/chat/completions", json=chat)
        assert r.status_code == 400 and "Conversation roles must alternate" in r.json()["error"]["message"]
    finally:
        tok.chat_template = original
    server.wait_idle()


def test_a_looping_template_is_a_400_and_health_answers_meanwhile(server):
    """A model file's template that loops renders off the event loop and stops at its
    budget: a clear 400 for that request, and /health answers all along. (It once ran
    on the event loop for ever, and every request waited.)"""
    import concurrent.futures
    import time

    from rvascend.tokenizer.chat_template import ChatTemplate
    tok = server.engine.tokenizer
    original = tok.chat_template
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    try:
        tok.chat_template = ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                                         "{% endfor %}")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(server.http.post, "/v1/chat/completions", json=chat, timeout=60)
            waits = []
            while not pending.done():
                start = time.monotonic()
                assert server.http.get("/health", timeout=5).status_code == 200
                waits.append(time.monotonic() - start)
                time.sleep(0.05)
            r = pending.result()
    finally:
        tok.chat_template = original
    assert r.status_code == 400 and "went over its budget" in r.json()["error"]["message"], r.text
    assert waits and max(waits) < 1.0, waits
    server.wait_idle()


def test_a_rebound_host_name_is_refused_and_flush_is_post_only(server):
    """DNS rebinding: a web page whose name now points at 127.0.0.1 sends its own name in
    Host; the server answers only to its loopback names. And a GET (an <img>) cannot
    flush the cache."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for host in ("evil.example", "evil.example:30000", "127.0.0.1.evil.example"):
        r = server.http.post("/v1/chat/completions", json=chat, headers={"Host": host})
        assert r.status_code == 421 and "is not one this server answers to" in r.json()["error"]["message"], host
    for host in (f"127.0.0.1:{server.port}", "localhost", f"[::1]:{server.port}"):
        assert server.http.post("/v1/chat/completions", json=chat, headers={"Host": host}).status_code == 200, host
    assert server.http.get("/health", headers={"Host": "evil.example"}).status_code == 200  # probes stay open
    assert server.http.get("/flush_cache").status_code == 405
    assert server.http.post("/flush_cache").status_code == 200
    server.wait_idle()


def test_a_cross_site_page_cannot_drive_the_server(server):
    """CSRF: a page of another site may post a form to a local server without asking; the
    browser sends the page's Origin and the form's Content-Type. Such a POST once got
    "200 Cache flushed." Requests without an Origin (SDKs, curl) are served as before.
    (With the key sent: the key is a separate guard, and off by default.)"""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    r = server.http.post("/flush_cache", content=b"x=1", headers={"Origin": "http://evil.example", "Host": "127.0.0.1",
                                                                  **form})
    assert r.status_code == 403, r.text
    assert r.json()["error"]["message"].startswith("Origin 'http://evil.example' is not this server ('127.0.0.1')")
    own = f"127.0.0.1:{server.port}"
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{server.port + 1}", "http://localhost",
                   "http://127.0.0.1:notaport"):
        r = server.http.post("/v1/chat/completions", json=chat, headers={"Origin": origin})
        assert r.status_code == 403 and "is not this server" in r.json()["error"]["message"], origin
    assert server.http.get("/v1/models", headers={"Origin": "http://evil.example"}).status_code == 403
    assert server.http.get("/health", headers={"Origin": "http://evil.example"}).status_code == 200
    # The server's own pages (FastAPI's /docs), by any loopback name of it, are served.
    for origin in (f"http://{own}", f"http://localhost:{server.port}", f"http://[::1]:{server.port}"):
        assert server.http.post("/v1/chat/completions", json=chat, headers={"Origin": origin}).status_code == 200
    # Bodies: JSON only, whatever the Origin; a bodiless POST without a type is curl -X POST's.
    body = json.dumps(chat).encode()
    for content_type in ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain"):
        for path in ("/v1/chat/completions", "/flush_cache"):
            r = server.http.post(path, content=body, headers={"Content-Type": content_type})
            assert r.status_code == 415, (path, content_type, r.text)
            assert r.json()["error"]["message"] == (f"Content-Type {content_type!r} is not application/json: "
                                                    f"POST {path} takes a JSON body")
    r = server.http.post("/v1/chat/completions", content=body)
    assert r.status_code == 415 and "has a body but no Content-Type" in r.json()["error"]["message"]
    for content_type in ("application/json; charset=utf-8", "Application/JSON"):
        r = server.http.post("/v1/chat/completions", content=body, headers={"Content-Type": content_type})
        assert r.status_code == 200, (content_type, r.text)
    assert server.http.post("/flush_cache").status_code == 200
    assert server.http.post("/flush_cache", headers={"Content-Type": "application/json"}).status_code == 200
    server.wait_idle()


def test_allowed_hosts():
    from rvascend.server.limits import allowed_hosts
    assert allowed_hosts("0.0.0.0") is None and allowed_hosts("127.0.0.1", ["*"]) is None
    assert allowed_hosts("127.0.0.1") == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts("0.0.0.0", ["Board.local:30000"]) == {"localhost", "127.0.0.1", "::1", "board.local"}
    assert "10.0.0.5" in allowed_hosts("10.0.0.5")


def test_chat_template_flags(server):
    """add_generation_prompt and continue_final_message at the top level (and inside
    chat_template_kwargs, as vLLM allows) change the prompt the model sees."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello the"}]
    tok = server.engine.tokenizer

    def prompt_tokens(**kw):
        r = server.http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1, **kw})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    opened = len(tok.encode(tok.apply_chat_template(messages), add_special_tokens=False))
    closed = len(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=False),
                            add_special_tokens=False))
    continued = len(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=False,
                                                       continue_final_message=True), add_special_tokens=False))
    assert len({opened, closed, continued}) == 3
    assert prompt_tokens() == opened
    assert prompt_tokens(add_generation_prompt=False) == closed
    assert prompt_tokens(chat_template_kwargs={"add_generation_prompt": False}) == closed
    assert prompt_tokens(continue_final_message=True) == continued
    r = server.http.post("/v1/chat/completions", json={"messages": messages, "continue_final_message": True,
                                                       "add_generation_prompt": True})
    assert r.status_code == 400 and "cannot both be true" in r.text


def test_skip_special_tokens(server):
    special = server.engine.tokenizer.encode("<|eot_id|>", add_special_tokens=False)
    assert len(special) == 1
    body = {"prompt": "x", "max_tokens": 2, "temperature": 0, "ignore_eos": True,
            "logit_bias": {str(special[0]): 100}}
    kept = server.http.post("/v1/completions", json={**body, "skip_special_tokens": False}).json()
    skipped = server.http.post("/v1/completions", json=body).json()
    assert kept["choices"][0]["text"] == "<|eot_id|>" * 2 and skipped["choices"][0]["text"] == ""
    native = server.http.post("/generate", json={"text": "x", "sampling_params": {
        "max_new_tokens": 2, "temperature": 0, "ignore_eos": True, "skip_special_tokens": False}})
    assert native.status_code == 200


def test_generate_logprobs_rid_and_refused_fields(server):
    text = "The quick brown fox jumps"
    ids = server.engine.tokenizer.encode(text)
    r = server.http.post("/generate", json={
        "text": text, "rid": "my-request-7", "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3,
        "return_text_in_logprobs": True, "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                                             "ignore_eos": True}})
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert meta["id"] == "my-request-7"
    inputs = meta["input_token_logprobs"]
    assert [t for _, t, _ in inputs] == ids and inputs[0][0] is None
    assert all(lp is not None and lp <= 0 for lp, _, _ in inputs[1:])
    outputs = meta["output_token_logprobs"]
    assert [t for _, t, _ in outputs] == r.json()["output_ids"]
    assert all(len(top) == 3 and top[0][0] >= top[-1][0] for top in meta["output_top_logprobs"])
    # Greedy: every output token is the top-1 of its own distribution.
    assert all(math.isclose(out[0], top[0][0], abs_tol=1e-6) for out, top in zip(outputs, meta["output_top_logprobs"]))
    assert outputs[0][2] == server.engine.tokenizer.token_text(outputs[0][1])
    # The same prompt token logprobs with the prefix cached (the cache must not skip them).
    again = server.http.post("/generate", json={"text": text, "return_logprob": True, "logprob_start_len": 2,
                                                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).json()
    tail = again["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in tail] == ids[2:]
    assert all(math.isclose(a[0], b[0], abs_tol=2e-2) for a, b in zip(tail, inputs[2:]))
    for field, value in (("lora_path", "adapter"), ("image_data", "x.png"), ("return_hidden_states", True)):
        bad = server.http.post("/generate", json={"text": "hi", field: value})
        assert bad.status_code == 400 and f"'{field}'" in bad.json()["error"]["message"]
    assert server.http.post("/generate", json={"text": "hi", "lora_path": None}).status_code == 200
    bad = server.http.post("/generate", json={"text": "hi", "top_logprobs_num": 2})
    assert bad.status_code == 400 and "return_logprob" in bad.text
    bad = server.http.post("/generate", json={"text": "hi", "return_logprob": True, "logprob_start_len": 99})
    assert bad.status_code == 400 and "logprob_start_len" in bad.text
    server.wait_idle()


def test_empty_prompt_list_and_chat_echo_are_refused(server):
    r = server.http.post("/v1/completions", json={"prompt": [], "max_tokens": 1})
    assert r.status_code == 400 and "empty" in r.json()["error"]["message"]
    r = server.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "echo": True})
    assert r.status_code == 400 and "'echo'" in r.json()["error"]["message"]
    assert API_KEY
