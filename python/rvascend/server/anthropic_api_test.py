"""Anthropic's Messages API through Anthropic's own SDK: create and stream, tool use
forced (its input streamed in pieces, a cut one closed) and round-tripped, stop reasons,
usage with the prefix cache, count_tokens, x-api-key, refusals in Anthropic's error
shape, and Claude Code's first request."""

from __future__ import annotations

import json
import sys
import time

import anthropic
import httpx
import pytest

from rvascend.server.anthropic_protocol import MessagesRequest
from rvascend.server.testing import API_KEY, Server, tokens_into_a_call

ADD = {"name": "add", "description": "Adds two numbers",
       "input_schema": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                        "required": ["a", "b"], "additionalProperties": False}}
USER = [{"role": "user", "content": "Add 2 and 3."}]


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)


def _create(client, server, **kw):
    # Greedy, so that answers can be compared. The SDK no longer names the sampling
    # fields (newer models fix them); the API still takes them.
    return client.messages.create(**{"model": server.name, "max_tokens": 12, "messages": USER,
                                     "extra_body": {"temperature": 0}, **kw})


def _rendered_tokens(server, messages, **kwargs) -> int:
    """Tokens of the prompt the model's chat template makes of chat `messages`."""
    tok = server.engine.tokenizer
    return len(tok.encode(tok.apply_chat_template(messages, template_kwargs=kwargs or None),
                          add_special_tokens=False))


def test_create_returns_a_text_message(client, server):
    m = _create(client, server, system="You are terse.")
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == server.name
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens <= 12
    expected = _rendered_tokens(server, [{"role": "system", "content": "You are terse."}, *USER])
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == expected
    assert m.usage.cache_creation_input_tokens == 0


