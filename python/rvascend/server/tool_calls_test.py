"""Tool calls and reasoning: the output formats parsed (qwen25's <tool_call> blocks,
llama3's JSON), the streaming split at every chunk boundary, calls streamed as they are
generated (random splits, cuts, hostile output, linear work), and through the server
`tool_choice` required / named constrained to valid calls, streamed as
`delta.tool_calls` pieces, and tool messages round-tripped."""

from __future__ import annotations

import json
import random
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rvascend.server import tool_calls
from rvascend.server.chat_output import ChatOutput, chat_delta, starts_in_reasoning
from rvascend.server.json_stream import JsonStream
from rvascend.server.tool_calls import CallArguments, CallEnd, CallStart, Text
from rvascend.server.protocol import MAX_JSON_DEPTH, UnsupportedField
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
    for cut in range(1, len(text)):  # two chunks, split anywhere; calls parsed whole or streamed
        for stream in (False, True):
            out = ChatOutput(reasoning, in_reasoning, request, parser, stream=stream)
            deltas = [chat_delta(out.events(text[:cut])), chat_delta(out.events(text[cut:])), chat_delta(out.end())]
            calls = out.calls
            joined = {f: "".join(d.get(f, "") for d in deltas) for f in ("reasoning_content", "content")}
            assert joined["reasoning_content"].strip() == (thinking or ""), (cut, stream)
            assert joined["content"].strip() == content, (cut, stream)
            assert [c["function"]["name"] for c in calls] == names, (cut, stream)


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
        out.events(two)
        out.end()
        assert len(out.calls) == len(want)


# Well-formed outputs: what a model writes, in several layouts. Each streamed at any split
# must give the whole parse's calls, arguments text included.
WELL_FORMED = [
    ("qwen25", 'Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os\\u006co \\/ \\ud83d\\ude00 \\"q\\"\\n;",'
               ' "unit": "c", "deep": [1.50, -0, 2e3, {"k": [true, false, null, {}, []]}], "\\u00e9": "é"}}'
               '\n</tool_call>'),
    ("qwen25", '<tool_call>{"name":"add","arguments":{"a":1,"b":{"c":[1,2]}}}</tool_call>\n\nDone, and no more.'),
    ("qwen25", '<tool_call>\n{\n  "name": "add",\n  "arguments": {\n    "a": 10,\n    "b": 20\n  }\n}\n</tool_call>'),
    ("qwen25", '<tool_call>\n{"arguments": {"a": 1}, "name": "add"}\n</tool_call>'),  # name last: whole at its end
    ("qwen25", '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>'),
    ("qwen25", 'No call: <tool_call>\n{"name": "add", "argument": {"a": 1}}\n</tool_call> and {"a": 1}.'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "a;b", "unit": "c"}}; '
               '{"name": "add", "parameters": {"a": 1, "b": 2}}'),
    ("llama3", '\n{"name": "add", "arguments": {"a": 7, "b": 8}}'),
    ("llama3", '{"answer": 42, "name": 3}'),  # JSON, but no call: content
]


def _stream(text, parser, sizes, choice="auto", parallel=None):
    """A streaming split fed `text` in pieces of these sizes (then the rest); its events."""
    out = ChatOutput(False, False, tool_calls.tool_request(TOOLS, choice, parallel), parser, stream=True)
    events, at = [], 0
    for n in sizes:
        events += out.events(text[at:at + n])
        at += n
    return events + out.events(text[at:]) + out.end(), out


def _joined(events):
    """Each call as (name, its pieces joined, its final arguments, complete), checking that
    a call's pieces come between its start and its end."""
    calls = {}
    for e in events:
        if isinstance(e, CallStart):
            assert e.index == len(calls)
            calls[e.index] = {"name": e.name, "pieces": [], "end": None}
        elif isinstance(e, CallArguments):
            assert calls[e.index]["end"] is None
            calls[e.index]["pieces"].append(e.text)
        elif isinstance(e, CallEnd):
            assert e.call["function"]["name"] == calls[e.index]["name"] and e.call["id"].startswith("call_")
            calls[e.index]["end"] = e
    return [(c["name"], "".join(c["pieces"]), c["end"].call["function"]["arguments"], c["end"].complete)
            for c in calls.values()]


