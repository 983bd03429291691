"""A request in flight: its engine sequences (n samples, several prompts) and their outputs."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Optional

from starlette.requests import Request

from rvascend.engine import Engine, SamplingParams
from rvascend.engine.sequence import Output, Sequence

# How often a non-streaming request checks that its client is still there.
_DISCONNECT_POLL_SECONDS = 0.25


class Submission:
    """Submits every (prompt, params) pair as one sequence; choice i is sequence i.

    If any of them is refused (bad input, queue full) the ones already
    submitted are aborted, so a request is admitted whole or not at all.
    """

    def __init__(self, engine: Engine, requests: list[tuple[list[int], SamplingParams]],
                 owner: Optional[str] = None) -> None:
        loop = asyncio.get_running_loop()
        self.engine = engine
        self.queue: asyncio.Queue[tuple[int, Output]] = asyncio.Queue()
        self.seqs: list[Sequence] = []
        try:
            for i, (ids, params) in enumerate(requests):
                self.seqs.append(engine.add_request(
                    ids, params, lambda seq, out, i=i: loop.call_soon_threadsafe(self.queue.put_nowait, (i, out)),
                    owner))
        except Exception:
            self.abort()
            raise
        self._finished: set[int] = set()

    def abort(self) -> None:
        for seq in self.seqs:
            if seq.finish_reason is None:
                self.engine.abort(seq)

    async def outputs(self, request: Optional[Request] = None) -> AsyncIterator[tuple[int, Output]]:
        """(choice index, output) as they come. With `request`, stops (and
        aborts every sequence) when its client disconnects; so does closing
        the iterator early."""
        loop = asyncio.get_running_loop()
        next_check = loop.time() + _DISCONNECT_POLL_SECONDS
        try:
            while len(self._finished) < len(self.seqs):
                if request is None:
                    index, out = await self.queue.get()
                else:
                    # Checked on a clock, not only when idle: outputs may arrive
                    # faster than the poll interval for as long as it generates.
                    if loop.time() >= next_check:
                        next_check = loop.time() + _DISCONNECT_POLL_SECONDS
                        if await request.is_disconnected():
                            return
                    try:
                        index, out = await asyncio.wait_for(self.queue.get(), _DISCONNECT_POLL_SECONDS)
                    except asyncio.TimeoutError:
                        continue
                if out.finished:
                    self._finished.add(index)
                yield index, out
        finally:
            if len(self._finished) < len(self.seqs):
                self.abort()
