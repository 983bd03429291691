"""The work one chat-template render may do: lines run, seconds, and the size of
any string or list it builds.

Jinja's sandbox stops a template from reaching Python internals but not from
working: nested `range(100000)` loops never finish and `'x' * 200000000`
allocates 200 MB in one operation. A chat template comes from the model file,
and the conversation it renders from the client, so both bounds matter:

- lines: the render's frames are traced and every template line run counts;
  past the budget the render stops;
- seconds: the deadline is checked on every template line and before every
  filter, method call and operator the size checks see, so a loop of heavy
  filters (`s|list|join` on a long string) stops within one filter of it;
- sizes: every operation that can make a large value from small ones (`*`,
  `+`, `%`, `**`, `~`, the padding and replacing methods and filters) is
  checked before it runs, and every call's and filter's result after;
  `tojson` is written piece by piece and stops at the limit, so a deeply
  nested value indented (Llama 3.1's `tojson(indent=4)` of a client's tool
  parameters) is never built whole.

Each raises RenderBudgetExceeded, which the template cannot catch.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import threading
import time
from typing import Any, Callable, Optional, Union

# A generous bound on real templates: Qwen3's tool-calling template renders a
# 20-message conversation with tools in about 3,000 lines.
MAX_LINES = 2_000_000
MAX_SECONDS = 5.0
# Characters of any one string, items of any one list, and of the output.
MAX_SIZE = 16 * 2**20
# A width or count argument (center(w), '%*d', '{:>w}') over this is refused.
_MAX_WIDTH = 2**16
# tojson's indent (spaces, or the length of an indent string): templates indent
# by 2 or 4; every line of nested JSON repeats it once per level.
_MAX_JSON_INDENT = 8
_PERCENT_WIDTH = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*:[^{}]*?(\d+)[^{}]*\}")
_NESTED_FORMAT = re.compile(r"\{[^{}]*:[^{}]*\{")
_TEMPLATE_FILE = "<template>"


class RenderBudgetExceeded(Exception):
    """A render went over one of the limits; the message says which."""


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 0


# The LineBudget of the render running in this thread (renders run in worker threads).
_active = threading.local()


def check_deadline() -> None:
    """RenderBudgetExceeded if this thread's render is past its deadline (no-op outside one)."""
    budget: Optional[LineBudget] = getattr(_active, "budget", None)
    if budget is not None:
        budget.check_deadline()


def check_size(what: str, size: int) -> None:
    if size > MAX_SIZE:
        raise RenderBudgetExceeded(f"{what} would hold {size} items, over the limit of {MAX_SIZE}")


