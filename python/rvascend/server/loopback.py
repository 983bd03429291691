"""Servers as processes on loopback ports: a free port, and waiting until one is healthy."""

from __future__ import annotations

import socket
import subprocess
import time
from typing import Callable

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
