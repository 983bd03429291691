"""A model file's chat template, rendered as untrusted code.

Chat templates come from `tokenizer_config.json` or a GGUF's
`tokenizer.chat_template`: whoever wrote the model file wrote them. They run in
Jinja's immutable sandbox (no attribute of Python internals, no mutation of the
values passed in), so a template like `{{ cycler.__init__.__globals__.os... }}`
raises a SecurityError instead of running a command (the flaw of
llama-cpp-python's CVE-2024-34359).

The environment offers what Hugging Face transformers' chat templates expect,
so a template renders here as `apply_chat_template` renders it: trim_blocks and
lstrip_blocks, the `loopcontrols` extension (`{% break %}`), `raise_exception`,
`strftime_now`, and a `tojson` that keeps non-ASCII characters, escapes no HTML
and keeps key order. `namespace` refuses underscore attributes (a namespace is a
writable object inside the sandbox); `dict` builds plain dicts.
"""

from __future__ import annotations

import datetime
import functools
import time
from typing import Any, Optional, Union

import jinja2
import jinja2.ext
import jinja2.sandbox
import jinja2.utils

from rvascend.tokenizer import template_budget


class ChatTemplateError(ValueError):
    """The template refused the conversation (its raise_exception) or failed on it;
    the message is the template's own or names the failure."""


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace without underscore attributes."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not set the attribute {name!r} on a namespace")


class _PlainDict:
    """`dict(...)` for templates: builds plain dicts, exposes nothing else of the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: Any) -> None:
    raise jinja2.exceptions.TemplateError(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators: Optional[tuple[str, str]] = None, sort_keys: bool = False) -> str:
    return template_budget.capped_json(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                       sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _BudgetedEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The immutable sandbox with the size checks of template_budget on every
    operation that can build a large value (the line and time budget is the
    render's, see ChatTemplate.render)."""

    intercepted_binops = frozenset({"*", "+", "%", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        template_budget.check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's
        template_budget.check_call(__obj, args, kwargs)
        return template_budget.check_result("a call's result",
                                            super().call(__context, __obj, *args, **kwargs))

    @staticmethod
    def concat(pieces: Any) -> str:
        return template_budget.check_result("a block's text", "".join(pieces))


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = _BudgetedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters.update({name: template_budget.capped_filter(name, f) for name, f in env.filters.items()})
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=_Namespace,
                       dict=_PlainDict())
    return env


def _plain(value: Any) -> Any:
    """Only JSON types reach the template: anything else could carry methods the
    sandbox does not know to be dangerous."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    # Subclasses (enums, numpy scalars) stripped to their base type.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return f"<{type(value).__name__}>"


# Appended to the last message when the client asks to continue it; what the
# template writes after it (the end-of-turn marker) is cut off with it.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# What ChatTemplate.probe renders: the turns every chat template accepts.
_PROBE_CONVERSATION = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi. How can I help?"},
                       {"role": "user", "content": "Name a fruit."}]


class ChatTemplate:
    """A compiled chat template. Compilation errors surface at construction."""

    def __init__(self, source: str, special_tokens: Optional[dict[str, str]] = None) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ChatTemplateError(f"the model's chat template does not compile: {e.message} "
                                    f"(template line {e.lineno})") from None
        # `~` compiles to calls of these two module globals of the template's code.
        namespace = self._template.root_render_func.__globals__
        for name in ("str_join", "markup_join"):
            namespace[name] = template_budget.capped_join(namespace[name])
        self.source = source
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               continue_final_message: Union[bool, str] = False,
               template_kwargs: Optional[dict[str, Any]] = None) -> str:
        """The prompt text of a conversation. With `continue_final_message`, the
        text ends inside the last message (a prefill the model continues)."""
        messages = [{k: v for k, v in m.items() if v is not None} for m in _plain(messages)]
        if continue_final_message:
            if add_generation_prompt:
                raise ChatTemplateError("continue_final_message and add_generation_prompt cannot both be set")
            field = continue_final_message if isinstance(continue_final_message, str) else "content"
            last = messages[-1].get(field) if messages else None
            if not isinstance(last, str):
                raise ChatTemplateError(f"continue_final_message: the last message has no text {field!r} to continue")
            messages[-1][field] = last + _CONTINUE_TAG
        variables = {**self.special_tokens, **_plain(template_kwargs or {})}
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt)
        try:
            text = self._render(variables)
        except template_budget.RenderBudgetExceeded as e:
            raise ChatTemplateError(f"the chat template went over its budget on this conversation: {e}") from None
        except jinja2.exceptions.SecurityError as e:
            raise ChatTemplateError(f"the chat template tried an operation the sandbox forbids: {e}") from None
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"the chat template refused the conversation: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError,
                RecursionError, OverflowError) as e:
            raise ChatTemplateError(f"the chat template failed on this conversation: {type(e).__name__}: {e}") \
                from None
        if continue_final_message:
            at = text.rfind(_CONTINUE_TAG.strip())
            if at < 0:
                raise ChatTemplateError("continue_final_message: the chat template dropped the final message")
            text = text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
        return text

    def probe(self, max_seconds: float = template_budget.MAX_SECONDS) -> None:
        """Renders a short conversation once, within the render budget and
        `max_seconds`; ChatTemplateError if the template cannot serve one. Run at
        start-up, so a model file whose template loops or fails is refused then."""
        start = time.monotonic()
        self.render(_PROBE_CONVERSATION, add_generation_prompt=True)
        took = time.monotonic() - start
        if took > max_seconds:
            raise ChatTemplateError(f"the chat template took {took:.1f} s to render a {len(_PROBE_CONVERSATION)}"
                                    f"-message conversation (the limit is {max_seconds:g} s)")

    def _render(self, variables: dict[str, Any]) -> str:
        """The template's text, within template_budget's line, time and size limits."""
        pieces, size = [], 0
        with template_budget.LineBudget():
            for piece in self._template.generate(**variables):
                size += len(piece)
                template_budget.check_size("the rendered prompt", size)
                pieces.append(piece)
        return "".join(pieces)
