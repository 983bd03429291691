"""Servers as processes on loopback ports: a free port, waiting until one is healthy,
and a server process started and stopped around a block."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from typing import Callable, Iterator, Optional, Sequence

import httpx


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
    """A loopback port nobody listens on now (bind to 0 and let the kernel choose). Another
    process may take it before the caller binds it: bind through bound_loopback_socket
    where the server runs in this process, or retry on "address already in use"."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bound_loopback_socket() -> socket.socket:
    """A listening-ready TCP socket bound to a free loopback port (uvicorn's `sockets`)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def address_in_use(message: str) -> bool:
    """Whether a server's error output says its port was taken."""
    return "address already in use" in message.lower()


@contextlib.contextmanager
def server_process(model_path: str, extra: Sequence[str] = (), timeout: float = 600,
                   env: Optional[dict[str, str]] = None) -> Iterator[tuple[subprocess.Popen, str]]:
    """`python -m rvascend.server` on a free loopback port with `extra` flags and `env`
    added to this process's environment: (process, base URL) once it is healthy (the
    end of its stderr in the error if it exits first); stopped (SIGTERM, then SIGKILL
    after 30 s) when the block ends, however it ends."""
    port = free_port()
    cmd = [sys.executable, "-m", "rvascend.server", f"--port={port}", f"--model-path={model_path}", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout, lambda: proc.stderr.read()[-3000:] if proc.poll() is not None else "")
        yield proc, url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