def _check_widths(fmt: str) -> None:
    for m in _PERCENT_WIDTH.finditer(fmt):
        for part in m.groups():
            if part == "*" or (part and int(part) > _MAX_WIDTH):
                raise RenderBudgetExceeded(f"a format width of {part!r} (the limit is {_MAX_WIDTH})")
    if _NESTED_FORMAT.search(fmt):
        raise RenderBudgetExceeded("a format field whose width comes from an argument")
    for m in _FORMAT_WIDTH.finditer(fmt):
        if int(m.group(1)) > _MAX_WIDTH:
            raise RenderBudgetExceeded(f"a format width of {m.group(1)} (the limit is {_MAX_WIDTH})")


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuses an operation whose result would be over the limits, before it runs."""
    check_deadline()
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if _sized(seq) and isinstance(times, int):
                check_size(f"{type(seq).__name__} * {times}", _sized(seq) * max(times, 0))
    elif operator == "+":
        if _sized(left) and _sized(right):
            check_size(f"{type(left).__name__} + {type(right).__name__}", _sized(left) + _sized(right))
    elif operator == "%":
        if isinstance(left, str):
            _check_widths(left)
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 \
                and abs(left).bit_length() * right > 64 * _MAX_WIDTH:
            raise RenderBudgetExceeded(f"{left} ** {right} is too large a number")


# String methods and filters whose result size an argument sets.
_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})
_WIDTH_FILTERS = frozenset({"center", "indent", "wordwrap"})


def check_call(obj: Any, args: tuple, kwargs: dict) -> None:
    """Refuses a method call whose result would be over the limits, before it runs."""
    check_deadline()
    target = getattr(obj, "__wrapped__", obj)
    owner, name = getattr(target, "__self__", None), getattr(target, "__name__", "")
    if not isinstance(owner, str):
        return
    if name in _WIDTH_METHODS:
        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and a > _MAX_WIDTH:
                raise RenderBudgetExceeded(f"str.{name}({a}): the limit is {_MAX_WIDTH}")
    elif name in ("format", "format_map"):
        _check_widths(owner)
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        hits = owner.count(args[0]) if args[0] else len(owner) + 1
        check_size("str.replace", len(owner) + hits * len(args[1]))
    elif name == "join" and args and isinstance(args[0], (list, tuple)):
        check_size("str.join", sum(_sized(x) for x in args[0]) + len(owner) * len(args[0]))


def check_result(what: str, value: Any) -> Any:
    check_size(what, _sized(value))
    return value


def capped_filter(name: str, f: Callable) -> Callable:
    """A Jinja filter whose width arguments and result are checked."""

    @functools.wraps(f)
    def run(*args: Any, **kwargs: Any) -> Any:
        check_deadline()
        if name in _WIDTH_FILTERS:
            for a in (*args[1:], *kwargs.values()):
                if isinstance(a, int) and not isinstance(a, bool) and a > _MAX_WIDTH:
                    raise RenderBudgetExceeded(f"the {name} filter's argument {a}: the limit is {_MAX_WIDTH}")
                if name == "indent" and isinstance(a, str) and args and isinstance(args[0], str):
                    check_size("the indent filter", len(args[0]) + (args[0].count("\n") + 1) * len(a))
        elif name == "format":
            for a in args:
                if isinstance(a, str):
                    _check_widths(a)
                    break
        elif name == "replace":
            strings = [a for a in args if isinstance(a, str)]
            if len(strings) >= 3:
                s, old, new = strings[:3]
                check_size("the replace filter", len(s) + (s.count(old) if old else len(s) + 1) * len(new))
        return check_result(f"the {name} filter's result", f(*args, **kwargs))

    return run


def capped_join(join: Callable) -> Callable:
    """`~` concatenation, checked after it runs: each operand is already within the
    limit, so the one result is at most a few times it."""

    @functools.wraps(join)
    def run(seq: Any) -> Any:
        check_deadline()
        return check_result("a '~' concatenation", join(seq))

    return run


def capped_json(value: Any, indent: Optional[Union[int, str]] = None, **options: Any) -> str:
    """json.dumps(value, indent=indent, **options), written piece by piece and
    refused as soon as the text passes MAX_SIZE characters or the deadline
    passes, never after building it whole."""
    if isinstance(indent, int) and not isinstance(indent, bool) and indent > _MAX_JSON_INDENT or \
            isinstance(indent, str) and len(indent) > _MAX_JSON_INDENT:
        raise RenderBudgetExceeded(f"tojson(indent={indent!r}): the limit is {_MAX_JSON_INDENT}")
    pieces, size = [], 0
    # Without _one_shot, iterencode is the pure-Python encoder, a generator of small
    # pieces (json.dumps's C encoder returns only the whole text). Its generators,
    # one per nesting level, all resume for every piece: untraced (they run no
    # template code), a refusal takes a fourth of the time.
    trace = sys.gettrace()
    sys.settrace(None)
    try:
        for piece in json.JSONEncoder(indent=indent, **options).iterencode(value):
            size += len(piece)
            check_size("tojson's text", size)
            check_deadline()
            pieces.append(piece)
    finally:
        sys.settrace(trace)
    return "".join(pieces)


class LineBudget:
    """Counts the template lines a render runs in this thread and stops it past
    `max_lines` or `max_seconds` (None: MAX_LINES or MAX_SECONDS as they are
    when it is made). Use as a context manager around the render."""

    def __init__(self, max_lines: Optional[int] = None, max_seconds: Optional[float] = None) -> None:
        self.max_lines = MAX_LINES if max_lines is None else max_lines
        self.max_seconds = MAX_SECONDS if max_seconds is None else max_seconds
        self.lines = 0

    def __enter__(self) -> "LineBudget":
        self.deadline = time.monotonic() + self.max_seconds
        self._previous = sys.gettrace(), getattr(_active, "budget", None)
        _active.budget = self
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: Any) -> None:
        trace, _active.budget = self._previous
        sys.settrace(trace)

    def check_deadline(self) -> None:
        if time.monotonic() > self.deadline:
            raise RenderBudgetExceeded(f"it ran over {self.max_seconds:g} s")

    def _call(self, frame, event, arg):
        # Only the template's own frames are traced line by line; Jinja's runtime
        # and the filters run untraced (their work is bounded by the size checks,
        # their time by the deadline checks in the wrappers).
        return self._line if frame.f_code.co_filename == _TEMPLATE_FILE else None

    def _line(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines > self.max_lines:
                raise RenderBudgetExceeded(f"it ran over {self.max_lines} template lines")
            self.check_deadline()
        return self._line
