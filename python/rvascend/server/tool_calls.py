"""Tool calls: the request's `tools` checked, the call grammar for `tool_choice:
required` or a named function, and the model's output parsed into OpenAI's
`tool_calls`.

Two output formats, as the families' chat templates teach them (SGLang's parser
names): `qwen25`, Hermes-style `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
blocks (Qwen2.5, Qwen3, Qwen3.5, SmolLM2's tool-use prompts), and `llama3`, a bare
JSON object `{"name": ..., "parameters": {...}}` (Llama 3.x), several separated by
";". Text that does not parse as a call stays content, as SGLang's and vLLM's
parsers leave it.

A choice's calls reach the API layers as events (Text, CallStart, CallArguments,
CallEnd): a whole response's from the finished text (WholeCalls, `parse`), a stream's
as they are generated (tool_call_stream.py, which states its rule).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any, Optional, Union

from rvascend.engine import Grammar
from rvascend.engine.grammar import JSON_LAYOUT
from rvascend.models.families import family_of
from rvascend.server.json_stream import canonical
from rvascend.server.protocol import UnsupportedField, check_nesting

PARSERS = ("qwen25", "llama3")
MAX_TOOLS = 128


def parser_for(architecture: str) -> str:
    """The tool-call format of a model family when --tool-call-parser names none."""
    return family_of(architecture).tool_call_parser


@dataclasses.dataclass(frozen=True)
class ToolRequest:
    """A chat request's tools and what it asks of them."""
    tools: list[dict[str, Any]]     # all the request lists, checked (OpenAI's shape)
    choice: str                     # "auto" | "none" | "required" | "function"
    function: Optional[str]         # with choice "function": its name
    parallel: bool

    @property
    def parse(self) -> bool:
        return self.choice != "none"

    @property
    def offered(self) -> list[dict[str, Any]]:
        """The tools the model is shown (its chat template's `tools`) and may call, as
        SGLang offers them: none with tool_choice "none", only the named one with a named
        choice: a tool in the prompt invites a call to it, so one that may not be called
        is left out."""
        if self.choice == "none":
            return []
        return [t for t in self.tools if self.choice != "function" or t["function"]["name"] == self.function]

    def keeps(self, index: int) -> bool:
        """Whether the call at `index` of a choice reaches the client: the first only with
        parallel_tool_calls false, whatever the tool_choice (SGLang and vLLM drop the rest
        alike)."""
        return self.parallel or index == 0


def tool_request(tools: Optional[list[Any]], tool_choice: Any, parallel: Optional[bool]) -> Optional[ToolRequest]:
    """The checked tools of a request; UnsupportedField naming what is wrong."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise UnsupportedField("tool_choice needs tools")
        return None
    if len(tools) > MAX_TOOLS:
        raise UnsupportedField(f"tools has {len(tools)} entries; at most {MAX_TOOLS} are served")
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise UnsupportedField(f"tools[{i}] is not a {{\"type\": \"function\", \"function\": {{...}}}} tool")
        if not isinstance(fn.get("name"), str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", fn["name"]):
            raise UnsupportedField(f"tools[{i}].function.name must be 1 to 64 letters, digits, '_', '.' or '-'")
        if not isinstance(fn.get("parameters", {}), dict):
            raise UnsupportedField(f"tools[{i}].function.parameters must be a JSON schema object")
        names.append(fn["name"])
    if len(set(names)) != len(names):
        raise UnsupportedField("tools: two functions share a name")
    function = None
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        choice = tool_choice or "auto"
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and \
            isinstance(tool_choice.get("function"), dict):
        choice, function = "function", tool_choice["function"].get("name")
        if function not in names:
            raise UnsupportedField(f"tool_choice names function {function!r}, which is not among the tools")
    else:
        raise UnsupportedField("tool_choice is 'auto', 'none', 'required' or {\"type\": \"function\", "
                               "\"function\": {\"name\": ...}}")
    return ToolRequest(list(tools), choice, function, True if parallel is None else bool(parallel))


def _call_schema(tool: dict[str, Any], arguments_key: str) -> dict[str, Any]:
    fn = tool["function"]
    return {"type": "object", "properties": {"name": {"const": fn["name"]},
                                             arguments_key: fn.get("parameters") or {"type": "object"}},
            "required": ["name", arguments_key], "additionalProperties": False}


def call_grammar(request: ToolRequest, parser: str) -> Optional[Grammar]:
    """The grammar that makes the output tool calls: with tool_choice 'required' (one or
    more of the tools; one unless parallel) or a named function (that one); else None."""
    if request.choice not in ("required", "function"):
        return None
    key = "parameters" if parser == "llama3" else "arguments"
    # JSON laid out as in every other JSON grammar here (engine/grammar.py).
    schema = {"anyOf": [_call_schema(t, key) for t in request.offered], "x-guidance": JSON_LAYOUT}
    body = "%json " + json.dumps(schema)
    many = request.parallel and request.choice == "required"
    if parser == "llama3":
        repeat = ' ("; " call)*' if many else ""
        lark = f"start: call{repeat}\ncall: {body}\n"
    else:
        repeat = ' ("\\n" call)*' if many else ""
        lark = f'start: call{repeat}\ncall: "<tool_call>\\n" body "\\n</tool_call>"\nbody: {body}\n'
    return Grammar("lark", lark)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def whole_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A call as OpenAI's tool_calls list it; `arguments` is JSON text."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def whole_object_call(value: Any, argument_keys: tuple[str, ...]) -> Optional[dict[str, Any]]:
    """The call a parsed object is, its arguments under the first of `argument_keys` it has,
    or None if it is not one: the name a string, the arguments an object nested at most
    MAX_JSON_DEPTH levels (what a request may carry back), without NaN or infinities."""
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    arguments = next((value[k] for k in argument_keys if k in value), None)
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    try:
        check_nesting("arguments", arguments)
        return whole_call(new_call_id(), name, canonical(arguments))
    except (UnsupportedField, ValueError):
        return None


CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"  # qwen25's block
def not_json(constant: str) -> None:
    """json's parse_constant: NaN and Infinity are refused, as the stream refuses them (json_stream.py)."""
    raise ValueError(f"{constant} is not JSON")


