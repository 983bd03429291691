"""OpenAI's Responses API endpoints: POST /v1/responses (whole, or streamed as named
server-sent events), GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items.

A request is translated into a chat completion request (responses_protocol.py) and
prepared by openai_api.prepare_chat, so templates, tools, grammars and the split of
reasoning, content and tool calls (chat_output.py) are chat's own. One builder makes the
output items from the generated text, event by event: the stream sends its events, a
whole response keeps only the end.
"""

from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator, Callable, Literal, Optional

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from rvascend.engine.sequence import Sequence
from rvascend.server import limits
from rvascend.server.chat_output import ChatOutput
from rvascend.server.context import BAD_INPUT, ServerContext, owner_of
from rvascend.server.openai_api import prepare_chat
from rvascend.server.responses import error
from rvascend.server.responses_protocol import ResponsesRequest, ResponseStore, Stored, new_id
from rvascend.server.streaming import Framing, stream_events
from rvascend.server.submission import Submission
from rvascend.server.tool_calls import CallArguments, CallEnd, CallStart, Event, Text

ENDPOINT = "responses"
MAX_LISTED_ITEMS = 100




class ResponseBuilder:
    """One response's output items, made from its generated text as it comes (`feed`, then
    `finish`), with the stream events that announce them, numbered in order."""

    def __init__(self, req: ResponsesRequest, model: str, split: ChatOutput) -> None:
        self.req = req
        self.model = model
        self.split = split
        self.id = new_id("resp")
        self.created = int(time.time())
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self.reasoning: Optional[list[str]] = None  # the open reasoning item's text
        self.text: Optional[list[str]] = None       # the open message's text
        self.reasoning_tokens = 0
        self.calls: dict[int, int] = {}  # a call's index -> its item's place in the output
        self.message_status = "completed"
        self.status = "in_progress"

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def feed(self, text: str) -> list[dict[str, Any]]:
        return self._events(self.split.events(text), counted=True)

    def finish(self, reason: Optional[str]) -> list[dict[str, Any]]:
        """The events that close the output; `reason` is the engine's finish reason."""
        final = "incomplete" if reason == "length" else "completed"
        # A message the end closes (its calls follow it) ends as the response does; one a
        # call closed mid-stream was complete.
        self.message_status = final
        events = self._events(self.split.end(), counted=False)
        self.status = final
        events += self._close_reasoning()
        if not self.items:
            events += self._say("")  # an empty answer is still a message
        return events + self._close_message()

    def _events(self, split: list[Event], counted: bool) -> list[dict[str, Any]]:
        if counted and any(isinstance(e, Text) and e.field == "reasoning_content" for e in split) and \
                not any(isinstance(e, Text) and e.field == "content" for e in split):
            self.reasoning_tokens += 1  # an output is one token's text
        events = []
        for e in split:
            if isinstance(e, Text):
                events += self._think(e.text) if e.field == "reasoning_content" else \
                    self._close_reasoning() + self._say(e.text)
            elif isinstance(e, CallStart):
                events += self._close_reasoning() + self._close_message() + self._call_start(e)
            elif isinstance(e, CallArguments):
                if e.text:
                    index = self.calls[e.index]
                    events.append(self.event("response.function_call_arguments.delta", item_id=self.items[index]["id"],
                                             output_index=index, delta=e.text))
            else:
                events += self._call_end(e)
        return events

    def _call_start(self, start: CallStart) -> list[dict[str, Any]]:
        item = {"id": new_id("fc"), "type": "function_call", "call_id": start.id, "name": start.name,
                "arguments": "", "status": "in_progress"}
        self.calls[start.index] = len(self.items)
        self.items.append(item)
        return [self.event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item))]

    def _call_end(self, end: CallEnd) -> list[dict[str, Any]]:
        """A call's arguments are its deltas joined (CallEnd's); a call the output cut is incomplete."""
        index = self.calls[end.index]
        item = self.items[index]
        item.update(arguments=end.call["function"]["arguments"], status="completed" if end.complete else "incomplete")
        return [self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                           name=item["name"], arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=dict(item))]

    def _think(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self.reasoning is None:
            self.reasoning = []
            self.items.append({"id": new_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress"})
            item = self.items[-1]
            events += [self.event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item)),
                       self.event("response.content_part.added", item_id=item["id"], output_index=len(self.items) - 1,
                                  content_index=0, part={"type": "reasoning_text", "text": ""})]
        self.reasoning.append(text)
        return events + [self.event("response.reasoning_text.delta", item_id=self.items[-1]["id"],
                                    output_index=len(self.items) - 1, content_index=0, delta=text)]

    def _close_reasoning(self) -> list[dict[str, Any]]:
        if self.reasoning is None:
            return []
        text, self.reasoning = "".join(self.reasoning), None
        index, item = len(self.items) - 1, self.items[-1]
        where = {"item_id": item["id"], "output_index": index}
        part = {"type": "reasoning_text", "text": text}
        events = [self.event("response.reasoning_text.done", **where, content_index=0, text=text),
                  self.event("response.content_part.done", **where, content_index=0, part=part)]
        item.update(content=[part], status="completed" if self.status == "in_progress" else self.status)
        if self.req.summary:
            # No summarizer here: the reasoning stands for its own summary.
            summary = {"type": "summary_text", "text": text}
            item["summary"] = [summary]
            events += [self.event("response.reasoning_summary_part.added", **where, summary_index=0,
                                  part={**summary, "text": ""}),
                       self.event("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text),
                       self.event("response.reasoning_summary_text.done", **where, summary_index=0, text=text),
                       self.event("response.reasoning_summary_part.done", **where, summary_index=0, part=summary)]
        if self.req.include_reasoning:
            item["encrypted_content"] = text  # not encrypted: the text itself, to be sent back
        return events + [self.event("response.output_item.done", output_index=index, item=dict(item))]

    def _say(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self.text is None:
            self.text = []
            self.items.append({"id": new_id("msg"), "type": "message", "role": "assistant", "content": [],
                               "status": "in_progress"})
            item = self.items[-1]
            events += [self.event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item)),
                       self.event("response.content_part.added", item_id=item["id"], output_index=len(self.items) - 1,
                                  content_index=0, part=_output_text(""))]
        self.text.append(text)
        if not text:
            return events
        return events + [self.event("response.output_text.delta", item_id=self.items[-1]["id"],
                                    output_index=len(self.items) - 1, content_index=0, delta=text, logprobs=[])]

    def _close_message(self) -> list[dict[str, Any]]:
        if self.text is None:
            return []
        text, self.text = "".join(self.text), None
        index, item = len(self.items) - 1, self.items[-1]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        item.update(content=[_output_text(text)], status=self.message_status)
        return [self.event("response.output_text.done", **where, text=text, logprobs=[]),
                self.event("response.content_part.done", **where, part=_output_text(text)),
                self.event("response.output_item.done", output_index=index, item=dict(item))]

    def body(self, seq: Optional[Sequence] = None, status: Optional[str] = None,
             failure: Optional[str] = None) -> dict[str, Any]:
        """The response object: in progress until `seq` (its usage) is given."""
        req = self.req
        status = status or (self.status if seq is not None else "in_progress")
        usage = None
        if seq is not None:
            prompt, output = len(seq.prompt_ids), len(seq.output_ids)
            usage = {"input_tokens": prompt,
                     # No explicit cache writes: the prefix cache keeps every prompt it runs.
                     "input_tokens_details": {"cached_tokens": seq.cached_tokens, "cache_write_tokens": 0},
                     "output_tokens": output, "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                     "total_tokens": prompt + output}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if status == "completed" else None, "background": False,
                "error": {"code": "server_error", "message": failure} if failure else None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": self.model,
                "output": [dict(item) for item in self.items] if seq is not None else [],
                "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
                "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": req.summary},
                "store": req.store, "temperature": req.temperature, "text": req.text or {"format": {"type": "text"}},
                "tool_choice": req.tool_choice, "tools": req.tools, "top_p": req.top_p,
                "truncation": req.truncation, "usage": usage, "user": req.user, "metadata": req.metadata or {},
                "prompt_cache_key": req.prompt_cache_key}


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