def _content(events):
    return "".join(e.text for e in events if isinstance(e, Text) and e.field == "content")


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(WELL_FORMED), sizes=st.lists(st.integers(1, 9), max_size=80))
def test_streamed_calls_at_any_split_are_the_whole_parses(case, sizes):
    parser, text = case
    message, _ = ChatOutput(False, False, tool_calls.tool_request(TOOLS, "auto", None), parser).message(text)
    whole = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    events, out = _stream(text, parser, sizes)
    calls = _joined(events)
    assert [(name, final) for name, _, final, _ in calls] == whole
    assert all(joined == final and complete for _, joined, final, complete in calls)
    assert out.calls == [e.call for e in events if isinstance(e, CallEnd)]
    assert _content(events).strip() == (message["content"] or "").strip()


def test_arguments_stream_before_the_call_ends():
    out = ChatOutput(False, False, tool_calls.tool_request(TOOLS, "auto", None), "qwen25", stream=True)
    events = []
    for piece in ("<tool_", 'call>\n{"name": "ad', 'd", "argu', 'ments": {"a', '": 12', ', "b": "x', "yz"):
        events += out.events(piece)
    start, *pieces = events
    assert start == CallStart(0, start.id, "add") and len(pieces) >= 3
    assert "".join(p.text for p in pieces) == '{"a": 12, "b": "xyz'
    # Nothing is announced before the name and the arguments' "{": the opening could still be content.
    out = ChatOutput(False, False, tool_calls.tool_request(TOOLS, "auto", None), "qwen25", stream=True)
    assert out.events('<tool_call>\n{"name": "add", "arguments": ') == []


@pytest.mark.parametrize("parser,text", WELL_FORMED)
def test_a_call_cut_anywhere_is_closed_into_what_was_streamed(parser, text):
    """max_tokens or a stop string may end the output inside a call: what was streamed
    stands, closed so that the pieces join to arguments that parse; a call not yet
    announced is content, as the whole parse leaves it."""
    full = _joined(_stream(text, parser, [])[0])
    rnd = random.Random(len(text))
    for cut in range(len(text) + 1):
        prefix = text[:cut]
        events, _ = _stream(prefix, parser, [rnd.randint(1, 6) for _ in range(cut)])
        calls = _joined(events)
        assert len(calls) <= len(full), cut
        for i, (name, joined, final, complete) in enumerate(calls):
            assert joined == final and isinstance(json.loads(final), dict), (cut, final)
            assert name == full[i][0]
            if complete:
                assert final == full[i][2], cut
            else:
                assert i == len(calls) - 1, cut  # only the call the cut fell in
        if not calls:
            whole, _ = ChatOutput(False, False, tool_calls.tool_request(TOOLS, "auto", None), parser).message(prefix)
            assert "tool_calls" in whole or _content(events) == whole["content"], cut


def test_parallel_tool_calls_false_streams_nothing_of_later_calls():
    two = ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
           '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>\nThat is all.')
    for choice in ("auto", "required", {"type": "function", "function": {"name": "add"}}):
        events, out = _stream(two, "qwen25", [3] * 60, choice=choice, parallel=False)
        assert {e.index for e in events if not isinstance(e, Text)} == {0}
        assert [final for _, _, final, _ in _joined(events)] == ['{"a": 1, "b": 2}'] == \
            [c["function"]["arguments"] for c in out.calls]
        assert _content(events) == "\nThat is all."  # the dropped call is not content


