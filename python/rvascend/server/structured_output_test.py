"""Constrained output through the API: every way a client names a grammar, the output
matching it (greedy, sampled, n > 1, streamed, with logprobs and stop strings), and
finish_reason "length" when max_tokens ends it first."""

from __future__ import annotations

import json
import re

import pytest

from rvascend.server.testing import Server

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


def _matches_schema(text: str) -> dict:
    value = json.loads(text)
    assert set(value) == {"name", "age", "tags"}, value
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 150
    assert all(t in ("a", "b") for t in value["tags"]) and len(value["tags"]) <= 3
    return value


def _chat(server, **kw):
    body = {"messages": [{"role": "user", "content": "Describe a person."}], "max_tokens": 200, **kw}
    r = server.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_response_format_json_schema_greedy_and_sampled(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    greedy = _chat(server, temperature=0, response_format=fmt)["choices"][0]
    assert greedy["finish_reason"] == "stop"
    _matches_schema(greedy["message"]["content"])
    sampled = _chat(server, temperature=1.0, seed=5, n=3, response_format=fmt, logprobs=True)["choices"]
    assert len(sampled) == 3
    for choice in sampled:
        assert choice["finish_reason"] == "stop", choice
        _matches_schema(choice["message"]["content"])
        # The log-probabilities are the model's own, of the tokens the grammar let through.
        assert all(t["logprob"] <= 0 for t in choice["logprobs"]["content"])


def test_json_object_and_the_vllm_and_sglang_names(server):
    # A random-weight model may fill a string until max_tokens: then the text is an object's start.
    for seed in range(3):
        obj = _chat(server, temperature=1.0, seed=seed, max_tokens=60,
                    response_format={"type": "json_object"})["choices"][0]
        text = obj["message"]["content"]
        assert text.startswith("{"), text
        if obj["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)
    for body in ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, {"regex": "[0-9]{3}-[a-z]{2}"},
                 {"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}):
        r = server.http.post("/v1/completions", json={"prompt": "Code:", "max_tokens": 20, "temperature": 0.8,
                                                      "seed": 1, **body})
        assert r.status_code == 200, r.text
        assert re.fullmatch("[0-9]{3}-[a-z]{2}", r.json()["choices"][0]["text"]), (body, r.text)
    choices = ["red", "green", "blue sky"]
    for body in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        text = server.http.post("/v1/completions", json={"prompt": "Color:", "max_tokens": 10, "temperature": 1,
                                                         "seed": 2, **body}).json()["choices"][0]["text"]
        assert text in choices
    ebnf = 'root ::= "ab" ("c" | "d")+ "!"'
    text = server.http.post("/v1/completions", json={"prompt": "x", "max_tokens": 12, "temperature": 1, "seed": 3,
                                                     "guided_grammar": ebnf}).json()["choices"][0]
    assert re.fullmatch("ab[cd]+!", text["text"]) or (text["finish_reason"] == "length"
                                                     and re.fullmatch("ab[cd]*", text["text"])), text


def test_generate_sampling_params_and_streaming(server):
    r = server.http.post("/generate", json={"text": "Person:", "sampling_params": {
        "max_new_tokens": 200, "temperature": 0, "json_schema": json.dumps(SCHEMA)}})
    assert r.status_code == 200, r.text
    _matches_schema(r.json()["text"])
    r = server.http.post("/generate", json={"text": "Id:", "sampling_params": {"max_new_tokens": 10,
                                                                               "regex": "id-[0-9]+"}})
    assert re.fullmatch("id-[0-9]+", r.json()["text"]), r.text
    bad = server.http.post("/generate", json={"text": "x", "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}})
    assert bad.status_code == 400 and "give one output constraint" in bad.text
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    chunks = server.client.chat.completions.create(
        model=server.name, messages=[{"role": "user", "content": "Describe a person."}], max_tokens=200,
        temperature=0, response_format=fmt, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == _chat(server, temperature=0, response_format=fmt)["choices"][0]["message"]["content"]
    _matches_schema(text)


def test_max_tokens_before_the_grammar_completes_is_length(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    choice = _chat(server, temperature=0, response_format=fmt, max_tokens=3)["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"].startswith("{")


def test_a_stop_string_still_ends_a_constrained_output(server):
    full = server.http.post("/v1/completions", json={"prompt": "Code:", "max_tokens": 20, "temperature": 0,
                                                     "guided_regex": "[a-c]{6}"}).json()["choices"][0]["text"]
    stop = full[3]
    cut = server.http.post("/v1/completions", json={"prompt": "Code:", "max_tokens": 20, "temperature": 0,
                                                    "guided_regex": "[a-c]{6}", "stop": [stop]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == full[:full.index(stop)]
    server.wait_idle()