async def _stream(ctx: ServerContext, sub: Submission, builder: ResponseBuilder,
                  keep: Callable[[dict[str, Any]], None]) -> AsyncIterator[str]:
    """The response's events, through the one SSE loop (streaming.stream_events): named
    events, a failure is a response.failed event, and no `[DONE]` ends the stream."""
    yield _sse(builder.event("response.created", response=builder.body()))
    yield _sse(builder.event("response.in_progress", response=builder.body()))

    def events(_: int, out) -> list[dict[str, Any]]:
        fed = builder.feed(out.text)
        return fed + builder.finish(out.finish_reason) if out.finished else fed

    def completed() -> dict[str, Any]:
        final = builder.body(sub.seqs[0])
        keep(final)
        return builder.event(f"response.{final['status']}", response=final)

    def failed(message: str) -> str:
        return _sse(builder.event("response.failed", response=builder.body(sub.seqs[0], "failed", message)))

    async for text in stream_events(ctx, ENDPOINT, sub, events, completed, Framing(_sse, failed, "")):
        yield text


def responses_routes(ctx: ServerContext) -> APIRouter:
    router = APIRouter()
    store = ResponseStore()

    def not_found(rid: str) -> Response:
        return error(404, f"no response with id {rid!r} is stored for this API key (store: false, evicted, "
                          "deleted, or another key's)")

    @router.post("/v1/responses")
    async def create(req: ResponsesRequest, request: Request):
        owner = owner_of(request)
        try:
            req.check_supported()
            history: list[dict[str, Any]] = []
            history_bytes = 0
            if req.previous_response_id is not None:
                previous = store.get(req.previous_response_id, owner)
                if previous is None:
                    return not_found(req.previous_response_id)
                history, history_bytes = previous.conversation, previous.size
            items = req.input_items()
            pairs, split = await prepare_chat(ctx, req.to_chat(history, items))
            pairs = ctx.bounded(pairs, req.max_output_tokens)
        except BAD_INPUT as e:
            return error(400, str(e))
        sub = ctx.submit(ENDPOINT, pairs, request)
        if isinstance(sub, Response):
            return sub
        builder = ResponseBuilder(req, ctx.model_name, split(stream=req.stream))

        def keep(final: dict[str, Any]) -> None:
            if req.store:
                store.put(Stored(owner, final, items, history + items + final["output"], history_bytes))

        if req.stream:
            return StreamingResponse(_stream(ctx, sub, builder, keep), media_type="text/event-stream")
        states, failure = await ctx.collect(ENDPOINT, sub, request)
        if failure is not None:
            return failure
        for text in states[0].text:
            builder.feed(text)
        builder.finish(states[0].reason)
        final = builder.body(sub.seqs[0])
        keep(final)
        return final

    @router.get("/v1/responses/{rid}")
    async def retrieve(rid: str, request: Request):
        stored = store.get(rid, owner_of(request))
        return stored.response if stored is not None else not_found(rid)

    @router.get("/v1/responses/{rid}/input_items")
    async def input_items(rid: str, request: Request, limit: int = Query(20, ge=1, le=MAX_LISTED_ITEMS),
                          order: Literal["asc", "desc"] = "desc", after: Optional[str] = None):
        stored = store.get(rid, owner_of(request))
        if stored is None:
            return not_found(rid)
        items = stored.input_items if order == "asc" else stored.input_items[::-1]
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                return error(400, f"after={after!r} is not an input item of {rid!r}")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}

    @router.delete("/v1/responses/{rid}")
    async def delete(rid: str, request: Request):
        if not store.delete(rid, owner_of(request)):
            return not_found(rid)
        return {"id": rid, "object": "response", "deleted": True}

    return router