def test_hostile_outputs():
    many = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>' + "<tool_call>" * 20000
    events, _ = _stream(many, "qwen25", [7] * 4000)
    assert len(_joined(events)) == 1 and _content(events) == "<tool_call>" * 20000
    # JSON that breaks after the call was announced: the call stands, closed; the rest of
    # its block is its own; text after the block is content.
    broken = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": tru}}\n</tool_call>\nafter'
    events, _ = _stream(broken, "qwen25", [2] * 40)
    assert _joined(events) == [("add", '{"a": 1}', '{"a": 1}', False)] and _content(events) == "\nafter"
    assert tool_calls.parse(broken, "qwen25") == (broken, [])  # the whole parse: not a call
    for raw in ('"a\nb"', '"\\x"', '"\\ud83d\\u12"', "01", "1.", "-", "truth", "[1,]", '{"a" 1}', "{,}"):
        events, _ = _stream('{"name": "add", "parameters": {"v": %s}}' % raw, "llama3", [1] * 60)
        ((_, joined, final, complete),) = _joined(events)
        assert joined == final and isinstance(json.loads(final), dict) and not complete, raw
    # What json.loads cannot take (an integer past 4300 digits, nesting past the recursion
    # limit) and what a request could not carry back (nesting past MAX_JSON_DEPTH) is no
    # call in the whole parse, not an error; streamed, the call is closed at the limit.
    digits = '<tool_call>{"name": "add", "arguments": {"a": %s}}</tool_call>' % ("7" * 5000)
    assert tool_calls.parse(digits, "qwen25") == (digits, [])
    for depth in (50000, MAX_JSON_DEPTH):
        deep = '<tool_call>{"name": "add", "arguments": {"a": %s}}</tool_call>' % ("[" * depth + "]" * depth)
        assert tool_calls.parse(deep, "qwen25") == (deep, [])
        events, _ = _stream(deep[:-30] if depth == MAX_JSON_DEPTH else deep[:-30000], "qwen25", [5] * 20000)
        ((_, joined, final, complete),) = _joined(events)
        limit = MAX_JSON_DEPTH - 1  # the arguments' own object is the first level
        assert joined == final == '{"a": ' + "[" * limit + "]" * limit + "}" and not complete
    fits = '<tool_call>{"name": "add", "arguments": {"a": %s}}</tool_call>' % ("[" * 63 + "]" * 63)
    ((_, joined, final, complete),) = _joined(_stream(fits, "qwen25", [3] * 100)[0])
    assert complete and [final] == [c["function"]["arguments"] for c in tool_calls.parse(fits, "qwen25")[1]]


@pytest.mark.parametrize("value", ["1e400", "-1e400", "NaN", "Infinity", "-Infinity"])
def test_numbers_json_cannot_hold_are_no_arguments(value):
    """1e400 reads as a float infinity, NaN and Infinity are Python's extensions: none is
    JSON a client can parse, so no call's arguments hold one, streamed or whole."""
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": %s}}\n</tool_call>' % value
    assert tool_calls.parse(text, "qwen25") == (text, [])
    ((_, joined, final, complete),) = _joined(_stream(text, "qwen25", [4] * 30)[0])
    assert joined == final == '{"a": 1}' and not complete


def test_lone_surrogates_stay_escaped():
    """An unpaired \\ud800 reads as a lone surrogate, which UTF-8 (the response) cannot carry:
    the arguments keep it escaped, streamed and whole alike; a pair becomes its character."""
    text = '<tool_call>{"name": "add", "arguments": {"\\ud800k": "x\\udfffy", "p": "\\ud83d\\ude00"}}</tool_call>'
    (call,) = tool_calls.parse(text, "qwen25")[1]
    want = '{"\\ud800k": "x\\udfffy", "p": "\U0001F600"}'
    assert call["function"]["arguments"] == want
    want.encode("utf-8")
    ((_, joined, final, complete),) = _joined(_stream(text, "qwen25", [1] * 200)[0])
    assert joined == final == want and complete


def test_llama3_prefers_parameters_streamed_as_whole():
    text = '{"name": "add", "arguments": {"a": 1}, "parameters": {"b": 2}}'
    assert [c["function"]["arguments"] for c in tool_calls.parse(text, "llama3")[1]] == ['{"b": 2}']
    ((_, joined, final, complete),) = _joined(_stream(text, "llama3", [2] * 40)[0])
    assert joined == final == '{"b": 2}' and complete
    only = '{"name": "add", "arguments": {"a": 1}}'  # "arguments" alone: the call's, in one piece at its end
    ((_, joined, final, complete),) = _joined(_stream(only, "llama3", [2] * 40)[0])
    assert joined == final == '{"a": 1}' and complete


def test_a_block_the_output_ends_before_closing_is_a_call():
    """A stop string "</tool_call>" (or max_tokens after the JSON) leaves the last block open:
    its whole JSON is a call, streamed or whole, and text after it is content."""
    for tail, content in (("\n", ""), ("\nmore", "more")):
        text = 'A\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}' + tail
        rest, calls = tool_calls.parse(text, "qwen25")
        assert [c["function"]["arguments"] for c in calls] == ['{"a": 1}']
        assert rest.replace("\n", "") == "A" + content
        events, _ = _stream(text, "qwen25", [3] * 30)
        ((_, joined, final, complete),) = _joined(events)
        assert joined == final == '{"a": 1}' and complete
        assert _content(events).replace("\n", "") == "A" + content


