"""Tool calls and reasoning: the output formats parsed (qwen25's <tool_call> blocks,
llama3's JSON), the streaming split at every chunk boundary, and through the server
`tool_choice` required / named constrained to valid calls, streamed as
`delta.tool_calls`, and tool messages round-tripped."""

from __future__ import annotations

import json

import pytest

from rvascend.server import tool_calls
from rvascend.server.chat_output import ChatOutput, starts_in_reasoning
from rvascend.server.protocol import UnsupportedField
from rvascend.server.testing import Server

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 8},
                                          "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"],
                                          "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}}},
]


def _valid(call: dict, names=("get_weather", "add")) -> dict:
    assert call["type"] == "function" and call["id"].startswith("call_")
    fn = call["function"]
    args = json.loads(fn["arguments"])
    assert fn["name"] in names
    if fn["name"] == "add":
        assert set(args) == {"a", "b"} and all(isinstance(v, int) and 0 <= v <= 99 for v in args.values())
    else:
        assert set(args) == {"city", "unit"} and len(args["city"]) <= 8 and args["unit"] in ("c", "f")
    return args


def test_parse_both_formats_and_leave_what_does_not_parse():
    text = ('Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>')
    content, calls = tool_calls.parse(text, "qwen25")
    assert content == "Let me check." and [c["function"]["name"] for c in calls] == ["add", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Oslo", "unit": "c"}
    broken = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1,\n</tool_call>"
    assert tool_calls.parse(broken, "qwen25") == (broken, [])
    # Unclosed blocks: one pass over the text (each end looked for once), calls before them kept.
    unclosed = text + "<tool_call>" * 20000
    content, calls = tool_calls.parse(unclosed, "qwen25")
    assert len(calls) == 2 and content.endswith("<tool_call>" * 20000)
    content, calls = tool_calls.parse('{"name": "add", "parameters": {"a": 3, "b": 4}}', "llama3")
    assert content == "" and json.loads(calls[0]["function"]["arguments"]) == {"a": 3, "b": 4}
    content, calls = tool_calls.parse('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 1}}; '
                                      '{"name": "add", "parameters": {"a": 2, "b": 2}}', "llama3")
    assert len(calls) == 2
    # A ";" inside an argument is the argument's, not a separator between calls.
    content, calls = tool_calls.parse('{"name": "get_weather", "parameters": {"city": "a;b", "unit": "c"}};'
                                      '{"name": "add", "parameters": {"a": 1, "b": 2}}', "llama3")
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "a;b", "unit": "c"}, {"a": 1, "b": 2}]
    assert tool_calls.parse('{"name": "add", "parameters": {"a": 1}} trailing', "llama3")[1] == []
    assert tool_calls.parse("The answer is {a}.", "llama3") == ("The answer is {a}.", [])


def test_the_request_is_checked_by_name():
    for tools, choice, message in (
            ([{"type": "function"}], None, "tools\\[0\\]"),
            ([{"type": "function", "function": {"name": "a b"}}], None, "function.name"),
            (TOOLS + TOOLS[:1], None, "share a name"),
            (TOOLS, {"type": "function", "function": {"name": "nope"}}, "'nope'"),
            (TOOLS, "sometimes", "tool_choice is"),
            (None, "required", "tool_choice needs tools")):
        with pytest.raises(UnsupportedField, match=message):
            tool_calls.tool_request(tools, choice, None)


