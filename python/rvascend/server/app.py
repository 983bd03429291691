"""The FastAPI application: OpenAI-compatible and SGLang-native endpoints over one engine thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from typing import Any, AsyncIterator, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

import rvascend
from rvascend.engine import Engine, QueueFullError, RequestError, SamplingParams
from rvascend.policy import RvvPolicy
from rvascend.server import limits, responses
from rvascend.server.metrics import ServerMetrics
from rvascend.server.protocol import (ChatCompletionRequest, CompletionRequest, GenerateRequest,
                                      UnsupportedField)
from rvascend.server.responses import ChoiceState, LogprobFormat, error, sse
from rvascend.server.submission import Submission

DEFAULT_COMPLETION_TOKENS = 16
DEFAULT_CHAT_TOKENS = 256
DEFAULT_WATCHDOG_SECONDS = 300.0

_BAD_INPUT = (RequestError, UnsupportedField, limits.InputError)


def create_app(engine: Engine, model_name: str, policy: Optional[RvvPolicy] = None,
               api_key: Optional[str] = None, watchdog_timeout: float = DEFAULT_WATCHDOG_SECONDS,
               server_args: Optional[dict[str, Any]] = None) -> FastAPI:
    metrics = ServerMetrics(engine.stats, policy)
    stop = threading.Event()
    thread = threading.Thread(target=engine.run_forever, args=(stop,), name="engine", daemon=True)
    tokenizer = engine.tokenizer
    max_prompt_bytes = engine.context_length * (tokenizer.max_token_bytes if tokenizer else 1)

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
    async def _invalid(request: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: {e.get('msg')}"
                             for e in exc.errors())
        return error(400, f"invalid request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return error(exc.status_code, str(exc.detail), "invalid_request_error" if exc.status_code < 500
                     else "server_error")

    # Bodies larger than any prompt that can fit (JSON escapes take up to 6
    # bytes a character) are refused before they are parsed.
    app.add_middleware(limits.RequestGuard, api_key=api_key, body_limit=8 * max_prompt_bytes + (1 << 20))

    # -- helpers -----------------------------------------------------------------
    async def tokenize(what: str, text: str, add_special_tokens: bool = True) -> list[int]:
        if tokenizer is None:
            raise limits.InputError("this server has no tokenizer: send token ids")
        size = limits.check_text(what, text)
        if not text:
            raise limits.InputError(f"{what} is empty")
        limits.check_prompt_bytes(what, size, max_prompt_bytes, engine.context_length)
        return await asyncio.to_thread(tokenizer.encode, text, add_special_tokens)

    def max_tokens_for(prompt_len: int, default: int, asked: Optional[int]) -> int:
        return asked if asked is not None else max(1, min(default, engine.context_length - prompt_len))

    def record(endpoint: str, sub: Submission, status: str) -> None:
        metrics.requests.labels(endpoint, status).inc()
        for seq in sub.seqs:
            metrics.observe_sequence(seq)
        metrics.batch_rows.set(engine.last_batch_rows)

    def submit(endpoint: str, pairs: list[tuple[list[int], SamplingParams]]) -> Union[Submission, Response]:
        try:
            return Submission(engine, pairs)
        except RequestError as e:
            metrics.requests.labels(endpoint, "invalid").inc()
            return error(400, str(e))
        except QueueFullError as e:
            metrics.requests.labels(endpoint, "rejected").inc()
            return error(503, f"server busy: {e}", "server_busy")

    async def collect(endpoint: str, sub: Submission, request: Request) -> tuple[list[ChoiceState], Optional[Response]]:
        """Every choice's outputs of a non-streaming request, and the error response
        (499 if the client left, 500 if generation failed) or None; records the request."""
        states = [ChoiceState() for _ in sub.seqs]
        async for index, out in sub.outputs(request):
            states[index].add(out)
        if any(s.reason is None for s in states):  # the client went away
            record(endpoint, sub, "aborted")
            return states, error(499, "client closed the request")
        failed = [s.error or "generation failed" for s in states if s.reason == "error"]
        if failed:
            record(endpoint, sub, "error")
            return states, error(500, failed[0], "server_error")
        record(endpoint, sub, "ok")
        return states, None

    async def serve_openai(endpoint: str, pairs: list[tuple[list[int], SamplingParams]], n: int, stream: bool,
                           chat: bool, include_usage: bool, logprobs: bool, request: Request,
                           echo: Optional[list[str]] = None):
        sub = submit(endpoint, pairs)
        if isinstance(sub, Response):
            return sub
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        fmt = LogprobFormat(tokenizer, chat) if logprobs and tokenizer else None
        head = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": model_name}
        if stream:
            return StreamingResponse(stream_openai(endpoint, sub, head, n, chat, include_usage, fmt, echo),
                                     media_type="text/event-stream")
        states, failure = await collect(endpoint, sub, request)
        if failure is not None:
            return failure
        choices = [responses.choice(i, s, chat, fmt, echo[i // n] if echo else "") for i, s in enumerate(states)]
        return {**head, "choices": choices, "usage": responses.usage(sub.seqs, n)}

    async def stream_openai(endpoint: str, sub: Submission, head: dict[str, Any], n: int, chat: bool,
                            include_usage: bool, fmt: Optional[LogprobFormat],
                            echo: Optional[list[str]]) -> AsyncIterator[str]:
        kind = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
        status = "aborted"
        started: set[int] = set()
        try:
            async for index, out in sub.outputs():
                if out.finish_reason == "error":
                    status = "error"
                    sub.abort()
                    yield sse(responses.error_body(500, out.error or "generation failed", "server_error"))
                    break
                first = index not in started
                started.add(index)
                # One chunk per generated token, even when its text is held back
                # (a partial UTF-8 character, a possible stop string): clients
                # and benchmarks see every token's timing.
                if out.token_id is not None or out.finished or first:
                    prefix = echo[index // n] if echo and first else ""
                    c = responses.chunk_choice(index, out, chat, fmt, first=first, prefix=prefix)
                    yield sse({**kind, "choices": [c]})
            else:
                status = "ok"
                if include_usage:
                    yield sse({**kind, "choices": [], "usage": responses.usage(sub.seqs, n)})
            yield sse("[DONE]")
        finally:
            record(endpoint, sub, status)

    # -- OpenAI endpoints --------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        try:
            req.check_supported()
            if req.echo and req.logprobs is not None:
                raise UnsupportedField("echo with logprobs (prompt log-probabilities) is not supported")
            prompts = req.prompts()
            ids = [await tokenize(f"prompt[{i}]" if len(prompts) > 1 else "prompt", p) if isinstance(p, str)
                   else list(p) for i, p in enumerate(prompts)]
            for s in req.stop_list():
                limits.check_text("stop", s)
            pairs = [(p, req.sampling_params(max_tokens_for(len(p), DEFAULT_COMPLETION_TOKENS, req.max_tokens),
                                             req.logprobs, j)) for p in ids for j in range(req.n)]
            echo = None
            if req.echo:
                echo = [p if isinstance(p, str) else (tokenizer.decode(p) if tokenizer else "") for p in prompts]
        except _BAD_INPUT as e:
            return error(400, str(e))
        return await serve_openai("completions", pairs, req.n, req.stream, False, req.include_usage,
                                  req.logprobs is not None, request, echo)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        try:
            req.check_supported()
            logprobs = req.requested_logprobs()
            messages = []
            for i, m in enumerate(req.messages):
                text = m.text()
                limits.check_text(f"messages[{i}].content", text)
                messages.append({"role": m.role, "content": text, **({"name": m.name} if m.name else {})})
            if tokenizer is None:
                raise limits.InputError("this server has no tokenizer: chat needs one")
            prompt = tokenizer.apply_chat_template(messages, req.chat_template_kwargs)
            ids = await tokenize("the chat prompt", prompt, add_special_tokens=False)
            for s in req.stop_list():
                limits.check_text("stop", s)
            max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
            pairs = [(ids, req.sampling_params(max_tokens_for(len(ids), DEFAULT_CHAT_TOKENS, max_tokens),
                                               logprobs, j)) for j in range(req.n)]
        except _BAD_INPUT as e:
            return error(400, str(e))
        return await serve_openai("chat", pairs, req.n, req.stream, True, req.include_usage, logprobs is not None,
                                  request)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "rvascend", "root": model_name,
                                            "max_model_len": engine.context_length}]}

    # -- SGLang-native endpoints ------------------------------------------------------
    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request):
        try:
            if (req.text is None) == (req.input_ids is None):
                raise limits.InputError("give exactly one of 'text' and 'input_ids'")
            ids = await tokenize("text", req.text) if req.text is not None else list(req.input_ids)
            params = _sglang_params(req.sampling_params, len(ids), engine.context_length)
        except _BAD_INPUT as e:
            return error(400, str(e))
        sub = submit("generate", [(ids, params)])
        if isinstance(sub, Response):
            return sub
        rid = uuid.uuid4().hex

        def body(state: ChoiceState, seq) -> dict[str, Any]:
            reason = None
            if state.reason:
                reason = {"type": responses.openai_reason(state.reason)}
                if state.matched_stop is not None:
                    reason["matched"] = state.matched_stop
            return {"text": "".join(state.text), "output_ids": list(seq.output_ids),
                    "meta_info": {"id": rid, "prompt_tokens": len(seq.prompt_ids), "cached_tokens": seq.cached_tokens,
                                  "completion_tokens": len(seq.output_ids), "finish_reason": reason}}

        if req.stream:
            async def stream() -> AsyncIterator[str]:
                state, status = ChoiceState(), "aborted"
                try:
                    async for _, out in sub.outputs():
                        state.add(out)
                        if out.finish_reason == "error":
                            status = "error"
                            yield sse(responses.error_body(500, out.error or "generation failed", "server_error"))
                            break
                        yield sse(body(state, sub.seqs[0]))
                    else:
                        status = "ok"
                    yield sse("[DONE]")
                finally:
                    record("generate", sub, status)
            return StreamingResponse(stream(), media_type="text/event-stream")
        (state,), failure = await collect("generate", sub, request)
        return failure if failure is not None else body(state, sub.seqs[0])

    @app.get("/get_model_info")
    async def model_info():
        return {"model_path": model_name, "tokenizer_path": model_name, "is_generation": True,
                "max_model_len": engine.context_length, "vocab_size": engine.model.config.vocab_size}

    @app.get("/get_server_info")
    async def server_info():
        return {**(server_args or {}), "version": rvascend.__version__, "context_length": engine.context_length,
                **engine.stats()}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        if engine.flush_cache():
            return Response("Cache flushed.\n", media_type="text/plain")
        return error(400, "the prefix cache was not flushed: requests are queued or running; retry when idle")

    @app.post("/tokenize")
    async def tokenize_endpoint(request: Request):
        body = await _json_object(request)
        text = body.get("prompt", body.get("text"))
        if not isinstance(text, str):
            return error(400, "'prompt' must be a string")
        add = body.get("add_special_tokens", True)
        try:
            ids = await tokenize("prompt", text, bool(add)) if text else []
        except _BAD_INPUT as e:
            return error(400, str(e))
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.context_length}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await _json_object(request)
        ids = body.get("tokens")
        vocab = engine.model.config.vocab_size
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return error(400, "'tokens' must be a list of token ids")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            return error(400, f"token id {bad[0]} is outside the vocabulary of {vocab}")
        if tokenizer is None:
            return error(400, "this server has no tokenizer")
        return {"prompt": tokenizer.decode(ids)}

    @app.get("/version")
    async def version():
        return {"version": rvascend.__version__}

    @app.get("/health")
    async def health():
        if not thread.is_alive():
            return error(503, "the engine thread is not running", "server_error")
        started = engine.step_started
        if started is not None and time.monotonic() - started > watchdog_timeout:
            return error(503, f"the engine has been in one step for {time.monotonic() - started:.0f} s "
                              f"(watchdog timeout {watchdog_timeout:.0f} s)", "server_error")
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise StarletteHTTPException(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise StarletteHTTPException(400, "the body must be a JSON object")
    return body


# SGLang's sampling_params names -> ours (and their types).
_SGLANG_PARAMS = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
                  "top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                  "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
                  "min_new_tokens": "min_tokens", "stop": "stop", "stop_token_ids": "stop_token_ids",
                  "ignore_eos": "ignore_eos", "seed": "seed", "sampling_seed": "seed"}


def _sglang_params(raw: dict[str, Any], prompt_len: int, context_length: int) -> SamplingParams:
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _SGLANG_PARAMS:
            raise UnsupportedField(f"sampling_params.{key} is not supported by this server")
        name = _SGLANG_PARAMS[key]
        expected = SamplingParams.__dataclass_fields__[name].type
        if name == "stop":
            value = (value,) if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise limits.InputError("sampling_params.stop must be a string or a list of strings")
            for s in value:
                limits.check_text("stop", s)
            value = tuple(value)
        elif name == "stop_token_ids":
            if not isinstance(value, list) or not all(isinstance(t, int) for t in value):
                raise limits.InputError("sampling_params.stop_token_ids must be a list of token ids")
            value = tuple(value)
        elif name == "ignore_eos":
            if not isinstance(value, bool):
                raise limits.InputError("sampling_params.ignore_eos must be a boolean")
        elif "float" in str(expected):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise limits.InputError(f"sampling_params.{key} must be a number")
            value = float(value)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise limits.InputError(f"sampling_params.{key} must be an integer")
        kwargs[name] = value
    kwargs.setdefault("max_tokens", max(1, min(128, context_length - prompt_len)))
    return SamplingParams(**kwargs)
