"""What every endpoint of one server shares: the engine, its tokenizer, metrics, and
the steps of a request from input to recorded outcome (tokenize within limits,
submit, collect)."""

from __future__ import annotations

import asyncio
import hashlib
import dataclasses
import threading
from typing import Any, Optional, Union

from fastapi import Request
from fastapi.responses import Response

from rvascend.engine import Engine, Grammar, GrammarError, QueueFullError, RequestError, SamplingParams
from rvascend.tokenizer.chat_template import ChatTemplateError
from rvascend.server import limits
from rvascend.server.metrics import ServerMetrics
from rvascend.server.protocol import UnsupportedField
from rvascend.server.responses import ChoiceState, error
from rvascend.server.submission import Submission

# Errors of the request's own making: a 400 naming the problem.
BAD_INPUT = (RequestError, UnsupportedField, limits.InputError, ChatTemplateError, GrammarError)


def owner_of(request: Request) -> str:
    """Who a request comes from: a digest of the API key it was admitted with (or, on a
    server without one, the key it carries: Authorization: Bearer, or x-api-key), so
    nothing holds the key itself. Stored responses and SUFFIX drafts stay within it."""
    key = request.scope.get("state", {}).get(limits.ADMITTED_KEY) \
        or request.headers.get("authorization", "").removeprefix("Bearer ").strip() \
        or request.headers.get("x-api-key", "")
    return hashlib.sha256(key.encode()).hexdigest()


@dataclasses.dataclass
class ServerContext:
    engine: Engine
    model_name: str
    metrics: ServerMetrics
    engine_thread: threading.Thread
    watchdog_timeout: float
    server_args: dict[str, Any]
    tool_call_parser: str = "qwen25"         # server/tool_calls.py's PARSERS
    reasoning_parser: Optional[str] = None   # server/chat_output.py's REASONING_PARSERS, or off

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_prompt_bytes(self) -> int:
        """No text longer than this can fit the context (a token covers at most max_token_bytes)."""
        return self.engine.context_length * (self.tokenizer.max_token_bytes if self.tokenizer else 1)

    async def tokenize(self, what: str, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise limits.InputError("this server has no tokenizer: send token ids")
        size = limits.check_text(what, text)
        if not text:
            raise limits.InputError(f"{what} is empty")
        limits.check_prompt_bytes(what, size, self.max_prompt_bytes, self.engine.context_length)
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens)

    def reasoning_end_ids(self) -> tuple[int, ...]:
        """The tokens of the reasoning's end (a grammar applies after them)."""
        return tuple(self.tokenizer.encode("</think>", add_special_tokens=False))

    async def grammar(self, grammar: Optional[Grammar]) -> Optional[Grammar]:
        """`grammar`, compiled off the event loop (a large schema can take a while; the engine
        keeps it compiled for the request); RequestError naming what is wrong with it."""
        if grammar is not None:
            await asyncio.to_thread(self.engine.compile_grammar, grammar)
        return grammar

    def max_tokens_for(self, prompt_len: int, default: int, asked: Optional[int]) -> int:
        return asked if asked is not None else max(1, min(default, self.engine.context_length - prompt_len))

    def bounded(self, pairs: list[tuple[list[int], SamplingParams]],
                asked: Optional[int]) -> list[tuple[list[int], SamplingParams]]:
        """The Responses and Messages APIs' output limit (max_output_tokens, max_tokens) is a
        bound, and without one the answer may run to the end of the context (OpenAI's
        default): either way at most what the context and the KV pool leave after the prompt.
        At least 1, so that a prompt over the context gets the engine's 400 naming its length."""
        room = min(self.engine.context_length, self.engine.config.max_total_tokens)
        return [(ids, dataclasses.replace(params, max_tokens=max(1, min(asked or room, room - len(ids)))))
                for ids, params in pairs]

    def record(self, endpoint: str, sub: Submission, status: str) -> None:
        self.metrics.requests.labels(endpoint, status).inc()
        for seq in sub.seqs:
            self.metrics.observe_sequence(seq)
        self.metrics.batch_rows.set(self.engine.last_batch_rows)

    def submit(self, endpoint: str, pairs: list[tuple[list[int], SamplingParams]],
               request: Request) -> Union[Submission, Response]:
        try:
            return Submission(self.engine, pairs, owner_of(request))
        except RequestError as e:
            self.metrics.requests.labels(endpoint, "invalid").inc()
            return error(400, str(e))
        except QueueFullError as e:
            self.metrics.requests.labels(endpoint, "rejected").inc()
            return error(503, f"server busy: {e}", "server_busy")

    async def collect(self, endpoint: str, sub: Submission,
                      request: Request) -> tuple[list[ChoiceState], Optional[Response]]:
        """Every choice's outputs of a non-streaming request, and the error response
        (499 if the client left, 500 if generation failed) or None; records the request."""
        states = [ChoiceState() for _ in sub.seqs]
        async for index, out in sub.outputs(request):
            states[index].add(out)
        if any(s.reason is None for s in states):  # the client went away
            self.record(endpoint, sub, "aborted")
            return states, error(499, "client closed the request")
        failed = [s.error or "generation failed" for s in states if s.reason == "error"]
        if failed:
            self.record(endpoint, sub, "error")
            return states, error(500, failed[0], "server_error")
        self.record(endpoint, sub, "ok")
        return states, None
