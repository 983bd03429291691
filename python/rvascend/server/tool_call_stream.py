"""Tool calls read from a streamed answer as the model writes them, one detector per
output format (tool_calls.py names them): the events (tool_calls.Text, CallStart,
CallArguments, CallEnd) each API turns into its own deltas.

The rule, for a stream (a whole response parses the finished text instead: tool_calls.parse):
- Text outside calls is content as it comes; whitespace right before a call is not
  (the whole parse strips it).
- A call is announced (CallStart: its id and name) once it is certain to be one: its
  opening (qwen25's `<tool_call>`; llama3's "{" opening the answer, or after a ";"
  following a call) then `{"name": "<string>", "arguments": {` (llama3: "parameters"),
  the name before the arguments. Until then its text is held; if it turns out not to be
  a call it is content.
- From then on its arguments stream as they are generated, as canonical JSON text
  (json_stream.py: json.dumps' layout), so the pieces join to exactly the arguments the
  call ends with, which for well-formed output are the whole parse's, character for
  character. A valid call in another order (arguments before name) is announced when its
  object closes, its arguments in one piece.
- An announced call stays a call. If the output ends inside it (max_tokens, a stop
  string) or its JSON breaks, its arguments are closed where the valid text ended (an
  open string and the open containers closed, a key without its value left out), so the
  joined pieces still parse as an object, and CallEnd says it is incomplete (the
  Responses API's status "incomplete"). The rest of a broken call's text is its own and
  dropped: up to `</tool_call>` (qwen25); for llama3, whose calls are the whole output,
  the rest of the output.
- Each call's text after its JSON, up to `</tool_call>`, is the call's (qwen25); after
  llama3's calls, text that is not ";" and another call is content.
- With parallel_tool_calls false nothing of a call after the first goes out
  (chat_output.ChatOutput drops its events), and its text is not content either.
The whole parse differs only where the output is not well-formed (there a call that does
not parse is content, which a stream that already announced it cannot take back), where
an object repeats a key (the stream keeps each member: the same object once parsed), and
where a string holds `</tool_call>` (the whole parse ends the block there).

Linear: every character is read once (held text is joined once, when released).
"""

from __future__ import annotations

import json
import re
from typing import Optional, Union

from rvascend.server.json_stream import JsonStream
from rvascend.server.protocol import MAX_JSON_DEPTH
from rvascend.server.tool_calls import (CALL_CLOSE, CALL_OPEN, NOT_JSON, CallArguments, CallEnd, CallStart, Event,
                                        Text, WholeCalls, call_events, new_call_id, not_json, partial_marker,
                                        whole_call, whole_object_call)

_WS = re.compile(r"[ \t\n\r]*")
_SPACE = re.compile(r"\s*")


class CallObject:
    """One call's JSON object, `{"name": ..., "<arguments key>": {...}, ...}`, read member by
    member; its arguments' canonical text is released once the name is known."""

    def __init__(self, argument_keys: tuple[str, ...]) -> None:
        self.argument_keys = argument_keys
        self.state = "open"   # open | key | colon | value | after | done | failed
        self.first = True     # just inside "{": "}" may follow
        self.member: Optional[JsonStream] = None  # the key or value being read
        self.keep = False     # the member's text is kept: a key, the name
        self.kept: list[str] = []
        self.key: Optional[str] = None
        self.name: Optional[str] = None
        self.arguments: Optional[JsonStream] = None  # set when the call is announced

    def feed(self, text: str, i: int) -> tuple[int, str]:
        """Reads text[i:] up to the object's end; returns (where it stopped, the arguments'
        text released)."""
        out: list[str] = []
        n = len(text)
        while i < n and self.state not in ("done", "failed"):
            if self.member is not None:
                i = self._member(text, i, out)
                continue
            i = _WS.match(text, i).end()
            if i < n:
                i = self._structure(text[i], i)
        return i, "".join(out)

    def _member(self, text: str, i: int, out: list[str]) -> int:
        member = self.member
        i, piece = member.feed(text, i)
        if member is self.arguments:
            out.append(piece)
        elif self.keep:
            self.kept.append(piece)
        if member.failed:
            self.state = "failed"
        if not member.done:
            return i
        # A kept member is a string (a key, or the name's value): loads reads it back.
        value = json.loads("".join(self.kept)) if self.keep else None
        self.member, self.keep, self.kept = None, False, []
        if self.state == "key":
            self.key, self.state = value, "colon"
        else:
            if self.key == "name" and self.name is None and isinstance(value, str):
                self.name = value
            self.state = "after"
        return i

    def _structure(self, c: str, i: int) -> int:
        state = self.state
        if state == "open" and c == "{":
            self.state = "key"
            return i + 1
        if state == "key" and c == '"':
            self.member, self.keep = JsonStream(), True
            return i
        if state == "colon" and c == ":":
            self.state = "value"
            return i + 1
        if state == "value":
            self.member = JsonStream()
            if self.key in self.argument_keys and self.name is not None and self.arguments is None and c == "{":
                # As deep as a request may carry the call back (the whole parse's limit too).
                self.member = self.arguments = JsonStream(MAX_JSON_DEPTH)
            self.keep = self.key == "name" and self.name is None and c == '"'
            return i
        if state == "after" and c == ",":
            self.state, self.first = "key", False
            return i + 1
        if c == "}" and (state == "after" or state == "key" and self.first):
            self.state = "done"
            return i + 1
        self.state = "failed"
        return i


