"""The one server-sent-events loop every API family streams through: an event per
output, an error event if generation fails, an end marker (OpenAI's `[DONE]`), and
the request recorded however it ended (a client that leaves aborts its sequences).
A Framing says how a family writes its events."""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator, Callable, Optional

from rvascend.engine.sequence import Output
from rvascend.server import responses
from rvascend.server.context import ServerContext
from rvascend.server.responses import sse
from rvascend.server.submission import Submission

# (choice index, output) -> the event's payload, a list of them, or None for no event.
EventOf = Callable[[int, Output], Optional[Any]]


def _openai_failure(message: str) -> str:
    return sse(responses.error_body(500, message, "server_error"))


@dataclasses.dataclass(frozen=True)
class Framing:
    """An API family's event text: of a payload, of a failed generation (its message), and the end."""
    event: Callable[[Any], str] = sse
    failure: Callable[[str], str] = _openai_failure
    done: str = sse("[DONE]")


OPENAI = Framing()


async def stream_events(ctx: ServerContext, endpoint: str, sub: Submission, event_of: EventOf,
                        final: Optional[Callable[[], Optional[Any]]] = None,
                        framing: Framing = OPENAI) -> AsyncIterator[str]:
    """SSE text of a submission: `event_of` per output, then `final()` (e.g. usage)."""
    status = "aborted"
    try:
        async for index, out in sub.outputs():
            if out.finish_reason == "error":
                status = "error"
                sub.abort()
                yield framing.failure(out.error or "generation failed")
                break
            for one in _each(event_of(index, out)):
                yield framing.event(one)
        else:
            status = "ok"
            for one in _each(final() if final is not None else None):
                yield framing.event(one)
        if framing.done:
            yield framing.done
    finally:
        ctx.record(endpoint, sub, status)


def _each(payload: Optional[Any]) -> list[Any]:
    """The events of a payload: none, one, or a list (an output can close one item and open
    the next: the Responses and Messages APIs announce items and blocks)."""
    return [] if payload is None else payload if isinstance(payload, list) else [payload]
