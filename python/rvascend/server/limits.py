"""Input limits checked before any expensive work: body size, prompt bytes, valid Unicode.

A prompt is refused by its byte length before it is tokenized (every token
covers at most `max_token_bytes` bytes, so a longer prompt cannot fit the
context), and tokenization itself runs off the event loop, so one huge
request never freezes the others or /health.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import urllib.parse
from typing import Awaitable, Callable, Optional, Sequence

from absl import logging

from rvascend.server import anthropic_protocol

ASGIApp = Callable[..., Awaitable[None]]

# The API key in the environment: what --workers hands its servers and router, so the
# key is never on a command line (visible to every user in `ps`).
API_KEY_ENV = "RVASCEND_API_KEY"


def resolve_api_key(flag: Optional[str]) -> Optional[str]:
    """The API key a server or a --workers router requires: the --api-key flag's value,
    else API_KEY_ENV's; None (no key) when neither is set or both are empty."""
    return flag or os.environ.get(API_KEY_ENV) or None


# Where RequestGuard leaves the API key a request was admitted with (the request's
# state), for what belongs to a key (stored responses): a request may carry a second,
# different credential beside it.
ADMITTED_KEY = "rvascend_api_key"

# A request refused before its body is read has the rest of its body read and dropped, up
# to this many bytes and seconds, before the answer: a server that closes a connection with
# unread data makes the kernel reset it, and a client still sending then gets a connection
# error in place of the answer (nginx's lingering close, bounded the same way).
DRAIN_BYTES = 64 << 20
DRAIN_SECONDS = 5.0


async def drain_body(receive, headers: dict) -> None:
    """Reads what is left of the request body and drops it, within DRAIN_BYTES and DRAIN_SECONDS.
    Not when the client waits for `100 Continue` before it sends (the first read would ask
    it for the body), nor when the request announces no body."""
    if headers.get(b"expect", b"").lower() == b"100-continue":
        return
    if b"content-length" not in headers and b"transfer-encoding" not in headers:
        return

    async def read() -> None:
        left = DRAIN_BYTES
        while left > 0:
            message = await receive()
            if message["type"] != "http.request":
                return
            left -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return
    try:
        await asyncio.wait_for(read(), DRAIN_SECONDS)
    except asyncio.TimeoutError:
        pass


# Paths open without the API key: probes and scrapers carry no credentials.
UNGUARDED_PATHS = frozenset({"/health", "/metrics"})


class InputError(ValueError):
    """The request's content is unusable; a 400 naming the problem."""


