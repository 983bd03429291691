"""A real server on a loopback port for tests and benchmarks: uvicorn in a thread."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import httpx
import openai
import uvicorn

from rvascend.models.random_model import ensure_random_model
from rvascend.server import limits
from rvascend.server.app import create_app
from rvascend.server.launch import build_engine, uvicorn_options
from rvascend.server.server_args import ServerArgs
from rvascend.server.loopback import bound_loopback_socket

API_KEY = "test-key"


def slow_steps(engine: Any, seconds: float) -> Callable[[], None]:
    """Makes every forward pass of `engine`'s model take `seconds` longer (a stuck engine for
    the watchdog); returns the undo function."""
    model = engine.model
    forward = model.forward

    def slow(*a, **k):
        time.sleep(seconds)
        return forward(*a, **k)
    model.forward = slow
    return lambda: model.__dict__.pop("forward", None)


class Server:
    """A model (the random-weight test model unless `model_path` says otherwise) served with
    the RVV policy (eager), an API key, and clients for it."""

    def __init__(self, app_options: dict[str, Any] | None = None, **options: Any) -> None:
        # The seed's shape gate: its routes are the same on every host (the measured one times this host).
        opts = dict(model_path=ensure_random_model(), enable_cpu_kernels=True, cpu_compile_mode="eager",
                    cpu_kernels_shape_gate="bucketed", max_total_tokens=4096, max_running_requests=8)
        opts.update(options)
        args = ServerArgs(**opts)
        self.engine, self.name, self.policy = build_engine(args)
        # Bound here and handed to uvicorn: a port picked free and bound later can be taken
        # in between by another test's server.
        self.socket = bound_loopback_socket()
        self.port = self.socket.getsockname()[1]
        app_options = {"server_args": {"model_path": opts["model_path"], "served_model_name": self.name},
                       **(app_options or {})}
        app_options.setdefault("allowed_hosts", limits.allowed_hosts("127.0.0.1"))
        self.app = create_app(self.engine, self.name, self.policy, api_key=API_KEY, **app_options)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, **uvicorn_options(args))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=API_KEY)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def wait_idle(self, timeout: float = 30) -> dict:
        """Engine stats once nothing runs, waits or holds KV slots (fails after `timeout` s)."""
        deadline = time.time() + timeout
        while True:
            stats = self.engine.stats()
            if stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_used_tokens"] == 0:
                return stats
            if time.time() > deadline:
                raise AssertionError(f"the engine did not become idle: {stats}")
            time.sleep(0.05)


def tokens_into_a_call(server: Server, **chat: Any) -> int:
    """A max_tokens that ends a greedy chat request's output midway through its first tool
    call's arguments: its stream sends a chunk per generated token, and the call's chunks
    are the ones with tool_calls."""
    chunks = [c.choices[0] for c in server.client.chat.completions.create(
        model=server.name, temperature=0, stream=True, **chat) if c.choices]
    with_call = [i for i, c in enumerate(chunks) if c.delta.tool_calls]
    assert len(with_call) >= 3, f"the call streamed in {len(with_call)} chunks: too few to cut it in the middle"
    return with_call[len(with_call) // 2]  # chunk i is token i + 1: this many tokens stop before it
