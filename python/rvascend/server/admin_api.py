"""The server's own endpoints: /health (the watchdog), /metrics (Prometheus),
/flush_cache, /version."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import rvascend
from rvascend.server.context import ServerContext
from rvascend.server.responses import error


def admin_routes(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health():
        if not ctx.engine_thread.is_alive():
            return error(503, "the engine thread is not running", "server_error")
        started = ctx.engine.step_started
        if started is not None and time.monotonic() - started > ctx.watchdog_timeout:
            return error(503, f"the engine has been in one step for {time.monotonic() - started:.0f} s "
                              f"(watchdog timeout {ctx.watchdog_timeout:.0f} s)", "server_error")
        return {"status": "ok"}

    @router.get("/metrics")
    async def metrics():
        return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def flush_cache():
        if ctx.engine.flush_cache():
            return Response("Cache flushed.\n", media_type="text/plain")
        return error(400, "the prefix cache was not flushed: requests are queued or running; retry when idle")

    # POST only (SGLang also answers GET): a GET is what a web page's <img> or link
    # can send, and it changes the server's state.
    router.add_api_route("/flush_cache", flush_cache, methods=["POST"])

    @router.get("/version")
    async def version():
        return {"version": rvascend.__version__}

    return router
