"""Request schemas of the OpenAI-compatible endpoints and their sampling parameters.

Known fields are type-checked strictly (`"max_tokens": "ten"` is a 400, not a
guess). Unknown fields are ignored, as OpenAI-compatible servers do, except
the ones that would change the answer if ignored (`functions`, `suffix`, ...):
those are refused by name. Output constraints (`response_format` and its vLLM
and SGLang kin) are read by server/structured_output.py. The free-form JSON a
request carries (tools, chat_template_kwargs, response formats, a tool call's
arguments) may nest at most MAX_JSON_DEPTH levels.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from rvascend.engine import Grammar, SamplingParams

Number = Union[StrictFloat, StrictInt]
MAX_N = 16
MAX_LOGPROBS = 20
# Nesting of the free-form JSON a client sends. A real tool's parameter schema
# nests a dozen levels; what walks such JSON recurses once per level or more
# (the chat template's input conversion and loops, the JSON encoders), and
# Python's recursion limit of 1000 frames gave a 500 past about 500 levels.
MAX_JSON_DEPTH = 64
# Keys of the deepest branch a nesting error shows.
_SHOWN_KEYS = 3

# Fields that change what a client gets back; serving without them would be a
# silently different answer.
_UNSUPPORTED = ("functions", "function_call", "suffix", "best_of", "audio",
                "prediction", "guided_whitespace_pattern")


class UnsupportedField(ValueError):
    pass


def _deepest(value: Any) -> tuple[int, list[Union[str, int]]]:
    """(depth, keys down the deepest branch) of a JSON value: a scalar is 0 deep, an
    object or array one more than its deepest item. Iterative, so no depth overflows it."""
    links: list[tuple[int, Union[str, int, None], int]] = []  # (parent's link, key, depth) per container
    stack: list[tuple[Any, int, Union[str, int, None], int]] = [(value, -1, None, 1)]
    deepest = -1
    while stack:
        node, parent, key, depth = stack.pop()
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        links.append((parent, key, depth))
        here = len(links) - 1
        if deepest < 0 or depth > links[deepest][2]:
            deepest = here
        stack.extend((v, here, k, depth + 1) for k, v in items if isinstance(v, (dict, list)))
    keys, at = [], deepest
    while at > 0:
        at, key, _ = links[at]
        keys.append(key)
    return (links[deepest][2] if deepest >= 0 else 0), keys[::-1]


def check_nesting(what: str, value: Any) -> None:
    """UnsupportedField naming `what` and its depth if the JSON `value` nests deeper
    than MAX_JSON_DEPTH (counted from `value` itself)."""
    depth, keys = _deepest(value)
    if depth > MAX_JSON_DEPTH:
        branch = what + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys[:_SHOWN_KEYS])
        raise UnsupportedField(f"{what} is nested {depth} levels deep (along {branch}"
                               f"{'...' if len(keys) > _SHOWN_KEYS else ''}); at most {MAX_JSON_DEPTH} are served")


def load_json(what: str, text: Union[str, bytes]) -> Any:
    """A client's JSON text, parsed, within MAX_JSON_DEPTH; UnsupportedField if it is not
    JSON (nor UTF-8) or nests deeper."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UnsupportedField(f"{what} is not JSON: {e}") from None
    except RecursionError:  # the parser recurses once per level
        raise UnsupportedField(f"{what} is nested deeper than Python's recursion limit of "
                               f"{sys.getrecursionlimit()} levels; at most {MAX_JSON_DEPTH} are served") from None
    check_nesting(what, value)
    return value