class _CallsStream:
    """What both formats share: content with its trailing whitespace held, and a call read
    from its opening to its end (`_read`), announced, streamed and closed."""

    argument_keys: tuple[str, ...] = ()  # the keys a call's arguments may have, preferred first
    streamed_keys: tuple[str, ...] = ()   # of those, the ones announced as they come (the preferred)

    def __init__(self) -> None:
        self.space: list[str] = []  # the content's trailing whitespace, held
        self.held: list[str] = []   # a call's text until it is announced
        self.reader: Optional[CallObject] = None
        self.count = 0              # calls announced
        self.current: Optional[CallStart] = None
        self.pieces: list[str] = []  # the current call's arguments so far

    def _content(self, text: str, events: list[Event]) -> None:
        body = text.rstrip()
        if body:
            events.append(Text("content", "".join(self.space) + body))
            self.space = []
        if len(body) < len(text):
            self.space.append(text[len(body):])

    def _flush(self, events: list[Event]) -> None:
        """At the end: held whitespace is content unless there were calls (the whole
        parse strips the content of a message with calls)."""
        if self.count == 0 and self.space:
            events.append(Text("content", "".join(self.space)))
        self.space = []

    def _begin(self, held: list[str]) -> None:
        self.reader, self.held = CallObject(self.streamed_keys), held

    def _read(self, text: str, i: int, events: list[Event]) -> tuple[int, str]:
        """Reads the call from text[i:]; returns (where it stopped, what it is so far): "more"
        (read on), "call" (ended), "broken" (an announced call whose JSON broke), "content"
        (not a call: self.held is its text; read on from the position as content)."""
        start = i
        i, piece = self.reader.feed(text, i)
        if self.current is None:
            if self.reader.arguments is not None:
                self._start(self.reader.name, events)
            else:
                self.held.append(text[start:i])
        if piece:
            self._piece(piece, events)
        if self.reader.state == "done":
            if self.current is not None:
                self._end(True, events)
                return i, "call"
            return i, self._whole(events)
        if self.reader.state == "failed":
            if self.current is None:
                return i, "content"
            self._cut(events)
            return i, "broken"
        return i, "more"

    def _start(self, name: str, events: list[Event]) -> None:
        self.current = CallStart(self.count, new_call_id(), name)
        self.count += 1
        self.space, self.held, self.pieces = [], [], []
        events.append(self.current)

    def _piece(self, piece: str, events: list[Event]) -> None:
        self.pieces.append(piece)
        events.append(CallArguments(self.current.index, piece))

    def _end(self, complete: bool, events: list[Event]) -> None:
        call = whole_call(self.current.id, self.current.name, "".join(self.pieces))
        events.append(CallEnd(self.current.index, call, complete))
        self.current, self.reader, self.pieces = None, None, []

    def _cut(self, events: list[Event]) -> None:
        """Ends the announced call where its valid text ended."""
        arguments = self.reader.arguments
        closing = arguments.closing()
        if closing:
            self._piece(closing, events)
        self._end(arguments.done, events)

    def _whole(self, events: list[Event]) -> str:
        """An object that closed without being announced: a call if it parses as one."""
        raw = "".join(self.held)
        try:
            value = json.loads(raw[raw.index("{"):], parse_constant=not_json)
        except NOT_JSON:
            return "content"
        call = whole_object_call(value, self.argument_keys)
        if call is None:
            return "content"
        events += call_events(self.count, call)
        self.count += 1
        self.space, self.held, self.reader = [], [], None
        return "call"

    def _finish_call(self, events: list[Event]) -> None:
        """The output ended inside a call."""
        if self.current is not None:
            self._cut(events)
        else:
            self._content("".join(self.held), events)
        self.held, self.reader = [], None


