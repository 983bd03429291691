"""OpenAI's Responses API through the `openai` SDK: the same prompt and answer as chat
completions, the stream's events in order, function calls (streamed piece by piece, cut
ones incomplete) and their results, text.format,
the store (previous_response_id, retrieve, input_items, delete, owners, eviction), refusals
in OpenAI's error shape, and the first request Codex sends."""

from __future__ import annotations

import json
import sys
import time

import httpx
import openai
import pytest
from starlette.requests import Request

from rvascend.server.chat_output import ChatOutput
from rvascend.server.context import owner_of
from rvascend.server.responses_api import ResponseBuilder
from rvascend.server.responses_protocol import ResponsesRequest, ResponseStore, Stored
from rvascend.server.testing import Server, tokens_into_a_call

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather of a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                           "unit": {"enum": ["c", "f"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}
DIGIT = {"type": "json_schema", "name": "digit", "strict": True,
         "schema": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                    "required": ["a"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def server():
    # A short context: the random model never ends its answer, and a request without
    # max_output_tokens runs to the end of the context.
    s = Server(context_length=1024)
    yield s
    s.stop()


def _chat(server, messages, **kw):
    return server.client.chat.completions.create(model=server.name, messages=messages, temperature=0, **kw)


def _events(server, body):
    """The stream's (event name, payload) pairs, checked: each `event:` line names its data's type."""
    with server.http.stream("POST", "/v1/responses", json={"model": server.name, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line]
    names, data = lines[0::2], lines[1::2]
    events = [(n.removeprefix("event: "), json.loads(d.removeprefix("data: "))) for n, d in zip(names, data)]
    assert all(name == payload["type"] for name, payload in events)
    assert [p["sequence_number"] for _, p in events] == list(range(len(events)))
    return events


def test_a_string_input_is_chats_user_message_and_max_output_tokens_makes_it_incomplete(server):
    r = server.client.responses.create(model=server.name, input="Tell me a story", max_output_tokens=6, temperature=0)
    chat = _chat(server, [{"role": "user", "content": "Tell me a story"}], max_tokens=6)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == server.name
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in r.output] == ["message"] and r.output[0].status == "incomplete"
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == 6
    assert r.usage.total_tokens == r.usage.input_tokens + 6


def test_instructions_and_developer_messages_are_one_system_message_first(server):
    by_instructions = server.client.responses.create(model=server.name, input="hi", instructions="Be brief.",
                                                     max_output_tokens=4, temperature=0)
    by_developer = server.client.responses.create(
        model=server.name, max_output_tokens=4, temperature=0,
        input=[{"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
               {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}])
    chat = _chat(server, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], max_tokens=4)
    assert by_instructions.usage.input_tokens == by_developer.usage.input_tokens == chat.usage.prompt_tokens
    assert by_instructions.output_text == by_developer.output_text == chat.choices[0].message.content
    assert by_instructions.instructions == "Be brief."


def test_stream_events_in_order_and_text_format_json_schema(server):
    body = {"input": "Pick a digit", "text": {"format": DIGIT}, "temperature": 0}
    events = _events(server, body)
    names = [name for name, _ in events]
    deltas = [p["delta"] for name, p in events if name == "response.output_text.delta"]
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * len(deltas) + [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    final = events[-1][1]["response"]
    text = final["output"][0]["content"][0]["text"]
    assert "".join(deltas) == text == events[-4][1]["text"]
    assert 0 <= json.loads(text)["a"] <= 9 and final["status"] == "completed"
    whole = server.client.responses.create(model=server.name, **body)
    assert whole.output_text == text
    with server.client.responses.stream(model=server.name, **body) as stream:
        assert stream.get_final_response().output_text == text


def test_forced_function_call_and_its_result_round_trip(server):
    r = server.client.responses.create(model=server.name, input="Weather in Oslo?", tools=[WEATHER],
                                       tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    assert r.status == "completed" and [item.type for item in r.output] == ["function_call"]
    call = r.output[0]
    args = json.loads(call.arguments)
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert set(args) == {"city", "unit"} and len(args["city"]) <= 8 and args["unit"] in ("c", "f")
    # Streamed, the arguments' deltas join to the call's arguments.
    # One call: "required" with parallel calls allows more, and near ties under load may take them.
    events = _events(server, {"input": "Weather in Oslo?", "tools": [WEATHER], "tool_choice": "required",
                              "parallel_tool_calls": False, "temperature": 0})
    streamed = [p for name, p in events if name.startswith("response.function_call_arguments")]
    item = events[-1][1]["response"]["output"][0]
    assert "".join(p["delta"] for p in streamed[:-1]) == streamed[-1]["arguments"] == item["arguments"]
    # The item is announced with its name, then its arguments come piece by piece as generated.
    names = [name for name, _ in events]
    added = names.index("response.output_item.added")
    assert events[added][1]["item"] | {"id": "", "call_id": ""} == {"id": "", "type": "function_call", "call_id": "",
                                                                  "name": "get_weather", "arguments": "",
                                                                  "status": "in_progress"}
    assert len(streamed) > 2 and names[added + 1:added + len(streamed) + 2] == \
        ["response.function_call_arguments.delta"] * (len(streamed) - 1) + [
            "response.function_call_arguments.done", "response.output_item.done"]
    # The result goes back with its call; the prompt is chat's for the same turns.
    back = server.client.responses.create(
        model=server.name, max_output_tokens=4, temperature=0, tools=[WEATHER],
        input=[{"role": "user", "content": "Weather in Oslo?"}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 c"}])
    chat = _chat(server, [{"role": "user", "content": "Weather in Oslo?"},
                          {"role": "assistant", "content": None, "tool_calls": [
                              {"id": call.call_id, "type": "function",
                               "function": {"name": call.name, "arguments": call.arguments}}]},
                          {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 c"}],
                 tools=[{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description",
                                                                                  "parameters", "strict")}}],
                 max_tokens=4)
    assert back.usage.input_tokens == chat.usage.prompt_tokens
    assert back.output_text == chat.choices[0].message.content


def test_a_function_call_streams_through_the_sdk_and_a_cut_one_is_incomplete(server):
    """The SDK's stream: argument deltas joining to the final response's arguments. A call
    that max_output_tokens cuts: the arguments streamed so far, closed into JSON that
    parses (tool_call_stream.py), are the item's, and the item is incomplete."""
    body = dict(model=server.name, input="Weather in Oslo?", tools=[WEATHER], tool_choice="required",
                parallel_tool_calls=False, temperature=0)
    with server.client.responses.stream(**body) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    (call,) = final.output
    assert len(deltas) > 1 and "".join(deltas) == call.arguments and call.status == "completed"
    chat = {k: WEATHER[k] for k in ("name", "description", "parameters", "strict")}
    cut = tokens_into_a_call(server, messages=[{"role": "user", "content": "Weather in Oslo?"}], max_tokens=120,
                             tools=[{"type": "function", "function": chat}], tool_choice="required",
                             parallel_tool_calls=False)
    events = _events(server, {**body, "max_output_tokens": cut})
    pieces = [p["delta"] for name, p in events if name == "response.function_call_arguments.delta"]
    (done,) = [p for name, p in events if name == "response.function_call_arguments.done"]
    final = events[-1][1]["response"]
    assert events[-1][0] == "response.incomplete" and final["output"][-1]["status"] == "incomplete"
    assert "".join(pieces) == done["arguments"] == final["output"][-1]["arguments"] != call.arguments
    assert isinstance(json.loads(done["arguments"]), dict)


def test_previous_response_id_continues_the_stored_conversation(server):
    client = server.client
    first = client.responses.create(model=server.name, input="Name three rivers of Europe, then explain why. " * 4,
                                    max_output_tokens=4, temperature=0)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    then = client.responses.create(model=server.name, previous_response_id=first.id, input="And of Asia?",
                                   max_output_tokens=4, temperature=0)
    assert then.previous_response_id == first.id
    assert then.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1 > 0
    chat = _chat(server, [{"role": "user", "content": "Name three rivers of Europe, then explain why. " * 4},
                          {"role": "assistant", "content": first.output_text},
                          {"role": "user", "content": "And of Asia?"}], max_tokens=4)
    assert then.usage.input_tokens == chat.usage.prompt_tokens
    items = list(client.responses.input_items.list(then.id))
    assert [i.content[0].text for i in items] == ["And of Asia?"]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=server.name, previous_response_id=first.id, input="more")
    unstored = client.responses.create(model=server.name, input="x", store=False, max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_response_belongs_to_the_key_it_was_admitted_with(server):
    """x-api-key admits a request whatever else its Authorization header carries (a proxy's
    token): the response was stored under that other credential, and the same key through
    Bearer (or x-api-key alone) did not find it."""
    mixed = {"x-api-key": server.client.api_key, "Authorization": "Bearer a-proxys-token"}
    made = httpx.post(server.url + "/v1/responses", json={"input": "hi", "max_output_tokens": 1}, headers=mixed)
    assert made.status_code == 200, made.text
    assert server.http.get(f"/v1/responses/{made.json()['id']}").status_code == 200
    alone = httpx.get(f"{server.url}/v1/responses/{made.json()['id']}", headers={"x-api-key": server.client.api_key})
    assert alone.status_code == 200


def _request(key: str) -> Request:
    return Request({"type": "http", "headers": [(b"authorization", f"Bearer {key}".encode())]})


def test_the_store_is_per_api_key_and_evicts_the_least_recently_used():
    mine, theirs = owner_of(_request("key-a")), owner_of(_request("key-b"))
    assert mine != theirs and "key-a" not in mine
    store = ResponseStore(limit=2)
    for rid in ("resp_1", "resp_2"):
        store.put(Stored(mine, {"id": rid}, [], []))
    assert store.get("resp_1", theirs) is None and not store.delete("resp_1", theirs)
    assert store.get("resp_1", mine) is not None  # now the most recently used
    store.put(Stored(mine, {"id": "resp_3"}, [], []))
    assert store.get("resp_2", mine) is None and len(store) == 2
    assert store.delete("resp_1", mine) and store.get("resp_1", mine) is None


def test_the_store_is_bounded_in_bytes_and_a_chain_counts_its_history():
    """Fields no template reads (and earlier turns' reasoning) are not bounded by the context:
    150 inputs carrying 1.2 MB each kept 210 MiB, and 1024 bodies near the limit would stay."""
    mine = owner_of(_request("key-a"))
    store = ResponseStore(max_bytes=10_000)
    junk = {"type": "message", "role": "user", "content": "x", "note": "j" * 4000}
    first = Stored(mine, {"id": "resp_1"}, [junk], [junk])
    store.put(first)
    # A continuation that adds nothing keeps its history alive: it counts it.
    second = Stored(mine, {"id": "resp_2"}, [], first.conversation, first.size)
    store.put(second)
    assert second.size > first.size > 4000 and store.bytes == first.size + second.size <= 10_000
    store.put(Stored(mine, {"id": "resp_3"}, [junk], [junk]))
    assert store.get("resp_1", mine) is None and store.bytes <= 10_000
    store.put(Stored(mine, {"id": "resp_4"}, [{**junk, "note": "j" * 20_000}], []))
    assert store.get("resp_4", mine) is None and store.bytes <= 10_000
    assert store.delete("resp_3", mine) and store.bytes == sum(s.size for s in store._items.values())


def test_items_become_chats_turns():
    req = ResponsesRequest.model_validate({"instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "Add 1 and 2"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": "I should call add."},
        {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": "{\"a\": 1, \"b\": 2}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "3"}]})
    chat = req.to_chat([], req.input_items())
    assert [(m.role, m.content) for m in chat.messages] == [
        ("system", "Be brief.\n\nUse tools."), ("user", "Add 1 and 2"), ("assistant", None), ("tool", "3")]
    assert chat.messages[2].reasoning_content == "I should call add."
    assert chat.messages[2].tool_calls[0].id == "call_1" and chat.messages[3].tool_call_id == "call_1"


def test_a_run_of_developer_items_is_joined_in_linear_time():
    """Each system message was added to the joined text one at a time, copying it per
    message: 100,000 developer items froze the event loop for 10 s."""
    n = 100_000
    req = ResponsesRequest.model_validate({"instructions": "Be brief.", "input": [
        {"role": "developer", "content": "word " * 4}] * n + [{"role": "user", "content": "x"}]})
    items = req.input_items()
    start = time.perf_counter()
    chat = req.to_chat([], items)
    assert time.perf_counter() - start < 2.0
    assert [m.role for m in chat.messages] == ["system", "user"]
    assert chat.messages[0].content == "\n\n".join(["Be brief."] + ["word " * 4] * n)


def test_reasoning_becomes_a_reasoning_item_and_goes_back_as_the_turns_reasoning():
    req = ResponsesRequest.model_validate({"input": "x", "reasoning": {"summary": "auto"},
                                           "include": ["reasoning.encrypted_content"]})
    builder = ResponseBuilder(req, "m", ChatOutput(True, True, None, "qwen25"))
    events = [e for text in ("Weigh", " it.</th", "ink>\n\nYes.") for e in builder.feed(text)] + builder.finish("stop")
    summary = ["response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
               "response.reasoning_summary_text.done", "response.reasoning_summary_part.done"]
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done", *summary,
        "response.output_item.done", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done"]
    reasoning, message = builder.items
    assert reasoning["content"][0]["text"] == reasoning["summary"][0]["text"] == reasoning["encrypted_content"] \
        == "Weigh it."
    assert message["content"][0]["text"] == "Yes." and builder.reasoning_tokens == 2
    again = ResponsesRequest.model_validate({"input": [*builder.items, {"role": "user", "content": "Sure?"}]})
    chat = again.to_chat([], again.input_items())
    assert (chat.messages[0].role, chat.messages[0].content, chat.messages[0].reasoning_content) == \
        ("assistant", "Yes.", "Weigh it.")


@pytest.mark.parametrize("body,named", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input_image"),
    ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "computer_call_output"),
    ({"input": [{"type": "function_call_output", "output": "3"}]}, "call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "3"}]}, "call_9"),
    ({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}, "apply_patch"),
    ({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "web_search"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "yaml"),
    ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
    ({"input": "many words " * 1500}, "context length"),
    # Were 500s: a format that is not an object, a reasoning item's summary that is not a list.
    ({"input": "x", "text": {"format": "json"}}, "text.format must be an object"),
    ({"input": [{"type": "reasoning", "summary": 5}, {"role": "user", "content": "x"}]}, "input[0].summary"),
])
def test_what_cannot_be_served_is_a_400_naming_it(server, body, named):
    r = server.http.post("/v1/responses", json={"model": server.name, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400 and named in error["message"]


@pytest.mark.parametrize("field,value", [
    ("metadata", {"a": "\ud800"}), ("user", "\udfff"), ("prompt_cache_key", "\ud800"),
    ("reasoning", {"summary": "\ud800"}), ("input", [{"role": "user", "content": "hi", "id": "msg_\ud800"}]),
])
def test_a_lone_surrogate_in_an_echoed_field_is_a_400(server, field, value):
    """These fields are echoed (or listed by input_items), not prompted: a lone surrogate
    was a 500 once the answer was generated, and the stored one a 500 on every GET."""
    body = json.dumps({"input": "hi", "max_output_tokens": 1, field: value})  # ASCII: \ud800 escaped
    r = server.http.post("/v1/responses", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["message"].startswith(field)


def test_codex_first_request_is_accepted_and_streamed(server):
    """Codex 0.171's first request (docs/TOOLCHAIN_NOTES.md), its instructions shortened to fit
    the test's context. The random model never ends its answer: it runs to the context's end."""
    def function(name):
        return {"type": "function", "name": name, "description": f"{name} tool", "strict": False,
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
    text = [{"type": "input_text", "text": "You are Codex, a coding agent. " * 8}]
    body = {
        "model": server.name, "instructions": None, "stream": True, "store": False, "tool_choice": "auto",
        "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0197-session", "client_metadata": {"originator": "codex_exec"},
        "input": [{"type": "message", "role": "developer", "content": text},
                  {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox"}]},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env/>"}]},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]}],
        "tools": [function(n) for n in ("exec_command", "write_stdin", "request_user_input", "view_image",
                                        "create_goal", "update_goal", "get_goal", "list_goals")]
        + [{"type": "namespace", "name": "multi_agent_v1", "tools": [function("spawn_agent")]},
           {"type": "web_search", "external_web_access": False}]}
    r = server.http.post("/v1/responses", json={**body, "stream": False, "max_output_tokens": 2})
    assert r.status_code == 200, r.text
    events = _events(server, body)
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] in ("response.completed", "response.incomplete")
    final = events[-1][1]["response"]
    assert final["usage"]["total_tokens"] <= server.engine.context_length
    assert final["store"] is False and len(final["tools"]) == 10
    with pytest.raises(openai.NotFoundError):
        server.client.responses.retrieve(final["id"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
