"""The FastAPI application: OpenAI-compatible endpoints over one engine thread."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rvascend.engine import Engine, QueueFullError, RequestError, SamplingParams
from rvascend.engine.sequence import Output, Sequence
from rvascend.policy import RvvPolicy
from rvascend.server.metrics import ServerMetrics
from rvascend.server.protocol import ChatCompletionRequest, CompletionRequest, _Request

DEFAULT_COMPLETION_TOKENS = 16
DEFAULT_CHAT_TOKENS = 256


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


class _Submission:
    """One request in flight: the engine sequence and the queue its outputs arrive on."""

    def __init__(self, engine: Engine, prompt_ids: list[int], params: SamplingParams) -> None:
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Output] = asyncio.Queue()
        self.engine = engine
        self.seq: Sequence = engine.add_request(
            prompt_ids, params, lambda seq, out: loop.call_soon_threadsafe(self.queue.put_nowait, out))
        self.done = False

    async def outputs(self) -> AsyncIterator[Output]:
        try:
            while not self.done:
                out = await self.queue.get()
                self.done = out.finished
                yield out
        finally:
            if not self.done:  # the client went away: free its KV slots
                self.engine.abort(self.seq)


def create_app(engine: Engine, model_name: str, policy: Optional[RvvPolicy] = None,
               api_key: Optional[str] = None) -> FastAPI:
    metrics = ServerMetrics(engine.stats, policy)
    stop = threading.Event()
    thread = threading.Thread(target=engine.run_forever, args=(stop,), name="engine", daemon=True)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        thread.start()
        yield
        stop.set()
        thread.join(timeout=30)

    app = FastAPI(title="rvascend", lifespan=lifespan)
    app.state.engine = engine
    app.state.metrics = metrics

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: {e.get('msg')}"
                             for e in exc.errors())
        return _error(400, f"invalid request: {problems}")

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return _error(401, "missing or wrong API key", "authentication_error")
        return await call_next(request)

    def _params(req: _Request, prompt_len: int, default_tokens: int, max_tokens: Optional[int]) -> SamplingParams:
        if max_tokens is None:
            max_tokens = max(1, min(default_tokens, engine.context_length - prompt_len))
        return SamplingParams(max_tokens=max_tokens, temperature=float(req.temperature), top_p=float(req.top_p),
                              stop=req.stop_list(), seed=req.seed, ignore_eos=req.ignore_eos)

    def _submit(prompt_ids: list[int], params: SamplingParams) -> _Submission:
        return _Submission(engine, prompt_ids, params)

    def _record(endpoint: str, sub: _Submission, status: str) -> None:
        seq = sub.seq
        metrics.requests.labels(endpoint, status).inc()
        metrics.prompt_tokens.inc(len(seq.prompt_ids))
        metrics.generation_tokens.inc(len(seq.output_ids))
        if seq.first_token_time is not None:
            metrics.ttft.observe(seq.first_token_time - seq.arrival)
            metrics.e2e.observe(seq.token_times[-1] - seq.arrival)
        for a, b in zip(seq.token_times, seq.token_times[1:]):
            metrics.itl.observe(b - a)
        metrics.batch_rows.set(engine.last_batch_rows)

    def _usage(seq: Sequence) -> dict[str, int]:
        return {"prompt_tokens": len(seq.prompt_ids), "completion_tokens": len(seq.output_ids),
                "total_tokens": len(seq.prompt_ids) + len(seq.output_ids)}

    async def _run(endpoint: str, prompt_ids: list[int], params: SamplingParams, stream: bool, chat: bool):
        try:
            sub = _submit(prompt_ids, params)
        except RequestError as e:
            metrics.requests.labels(endpoint, "invalid").inc()
            return _error(400, str(e))
        except QueueFullError as e:
            metrics.requests.labels(endpoint, "rejected").inc()
            return _error(503, f"server busy: {e}", "server_busy")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        if stream:
            return StreamingResponse(_stream(endpoint, sub, rid, created, chat), media_type="text/event-stream")
        text, reason = [], None
        async for out in sub.outputs():
            text.append(out.text)
            reason = out.finish_reason
        _record(endpoint, sub, "ok" if reason != "abort" else "aborted")
        content = "".join(text)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice["text"] = content
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": model_name, "choices": [choice], "usage": _usage(sub.seq)}

    async def _stream(endpoint: str, sub: _Submission, rid: str, created: int, chat: bool) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: Optional[str], reason: Optional[str], first: bool = False) -> str:
            if chat:
                d: dict[str, Any] = {"role": "assistant"} if first else {}
                if delta:
                    d["content"] = delta
                choice = {"index": 0, "delta": d, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": delta or "", "finish_reason": reason, "logprobs": None}
            return "data: " + json.dumps({"id": rid, "object": kind, "created": created, "model": model_name,
                                          "choices": [choice]}) + "\n\n"

        status = "aborted"
        try:
            if chat:
                yield chunk(None, None, first=True)
            async for out in sub.outputs():
                # One chunk per generated token, even when its text is held back
                # (a partial UTF-8 character, a possible stop string): clients
                # and benchmarks see every token's timing.
                if out.token_id is not None or out.finished:
                    yield chunk(out.text, out.finish_reason)
                if out.finished:
                    status = "ok" if out.finish_reason != "abort" else "aborted"
            yield "data: [DONE]\n\n"
        finally:
            _record(endpoint, sub, status)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        if isinstance(req.prompt, str):
            if not req.prompt:
                return _error(400, "the prompt is empty")
            prompt_ids = engine.tokenizer.encode(req.prompt)
        else:
            prompt_ids = list(req.prompt)
        return await _run("completions", prompt_ids, _params(req, len(prompt_ids), DEFAULT_COMPLETION_TOKENS,
                                                             req.max_tokens), req.stream, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest):
        messages = [m.model_dump() for m in req.messages]
        prompt_ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages), add_special_tokens=False)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        return await _run("chat", prompt_ids, _params(req, len(prompt_ids), DEFAULT_CHAT_TOKENS, max_tokens),
                          req.stream, chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "rvascend", "max_model_len": engine.context_length}]}

    @app.get("/health")
    async def health():
        if not thread.is_alive():
            return _error(503, "the engine thread is not running", "server_error")
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