@pytest.mark.parametrize("reasoning,in_reasoning,parser,text,want", [
    (True, False, "qwen25", "<think>\nweigh it</think>\n\nThe answer.",
     ("weigh it", "The answer.", [])),
    (True, True, "qwen25", "already thinking</think>Done <tool_call>\n"
     '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', ("already thinking", "Done", ["add"])),
    (False, False, "qwen25", "plain <think> text", (None, "plain <think> text", [])),
    (True, False, "llama3", '{"name": "add", "parameters": {"a": 5, "b": 6}}', ("", "", ["add"])),
    (True, False, "qwen25", "no tool < call here", ("", "no tool < call here", [])),
])
def test_streaming_splits_alike_at_every_chunk_boundary(reasoning, in_reasoning, parser, text, want):
    request = tool_calls.tool_request(TOOLS, "auto", None)
    message, _ = ChatOutput(reasoning, in_reasoning, request, parser).message(text)
    thinking, content, names = want
    assert (message.get("reasoning_content") or "") == (thinking or "")
    assert (message["content"] or "") == content
    assert [c["function"]["name"] for c in message.get("tool_calls", [])] == names
    for cut in range(1, len(text)):  # two chunks, split anywhere
        out = ChatOutput(reasoning, in_reasoning, request, parser)
        deltas = [out.feed(text[:cut]), out.feed(text[cut:])]
        rest, calls = out.finish()
        deltas.append(rest)
        joined = {f: "".join(d.get(f, "") for d in deltas) for f in ("reasoning_content", "content")}
        assert joined["reasoning_content"].strip() == (thinking or ""), cut
        assert joined["content"].strip() == content, cut
        assert [c["function"]["name"] for c in calls] == names, cut


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "add"}}])
def test_parallel_tool_calls_false_keeps_one_call_whatever_the_choice(choice):
    """At most one call without parallel_tool_calls: not only under 'required' (where the
    grammar already makes one) but under 'auto' and a named choice, where the model's
    own text may hold several."""
    two = ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
           '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>')
    for parallel, want in ((False, [{"a": 1, "b": 2}]), (None, [{"a": 1, "b": 2}, {"a": 3, "b": 4}])):
        request = tool_calls.tool_request(TOOLS, choice, parallel)
        message, has_calls = ChatOutput(False, False, request, "qwen25").message(two)
        assert has_calls and [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == want
        assert message["content"] is None  # the dropped call is not content either
        out = ChatOutput(False, False, request, "qwen25")  # streamed: the calls come at the end
        out.feed(two)
        assert len(out.finish()[1]) == len(want)


def test_a_prompt_that_opens_the_reasoning():
    assert starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.fixture(scope="module", params=["qwen25", "llama3"])
def server(request):
    s = Server(app_options={"tool_call_parser": request.param})
    yield s, request.param
    s.stop()


def _chat(server, **kw):
    body = {"messages": [{"role": "user", "content": "What is the weather in Oslo?"}], "tools": TOOLS,
            "max_tokens": 120, **kw}
    r = server.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"]


def test_required_and_named_tool_choice_make_valid_calls(server):
    s, _ = server
    for seed in range(3):
        (choice,) = _chat(s, tool_choice="required", temperature=1.0, seed=seed, parallel_tool_calls=False)
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        _valid(call)
    (choice,) = _chat(s, tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0)
    assert choice["finish_reason"] == "tool_calls"
    assert [_valid(c, ("add",)) and c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["add"]
    (none,) = _chat(s, tool_choice="none", temperature=0, max_tokens=8)
    assert "tool_calls" not in none["message"]


def test_the_template_sees_only_the_tools_the_choice_allows(server):
    """As SGLang renders them: tool_choice 'none' shows the model no tools (a tool in the
    prompt invites a call), a named choice only that tool, 'auto' and 'required' all."""
    from rvascend.tokenizer.chat_template import ChatTemplate

    s, _ = server
    tok = s.engine.tokenizer
    original = tok.chat_template
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    try:
        tok.chat_template = ChatTemplate(
            "{% for t in tools or [] %}[tool {{ t.function.name }}]\n{% endfor %}"
            "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>")

        def rendered(tools):
            prompt = tok.apply_chat_template(messages, template_kwargs={"tools": tools} if tools else None)
            return len(tok.encode(prompt, add_special_tokens=False))
        everything, only_add, nothing = rendered(TOOLS), rendered(TOOLS[1:]), rendered(None)
        assert len({everything, only_add, nothing}) == 3
        choices = {"none": "none", "named": {"type": "function", "function": {"name": "add"}}, "auto": "auto",
                   "required": "required"}
        seen = {}
        for name, choice in choices.items():
            r = s.http.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS, "max_tokens": 1,
                                                          "tool_choice": choice})
            assert r.status_code == 200, r.text
            seen[name] = r.json()["usage"]["prompt_tokens"]
        assert seen == {"none": nothing, "named": only_add, "auto": everything, "required": everything}
    finally:
        tok.chat_template = original
    s.wait_idle()


def test_tool_calls_stream_as_deltas(server):
    s, _ = server
    stream = s.client.chat.completions.create(
        model=s.name, messages=[{"role": "user", "content": "Add 2 and 3."}], tools=TOOLS, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0, stream=True)
    deltas = [c.choices[0] for c in stream if c.choices]
    calls = [tc for d in deltas for tc in (d.delta.tool_calls or [])]
    assert deltas[-1].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["add"]
    whole = _chat(s, messages=[{"role": "user", "content": "Add 2 and 3."}],
                  tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0)[0]
    assert json.loads(calls[0].function.arguments) == json.loads(whole["message"]["tool_calls"][0]["function"]["arguments"])


def test_tool_messages_round_trip_and_bad_tools_are_400(server):
    s, _ = server
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"c\"}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "4 C, rain"}]
    (choice,) = _chat(s, messages=history, temperature=0, max_tokens=4)
    assert choice["finish_reason"] in ("length", "stop", "tool_calls")
    bad = s.http.post("/v1/chat/completions", json={"messages": history[:1], "tools": [{"type": "function"}]})
    assert bad.status_code == 400 and "tools[0]" in bad.json()["error"]["message"]
    broken = [history[0], {**history[1], "tool_calls": [{**history[1]["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": "{not json"}}]}]
    bad = s.http.post("/v1/chat/completions", json={"messages": broken, "tools": TOOLS})
    assert bad.status_code == 400 and "arguments is not JSON" in bad.json()["error"]["message"]
    both = s.http.post("/v1/chat/completions", json={"messages": history[:1], "tools": TOOLS,
                                                     "tool_choice": "required",
                                                     "response_format": {"type": "json_object"}})
    assert both.status_code == 400 and "one output constraint" in both.text
    s.wait_idle()


def test_reasoning_parser_splits_and_streams_the_reasoning():
    """--reasoning-parser qwen3 with a template that opens the reasoning in the generation
    prompt (as Qwen3.5's does): until "</think>" the output is reasoning_content."""
    from rvascend.tokenizer.chat_template import ChatTemplate

    s = Server(app_options={"reasoning_parser": "qwen3"})
    try:
        s.engine.tokenizer.chat_template = ChatTemplate(
            "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}")
        body = {"messages": [{"role": "user", "content": "Think."}], "max_tokens": 12, "temperature": 0,
                "ignore_eos": True}
        message = s.http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        ids = s.engine.tokenizer.encode("<|user|>Think.\n<|assistant|><think>\n", add_special_tokens=False)
        plain = s.http.post("/v1/completions", json={"prompt": ids, "max_tokens": 12, "temperature": 0,
                                                     "ignore_eos": True})
        text = plain.json()["choices"][0]["text"]
        assert "</think>" not in text  # a random model: no end of the reasoning in 12 tokens
        assert message["reasoning_content"] == text.strip() and message["content"] == ""
        chunks = s.client.chat.completions.create(model=s.name, stream=True, messages=body["messages"],
                                                  max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
        streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                           for c in chunks if c.choices)
        assert streamed.strip() == message["reasoning_content"]
    finally:
        s.stop()
