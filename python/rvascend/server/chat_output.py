"""One chat choice's generated text split as a chat client reads it: the reasoning
(`reasoning_content`, with --reasoning-parser qwen3: the text inside
`<think>...</think>`), the answer (`content`) and the tool calls (`tool_calls`,
server/tool_calls.py).

Streaming, text goes out as soon as it cannot be part of a marker: a partial
`</think>` at the end of a chunk waits for the next one, and once a tool call
begins everything after it waits for the end, where it is parsed (one
`delta.tool_calls` chunk per call, each with its whole arguments, as OpenAI's
stream allows). Without a reasoning parser or tools, the text is content as it comes.
"""

from __future__ import annotations

from typing import Any, Optional

from rvascend.server import tool_calls
from rvascend.server.tool_calls import ToolRequest

REASONING_PARSERS = ("qwen3",)
THINK_START, THINK_END = "<think>", "</think>"


def starts_in_reasoning(prompt: str) -> bool:
    """Whether the prompt leaves a <think> block open for the model (Qwen3.5's and
    Qwen3-Thinking's templates open it in the generation prompt)."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_START)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (text to hold back)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ChatOutput:
    """Splits one choice's text, chunk by chunk (feed) or at the end (finish)."""

    def __init__(self, reasoning: bool, in_reasoning: bool, tools: Optional[ToolRequest], parser: str) -> None:
        self.reasoning = reasoning
        # "start": a <think> may open the output; "think": inside it; "answer": after it.
        self.mode = "think" if reasoning and in_reasoning else ("start" if reasoning else "answer")
        self.tools = tools if tools is not None and tools.parse else None
        self.parser = parser
        self.pending = ""    # text held back: a possible marker's start
        self.call: list[str] = []  # from a tool call's start on: parsed at the end
        self.content: list[str] = []
        self.said = False  # some content other than whitespace went out
        self.reasoning_text: list[str] = []

    def feed(self, text: str) -> dict[str, str]:
        """The delta fields this text releases ({"reasoning_content": ..., "content": ...})."""
        delta: dict[str, str] = {}
        text = self.pending + text
        self.pending = ""
        while text:
            if self.mode == "start":
                stripped = text.lstrip()
                if stripped.startswith(THINK_START):
                    self.mode, text = "think", stripped[len(THINK_START):]
                    continue
                if THINK_START.startswith(stripped):  # still possibly "<think>"
                    self.pending = text
                    return delta
                self.mode = "answer"
                continue
            if self.mode == "think":
                at = text.find(THINK_END)
                if at >= 0:
                    self._add(delta, "reasoning_content", text[:at])
                    self.mode, text = "answer", text[at + len(THINK_END):].lstrip("\n")
                    continue
                hold = _partial_suffix(text, THINK_END)
                self._add(delta, "reasoning_content", text[:len(text) - hold])
                self.pending = text[len(text) - hold:]
                return delta
            # answer
            if self.call or self.tools is None:
                if self.call:
                    self.call.append(text)
                else:
                    self._add(delta, "content", text)
                return delta
            marker = tool_calls.start_marker(self.parser)
            at = text.find(marker)
            if self.parser == "llama3" and at >= 0 and (self.said or text[:at].strip()):
                at = -1  # llama3's calls are the whole output: a "{" after other text is content
            if at >= 0:
                self._add(delta, "content", text[:at])
                self.call = [text[at:]]
                return delta
            hold = _partial_suffix(text, marker)
            self._add(delta, "content", text[:len(text) - hold])
            self.pending = text[len(text) - hold:]
            return delta
        return delta

    def _add(self, delta: dict[str, str], field: str, text: str) -> None:
        if not text:
            return
        delta[field] = delta.get(field, "") + text
        if field == "reasoning_content":
            self.reasoning_text.append(text)
        else:
            self.content.append(text)
            self.said = self.said or not text.isspace()

    def finish(self) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """(the held-back text's delta, the parsed tool calls) at the end of the choice."""
        delta: dict[str, str] = {}
        if self.pending:
            self._add(delta, "reasoning_content" if self.mode == "think" else "content", self.pending)
            self.pending = ""
        calls: list[dict[str, Any]] = []
        if self.call:
            rest, calls = tool_calls.parse("".join(self.call), self.parser)
            calls = self.tools.kept_calls(calls)
            self._add(delta, "content", rest)
            self.call = []
        return delta, calls

    def message(self, text: str) -> tuple[dict[str, Any], bool]:
        """A whole choice's message from its text, and whether it holds tool calls."""
        self.feed(text)
        _, calls = self.finish()
        content = "".join(self.content).strip() if self.reasoning or calls else "".join(self.content)
        message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning_text).strip() or None
        if calls:
            message["tool_calls"] = calls
        return message, bool(calls)
