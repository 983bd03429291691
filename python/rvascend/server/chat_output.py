"""One chat choice's generated text split as a chat client reads it: the reasoning
(`reasoning_content`, with --reasoning-parser qwen3: the text inside
`<think>...</think>`), the answer (`content`) and the tool calls (`tool_calls`,
server/tool_calls.py).

Streaming, text goes out as soon as it cannot be part of a marker: a partial
`</think>` at the end of a chunk waits for the next one. A stream's tool calls go out as
they are generated (tool_call_stream.py states when a call is announced and how a cut
one ends); a whole response's are parsed from the finished text. Without a reasoning
parser or tools, the text is content as it comes.

The split is a list of events in output order (tool_calls.Text, CallStart,
CallArguments, CallEnd), which the Responses and Messages APIs turn into their items
and blocks; `chat_delta` folds them into one chat completion delta.
"""

from __future__ import annotations

from typing import Any, Optional

from rvascend.server.tool_call_stream import call_reader
from rvascend.server.tool_calls import CallArguments, CallEnd, CallStart, Event, Text, ToolRequest, partial_marker

REASONING_PARSERS = ("qwen3",)
THINK_START, THINK_END = "<think>", "</think>"


def starts_in_reasoning(prompt: str) -> bool:
    """Whether the prompt leaves a <think> block open for the model (Qwen3.5's and
    Qwen3-Thinking's templates open it in the generation prompt)."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_START)


def chat_delta(events: list[Event]) -> dict[str, Any]:
    """A chat completion delta's fields of these events: reasoning_content, content, and
    tool_calls (a call's first entry carries its id, type and name; the others, by index,
    only the next piece of its arguments)."""
    delta: dict[str, Any] = {}
    calls: dict[int, dict[str, Any]] = {}
    for e in events:
        if isinstance(e, Text):
            delta[e.field] = delta.get(e.field, "") + e.text
        elif isinstance(e, CallStart):
            calls[e.index] = {"index": e.index, "id": e.id, "type": "function",
                              "function": {"name": e.name, "arguments": ""}}
        elif isinstance(e, CallArguments):
            entry = calls.setdefault(e.index, {"index": e.index, "function": {"arguments": ""}})
            entry["function"]["arguments"] += e.text
    if calls:
        delta["tool_calls"] = list(calls.values())
    return delta


class ChatOutput:
    """Splits one choice's text, chunk by chunk (`events`, then `end`); `stream` says
    whether its tool calls are read as they come or parsed from the finished text."""

    def __init__(self, reasoning: bool, in_reasoning: bool, tools: Optional[ToolRequest], parser: str,
                 stream: bool = False) -> None:
        self.reasoning = reasoning
        # "start": a <think> may open the output; "think": inside it; "answer": after it.
        self.mode = "think" if reasoning and in_reasoning else ("start" if reasoning else "answer")
        self.tools = tools if tools is not None and tools.parse else None
        self.calls_reader = call_reader(parser, stream) if self.tools is not None else None
        self.pending = ""    # text held back: a possible <think> or </think>
        self.lead: list[str] = []  # whitespace before a possible <think>
        self.content: list[str] = []
        self.reasoning_text: list[str] = []
        self.calls: list[dict[str, Any]] = []  # the client's calls, whole, as they end

    def events(self, text: str) -> list[Event]:
        """The events this text releases, in order."""
        events: list[Event] = []
        text, self.pending = self.pending + text, ""
        while text:
            if self.mode == "start":
                stripped = text.lstrip()
                if not stripped:  # whitespace before a possible <think>: kept aside, never read again
                    self.lead.append(text)
                    break
                if stripped.startswith(THINK_START):
                    self.mode, text, self.lead = "think", stripped[len(THINK_START):], []
                    continue
                if THINK_START.startswith(stripped):  # still possibly "<think>"
                    self.pending = text
                    break
                self.mode, text, self.lead = "answer", "".join(self.lead) + text, []
                continue
            if self.mode == "think":
                at = text.find(THINK_END)
                if at >= 0:
                    events.append(Text("reasoning_content", text[:at]))
                    self.mode, text = "answer", text[at + len(THINK_END):].lstrip("\n")
                    continue
                hold = partial_marker(text, THINK_END)
                events.append(Text("reasoning_content", text[:len(text) - hold]))
                self.pending = text[len(text) - hold:]
                break
            if self.calls_reader is None:
                events.append(Text("content", text))
            else:
                events += self.calls_reader.feed(text)
            break
        return self._kept(events)

    def end(self) -> list[Event]:
        """The events the end of the choice releases: held-back text, the calls' ends."""
        events: list[Event] = []
        held, self.pending, self.lead = "".join(self.lead) + self.pending, "", []
        if held:
            if self.mode == "start" and self.calls_reader is not None:
                events += self.calls_reader.feed(held)  # an answer that is only this: read as any answer
            else:
                events.append(Text("reasoning_content" if self.mode == "think" else "content", held))
        if self.calls_reader is not None:
            events += self.calls_reader.finish()
        return self._kept(events)

    def _kept(self, events: list[Event]) -> list[Event]:
        """The events a client gets (no empty text; with parallel_tool_calls false, the
        first call's only: the others are not content either), recorded for `message`."""
        kept: list[Event] = []
        for e in events:
            if isinstance(e, Text):
                if not e.text:
                    continue
                (self.reasoning_text if e.field == "reasoning_content" else self.content).append(e.text)
            elif not self.tools.keeps(e.index):
                continue
            elif isinstance(e, CallEnd):
                self.calls.append(e.call)
            kept.append(e)
        return kept

    def message(self, text: str) -> tuple[dict[str, Any], bool]:
        """A whole choice's message from its text, and whether it holds tool calls."""
        self.events(text)
        self.end()
        calls = self.calls
        content = "".join(self.content).strip() if self.reasoning or calls else "".join(self.content)
        message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning_text).strip() or None
        if calls:
            message["tool_calls"] = calls
        return message, bool(calls)