def check_text(what: str, text: str) -> int:
    """Byte length of `text` in UTF-8; InputError on a lone UTF-16 surrogate."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InputError(f"{what} contains a lone UTF-16 surrogate (U+{ord(text[e.start]):04X}) at character "
                         f"{e.start}; send valid Unicode") from None


def check_prompt_bytes(what: str, size: int, max_bytes: int, context_length: int) -> None:
    if size > max_bytes:
        raise InputError(f"{what} is {size} bytes; no text over {max_bytes} bytes fits the context length of "
                         f"{context_length} tokens")


def announces_body(headers: dict) -> bool:
    return headers.get(b"content-length", b"0") not in (b"", b"0") or b"transfer-encoding" in headers


async def send_json_error(send, status: int, message: str, kind: str, path: str = "", close: bool = False) -> None:
    """The error in the shape of the API `path` belongs to (Anthropic's on its paths); the
    connection closes after it with `close` and after every 413 and above."""
    shape = anthropic_protocol.error_body(status, message) if path.startswith(anthropic_protocol.PATH_PREFIX) \
        else {"error": {"message": message, "type": kind, "code": status}}
    body = json.dumps(shape).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                + ([(b"connection", b"close")] if close or status >= 413 else [])})
    await send({"type": "http.response.body", "body": body})


async def _refuse(receive, send, headers: dict, status: int, message: str, kind: str, path: str = "") -> None:
    """An error answered before the body is read: the body is drained first (drain_body),
    and a connection that carried one closes after the answer (the drain is bounded: what a
    client sends past it must not be read as its next request, and a refused client is not
    kept for the keep-alive time)."""
    await drain_body(receive, headers)
    await send_json_error(send, status, message, kind, path, close=announces_body(headers))


_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_EVERY_ADDRESS = frozenset({"0.0.0.0", "::", ""})


def host_name(host: str) -> str:
    """The name in a Host header, without its port ("[::1]:30000" -> "::1"), lower-cased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def allowed_hosts(bind_host: str, extra: Sequence[str] = ()) -> Optional[frozenset[str]]:
    """The Host header values a server bound to `bind_host` answers to: on a loopback
    address, the loopback names and `extra` (a web page's DNS-rebound name is none of
    them, so it cannot drive a local server); on every address (0.0.0.0, ::), any host,
    unless `extra` lists them ("*": any)."""
    names = frozenset(host_name(h) for h in extra if h)
    if "*" in names:
        return None
    bind = host_name(bind_host)
    if bind in _EVERY_ADDRESS:
        return _LOOPBACK_NAMES | names if names else None
    return _LOOPBACK_NAMES | names | {bind}


_DEFAULT_PORTS = {"http": 80, "https": 443}


def same_origin(origin: str, host: str) -> bool:
    """Whether a browser's Origin header names the server the request was sent to, as
    its Host header addresses it: the same host (or loopback names both) and port.
    "null" (a sandboxed frame, a file:// page) names no server."""
    try:
        page = urllib.parse.urlsplit(origin.strip())
        server = urllib.parse.urlsplit("//" + host.strip())
        # A Host without a port was sent to the default port of the client's scheme, which
        # behind a TLS proxy is not this server's: a same-origin page used its own scheme.
        default = _DEFAULT_PORTS.get(page.scheme)
        ports_match = (page.port or default) == (server.port or default)
    except ValueError:  # a port that is not a number, or out of range
        return False
    if page.hostname is None or not ports_match:
        return False
    return page.hostname == server.hostname or {page.hostname, server.hostname} <= _LOOPBACK_NAMES


# RFC 9110's safe methods: they change nothing, and this server reads no body with them.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _body_problem(headers: dict[bytes, bytes], method: str, path: str) -> Optional[str]:
    """Why a request that may change state is refused for its body, or None. A page of
    another site can post a form (urlencoded, multipart, text/plain) without asking, but
    application/json only after a CORS preflight this server never grants. A POST with
    neither a Content-Type nor a body, as `curl -X POST .../flush_cache` sends it, is
    served: a form always names its type, and a script's bodiless cross-site POST
    carries an Origin, refused before this."""
    content_type = headers.get(b"content-type")
    if content_type is None:
        if headers.get(b"content-length", b"0") not in (b"", b"0") or b"transfer-encoding" in headers:
            return f"{method} {path} has a body but no Content-Type: send it as application/json"
        return None
    if content_type.split(b";", 1)[0].strip().lower() != b"application/json":
        return (f"Content-Type {content_type.decode('latin-1')!r} is not application/json: {method} {path} "
                "takes a JSON body")
    return None


class RequestGuard:
    """Pure ASGI middleware in front of every endpoint: the Host header (DNS
    rebinding), the Origin header (cross-site requests from web pages), the API key
    (as SGLang guards it) on every path but /health and /metrics, JSON bodies (a
    web page's form cannot be one), a 413 for bodies over `body_limit` bytes
    (announced or read), and a JSON 500 for any unhandled error.

    Pure ASGI (not Starlette's BaseHTTPMiddleware) so that the endpoint's
    `request.is_disconnected()` sees the client leave.
    """

    def __init__(self, app: ASGIApp, api_key: Optional[str], body_limit: int,
                 allowed_hosts: Optional[frozenset[str]] = None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.key = api_key.encode() if api_key else None  # as Anthropic's clients send it, in x-api-key
        self.limit = body_limit
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        path, method = scope["path"], scope["method"]
        guarded = path not in UNGUARDED_PATHS
        if self.allowed_hosts is not None and guarded:
            host = host_name(headers.get(b"host", b"").decode("latin-1"))
            if host not in self.allowed_hosts:
                await _refuse(receive, send, headers, 421, f"Host {host!r} is not one this server answers to "
                              "(--allowed-hosts)", "invalid_request_error", path)
                return
        # Browsers send Origin with every POST and every cross-site fetch; SDKs and curl
        # send none, and are served.
        origin = headers.get(b"origin")
        if origin is not None and guarded:
            origin_text, host_text = origin.decode("latin-1"), headers.get(b"host", b"").decode("latin-1")
            if not same_origin(origin_text, host_text):
                await _refuse(receive, send, headers, 403,
                              f"Origin {origin_text!r} is not this server ({host_text!r}): requests from other sites' "
                              "web pages are refused", "invalid_request_error", path)
                return
        if self.expected is not None and guarded:
            bearer = hmac.compare_digest(headers.get(b"authorization", b""), self.expected)
            if not (hmac.compare_digest(headers.get(b"x-api-key", b""), self.key) or bearer):
                await _refuse(receive, send, headers, 401, "missing or wrong API key (Authorization: Bearer KEY, "
                              "or x-api-key: KEY)", "authentication_error", path)
                return
            scope.setdefault("state", {})[ADMITTED_KEY] = self.key.decode()
        if method not in _SAFE_METHODS and guarded:
            problem = _body_problem(headers, method, path)
            if problem is not None:
                await _refuse(receive, send, headers, 415, problem, "invalid_request_error", path)
                return
        announced = headers.get(b"content-length", b"")
        if announced.isdigit() and int(announced) > self.limit:
            await drain_body(receive, headers)
            await self._too_large(send, int(announced), path)
            return
        received = 0
        started = too_large = False

        async def counting_receive():
            # Past the limit the app sees its client leave (it stops reading) and the
            # 413 is sent here: an exception raised into the app's body read became
            # the framework's 400 ("error parsing the body") for a chunked body.
            nonlocal received, too_large
            if too_large:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    too_large = True
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message):
            nonlocal started
            if too_large:
                return  # the 413 below is the response
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except Exception as e:  # noqa: BLE001 - every failure a client sees is JSON
            if not too_large:
                logging.exception("unhandled error in %s", scope["path"])
                if started:
                    raise
                await send_json_error(send, 500, f"internal error: {type(e).__name__}: {e}", "server_error", path)
                return
        if too_large and not started:
            await drain_body(receive, headers)
            await self._too_large(send, received, path)

    async def _too_large(self, send, size: int, path: str) -> None:
        await send_json_error(send, 413, f"request body of {size} bytes exceeds the limit of {self.limit} bytes",
                              "invalid_request_error", path)
