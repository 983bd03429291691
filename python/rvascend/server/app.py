"""The FastAPI application: the OpenAI-compatible, Anthropic Messages, SGLang-native and
admin endpoints (openai_api.py, responses_api.py, anthropic_api.py, native_api.py,
admin_api.py) over one engine thread."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rvascend.engine import Engine
from rvascend.policy import KernelPolicy
from rvascend.server import limits, tool_calls
from rvascend.server.admin_api import admin_routes
from rvascend.server.anthropic_api import anthropic_routes
from rvascend.server.chat_output import REASONING_PARSERS
from rvascend.server.context import ServerContext
from rvascend.server.metrics import ServerMetrics
from rvascend.server.native_api import native_routes
from rvascend.server.openai_api import openai_routes
from rvascend.server.responses import error
from rvascend.server.responses_api import responses_routes

DEFAULT_WATCHDOG_SECONDS = 300.0


def create_app(engine: Engine, model_name: str, policy: Optional[KernelPolicy] = None,
               api_key: Optional[str] = None, watchdog_timeout: float = DEFAULT_WATCHDOG_SECONDS,
               server_args: Optional[dict[str, Any]] = None,
               allowed_hosts: Optional[frozenset[str]] = None, tool_call_parser: Optional[str] = None,
               reasoning_parser: Optional[str] = None) -> FastAPI:
    """`tool_call_parser`: the output format of tool calls (None: the model family's);
    `reasoning_parser`: how reasoning is split from the answer (None: it is not)."""
    if tool_call_parser is not None and tool_call_parser not in tool_calls.PARSERS:
        raise ValueError(f"--tool-call-parser {tool_call_parser!r} is not one of {', '.join(tool_calls.PARSERS)}")
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        raise ValueError(f"--reasoning-parser {reasoning_parser!r} is not one of {', '.join(REASONING_PARSERS)}")
    stop = threading.Event()
    thread = threading.Thread(target=engine.run_forever, args=(stop,), name="engine", daemon=True)
    ctx = ServerContext(engine, model_name, ServerMetrics(engine.stats, policy), thread, watchdog_timeout,
                        dict(server_args or {}),
                        tool_call_parser or tool_calls.parser_for(engine.model.config.architecture),
                        reasoning_parser)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        thread.start()
        yield
        stop.set()
        thread.join(timeout=30)
        engine.close()  # the cache tiers' queued disk writes land before the process ends

    app = FastAPI(title="rvascend", lifespan=lifespan)
    app.state.engine = engine
    app.state.metrics = ctx.metrics

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
    app.add_middleware(limits.RequestGuard, api_key=api_key, body_limit=8 * ctx.max_prompt_bytes + (1 << 20),
                       allowed_hosts=allowed_hosts)
    for routes in (openai_routes, responses_routes, anthropic_routes, native_routes, admin_routes):
        app.include_router(routes(ctx))
    return app