class _NullIsDefault(BaseModel):
    """An explicit JSON null in a field means the field's default, as OpenAI's
    API types its optional fields "X or null" and SGLang's clients send them."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class _Request(_NullIsDefault):
    model_config = ConfigDict(extra="allow")

    model: Optional[StrictStr] = None
    max_tokens: Optional[StrictInt] = None
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: StrictInt = -1
    min_p: Number = 0.0
    repetition_penalty: Number = 1.0
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    min_tokens: StrictInt = 0
    stop: Optional[Union[StrictStr, list[StrictStr]]] = None
    stop_token_ids: Optional[list[StrictInt]] = None
    logit_bias: Optional[dict[StrictStr, Number]] = None
    seed: Optional[StrictInt] = Field(default=None, ge=-(2**63), lt=2**64)
    n: StrictInt = Field(default=1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    user: Optional[StrictStr] = None

    def check_supported(self) -> None:
        extra = self.model_extra or {}
        for name in _UNSUPPORTED:
            if extra.get(name) not in (None, [], {}) and not (name == "best_of" and extra[name] == self.n):
                raise UnsupportedField(f"'{name}' is not supported by this server")
        for name, value in extra.items():
            check_nesting(name, value)

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling_params(self, max_tokens: int, logprobs: Optional[int], index: int = 0,
                        grammar: Optional[Grammar] = None, grammar_after: tuple[int, ...] = ()) -> SamplingParams:
        """The engine's parameters; the `index`-th of n samples gets seed + index."""
        bias = []
        for key, value in (self.logit_bias or {}).items():
            try:
                bias.append((int(key), float(value)))
            except ValueError:
                raise UnsupportedField(f"logit_bias: key {key!r} is not a token id") from None
        seed = None if self.seed is None else (self.seed + index) % 2**64
        return SamplingParams(
            max_tokens=max_tokens, temperature=float(self.temperature), top_p=float(self.top_p),
            top_k=self.top_k, min_p=float(self.min_p), repetition_penalty=float(self.repetition_penalty),
            frequency_penalty=float(self.frequency_penalty), presence_penalty=float(self.presence_penalty),
            min_tokens=self.min_tokens, stop=self.stop_list(), stop_token_ids=tuple(self.stop_token_ids or ()),
            logit_bias=tuple(bias), logprobs=logprobs, seed=seed, ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens, grammar=grammar,
            grammar_after=tuple(grammar_after) if grammar is not None else ())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Request):
    prompt: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]
    logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: StrictBool = False

    def check_supported(self) -> None:
        super().check_supported()
        for name in ("tools", "tool_choice", "parallel_tool_calls"):
            if (self.model_extra or {}).get(name) not in (None, [], {}):
                raise UnsupportedField(f"'{name}' is for chat completions; /v1/completions has no tool calls")

    def prompts(self) -> list[Union[str, list[int]]]:
        """One entry per prompt: text or token ids."""
        p = self.prompt
        if isinstance(p, list) and not p:
            raise UnsupportedField("'prompt' is an empty list: send a prompt (text or token ids)")
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    text: Optional[StrictStr] = None


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr
    arguments: Union[StrictStr, dict[str, Any]]


class ToolCall(_NullIsDefault):
    model_config = ConfigDict(extra="ignore")
    id: Optional[StrictStr] = None
    type: Literal["function"] = "function"
    function: FunctionCall

    def template_fields(self) -> dict[str, Any]:
        """The call as transformers' chat templates expect it: its arguments an object
        (OpenAI's API sends them as JSON text)."""
        arguments = self.function.arguments
        if isinstance(arguments, str):
            arguments = load_json("a tool call's function.arguments", arguments)
        fields = self.model_dump()
        fields["function"]["arguments"] = arguments
        return fields


