"""OpenAI's Responses API (/v1/responses): the request's schema, its translation into a
chat completion request (server/openai_api.prepare_chat serves both: one implementation
of templates, tools and constraints), and the bounded store that keeps responses for
`previous_response_id` and GET /v1/responses/{id}.

Known fields are type-checked; unknown ones are ignored, except those that would change
the answer if ignored (`conversation`, `prompt`, chat's `messages`, ...), refused by
name. Tools that cannot run here (`web_search`, Codex's `namespace`, the other hosted
types) are left out with a log line, as Codex sends them beside its function tools and
gives up on any 400; a `tool_choice` that forces one of them is refused.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import json
import uuid
from typing import Any, Literal, Optional, Union

import pydantic
from absl import logging
from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr

from rvascend.server import limits
from rvascend.server.protocol import ChatCompletionRequest, Number, UnsupportedField, _NullIsDefault, check_nesting

# Responses kept for previous_response_id and GET, least recently used evicted first.
MAX_STORED_RESPONSES = 1024
# And their bytes (as JSON): what a stored item carries is not bounded by the context (fields
# no template reads, earlier turns' reasoning that templates drop), so a count alone let
# 1024 bodies near the body limit each stay in memory.
MAX_STORED_BYTES = 256 << 20
ENCRYPTED_REASONING = "reasoning.encrypted_content"

# Fields of other APIs (or of Responses features not served) that a client means to
# change the answer with; ignoring them would answer a different question.
_REFUSED = {
    "conversation": "'conversation' (server-side conversations) is not supported: send previous_response_id "
                    "or the whole input",
    "prompt": "'prompt' (stored prompt templates) is not supported",
    "max_tool_calls": "'max_tool_calls' is not supported",
    "messages": "'messages' is chat completions' field: the Responses API takes 'input'",
    "max_tokens": "'max_tokens' is chat completions' field: the Responses API takes 'max_output_tokens'",
    "response_format": "'response_format' is chat completions' field: the Responses API takes 'text.format'",
    "functions": "'functions' is not supported: send 'tools'",
    "stop": "'stop' is not a Responses API field and is not supported",
    "n": "'n' is not a Responses API field: one response per request",
}
# Tool types of OpenAI's hosted tools (and Codex's `namespace` of tools it runs through
# another channel): nothing here can run them, so the model is not offered them.
_HOSTED_TOOL_PREFIXES = ("web_search", "file_search", "computer", "code_interpreter", "image_generation", "mcp",
                         "local_shell", "shell", "apply_patch", "namespace", "tool_search")
_UNSERVED_PARTS = ("input_image", "input_file", "input_audio")
_TEXT_PARTS = ("input_text", "output_text")
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesRequest(_NullIsDefault):
    """POST /v1/responses, as OpenAI's reference and Codex send it."""

    model_config = ConfigDict(extra="allow")

    model: Optional[StrictStr] = None
    input: Optional[Union[StrictStr, list[dict[str, Any]]]] = None
    instructions: Optional[StrictStr] = None
    previous_response_id: Optional[StrictStr] = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Union[StrictStr, dict[str, Any]] = "auto"
    parallel_tool_calls: StrictBool = True
    max_output_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    temperature: Number = 1.0
    top_p: Number = 1.0
    text: Optional[dict[str, Any]] = None
    reasoning: Optional[dict[str, Any]] = None
    metadata: Optional[dict[StrictStr, StrictStr]] = None
    user: Optional[StrictStr] = None
    truncation: Literal["auto", "disabled"] = "disabled"
    include: list[StrictStr] = Field(default_factory=list)
    store: StrictBool = True
    stream: StrictBool = False
    background: StrictBool = False
    top_logprobs: StrictInt = 0
    # Accepted and echoed, changing nothing here: caching is by prefix for every request.
    prompt_cache_key: Optional[StrictStr] = None
    client_metadata: Optional[dict[str, Any]] = None

    def check_supported(self) -> None:
        extra = self.model_extra or {}
        for name, message in _REFUSED.items():
            if extra.get(name) not in (None, [], {}):
                raise UnsupportedField(message)
        if self.background:
            raise UnsupportedField("'background': true is not supported: responses run while the request is open")
        if self.truncation == "auto":
            raise UnsupportedField("truncation 'auto' is not supported: send 'disabled' (an input over the "
                                   "context is refused)")
        if self.top_logprobs:
            raise UnsupportedField("'top_logprobs' is not supported by the Responses API here")
        for name in self.include:
            if name.endswith("logprobs"):
                raise UnsupportedField(f"include {name!r} is not supported (log-probabilities)")
        for name in ("input", "tools", "tool_choice", "text", "reasoning"):
            check_nesting(name, getattr(self, name))
        for name, value in extra.items():
            check_nesting(name, value)
        # The response echoes fields the prompt never holds (metadata, user, tools, text,
        # reasoning) and input_items lists the items whole: a lone surrogate in any of them
        # failed its JSON encoding, a 500 after the generation ran and on every GET.
        for name in self.model_fields_set:
            _check_unicode(name, getattr(self, name))
        if not self.input and self.previous_response_id is None:
            raise UnsupportedField("'input' is empty: send a string or a list of input items")

    @property
    def include_reasoning(self) -> bool:
        return ENCRYPTED_REASONING in self.include

    @property
    def summary(self) -> Optional[str]:
        return (self.reasoning or {}).get("summary") or (self.reasoning or {}).get("generate_summary")

    def input_items(self) -> list[dict[str, Any]]:
        """The request's input as items, each with an id and a message's text as a part, as
        input_items lists them (a string input is one user message)."""
        if isinstance(self.input, str):
            items = [{"type": "message", "role": "user", "content": self.input}]
        else:
            items = [dict(item) for item in self.input or ()]
        for item in items:
            item.setdefault("type", "message")
            item.setdefault("id", new_id("msg" if item["type"] == "message" else "item"))
            if item["type"] == "message" and isinstance(item.get("content"), str):
                kind = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": kind, "text": item["content"]}]
        return items

    def to_chat(self, history: list[dict[str, Any]], items: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The chat completion request that answers this one: `instructions`, then the
        stored conversation `history`, then `items`. UnsupportedField naming what is wrong."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages += item_messages([("the stored conversation", history), ("input", items)])
        if not messages:
            raise UnsupportedField("the conversation is empty: send input")
        body: dict[str, Any] = {
            "messages": _join_system(messages), "temperature": self.temperature, "top_p": self.top_p,
            "max_completion_tokens": self.max_output_tokens, "user": self.user,
            "parallel_tool_calls": self.parallel_tool_calls}
        tools = chat_tools(self.tools)
        if tools:
            body["tools"] = tools
        body["tool_choice"] = chat_tool_choice(self.tool_choice, self.tools)
        fmt = response_format((self.text or {}).get("format"))
        if fmt is not None:
            body["response_format"] = fmt
        effort = (self.reasoning or {}).get("effort")
        if effort is not None:
            if effort not in _EFFORTS:
                raise UnsupportedField(f"reasoning.effort {effort!r} is not one of {', '.join(_EFFORTS)}")
            # The families served here think or do not (Qwen3's switch); every effort but
            # "none" thinks.
            body["chat_template_kwargs"] = {"enable_thinking": effort != "none"}
        try:
            return ChatCompletionRequest.model_validate(body)
        except pydantic.ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
            raise UnsupportedField(f"invalid input: {problems}") from None


def _check_unicode(what: str, value: Any) -> None:
    """limits.InputError naming the string (or key) in the JSON `value` that holds a lone
    UTF-16 surrogate, if one does. Iterative, as check_nesting."""
    stack = [(what, value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, str):
            limits.check_text(where, node)
        elif isinstance(node, dict):
            for key, item in node.items():
                limits.check_text(f"a key of {where}", key)
                stack.append((f"{where}.{key}", item))
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(node))


def _text_of(parts: Any, where: str) -> str:
    """A message's text: a string, or its input_text / output_text parts joined."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise UnsupportedField(f"{where}.content must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _UNSERVED_PARTS:
            raise UnsupportedField(f"{where}.content[{j}] is of type {kind!r}: this server takes text only")
        if kind not in _TEXT_PARTS + ("refusal", "reasoning_text", "summary_text") \
                or not isinstance(part.get("text", part.get("refusal")), str):
            raise UnsupportedField(f"{where}.content[{j}] of type {kind!r} is not a text part (input_text, "
                                   "output_text)")
        texts.append(part.get("text", part.get("refusal")))
    return "".join(texts)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text: its content, else what encrypted_content carries here (the
    text itself), else its summary."""
    if item.get("content"):
        return _text_of(item["content"], where)
    if isinstance(item.get("encrypted_content"), str):
        return item["encrypted_content"]
    summary = item.get("summary") or []
    if not isinstance(summary, list):
        raise UnsupportedField(f"{where}.summary must be a list of summary_text parts")
    return "\n\n".join(_text_of([s], f"{where}.summary") for s in summary)


def item_messages(groups: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Chat messages of Responses items, given as (name, items) groups that follow each
    other: messages (developer -> system), function calls (an assistant's tool_calls;
    consecutive calls are one turn), their outputs (tool messages), reasoning (the next
    assistant turn's reasoning_content)."""
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    reasoning: Optional[str] = None

    def assistant() -> dict[str, Any]:
        nonlocal reasoning
        message = {"role": "assistant", "content": None}
        if reasoning is not None:
            message["reasoning_content"], reasoning = reasoning, None
        messages.append(message)
        return message

    for where, item in ((f"{what}[{i}]", item) for what, items in groups for i, item in enumerate(items)):
        if not isinstance(item, dict):
            raise UnsupportedField(f"{where} is not an item object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise UnsupportedField(f"{where}.role {role!r} is not user, assistant, system or developer")
            text = _text_of(item.get("content"), where)
            if role == "assistant":
                assistant()["content"] = text
            else:
                messages.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            for field in ("call_id", "name", "arguments"):
                if not isinstance(item.get(field), str):
                    raise UnsupportedField(f"{where} (function_call) needs '{field}' as a string")
            last = messages[-1] if messages else None
            # A call follows its turn's text (or the turn's other calls) in one assistant message.
            turn = last if last is not None and last["role"] == "assistant" and reasoning is None else assistant()
            turn.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
            calls.add(item["call_id"])
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise UnsupportedField(f"{where} (function_call_output) needs 'call_id' as a string")
            if call_id not in calls:
                raise UnsupportedField(f"{where}: no function_call with call_id {call_id!r} comes before "
                                       "this function_call_output")
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": output if isinstance(output, str) else _text_of(output, where)})
        elif kind == "reasoning":
            reasoning = _reasoning_text(item, where)
        elif kind == "item_reference":
            raise UnsupportedField(f"{where} is an item_reference: send the item itself, or previous_response_id")
        else:
            raise UnsupportedField(f"{where} has type {kind!r}, which is not a message, function_call, "
                                   "function_call_output or reasoning item")
    return messages


def _join_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive system messages (instructions, Codex's developer messages) as one: many
    chat templates take a single system message, first."""
    joined: list[dict[str, Any]] = []
    # Each run joined once: adding a message at a time to the joined text copied it per
    # message, quadratic in a run of developer items.
    for system, run in itertools.groupby(messages, key=lambda m: m["role"] == "system"):
        if system:
            joined.append({"role": "system", "content": "\n\n".join(m["content"] for m in run)})
        else:
            joined.extend(run)
    return joined


def _is_hosted(kind: Any) -> bool:
    return isinstance(kind, str) and kind.startswith(_HOSTED_TOOL_PREFIXES)


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function tools in chat's shape; hosted tools left out (logged), others refused."""
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind == "function":
            if not isinstance(tool.get("name"), str):
                raise UnsupportedField(f"tools[{i}] (a function) needs a 'name'")
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
            out.append({"type": "function", "function": fn})
        elif _is_hosted(kind):
            logging.info("responses: tools[%d] of type %r cannot run here; the model is not offered it", i, kind)
        elif kind == "custom":
            raise UnsupportedField(f"tools[{i}] is a custom tool ({tool.get('name')!r}): free-form tool input is "
                                   "not supported, send a function tool")
        else:
            raise UnsupportedField(f"tools[{i}] has type {kind!r}, which is not supported (function)")
    return out


def chat_tool_choice(choice: Union[str, dict[str, Any]], tools: list[dict[str, Any]]) -> Union[str, dict[str, Any]]:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise UnsupportedField(f"tool_choice {choice!r} is not auto, none, required or a tool")
        return choice
    kind = choice.get("type")
    if kind == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if _is_hosted(kind) or kind in ("custom", "allowed_tools"):
        raise UnsupportedField(f"tool_choice forces {kind!r}, which this server cannot run")
    raise UnsupportedField(f"tool_choice of type {kind!r} is not supported (auto, none, required, function)")


def response_format(fmt: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """text.format as chat's response_format."""
    if fmt is not None and not isinstance(fmt, dict):
        raise UnsupportedField(f"text.format must be an object such as {{\"type\": \"json_schema\", ...}}, "
                               f"not a {type(fmt).__name__}")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    raise UnsupportedField(f"text.format type {fmt.get('type')!r} is not text, json_object or json_schema")


@dataclasses.dataclass
class Stored:
    owner: str                              # digest of the API key that made it
    response: dict[str, Any]
    input_items: list[dict[str, Any]]       # this request's own input
    conversation: list[dict[str, Any]]      # what a continuation prepends: history, input, output
    history_bytes: int = 0                  # the size of the stored response it continues

    @functools.cached_property
    def size(self) -> int:
        """Bytes as JSON, its history's included: the history's items live on in their
        continuations after their own response is evicted. Measured on its own part only,
        so storing a long chain's next step costs that step's bytes."""
        return self.history_bytes + len(json.dumps([self.response, self.input_items]))


class ResponseStore:
    """Stored responses, at most `limit` of them and `max_bytes` (Stored.size), the least
    recently used evicted first. An item belongs to its owner: to anyone else it does not
    exist. Used from the event loop only (the endpoints are coroutines), so it takes no lock."""

    def __init__(self, limit: int = MAX_STORED_RESPONSES, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: collections.OrderedDict[str, Stored] = collections.OrderedDict()

    def put(self, stored: Stored) -> None:
        self._discard(stored.response["id"])
        if stored.size > self.max_bytes:  # it would evict every other response, then itself
            logging.info("responses: %s not stored: %d bytes with its history, over the store's %d",
                         stored.response["id"], stored.size, self.max_bytes)
            return
        self._items[stored.response["id"]] = stored
        self.bytes += stored.size
        while len(self._items) > self.limit or self.bytes > self.max_bytes:
            evicted, old = self._items.popitem(last=False)
            self.bytes -= old.size
            logging.info("responses: %s evicted from the store (over %d responses or %d bytes)", evicted,
                         self.limit, self.max_bytes)

    def get(self, rid: str, owner: str) -> Optional[Stored]:
        stored = self._items.get(rid)
        if stored is None or stored.owner != owner:
            return None
        self._items.move_to_end(rid)
        return stored

    def delete(self, rid: str, owner: str) -> bool:
        if self.get(rid, owner) is None:
            return False
        self._discard(rid)
        return True

    def _discard(self, rid: str) -> None:
        stored = self._items.pop(rid, None)
        if stored is not None:
            self.bytes -= stored.size

    def __len__(self) -> int:
        return len(self._items)
