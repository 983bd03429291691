"""One JSON value read as its text arrives, its canonical text released as it goes:
what a streamed tool call's arguments are made of (server/tool_call_stream.py).

Canonical is the layout `json.dumps(json.loads(raw), ensure_ascii=False)` writes: ", "
and ": " separators, strings escaped as dumps escapes them (`\\/` and `\\u00e9` read
back as "/" and "é"; a lone surrogate stays escaped, as UTF-8 cannot carry it: see
`canonical`), numbers as dumps writes what loads reads (`1.50` -> `1.5`; a number no
float holds, `1e400`, and NaN or Infinity are not JSON and break the value). So
for a value without repeated keys the released pieces join to exactly the text the
whole-text parse gives (tool_calls.parse); with a repeated key they keep every member,
which parses to the same object.

What is released can always be closed into valid JSON (`closing()`): a separator and a
key wait for their value's first character, a number or literal until it is whole, and
a cut value is closed by ending its open string and containers.

Linear in the text: each character is looked at once (a run of plain string characters
is copied as one slice) and nothing is re-read; the nesting is an explicit stack, so
depth costs no recursion. Written here, not taken from a library: the JSON parsers that
read partial text (partial-json-parser, jiter's partial mode) re-read the whole text on
every call, which is quadratic over a stream.
"""

from __future__ import annotations

import json
import re
from typing import Optional

