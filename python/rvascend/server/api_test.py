"""What SGLang's and vLLM's clients send: sampling fields, batched prompts, usage chunks,
SGLang's native endpoints, the metrics its dashboards read, and streamed tool calls that
max_tokens or a stop string cuts."""

from __future__ import annotations

import json
import os
import sys

import pytest

from rvascend.server.testing import Server, tokens_into_a_call


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


def _complete(server, **kw):
    body = {"prompt": "The api", "max_tokens": 6, "temperature": 0, "ignore_eos": True, **kw}
    r = server.http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_stream_options_include_usage(server):
    chunks = list(server.client.completions.create(model=server.name, prompt="usage", max_tokens=5, stream=True,
                                                   stream_options={"include_usage": True},
                                                   extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


def test_batched_prompts_text_and_ids(server):
    r = _complete(server, prompt=["first one", "second one"], n=2)
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    alone = _complete(server, prompt="second one")
    assert r["choices"][2]["text"] == r["choices"][3]["text"] == alone["choices"][0]["text"]
    ids = server.engine.tokenizer.encode("first one")
    by_ids = _complete(server, prompt=[ids, ids])
    assert by_ids["choices"][0]["text"] == r["choices"][0]["text"]


def test_top_k_one_equals_greedy_and_logit_bias_forces_a_token(server):
    greedy = _complete(server)["choices"][0]["text"]
    assert _complete(server, temperature=1.0, top_k=1, seed=3)["choices"][0]["text"] == greedy
    token = 1234
    forced = server.http.post("/v1/completions", json={"prompt": "The api", "max_tokens": 3, "temperature": 0,
                                                       "ignore_eos": True, "logit_bias": {str(token): 100},
                                                       "logprobs": 0}).json()
    text = server.engine.tokenizer.token_text(token)
    assert forced["choices"][0]["logprobs"]["tokens"] == [text] * 3


def test_stop_token_ids_and_matched_stop(server):
    # The generated ids themselves: re-encoding the generated text need not give them back.
    base = server.http.post("/generate", json={"text": "The api", "sampling_params": {
        "max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}).json()
    stop_at = base["output_ids"][2]
    r = server.http.post("/v1/completions", json={"prompt": "The api", "max_tokens": 6, "temperature": 0,
                                                  "ignore_eos": True, "stop_token_ids": [stop_at]}).json()
    c = r["choices"][0]
    assert c["finish_reason"] == "stop" and c["matched_stop"] == stop_at
    assert r["usage"]["completion_tokens"] <= 3


def test_min_tokens_masks_eos(server):
    eos = server.engine.tokenizer.eos_token_id
    r = server.http.post("/v1/completions", json={"prompt": "x", "max_tokens": 6, "min_tokens": 4, "temperature": 0,
                                                  "logit_bias": {str(eos): 100}}).json()
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["matched_stop"] == eos


def test_penalties_change_the_answer(server):
    plain = _complete(server, max_tokens=24)["choices"][0]["text"]
    penalised = _complete(server, max_tokens=24, repetition_penalty=2.0, frequency_penalty=2.0)["choices"][0]["text"]
    assert penalised != plain


def test_sglang_generate(server):
    r = server.http.post("/generate", json={"text": "The api", "sampling_params": {
        "max_new_tokens": 6, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text"] == _complete(server)["choices"][0]["text"]
    assert body["meta_info"]["completion_tokens"] == 6 and body["meta_info"]["finish_reason"] == {"type": "length"}
    with server.http.stream("POST", "/generate", json={"input_ids": [1, 2, 3], "stream": True, "sampling_params": {
            "max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}) as s:
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert len(last["output_ids"]) == 4 and last["meta_info"]["finish_reason"] == {"type": "length"}
    bad = server.http.post("/generate", json={"text": "x", "sampling_params": {"bogus": 1}})
    assert bad.status_code == 400 and "bogus" in bad.json()["error"]["message"]


def test_tokenize_detokenize_version_and_info(server):
    t = server.http.post("/tokenize", json={"prompt": "hello world"}).json()
    assert t["count"] == len(t["tokens"]) > 0
    assert server.http.post("/detokenize", json={"tokens": t["tokens"]}).json()["prompt"].strip() == "hello world"
    assert server.http.post("/detokenize", json={"tokens": [10**9]}).status_code == 400
    assert server.http.get("/version").json()["version"]
    info = server.http.get("/get_model_info").json()
    assert info["is_generation"] and info["max_model_len"] == server.engine.context_length
    assert server.http.get("/model_info").json() == info  # SGLang's current name, which sglang-router asks first
    assert info["tokenizer_path"] and os.path.isfile(os.path.join(info["tokenizer_path"], "tokenizer.json"))
    assert "running" in server.http.get("/get_server_info").json()
    assert server.http.get("/server_info").json().keys() == server.http.get("/get_server_info").json().keys()


def test_get_load_has_sglangs_shape(server):
    server.wait_idle()
    assert server.http.get("/get_load").json() == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0,
                                                    "num_tokens": 0}]


def test_generate_accepts_what_sglang_router_adds(server):
    """sglang-router 0.3.2 forwards /generate with these defaults; none changes the answer."""
    base = {"text": "hello world", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    routed = dict(base, model=None, log_metrics=True, no_logs=False, return_hidden_states=False, background=False,
                  return_bytes=False, return_entropy=False, return_text_in_logprobs=False, stream=False)
    a, b = server.http.post("/generate", json=base), server.http.post("/generate", json=routed)
    assert b.status_code == 200, b.text
    assert a.json()["text"] == b.json()["text"]
    refused = server.http.post("/generate", json=dict(base, return_hidden_states=True))
    assert refused.status_code == 400 and "return_hidden_states" in refused.text
    model = server.http.get("/v1/models").json()["data"][0]
    assert model["root"] == server.name


def test_sglang_metric_names(server):
    _complete(server)
    metrics = server.http.get("/metrics").text
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total",
                 "sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket",
                 "sglang:e2e_request_latency_seconds_bucket", "sglang:num_running_reqs", "sglang:num_queue_reqs",
                 "sglang:token_usage", "sglang:cache_hit_rate", "rvascend_projection_calls_total"):
        assert name in metrics, name


def _metric(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_prefix_cache_usage_metrics_and_flush(server):
    system = "You are a helpful assistant who answers in one short sentence. " * 6
    server.wait_idle()
    assert server.http.post("/flush_cache").status_code == 200
    first = _complete(server, prompt=system + "First question?")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    second = server.client.completions.create(model=server.name, prompt=system + "Second question?", max_tokens=2)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    native = server.http.post("/generate", json={"text": system + "Third?", "sampling_params": {
        "max_new_tokens": 1}}).json()
    assert native["meta_info"]["cached_tokens"] >= cached
    assert _metric(server.http.get("/metrics").text, "sglang:cache_hit_rate") > 0
    server.wait_idle()
    flushed = server.http.post("/flush_cache")
    assert flushed.status_code == 200 and server.engine.stats()["kv_cached_tokens"] == 0
    again = _complete(server, prompt=system + "Second question?")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_flush_cache_is_refused_while_requests_run(server):
    server.wait_idle()
    with server.http.stream("POST", "/v1/completions", json={"prompt": "busy", "max_tokens": 3000, "stream": True,
                                                              "ignore_eos": True}) as s:
        lines = s.iter_lines()
        while server.engine.stats()["running"] == 0:
            next(lines)
        refused = server.http.post("/flush_cache")
    assert refused.status_code == 400 and "running" in refused.json()["error"]["message"]


def test_chat_template_kwargs_reach_the_template(server):
    msgs = [{"role": "user", "content": "hi"}]
    with_prompt = server.http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 1}).json()
    without = server.http.post("/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 1, "chat_template_kwargs": {"add_generation_prompt": False}}).json()
    assert with_prompt["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"]


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}


def _streamed_call(server, **kw):
    """(finish_reason, the streamed call's name, its argument pieces) of a streamed chat."""
    chunks = [c.choices[0] for c in server.client.chat.completions.create(
        model=server.name, temperature=0, stream=True, **kw) if c.choices]
    calls = [tc for c in chunks for tc in (c.delta.tool_calls or [])]
    assert {tc.index for tc in calls} == {0}
    return chunks[-1].finish_reason, calls[0].function.name, [tc.function.arguments for tc in calls]


def test_a_streamed_tool_call_that_max_tokens_or_a_stop_string_cuts_is_closed(server):
    """The arguments streamed before the cut stand, closed into JSON that parses (an open
    string and the object ended: tool_call_stream.py's rule); the whole response parses the
    finished text, where the unfinished call is content."""
    kw = dict(messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER], tool_choice="required",
              parallel_tool_calls=False)
    reason, name, pieces = _streamed_call(server, max_tokens=120, **kw)
    full = "".join(pieces)
    assert reason == "tool_calls" and len(pieces) > 1 and set(json.loads(full)) == {"city", "unit"}
    cut = tokens_into_a_call(server, max_tokens=120, **kw)
    reason, name, pieces = _streamed_call(server, max_tokens=cut, **kw)
    joined = "".join(pieces)
    assert reason == "length" and name == "get_weather" and isinstance(json.loads(joined), dict)
    # What the pieces add to the model's text is only the closing: quotes and braces.
    assert joined != full and any(full.startswith(joined[:k]) and set(joined[k:]) <= set('"}')
                                  for k in range(len(joined) + 1))
    whole = server.client.chat.completions.create(model=server.name, temperature=0, max_tokens=cut, **kw)
    assert whole.choices[0].message.tool_calls is None and '"get_weather"' in whole.choices[0].message.content
    # A stop string inside the arguments: the member it cut is left out.
    reason, _, pieces = _streamed_call(server, max_tokens=120, stop=['"unit"'], **kw)
    assert reason == "tool_calls" and json.loads("".join(pieces)) == {"city": json.loads(full)["city"]}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