class ChatMessage(_NullIsDefault):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Optional[Union[StrictStr, list[TextPart]]] = None
    name: Optional[StrictStr] = None
    tool_calls: Optional[list[ToolCall]] = None  # an assistant's calls (OpenAI's shape)
    tool_call_id: Optional[StrictStr] = None     # a tool message's answer to that call
    # An assistant's earlier reasoning (vLLM's field): templates that replay it (Qwen3's)
    # render it, the others leave it out.
    reasoning_content: Optional[StrictStr] = None

    def template_fields(self) -> dict[str, Any]:
        """The message as the chat template receives it."""
        fields: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name:
            fields["name"] = self.name
        if self.tool_calls:
            fields["tool_calls"] = [c.template_fields() for c in self.tool_calls]
        if self.tool_call_id is not None:
            fields["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            fields["reasoning_content"] = self.reasoning_content
        return fields

    def text(self) -> str:
        """The message's text: a string, text parts joined, or "" for null content."""
        if self.content is None:
            if self.role != "assistant":
                raise UnsupportedField(f"a {self.role} message needs content (null is for assistant messages)")
            return ""
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise UnsupportedField(f"content part of type {part.type!r} is not supported (text only)")
            texts.append(part.text)
        return "".join(texts)


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = None
    logprobs: StrictBool = False
    top_logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=MAX_LOGPROBS)
    chat_template_kwargs: Optional[dict[str, Any]] = None
    # vLLM's and SGLang's chat extensions: end the prompt with the assistant's turn
    # opened, or inside the last message so that the model continues it.
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[StrictStr, dict[str, Any]]] = None
    parallel_tool_calls: Optional[StrictBool] = None

    def check_supported(self) -> None:
        super().check_supported()
        if (self.model_extra or {}).get("echo"):
            raise UnsupportedField("'echo' is not supported in chat completions by this server")
        for name in ("chat_template_kwargs", "tools", "tool_choice"):
            check_nesting(name, getattr(self, name))
        for i, message in enumerate(self.messages):
            for j, call in enumerate(message.tool_calls or ()):
                check_nesting(f"messages[{i}].tool_calls[{j}].function.arguments", call.function.arguments)

    def template_options(self) -> tuple[bool, bool, dict[str, Any]]:
        """(add_generation_prompt, continue_final_message, other template variables);
        the two flags may also come inside chat_template_kwargs, as vLLM allows."""
        kwargs = dict(self.chat_template_kwargs or {})
        add = kwargs.pop("add_generation_prompt", None)
        cont = kwargs.pop("continue_final_message", None)
        for name, value in (("add_generation_prompt", add), ("continue_final_message", cont)):
            if value is not None and not isinstance(value, bool):
                raise UnsupportedField(f"chat_template_kwargs.{name} must be a boolean")
        add = self.add_generation_prompt if add is None else add
        cont = self.continue_final_message if cont is None else cont
        if cont and "add_generation_prompt" not in self.model_fields_set and \
                "add_generation_prompt" not in (self.chat_template_kwargs or {}):
            add = False  # continuing the last message implies not opening a new turn
        if cont and add:
            raise UnsupportedField("continue_final_message and add_generation_prompt cannot both be true")
        return add, cont, kwargs

    def requested_logprobs(self) -> Optional[int]:
        if self.top_logprobs is not None and not self.logprobs:
            raise UnsupportedField("top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None


class GenerateRequest(_NullIsDefault):
    """SGLang's native /generate: text or input_ids, sampling_params, stream, the
    log-probabilities (return_logprob, logprob_start_len, top_logprobs_num,
    return_text_in_logprobs) and rid. log_metrics and no_logs, which sglang-router
    sets on every request it forwards, only say what to log and are accepted. Any
    other field that is set (lora_path, image_data, ...) is refused by name."""

    model_config = ConfigDict(extra="allow")
    text: Optional[StrictStr] = None
    input_ids: Optional[list[StrictInt]] = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: StrictBool = False
    rid: Optional[StrictStr] = None
    return_logprob: StrictBool = False
    logprob_start_len: StrictInt = -1
    top_logprobs_num: StrictInt = Field(default=0, ge=0, le=MAX_LOGPROBS)
    return_text_in_logprobs: StrictBool = False
    log_metrics: StrictBool = True
    no_logs: StrictBool = False

    def check_supported(self) -> None:
        for name, value in (self.model_extra or {}).items():
            if value not in (None, False, [], {}, ""):
                raise UnsupportedField(f"'{name}' is not supported by this server")
        check_nesting("sampling_params", self.sampling_params)
        if not self.return_logprob and (self.logprob_start_len != -1 or self.top_logprobs_num):
            raise UnsupportedField("logprob_start_len and top_logprobs_num need return_logprob: true")