_WS = re.compile(r"[ \t\n\r]*")
_PLAIN = re.compile('[^"\\\\\x00-\x1f\ud800-\udfff]*')  # string characters json.dumps writes as they are
_NUMBER_CHARS = re.compile(r"[-+0-9.eE]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LETTERS = re.compile(r"[a-z]*")
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_LOW = re.compile(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}")
# What may still become an escaped low surrogate (json.loads joins it to a high one before it).
_LOW_START = re.compile(r"(?:\\(?:u(?:[dD](?:[c-fC-F][0-9a-fA-F]{0,2})?)?)?)?")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_LITERALS = ("true", "false", "null")


def canonical(value: object) -> str:
    """`value`'s canonical JSON text (ValueError for NaN and infinities)."""
    return escape_lone_surrogates(json.dumps(value, ensure_ascii=False, allow_nan=False))


def escape_lone_surrogates(text: str) -> str:
    """`text` with each lone surrogate (json.loads reads one from an unpaired `\\ud800`)
    written as its escape: the same JSON, and text UTF-8 can encode."""
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class JsonStream:
    """Reads one JSON value from the pieces fed to it (`feed`) and stops right after it;
    containers nested deeper than `max_depth` break it."""

    def __init__(self, max_depth: Optional[int] = None) -> None:
        self.max_depth = max_depth
        self.stack: list[str] = []     # the open containers' closers, "}" or "]"
        # value | key | colon | after (a container's member) | string | number | literal
        self.state = "value"
        self.first = False             # just inside "{" or "[": a closer may follow
        self.done = False
        self.failed = False
        self.in_key = False            # the open string is a key (held, not released)
        self.held: list[str] = []      # separator and key waiting for their value
        self.token: list[str] = []     # the number, literal or key being read
        self.tail = ""                 # an escape the last piece cut short

    def feed(self, text: str, pos: int = 0) -> tuple[int, str]:
        """Reads text[pos:] up to the value's end; returns (the position it stopped at:
        after the value, at the character that broke it, or len(text)) and the canonical
        text this releases."""
        if self.done or self.failed:
            return pos, ""
        offset = pos - len(self.tail)  # positions in `text` of what is read after the tail
        i = 0
        if self.tail:  # copied only then: a long piece read member by member stays linear
            text, self.tail = self.tail + text[pos:], ""
        else:
            i, offset = pos, 0
        out: list[str] = []
        n = len(text)
        while i < n and not (self.done or self.failed):
            if self.state == "string":
                i = self._string(text, i, out)
            elif self.state in ("number", "literal"):
                i = self._scalar(text, i, out)
            else:
                i = _WS.match(text, i).end()
                if i < n:
                    i = self._structure(text[i], i, out)
        # A failure inside the tail is reported at `pos`: the caller already has that text.
        return max(i + offset, pos), "".join(out)

    def _structure(self, c: str, i: int, out: list[str]) -> int:
        state = self.state
        if state == "value":
            return self._value(c, i, out)
        if state == "key":
            if c == '"':
                self.state, self.in_key = "string", True
                return i + 1
            if c == "}" and self.first:
                return self._close(c, i, out)
        elif state == "colon":
            if c == ":":
                self.held.append(": ")
                self.state = "value"
                return i + 1
        elif state == "after":
            if c == ",":
                self.held.append(", ")
                self.state, self.first = ("key" if self.stack[-1] == "}" else "value"), False
                return i + 1
            if c == self.stack[-1]:
                return self._close(c, i, out)
        return self._fail(i)

    def _value(self, c: str, i: int, out: list[str]) -> int:
        if c in "{[":
            if self.max_depth is not None and len(self.stack) >= self.max_depth:
                return self._fail(i)
            self._release(out, c)
            self.stack.append("}" if c == "{" else "]")
            self.state, self.first = ("key" if c == "{" else "value"), True
            return i + 1
        if c == '"':
            self._release(out, '"')
            self.state, self.in_key = "string", False
            return i + 1
        if c in "-0123456789":
            self.state = "number"
            return i
        if c in "tfn":
            self.state = "literal"
            return i
        if c == "]" and self.first:
            return self._close(c, i, out)
        return self._fail(i)

    def _close(self, closer: str, i: int, out: list[str]) -> int:
        self.stack.pop()
        out.append(closer)
        self._after_value()
        return i + 1

    def _after_value(self) -> None:
        self.state, self.first = "after", False
        self.done = not self.stack

    def _release(self, out: list[str], text: str) -> None:
        out.extend(self.held)
        self.held = []
        out.append(text)

    def _fail(self, i: int) -> int:
        self.failed = True
        return i

    def _string(self, text: str, i: int, out: list[str]) -> int:
        """Reads string characters from i: up to the closing quote, or all of `text`."""
        sink = self.token if self.in_key else out
        n = len(text)
        while True:
            j = _PLAIN.match(text, i).end()
            if j > i:
                sink.append(text[i:j])
                i = j
            if i == n:
                return i
            if text[i] == '"':
                return self._string_end(i + 1, out)
            if "\ud800" <= text[i] <= "\udfff":  # a raw lone surrogate (not from a decoder): escaped
                sink.append(escape_lone_surrogates(text[i]))
                i += 1
                continue
            if text[i] != "\\":  # a raw control character: json.loads refuses it (strict)
                return self._fail(i)
            end, char = self._escape(text, i)
            if end < 0:
                return self._fail(i)
            if char is None:  # cut short: kept for the next piece
                self.tail = text[i:]
                return n
            sink.append(escape_lone_surrogates(json.dumps(char, ensure_ascii=False)[1:-1]))
            i = end

    def _escape(self, text: str, i: int) -> tuple[int, Optional[str]]:
        """(the escape's end, its character) at text[i] == "\\"; (i, None) if the text
        ends before it is known, (-1, None) if it is not an escape."""
        n = len(text)
        if i + 1 >= n:
            return i, None
        e = text[i + 1]
        if e in _ESCAPES:
            return i + 2, _ESCAPES[e]
        if e != "u":
            return -1, None
        if i + 6 > n:
            return (i, None) if re.fullmatch(r"[0-9a-fA-F]*", text[i + 2:]) else (-1, None)
        if not _HEX4.fullmatch(text, i + 2, i + 6):
            return -1, None
        code, end = int(text[i + 2:i + 6], 16), i + 6
        if 0xD800 <= code <= 0xDBFF:
            # json.loads joins an escaped surrogate pair into one character.
            if n - end < 6 and _LOW_START.fullmatch(text, end):
                return i, None
            if _LOW.match(text, end):
                low = int(text[end + 2:end + 6], 16)
                return end + 6, chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))
        return end, chr(code)

    def _string_end(self, i: int, out: list[str]) -> int:
        if self.in_key:
            key = "".join(self.token)
            self.token = []
            self.held += ['"', key, '"']
            self.state = "colon"
            return i
        out.append('"')
        self._after_value()
        return i

    def _scalar(self, text: str, i: int, out: list[str]) -> int:
        chars = _NUMBER_CHARS if self.state == "number" else _LETTERS
        j = chars.match(text, i).end()
        self.token.append(text[i:j])
        if j == len(text):
            return j  # the number or literal may go on in the next piece
        whole = self._scalar_text()
        if whole is None:
            return self._fail(j)
        self.token = []
        self._release(out, whole)
        self._after_value()
        return j

    def _scalar_text(self) -> Optional[str]:
        token = "".join(self.token)
        if self.state == "literal":
            return token if token in _LITERALS else None
        if not _NUMBER.fullmatch(token):
            return None
        try:
            return json.dumps(json.loads(token), allow_nan=False)
        except ValueError:  # an integer past Python's 4300-digit limit, a number past a float's range
            return None

    def closing(self) -> str:
        """The text that closes what was released into valid JSON, for a value the text
        ends (or breaks) inside: a number read so far stands if it is whole, an open string
        is ended, open containers are closed; a key without its value is left out."""
        if self.done:
            return ""
        parts = []
        if self.state in ("number", "literal") and not self.failed:
            whole = self._scalar_text()
            if whole is not None:
                parts += self.held + [whole]
        elif self.state == "string" and not self.in_key:
            parts.append('"')
        return "".join(parts) + "".join(reversed(self.stack))
