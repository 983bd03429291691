"""Anthropic's Messages API requests and their translation into a chat completion
request, so that one implementation (openai_api.prepare_chat) renders templates,
offers tools and builds constraints for both APIs; and the Messages API's error shape.

What the translation does with each part of a request:
- `system` (text or text blocks) is the first message; a message with role `system`
  inside `messages` (Claude Code sends one) is user text, as the only place every
  chat template accepts it after the first message.
- Blocks: `text`; `tool_use` -> the assistant's `tool_calls`; `tool_result` (text or
  text blocks, `is_error`) -> a `tool` message answering a tool_use of the assistant
  message before it; `thinking` and `redacted_thinking` are dropped (the families'
  templates drop earlier turns' reasoning too). `image`, `document` and any other
  type are refused by name: this server reads text only.
- Consecutive messages of one role are combined into one turn, as Anthropic combines
  them; a last assistant message is continued (Anthropic's prefill).
- `tools`: custom tools (`input_schema`) become functions; Anthropic's server tools
  (`web_search_20250305`, `bash_20250124`, ...) run on Anthropic's side, so they are
  left out with a log line, and a tool_choice naming one is refused.
- `thinking` enabled / disabled -> the template's `enable_thinking`; adaptive leaves
  the template's default. `budget_tokens` is not enforced: max_tokens bounds it.
- `output_config.format` (and the beta's `output_format`) -> a JSON-schema response
  format; `effort`, `context_management`, `metadata`, `service_tier` change nothing
  here and are ignored, as are unknown fields, except `container` and `mcp_servers`
  (tools this server cannot run): refused by name.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from absl import logging
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from rvascend.server.protocol import ChatCompletionRequest, Number, UnsupportedField

# The paths of this API: errors the server sends on them take Anthropic's shape.
PATH_PREFIX = "/v1/messages"

# Anthropic's error types by HTTP status (its reference's table).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               529: "overloaded_error"}

# Fields that would change the answer and that this server does not implement.
_UNSUPPORTED = ("container", "mcp_servers")

# Blocks that carry what this server cannot read.
_NOT_TEXT = {"image": "an image", "document": "a document", "search_result": "a search result"}

# Between the text blocks of one turn: Claude Code splits a turn into a reminder and
# the prompt, which glued together would read as one sentence.
_BLOCK_SEPARATOR = "\n\n"


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error" if status >= 500
                                                                 else "invalid_request_error"),
                                       "message": message}}


def validated(model: type[BaseModel], data: Any) -> Any:
    """`data` as a `model`; UnsupportedField listing every problem (a 400 in this API's shape)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'the body'}: {err['msg']}"
                             for err in e.errors())
        raise UnsupportedField(f"invalid request: {problems}") from None


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control, citations: nothing to do here
    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant", "system"]
    # Blocks are checked by the translation, which names each one's place and type.
    content: Union[StrictStr, list[dict[str, Any]]]


