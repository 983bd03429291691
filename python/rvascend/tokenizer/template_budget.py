"""The work one chat-template render may do: lines run, seconds, and the size of
any string or list it builds.

Jinja's sandbox stops a template from reaching Python internals but not from
working: nested `range(100000)` loops never finish and `'x' * 200000000`
allocates 200 MB in one operation. A chat template comes from the model file,
and the conversation it renders from the client, so both bounds matter:

- lines: the render's frames are traced and every template line run counts;
  past the budget (or the deadline, checked every 1024 lines) the render stops;
- sizes: every operation that can make a large value from small ones (`*`,
  `+`, `%`, `**`, `~`, the padding and replacing methods and filters) is
  checked before it runs, and every call's and filter's result after.

Both raise RenderBudgetExceeded, which the template cannot catch.
"""

from __future__ import annotations

import functools
import re
import sys
import time
from typing import Any, Callable

# A generous bound on real templates: Qwen3's tool-calling template renders a
# 20-message conversation with tools in about 3,000 lines.
MAX_LINES = 2_000_000
MAX_SECONDS = 5.0
# Characters of any one string, items of any one list, and of the output.
MAX_SIZE = 16 * 2**20
# A width or count argument (center(w), '%*d', '{:>w}') over this is refused.
_MAX_WIDTH = 2**16
_PERCENT_WIDTH = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*:[^{}]*?(\d+)[^{}]*\}")
_NESTED_FORMAT = re.compile(r"\{[^{}]*:[^{}]*\{")
_TEMPLATE_FILE = "<template>"


class RenderBudgetExceeded(Exception):
    """A render went over one of the limits; the message says which."""


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 0


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
        return check_result("a '~' concatenation", join(seq))

    return run


class LineBudget:
    """Counts the template lines a render runs in this thread and stops it past
    MAX_LINES or MAX_SECONDS. Use as a context manager around the render."""

    def __init__(self, max_lines: int = MAX_LINES, max_seconds: float = MAX_SECONDS) -> None:
        self.max_lines, self.max_seconds = max_lines, max_seconds
        self.lines = 0

    def __enter__(self) -> "LineBudget":
        self.deadline = time.monotonic() + self.max_seconds
        self._previous = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self._previous)

    def _call(self, frame, event, arg):
        # Only the template's own frames are traced line by line; Jinja's runtime
        # and the filters run untraced (their work is bounded by the size checks).
        return self._line if frame.f_code.co_filename == _TEMPLATE_FILE else None

    def _line(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines > self.max_lines:
                raise RenderBudgetExceeded(f"it ran over {self.max_lines} template lines")
            if not self.lines & 1023 and time.monotonic() > self.deadline:
                raise RenderBudgetExceeded(f"it ran over {self.max_seconds:g} s")
        return self._line