_JSON = json.JSONDecoder(parse_constant=not_json)
# What json.loads raises on text that is no call: a syntax error (a ValueError), an integer
# past Python's 4300-digit limit (a ValueError), nesting past the recursion limit.
NOT_JSON = (ValueError, RecursionError)


def _llama3_calls(body: str) -> Optional[list[dict[str, Any]]]:
    """Llama 3's calls: JSON objects separated by ";" (a ";" inside a string is the string's),
    or None if the body is not only that."""
    calls, pos = [], 0
    while True:
        try:
            value, pos = _JSON.raw_decode(body, pos)
        except NOT_JSON:
            return None
        call = whole_object_call(value, ("parameters", "arguments"))
        if call is None:
            return None
        calls.append(call)
        rest = body[pos:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(";"):
            return None
        pos = len(body) - len(rest) + 1
        while pos < len(body) and body[pos].isspace():
            pos += 1


def parse(text: str, parser: str) -> tuple[str, list[dict[str, Any]]]:
    """(content, tool calls) of a finished output; calls that do not parse stay in the content.
    One pass over the text: each block's end is looked for once, from its start."""
    if parser == "llama3":
        body = text.strip().removeprefix("<|python_tag|>").strip()
        calls = _llama3_calls(body) if body.startswith("{") else None
        return ("", calls) if calls else (text, [])
    calls, kept, last, pos = [], [], 0, 0
    while (start := text.find(CALL_OPEN, pos)) >= 0:
        end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        body = text[start + len(CALL_OPEN):end if end >= 0 else len(text)]
        try:
            if end >= 0:
                value = _JSON.decode(body)
            else:
                # The last block, which the output ended before closing (a stop string, or
                # max_tokens after its JSON): a call if its JSON is whole; the rest is content.
                stripped = body.lstrip()
                value, used = _JSON.raw_decode(stripped)
                end = len(text) - (len(stripped) - used)
        except NOT_JSON:
            if end < 0:
                break  # no block closes after this one starts: none further does either
            pos = end + len(CALL_CLOSE)
            continue
        pos = end + len(CALL_CLOSE) if text.startswith(CALL_CLOSE, end) else end
        call = whole_object_call(value, ("arguments",))
        if call is None:
            continue
        kept.append(text[last:start])
        last = pos
        calls.append(call)
    kept.append(text[last:])
    return ("".join(kept).strip() if calls else text), calls


def start_marker(parser: str) -> str:
    """The text where a call begins in the output (streaming holds it back from there)."""
    return CALL_OPEN if parser == "qwen25" else "{"


def partial_marker(text: str, marker: str, start: int = 0) -> int:
    """Length of the longest end of text[start:] that begins `marker` (text to hold back
    until the next piece says whether the marker is there)."""
    for n in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


@dataclasses.dataclass(frozen=True)
class Text:
    field: str  # "content" | "reasoning_content"
    text: str


@dataclasses.dataclass(frozen=True)
class CallStart:
    index: int  # the call's place among the choice's calls
    id: str
    name: str


@dataclasses.dataclass(frozen=True)
class CallArguments:
    index: int
    text: str   # the next piece of the call's arguments (JSON text)


@dataclasses.dataclass(frozen=True)
class CallEnd:
    index: int
    call: dict[str, Any]  # the whole call: its arguments are its pieces joined
    complete: bool        # False: the output ended or broke inside the arguments


Event = Union[Text, CallStart, CallArguments, CallEnd]


def call_events(index: int, call: dict[str, Any]) -> list[Event]:
    """A whole call's events: its arguments in one piece."""
    fn = call["function"]
    return [CallStart(index, call["id"], fn["name"]), CallArguments(index, fn["arguments"]),
            CallEnd(index, call, True)]


class WholeCalls:
    """A whole response's calls: content goes out up to where a call may begin (the
    format's start marker), the rest waits for the end and is parsed whole (`parse`)."""

    def __init__(self, parser: str) -> None:
        self.parser = parser
        self.pending = ""          # a possible marker's start
        self.call: list[str] = []  # from a call's start on
        self.said = False          # some content other than whitespace went out

    def feed(self, text: str) -> list[Event]:
        if self.call:
            self.call.append(text)
            return []
        text, self.pending = self.pending + text, ""
        marker = start_marker(self.parser)
        at = text.find(marker)
        if self.parser == "llama3" and at >= 0 and (self.said or text[:at].strip()):
            at = -1  # llama3's calls are the whole output: a "{" after other text is content
        if at >= 0:
            self.call = [text[at:]]
            return self._text(text[:at])
        hold = partial_marker(text, marker)
        self.pending = text[len(text) - hold:]
        return self._text(text[:len(text) - hold])

    def finish(self) -> list[Event]:
        events, self.pending = self._text(self.pending), ""
        if self.call:
            rest, calls = parse("".join(self.call), self.parser)
            self.call = []
            events += self._text(rest)
            for i, call in enumerate(calls):
                events += call_events(i, call)
        return events

    def _text(self, text: str) -> list[Event]:
        if not text:
            return []
        self.said = self.said or not text.isspace()
        return [Text("content", text)]
