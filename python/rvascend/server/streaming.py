"""The one server-sent-events loop both API families stream through: an event per
output, an error event if generation fails, `[DONE]` at the end, and the request
recorded however it ended (a client that leaves aborts its sequences)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Optional

from rvascend.engine.sequence import Output
from rvascend.server import responses
from rvascend.server.context import ServerContext
from rvascend.server.responses import sse
from rvascend.server.submission import Submission

# (choice index, output) -> the event's payload, or None for no event.
EventOf = Callable[[int, Output], Optional[dict[str, Any]]]


async def stream_events(ctx: ServerContext, endpoint: str, sub: Submission, event_of: EventOf,
                        final: Optional[Callable[[], Optional[dict[str, Any]]]] = None) -> AsyncIterator[str]:
    """SSE text of a submission: `event_of` per output, then `final()` (e.g. usage)."""
    status = "aborted"
    try:
        async for index, out in sub.outputs():
            if out.finish_reason == "error":
                status = "error"
                sub.abort()
                yield sse(responses.error_body(500, out.error or "generation failed", "server_error"))
                break
            payload = event_of(index, out)
            if payload is not None:
                yield sse(payload)
        else:
            status = "ok"
            last = final() if final is not None else None
            if last is not None:
                yield sse(last)
        yield sse("[DONE]")
    finally:
        ctx.record(endpoint, sub, status)