class CountTokensRequest(BaseModel):
    """/v1/messages/count_tokens: what the prompt is made of."""

    model_config = ConfigDict(extra="allow")
    model: Optional[StrictStr] = None
    messages: list[Message] = Field(min_length=1)
    system: Optional[Union[StrictStr, list[TextBlock]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None
    output_config: Optional[dict[str, Any]] = None

    def chat_fields(self) -> dict[str, Any]:
        """The ChatCompletionRequest fields of the prompt; UnsupportedField naming what is
        refused."""
        extra = self.model_extra or {}
        for name in _UNSUPPORTED:
            if extra.get(name) not in (None, [], {}):
                raise UnsupportedField(f"'{name}' is not supported by this server")
        fields: dict[str, Any] = {"messages": self._messages()}
        if not fields["messages"]:
            raise UnsupportedField("the messages hold nothing to answer (only thinking blocks)")
        last = fields["messages"][-1]
        if last["role"] == "assistant":
            if last.get("tool_calls"):
                raise UnsupportedField("the last message's tool_use blocks have no tool_result: send the results "
                                       "in a user message")
            fields["continue_final_message"] = True  # Anthropic's prefill: the answer continues it
        tools, choice, parallel = self._tools()
        if tools:
            fields["tools"] = tools
        if choice is not None:
            fields["tool_choice"] = choice
        if parallel is not None:
            fields["parallel_tool_calls"] = parallel
        thinking = _thinking(self.thinking)
        if thinking is not None:
            fields["chat_template_kwargs"] = {"enable_thinking": thinking}
        fmt = _output_format(self.output_config, extra.get("output_format"))
        if fmt is not None:
            fields["response_format"] = fmt
        return fields

    def chat_request(self) -> ChatCompletionRequest:
        return validated(ChatCompletionRequest, self.chat_fields())

    def _messages(self) -> list[dict[str, Any]]:
        turns: list[dict[str, Any]] = []
        if self.system:
            text = self.system if isinstance(self.system, str) else \
                _BLOCK_SEPARATOR.join(b.text for b in self.system)
            turns.append({"role": "system", "content": text})
        texts: list[list[str]] = [[] for _ in turns]  # each turn's texts, joined once at the end
        called: set[str] = set()  # the tool_use ids of the last assistant turn
        role = None
        for i, message in enumerate(self.messages):
            blocks = [{"type": "text", "text": message.content}] if isinstance(message.content, str) \
                else message.content
            if not blocks:
                raise UnsupportedField(f"messages[{i}].content is an empty list: send at least one block")
            if message.role == "assistant" and role != "assistant":
                called = set()
            role = "user" if message.role == "system" else message.role
            for j, block in enumerate(blocks):
                turn = _turn(f"messages[{i}].content[{j}]", role, block, called)
                if turn is not None:
                    _append(turns, texts, turn)
        for turn, parts in zip(turns, texts):
            if parts:
                turn["content"] = parts[0] if len(parts) == 1 else _BLOCK_SEPARATOR.join(t for t in parts if t) or None
        return turns

    def _tools(self) -> tuple[list[dict[str, Any]], Any, Optional[bool]]:
        """(OpenAI functions, tool_choice, parallel_tool_calls) of the request's tools."""
        functions, skipped = [], []
        for i, tool in enumerate(self.tools or ()):
            if not isinstance(tool, dict):
                raise UnsupportedField(f"tools[{i}] is not an object")
            if tool.get("type", "custom") != "custom":
                skipped.append(str(tool.get("name", tool.get("type"))))
                continue
            if not isinstance(tool.get("input_schema"), dict):
                raise UnsupportedField(f"tools[{i}] ({tool.get('name')!r}) needs an input_schema object")
            function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
            if tool.get("description") is not None:
                function["description"] = tool["description"]
            functions.append({"type": "function", "function": function})
        if skipped:
            logging.info("left out tools this server cannot run (Anthropic's server tools): %s", ", ".join(skipped))
        choice = self.tool_choice
        if choice is None:
            return functions, None, None
        kind = choice.get("type")
        parallel = False if choice.get("disable_parallel_tool_use") else None
        if kind in ("auto", "none"):
            return functions, kind, parallel
        if kind == "any":
            return functions, "required", parallel
        if kind == "tool":
            name = choice.get("name")
            if name in skipped:
                raise UnsupportedField(f"tool_choice names {name!r}, a server tool this server cannot run")
            return functions, {"type": "function", "function": {"name": name}}, parallel
        raise UnsupportedField(f"tool_choice type {kind!r} is not one of auto, any, tool, none")


class MessagesRequest(CountTokensRequest):
    """/v1/messages: the prompt, the bound on its answer and how to sample it."""

    max_tokens: StrictInt = Field(ge=1)
    stop_sequences: Optional[list[StrictStr]] = None
    stream: StrictBool = False
    temperature: Optional[Number] = None
    top_p: Optional[Number] = None
    top_k: Optional[StrictInt] = None
    metadata: Optional[dict[str, Any]] = None

    def chat_fields(self) -> dict[str, Any]:
        fields = super().chat_fields()
        fields["max_tokens"] = self.max_tokens
        if self.stop_sequences:
            fields["stop"] = self.stop_sequences
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        return fields


def _text(where: str, content: Any) -> str:
    """A tool result's content: text, or text blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise UnsupportedField(f"{where} must be text or a list of text blocks")
    texts = []
    for k, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in _NOT_TEXT:
            raise UnsupportedField(f"{where}[{k}] is {_NOT_TEXT[kind]} block: this server reads text only")
        if kind != "text" or not isinstance(block.get("text"), str):
            raise UnsupportedField(f"{where}[{k}] of type {kind!r} is not a text block")
        texts.append(block["text"])
    return _BLOCK_SEPARATOR.join(texts)


def _turn(where: str, role: str, block: Any, called: set[str]) -> Optional[dict[str, Any]]:
    """The chat message of one block, or None for a block left out; `called` collects
    the assistant's tool_use ids that the next tool results answer."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise UnsupportedField(f"{where}.text must be a string")
        return {"role": role, "content": block["text"]}
    if kind in ("thinking", "redacted_thinking") and role == "assistant":
        return None
    if kind == "tool_use" and role == "assistant":
        call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
        if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, dict):
            raise UnsupportedField(f"{where} needs an id, a name and an input object")
        called.add(call_id)
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": call_id, "type": "function",
                                "function": {"name": name, "arguments": arguments}}]}
    if kind == "tool_result" and role == "user":
        call_id = block.get("tool_use_id")
        if call_id not in called:
            raise UnsupportedField(f"{where}.tool_use_id {call_id!r} answers no tool_use of the assistant "
                                   "message before it")
        text = _text(f"{where}.content", block.get("content", ""))
        if block.get("is_error"):
            text = "Error: " + text
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    if kind in _NOT_TEXT:
        raise UnsupportedField(f"{where} is {_NOT_TEXT[kind]} block: this server reads text only")
    raise UnsupportedField(f"{where} has type {kind!r}, which a {role} message cannot hold here "
                           "(text, tool_use and thinking from the assistant; text and tool_result from the user)")


def _append(turns: list[dict[str, Any]], texts: list[list[str]], turn: dict[str, Any]) -> None:
    """Adds a block's message, combined with the one before if both are the same
    role's turn (tool results stay one message each, as chat templates expect). A turn's
    texts are collected in `texts`, for the caller to join once: joining them as they came
    copied the turn's text per block, quadratic in a turn of many blocks."""
    last = turns[-1] if turns else None
    if last is None or last["role"] != turn["role"] or turn["role"] not in ("user", "assistant"):
        turns.append(turn)
        texts.append([turn["content"]] if turn.get("content") is not None else [])
        return
    if turn.get("content") is not None:
        texts[-1].append(turn["content"])
    if turn.get("tool_calls"):
        last.setdefault("tool_calls", []).extend(turn["tool_calls"])


def _thinking(thinking: Optional[dict[str, Any]]) -> Optional[bool]:
    """The template's enable_thinking for Anthropic's `thinking`, or None for its default."""
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise UnsupportedField(f"thinking type {kind!r} is not one of enabled, disabled, adaptive")
    return None if kind == "adaptive" else kind == "enabled"


def _output_format(config: Optional[dict[str, Any]], beta: Any) -> Optional[dict[str, Any]]:
    """The response_format of `output_config.format` or the beta's `output_format`."""
    fmt = (config or {}).get("format") or beta
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise UnsupportedField("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
