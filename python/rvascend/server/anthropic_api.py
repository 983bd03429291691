"""Anthropic's Messages API: POST /v1/messages (whole or streamed) and
/v1/messages/count_tokens, on the chat completions' implementation: the request is
translated into a chat request (anthropic_protocol.py) and prepared by
openai_api.prepare_chat, its output split by chat_output.ChatOutput into reasoning
(`thinking` blocks), content (`text`) and tool calls (`tool_use`).

Usage counts as Anthropic counts it: `input_tokens` are the prompt tokens the prefix
cache did not serve, `cache_read_input_tokens` the ones it did (so count_tokens is
their sum), `cache_creation_input_tokens` 0 (caching costs nothing extra here).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rvascend.engine.sequence import Output, Sequence
from rvascend.server.anthropic_protocol import CountTokensRequest, MessagesRequest, error_body, validated
from rvascend.server.chat_output import ChatOutput
from rvascend.server.context import BAD_INPUT, ServerContext
from rvascend.server.openai_api import prepare_chat
from rvascend.server.protocol import load_json
from rvascend.server.responses import ChoiceState
from rvascend.server.streaming import Framing, stream_events
from rvascend.server.tool_calls import CallArguments, CallStart, Text

ENDPOINT = "messages"
# Events as (name, data) pairs.
Events = list[tuple[str, dict[str, Any]]]


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


def _reshaped(response: Response) -> JSONResponse:
    """An error of the steps every API shares (submit, collect) in Anthropic's shape; a
    full queue is its 529 (overloaded), which its clients retry."""
    status = 529 if response.status_code == 503 else response.status_code
    return error(status, json.loads(response.body)["error"]["message"])


def _frame(event: tuple[str, dict[str, Any]]) -> str:
    name, data = event
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


FRAMING = Framing(event=_frame, failure=lambda message: _frame(("error", error_body(500, message))), done="")


async def _request(request: Request, model: type[CountTokensRequest]) -> Any:
    return validated(model, load_json("the request body", await request.body()))


def usage(seq: Sequence) -> dict[str, int]:
    return {"input_tokens": len(seq.prompt_ids) - seq.cached_tokens, "output_tokens": len(seq.output_ids),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": seq.cached_tokens}


def stop_reason(reason: Optional[str], matched: Any, called: bool) -> tuple[str, Optional[str]]:
    """(stop_reason, stop_sequence) of a finished generation."""
    if reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(matched, str):  # a stop token's id is the model's own end: end_turn
        return "stop_sequence", matched
    return "end_turn", None


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


def message(head: dict[str, Any], state: ChoiceState, split: ChatOutput, seq: Sequence) -> dict[str, Any]:
    """A whole message: its thinking, text and tool_use blocks."""
    chat, called = split.message("".join(state.text))
    content: list[dict[str, Any]] = []
    if chat.get("reasoning_content"):
        # No signature: it proves Anthropic's own thinking untouched, and nothing here checks it.
        content.append({"type": "thinking", "thinking": chat["reasoning_content"], "signature": ""})
    if chat["content"]:
        content.append({"type": "text", "text": chat["content"]})
    content.extend(_tool_use(call) for call in chat.get("tool_calls", ()))
    reason, sequence = stop_reason(state.reason, state.matched_stop, called)
    return {**head, "content": content, "stop_reason": reason, "stop_sequence": sequence, "usage": usage(seq)}


class MessageStream:
    """One streamed message's events: a block opens when the split releases another kind
    of output (reasoning: thinking, content: text, a call: tool_use) and closes when the
    next opens; a tool_use block's input comes as input_json_delta pieces while the call
    is generated, which join to its arguments (chat_output.py, tool_call_stream.py)."""

    def __init__(self, head: dict[str, Any], split: ChatOutput, seq: Sequence) -> None:
        self.head = head
        self.split = split
        self.seq = seq
        self.started = False
        self.index = -1          # the last block's index
        self.open: Optional[str] = None  # the open block's type
        self.end: tuple[str, Optional[str]] = ("end_turn", None)

    def event(self, _: int, out: Output) -> Optional[Events]:
        events: Events = []
        if not self.started:
            self.started = True
            start = {**self.head, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage(self.seq)}
            events += [("message_start", {"type": "message_start", "message": start}), ("ping", {"type": "ping"})]
        split = self.split.events(out.text) + (self.split.end() if out.finished else [])
        for e in split:
            if isinstance(e, Text):
                events += self._text("thinking" if e.field == "reasoning_content" else "text", e.text)
            elif isinstance(e, CallStart):
                events += self._open("tool_use", {"type": "tool_use", "id": e.id, "name": e.name, "input": {}})
            elif isinstance(e, CallArguments):
                if e.text:
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                           "delta": {"type": "input_json_delta",
                                                                     "partial_json": e.text}}))
            else:
                events += self._close()
        if out.finished:
            events += self._close()
            self.end = stop_reason(out.finish_reason, out.matched_stop, bool(self.split.calls))
        return events or None

    def _open(self, kind: str, block: dict[str, Any]) -> Events:
        events = self._close()
        self.index += 1
        self.open = kind
        return events + [("content_block_start", {"type": "content_block_start", "index": self.index,
                                                  "content_block": block})]

    def _text(self, kind: str, text: str) -> Events:
        events = []
        if self.open != kind:
            block = {"type": kind, kind: ""}
            if kind == "thinking":
                block["signature"] = ""
            events += self._open(kind, block)
        events.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                               "delta": {"type": f"{kind}_delta", kind: text}}))
        return events

    def _close(self) -> Events:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def final(self) -> Events:
        reason, sequence = self.end
        return [("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason,
                                                                      "stop_sequence": sequence},
                                   "usage": usage(self.seq)}),
                ("message_stop", {"type": "message_stop"})]


def anthropic_routes(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    # The body is read here, not by FastAPI: its validation errors would take OpenAI's shape.
    @router.post("/v1/messages")
    async def messages(request: Request):
        try:
            req = await _request(request, MessagesRequest)
            pairs, split = await prepare_chat(ctx, req.chat_request())
            # max_tokens is a bound (Claude Code asks 32000, more than a small model's context).
            pairs = ctx.bounded(pairs, req.max_tokens)
        except BAD_INPUT as e:
            return error(400, str(e))
        sub = ctx.submit(ENDPOINT, pairs, request)
        if isinstance(sub, Response):
            return _reshaped(sub)
        head = {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
                "model": ctx.model_name}
        if req.stream:
            stream = MessageStream(head, split(stream=True), sub.seqs[0])
            return StreamingResponse(stream_events(ctx, ENDPOINT, sub, stream.event, stream.final, FRAMING),
                                     media_type="text/event-stream")
        states, failure = await ctx.collect(ENDPOINT, sub, request)
        if failure is not None:
            return _reshaped(failure)
        return message(head, states[0], split(), sub.seqs[0])

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        try:
            req = await _request(request, CountTokensRequest)
            pairs, _ = await prepare_chat(ctx, req.chat_request())
        except BAD_INPUT as e:
            return error(400, str(e))
        return {"input_tokens": len(pairs[0][0])}

    return router