def test_whitespace_before_a_think_is_linear():
    """Leading whitespace while a <think> may still come is held aside, not re-read per
    piece. Timed, as the re-reading was work in C: 300k pieces take 0.07 s of CPU here, and
    joining and stripping the whitespace so far at every piece took 13.6 s."""
    out = ChatOutput(True, False, None, "qwen25", stream=True)
    started = time.process_time()
    for _ in range(300_000):
        assert out.events(" ") == []
    events = out.events("hi") + out.end()
    assert time.process_time() - started < 3
    assert "".join(e.text for e in events) == " " * 300_000 + "hi"


@settings(max_examples=400, deadline=None)
@given(value=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                          | st.text(), lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=24),
       ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 3]), sizes=st.lists(st.integers(1, 7), max_size=200),
       cut=st.floats(0, 1))
def test_json_stream_releases_json_dumps_text(value, ascii_only, indent, sizes, cut):
    """The released pieces join to json.dumps(json.loads(raw)) whatever the layout and the
    split; any prefix, closed, parses."""
    raw = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    reader, out, at = JsonStream(), [], 0
    for n in sizes + [len(raw)]:
        out.append(reader.feed(raw[at:at + n])[1])
        at += n
    assert not reader.failed and "".join(out) + reader.closing() == json.dumps(value, ensure_ascii=False)
    reader = JsonStream()
    piece = reader.feed(raw[:int(cut * len(raw))])[1]
    if piece:
        json.loads(piece + reader.closing())


def _lines_run(text, sizes):
    """Python lines run to stream `text` in pieces of `sizes` (cycled)."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        count += event == "line"
        return local
    sys.settrace(lambda frame, event, arg: local)
    try:
        _stream(text, "qwen25", [sizes[i % len(sizes)] for i in range(len(text) // min(sizes))])
    finally:
        sys.settrace(None)
    return count


def _long_call(chars):
    return '<tool_call>\n{"name": "add", "arguments": {"a": "%s"}}\n</tool_call>' % ('x\\"y z' * (chars // 6))


def test_streaming_a_long_call_is_linear():
    """An attacker can ask for 30k tokens of arguments: streaming them must not re-read the
    text seen so far. Counted: four times the text runs about four times the lines (a
    re-read would run sixteen); timed, for work in C that counts no lines: 200k characters
    in token-sized pieces take 0.4 s of CPU here, and joining the pieces so far at every
    piece (one quadratic slip) 19 s."""
    small, large = _lines_run(_long_call(5000), [1, 3, 2, 4]), _lines_run(_long_call(20000), [1, 3, 2, 4])
    assert large < 5 * small, (small, large)
    text = _long_call(200_000)
    started = time.process_time()
    events, _ = _stream(text, "qwen25", [1, 3, 2, 4] * (len(text) // 10))
    ((_, joined, final, complete),) = _joined(events)
    assert complete and joined == final and len(json.loads(final)["a"]) > 150_000
    assert time.process_time() - started < 6


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
    """Streamed, a call's first delta carries its index, id, type and name; its arguments
    follow in pieces as they are generated, which join to the whole response's arguments
    character for character (and, through the SDK's own stream, to its done event)."""
    s, _ = server
    kw = dict(model=s.name, messages=[{"role": "user", "content": "Add 2 and 3."}], max_tokens=120, temperature=0,
              tool_choice={"type": "function", "function": {"name": "add"}})
    deltas = [c.choices[0] for c in s.client.chat.completions.create(**kw, tools=TOOLS, stream=True) if c.choices]
    first, *rest = [tc for d in deltas for tc in (d.delta.tool_calls or [])]
    assert deltas[-1].finish_reason == "tool_calls"
    assert (first.index, first.type, first.function.name) == (0, "function", "add") and first.id.startswith("call_")
    assert len(rest) > 1 and all((c.index, c.id, c.function.name) == (0, None, None) for c in rest)
    joined = "".join(c.function.arguments for c in [first, *rest])
    (whole,) = s.client.chat.completions.create(**kw, tools=TOOLS).choices[0].message.tool_calls
    assert joined == whole.function.arguments
    _valid(whole.model_dump(), ("add",))
    strict = [{"type": "function", "function": {**t["function"], "strict": True}} for t in TOOLS]
    with s.client.chat.completions.stream(**kw, tools=strict) as sdk:
        events = list(sdk)
        final = sdk.get_final_completion().choices[0].message.tool_calls[0].function.arguments
    pieces = [e.arguments_delta for e in events if e.type == "tool_calls.function.arguments.delta"]
    (done,) = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert len(pieces) > 1 and "".join(pieces) == done.arguments == final
    s.wait_idle()


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
