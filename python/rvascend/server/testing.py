"""A real server on a loopback port for tests and benchmarks: uvicorn in a thread."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from typing import Any, Callable

import httpx
import openai
import uvicorn

from rvascend.engine.random_model import ensure_random_model
from rvascend.server.app import create_app
from rvascend.server.launch import ServeOptions, build_engine

API_KEY = "test-key"


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float, describe: Callable[[], str] = lambda: "") -> None:
    """Until `url`/health answers 200; RuntimeError if `proc` exits first or `timeout` s pass
    (with `describe()`, e.g. the end of its log, in the message)."""
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): {describe()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            raise RuntimeError(f"the server did not become healthy in {timeout:.0f} s: {describe()}")
        time.sleep(0.5)


def free_port() -> int:
    """A loopback port nobody listens on (bind to 0 and let the kernel choose)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A model (the random-weight test model unless `model_path` says otherwise) served with
    the RVV policy (eager), an API key, and clients for it."""

    def __init__(self, app_options: dict[str, Any] | None = None, **options: Any) -> None:
        opts = dict(model_path=ensure_random_model(), enable_cpu_rvv_inductor=True, cpu_compile_mode="eager",
                    max_total_tokens=4096, max_running_requests=8)
        opts.update(options)
        self.engine, self.name, self.policy = build_engine(ServeOptions(**opts))
        self.port = free_port()
        self.app = create_app(self.engine, self.name, self.policy, api_key=API_KEY, **(app_options or {}))
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
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
