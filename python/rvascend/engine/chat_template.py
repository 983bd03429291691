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
import json
from typing import Any, Optional, Union

import jinja2
import jinja2.ext
import jinja2.sandbox
import jinja2.utils


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
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
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


class ChatTemplate:
    """A compiled chat template. Compilation errors surface at construction."""

    def __init__(self, source: str, special_tokens: Optional[dict[str, str]] = None) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ChatTemplateError(f"the model's chat template does not compile: {e.message} "
                                    f"(template line {e.lineno})") from None
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
            text = self._template.render(**variables)
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
