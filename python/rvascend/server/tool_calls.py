"""Tool calls: the request's `tools` checked, the call grammar for `tool_choice:
required` or a named function, and the model's output parsed into OpenAI's
`tool_calls`.

Two output formats, as the families' chat templates teach them (SGLang's parser
names): `qwen25`, Hermes-style `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
blocks (Qwen2.5, Qwen3, Qwen3.5, SmolLM2's tool-use prompts), and `llama3`, a bare
JSON object `{"name": ..., "parameters": {...}}` (Llama 3.x), several separated by
";". Text that does not parse as a call stays content, as SGLang's and vLLM's
parsers leave it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any, Optional

from rvascend.engine import Grammar
from rvascend.engine.grammar import JSON_LAYOUT
from rvascend.server.protocol import UnsupportedField

PARSERS = ("qwen25", "llama3")
MAX_TOOLS = 128


def parser_for(architecture: str) -> str:
    """The tool-call format of a model family when --tool-call-parser names none."""
    return "llama3" if "llama" in architecture.lower() else "qwen25"


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

    def kept_calls(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The parsed calls a client gets: the first only with parallel_tool_calls false,
        whatever the tool_choice (SGLang and vLLM drop the rest alike)."""
        return calls if self.parallel else calls[:1]


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


def _call(name: Any, arguments: Any) -> Optional[dict[str, Any]]:
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_JSON = json.JSONDecoder()


def _llama3_calls(body: str) -> Optional[list[dict[str, Any]]]:
    """Llama 3's calls: JSON objects separated by ";" (a ";" inside a string is the string's),
    or None if the body is not only that."""
    calls, pos = [], 0
    while True:
        try:
            value, pos = _JSON.raw_decode(body, pos)
        except json.JSONDecodeError:
            return None
        call = _call(value.get("name"), value.get("parameters", value.get("arguments"))) \
            if isinstance(value, dict) else None
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
    while (start := text.find(_OPEN, pos)) >= 0:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            break  # no block closes after this one starts: none further does either
        pos = end + len(_CLOSE)
        try:
            value = json.loads(text[start + len(_OPEN):end])
        except json.JSONDecodeError:
            continue
        call = _call(value.get("name"), value.get("arguments")) if isinstance(value, dict) else None
        if call is None:
            continue
        kept.append(text[last:start])
        last = pos
        calls.append(call)
    kept.append(text[last:])
    return ("".join(kept).strip() if calls else text), calls


def start_marker(parser: str) -> str:
    """The text where a call begins in the output (streaming holds it back from there)."""
    return "<tool_call>" if parser == "qwen25" else "{"