def test_stream_events_in_order_and_deltas_join_to_the_message(client, server):
    whole = _create(client, server, max_tokens=16)
    events = list(_create(client, server, max_tokens=16, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[2:-3] == ["content_block_delta"] * (len(kinds) - 5) and kinds[-3] == "content_block_stop"
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == whole.content[0].text
    assert events[-2].delta.stop_reason == whole.stop_reason
    assert events[-2].usage.output_tokens == whole.usage.output_tokens
    raw = server.http.post("/v1/messages", json={"max_tokens": 2, "messages": USER, "stream": True})
    names = [line.removeprefix("event: ") for line in raw.text.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert "[DONE]" not in raw.text
    with client.messages.stream(model=server.name, max_tokens=16, messages=USER,
                                extra_body={"temperature": 0}) as s:
        assert s.get_final_message().content[0].text == whole.content[0].text


def test_forced_tool_use_matches_its_schema(client, server):
    m = _create(client, server, max_tokens=80, tools=[ADD], tool_choice={"type": "tool", "name": "add"})
    assert m.stop_reason == "tool_use"
    (call,) = [b for b in m.content if b.type == "tool_use"]
    assert call.name == "add" and set(call.input) == {"a", "b"}
    assert all(isinstance(v, int) and 0 <= v <= 99 for v in call.input.values())
    streamed = list(_create(client, server, max_tokens=80, tools=[ADD], tool_choice={"type": "tool", "name": "add"},
                            stream=True))
    starts = [e.content_block for e in streamed if e.type == "content_block_start"]
    assert starts[-1].type == "tool_use" and starts[-1].name == "add"
    pieces = [e.delta.partial_json for e in streamed
              if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == call.input
    assert [e.delta.stop_reason for e in streamed if e.type == "message_delta"] == ["tool_use"]
    # The SDK's stream builds its final message from those pieces.
    with client.messages.stream(model=server.name, max_tokens=80, messages=USER, tools=[ADD],
                                tool_choice={"type": "tool", "name": "add"}, extra_body={"temperature": 0}) as s:
        deltas = [e.partial_json for e in s if e.type == "input_json"]
        final = s.get_final_message()
    assert len(deltas) > 1 and [b.input for b in final.content if b.type == "tool_use"] == [json.loads("".join(deltas))]


def test_a_tool_use_that_max_tokens_cuts_is_closed(client, server):
    """max_tokens ending the output inside a tool_use's input: the pieces streamed so far,
    closed into JSON that parses (tool_call_stream.py), are the block's input."""
    forced = dict(max_tokens=80, tools=[ADD], tool_choice={"type": "tool", "name": "add"})
    whole = _create(client, server, **forced)
    cut = tokens_into_a_call(server, messages=USER, max_tokens=80, tool_choice={"type": "function",
                             "function": {"name": "add"}}, tools=[{"type": "function", "function": {
                                 "name": "add", "description": ADD["description"], "parameters": ADD["input_schema"]}}])
    streamed = list(_create(client, server, **{**forced, "max_tokens": cut}, stream=True))
    kinds = [e.type for e in streamed]
    start = [e for e in streamed if e.type == "content_block_start"][-1]
    pieces = [e.delta.partial_json for e in streamed if e.type == "content_block_delta"]
    assert start.content_block.type == "tool_use" and start.content_block.input == {} and len(pieces) >= 1
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert streamed[-2].delta.stop_reason == "max_tokens"
    cut_input = json.loads("".join(pieces))
    assert isinstance(cut_input, dict) and cut_input != [b for b in whole.content if b.type == "tool_use"][0].input


def test_tool_result_round_trip_is_rendered(client, server):
    history = [*USER,
               {"role": "assistant", "content": [{"type": "text", "text": "Adding."},
                                                 {"type": "tool_use", "id": "toolu_1", "name": "add",
                                                  "input": {"a": 2, "b": 3}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"},
                                            {"type": "text", "text": "Now say it."}]}]
    m = _create(client, server, max_tokens=4, messages=history, tools=[ADD])
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    chat = [USER[0],
            {"role": "assistant", "content": "Adding.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
            {"role": "tool", "content": "5", "tool_call_id": "toolu_1"},
            {"role": "user", "content": "Now say it."}]
    tools = [{"type": "function", "function": {"name": "add", "parameters": ADD["input_schema"],
                                               "description": ADD["description"]}}]
    expected = _rendered_tokens(server, chat, tools=tools)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == expected
    counted = client.messages.count_tokens(model=server.name, messages=history, tools=[ADD])
    assert counted.input_tokens == expected
    errored = [*history[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                            "is_error": True,
                                                            "content": [{"type": "text", "text": "5"}]}]}]
    assert client.messages.count_tokens(model=server.name, messages=errored).input_tokens == _rendered_tokens(
        server, [*chat[:2], {"role": "tool", "content": "Error: 5", "tool_call_id": "toolu_1"}])


def test_count_tokens_equals_the_prompt_create_used(client, server):
    system = [{"type": "text", "text": "You count.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Be brief."}]
    counted = client.messages.count_tokens(model=server.name, system=system, messages=USER)
    m = _create(client, server, system=system, max_tokens=1)
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens
    assert counted.input_tokens == _rendered_tokens(server, [{"role": "system", "content": "You count.\n\nBe brief."},
                                                             *USER])


def test_stop_sequences_and_max_tokens_end_the_message(client, server):
    free = _create(client, server, max_tokens=24)
    text = free.content[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    stopped = _create(client, server, max_tokens=24, stop_sequences=[stop])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert "".join(b.text for b in stopped.content) == text[:text.find(stop)]
    short = _create(client, server, max_tokens=3)
    assert short.stop_reason == "max_tokens" and short.stop_sequence is None and short.usage.output_tokens == 3


def test_second_identical_long_request_reads_the_prefix_cache(client, server):
    system = "You are a helpful assistant who answers in one short sentence. " * 8
    first = _create(client, server, system=system, max_tokens=2)
    second = _create(client, server, system=system, max_tokens=2)
    total = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens > 0
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == total


def test_x_api_key_and_bearer_are_accepted_a_wrong_key_is_401(server):
    body = {"max_tokens": 1, "messages": USER}
    assert httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": API_KEY}).status_code == 200
    assert server.http.post("/v1/messages", json=body).status_code == 200  # Authorization: Bearer
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model=server.name, max_tokens=1, messages=USER)
    assert e.value.status_code == 401 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "authentication_error"
    assert httpx.post(server.url + "/v1/messages", json=body).status_code == 401


@pytest.mark.parametrize("body,named", [
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
     "messages[0].content[0] is an image"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "a document"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]}, "'video'"),
    ({"messages": USER}, "max_tokens"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": []}]}, "messages[0].content is an empty list"),
    ({"max_tokens": 8, "messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}]},
     "nothing to answer"),
    ({"max_tokens": 8, "messages": [*USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "5"}]}]}, "'toolu_nope'"),
    ({"max_tokens": 8, "messages": USER, "mcp_servers": [{"type": "url", "url": "http://x"}]}, "mcp_servers"),
    ({"max_tokens": 8, "messages": USER, "tools": [ADD], "tool_choice": {"type": "tool", "name": "sub"}}, "'sub'"),
    ({"max_tokens": 8, "messages": USER, "thinking": {"type": "sometimes"}}, "'sometimes'"),
])
def test_hostile_requests_are_400_in_anthropic_shape(server, body, named):
    r = server.http.post("/v1/messages", json=body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert named in err["error"]["message"], err


def test_a_prompt_over_the_context_is_400(server):
    long = "word " * (server.engine.context_length + 100)
    r = server.http.post("/v1/messages", json={"max_tokens": 8, "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "context length" in r.json()["error"]["message"]


def test_claude_codes_first_request_is_accepted(server):
    schema = {"type": "object", "properties": {"command": {"type": "string"},
                                               "timeout": {"type": "number"}}, "required": ["command"]}
    tools = [{"name": f"Tool{i}", "description": f"Tool number {i}", "input_schema": schema} for i in range(24)]
    body = {
        "model": server.name, "max_tokens": 32000, "stream": True, "temperature": 1,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "Be helpful. " * 20}],
        "messages": [{"role": "user", "content": [
                        {"type": "text", "text": "<system-reminder>context</system-reminder>"},
                        {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}]},
                     {"role": "system", "content": "The user is in /tmp."}],
        "tools": tools, "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "user_abc_account__session_1"},
    }
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01",
               "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
               "X-Claude-Code-Session-Id": "s1", "accept": "application/json"}
    with httpx.stream("POST", server.url + "/v1/messages?beta=true", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        first = next(r.iter_lines())
        assert first == "event: message_start"
    counted = httpx.post(server.url + "/v1/messages/count_tokens?beta=true", headers=headers,
                         json={k: v for k, v in body.items() if k not in ("max_tokens", "stream")})
    assert counted.status_code == 200, counted.text
    chat = [{"role": "system", "content": "You are Claude Code.\n\n" + "Be helpful. " * 20},
            {"role": "user", "content": "<system-reminder>context</system-reminder>\n\nhello\n\nThe user is in /tmp."}]
    assert counted.json()["input_tokens"] == _rendered_tokens(server, chat, tools=[
        {"type": "function", "function": {"name": t["name"], "parameters": schema, "description": t["description"]}}
        for t in tools])
    server.wait_idle()


def test_server_tools_are_left_out(client, server):
    web = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
    with_server_tool = client.messages.count_tokens(model=server.name, messages=USER, tools=[ADD, web])
    assert with_server_tool.input_tokens == client.messages.count_tokens(model=server.name, messages=USER,
                                                                          tools=[ADD]).input_tokens
    r = server.http.post("/v1/messages", json={"max_tokens": 4, "messages": USER, "tools": [ADD, web],
                                               "tool_choice": {"type": "tool", "name": "web_search"}})
    assert r.status_code == 400 and "web_search" in r.json()["error"]["message"]


def test_a_turn_of_many_blocks_is_translated_in_linear_time():
    """A turn's blocks were joined one at a time, copying the turn's text per block: 200,000
    text blocks (5 MB, under the body limit of a long-context model) froze the event loop
    for 17 s or more. Each block's text and tool_use still lands in the one turn."""
    n = 200_000
    req = MessagesRequest.model_validate({"max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "word " * 4}] * n},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]
         + [{"type": "tool_use", "id": f"t{i}", "name": "f", "input": {}} for i in range(n // 8)]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": "r"}]}]})
    start = time.perf_counter()
    messages = req.chat_fields()["messages"]
    assert time.perf_counter() - start < 2.0
    assert messages[0]["content"] == "\n\n".join(["word " * 4] * n)
    assert messages[1]["content"] == "ok" and len(messages[1]["tool_calls"]) == n // 8
    assert messages[2] == {"role": "tool", "tool_call_id": "t0", "content": "r"}


def test_thinking_switches_the_template_and_comes_back_as_thinking_blocks():
    """With --reasoning-parser qwen3 and a template that opens the reasoning unless
    enable_thinking is false (as Qwen3.5's does), the reasoning is a thinking block."""
    from rvascend.tokenizer.chat_template import ChatTemplate

    s = Server(app_options={"reasoning_parser": "qwen3"})
    try:
        s.engine.tokenizer.chat_template = ChatTemplate(
            "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>"
            "{% if enable_thinking is not defined or enable_thinking %}<think>\n{% endif %}{% endif %}")
        client = anthropic.Anthropic(base_url=s.url, api_key=API_KEY, max_retries=0)
        ask = {"model": s.name, "max_tokens": 8, "messages": USER, "extra_body": {"temperature": 0}}
        thought = client.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": 1024})
        assert [b.type for b in thought.content] == ["thinking"] and thought.content[0].thinking
        assert client.messages.create(**ask, thinking={"type": "adaptive"}).content == thought.content
        plain = client.messages.create(**ask, thinking={"type": "disabled"})
        assert [b.type for b in plain.content] == ["text"]
        events = list(client.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": 1024},
                                             stream=True))
        starts = [e.content_block.type for e in events if e.type == "content_block_start"]
        deltas = [e.delta for e in events if e.type == "content_block_delta"]
        assert starts == ["thinking"] and {d.type for d in deltas} == {"thinking_delta"}
        assert "".join(d.thinking for d in deltas).strip() == thought.content[0].thinking
        history = [*USER, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "secret", "signature": "x"}, {"type": "text", "text": "5"}]},
            {"role": "user", "content": "And 3 and 4?"}]
        kept = client.messages.count_tokens(model=s.name, messages=history).input_tokens
        without = client.messages.count_tokens(model=s.name, messages=[*history[:1], {
            "role": "assistant", "content": "5"}, history[2]]).input_tokens
        assert kept == without  # earlier turns' reasoning is dropped, as the families' templates drop it
    finally:
        s.stop()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