class Qwen25Stream(_CallsStream):
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks anywhere in the answer."""

    argument_keys = streamed_keys = ("arguments",)

    def __init__(self) -> None:
        super().__init__()
        self.state = "text"  # text | call | block (after a call's JSON, up to </tool_call>)
        self.pending = ""    # a possible marker's start
        self.after: list[str] = []  # a block's text after its call's JSON: content if it never closes

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        text, self.pending = self.pending + text, ""
        i = 0
        while i < len(text):
            if self.state == "text":
                i = self._text(text, i, events)
            elif self.state == "call":
                i, what = self._read(text, i, events)
                if what == "content":
                    self._content("".join(self.held), events)
                    self.held, self.reader, self.state = [], None, "text"
                elif what != "more":
                    self.state = "block"
            else:
                i = self._skip(text, i)
        return events

    def _text(self, text: str, i: int, events: list[Event]) -> int:
        at = text.find(CALL_OPEN, i)
        if at < 0:
            hold = partial_marker(text, CALL_OPEN, i)
            self._content(text[i:len(text) - hold], events)
            self.pending = text[len(text) - hold:]
            return len(text)
        self._content(text[i:at], events)
        self._begin([CALL_OPEN])
        self.state = "call"
        return at + len(CALL_OPEN)

    def _skip(self, text: str, i: int) -> int:
        at = text.find(CALL_CLOSE, i)
        if at < 0:
            hold = partial_marker(text, CALL_CLOSE, i)
            self.after.append(text[i:len(text) - hold])
            self.pending = text[len(text) - hold:]
            return len(text)
        self.state, self.after = "text", []
        return at + len(CALL_CLOSE)

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self.state == "text":
            self._content(self.pending, events)
        elif self.state == "call":
            self._finish_call(events)
        else:  # the output ended inside a block after its call: the rest is content (as `parse` has it)
            self._content("".join(self.after) + self.pending, events)
            self.after = []
        self.pending = ""
        self._flush(events)
        return events


class Llama3Stream(_CallsStream):
    """Bare JSON calls `{"name": ..., "parameters": {...}}` separated by ";", the whole answer."""

    argument_keys = ("parameters", "arguments")  # the whole parse's order of preference
    # "arguments" is the call's only if no "parameters" follows: such a call is announced
    # when its object closes, its arguments in one piece.
    streamed_keys = ("parameters",)

    def __init__(self) -> None:
        super().__init__()
        # start | call | between (after a call) | next (after its ";") | content | drop
        self.state = "start"

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        i, n = 0, len(text)
        while i < n:
            state = self.state
            if state == "content":
                self._content(text[i:], events)
                i = n
            elif state == "drop":
                i = n
            elif state == "call":
                i, what = self._read(text, i, events)
                if what == "content":
                    self._content("".join(self.held), events)
                    self.held, self.reader, self.state = [], None, "content"
                elif what != "more":
                    self.state = "between" if what == "call" else "drop"
            else:
                j = _SPACE.match(text, i).end()
                if state == "start":
                    self._content(text[i:j], events)  # held: content only if no call follows
                i = j
                if i == n:
                    break
                if state == "between" and text[i] == ";":
                    self.state, i = "next", i + 1
                elif state != "between" and text[i] == "{":
                    self._begin([])
                    self.state = "call"
                else:
                    self.state = "content"  # text after the calls, or an answer that is not one
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self.state == "call":
            self._finish_call(events)
        self._flush(events)
        return events


CallReader = Union[WholeCalls, Qwen25Stream, Llama3Stream]


def call_reader(parser: str, stream: bool) -> CallReader:
    """The reader of an answer's calls in `parser`'s format: streamed, or parsed whole at the end."""
    if not stream:
        return WholeCalls(parser)
    return Llama3Stream() if parser == "llama3" else Qwen25Stream()
