"""The agents bench without npm or the CLIs: Codex's config, the clients' environments,
usage read from both APIs' streams, and the logging proxy in front of a stub server."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import tomllib

import httpx
import pytest

from rvascend.bench import agents


def test_codex_config_points_at_the_server_over_the_responses_api(tmp_path):
    path = agents.write_codex_config(str(tmp_path / "codex"), "http://127.0.0.1:8123/v1", "m", "KEY_VAR")
    with open(path, "rb") as f:
        config = tomllib.load(f)
    assert config["model_provider"] == "local" and config["model"] == "m"
    assert config["model_providers"]["local"] == {
        "name": "rvascend", "base_url": "http://127.0.0.1:8123/v1", "wire_api": "responses", "env_key": "KEY_VAR",
        "request_max_retries": 0, "stream_max_retries": 0}


def test_client_commands_carry_home_key_and_model(tmp_path):
    argv, env = agents.client_command("codex", "/bin/codex", str(tmp_path), "http://127.0.0.1:9", "m", "k", 64)
    assert argv == ["/bin/codex", "exec", "--skip-git-repo-check", agents.PROMPT]
    assert env["HOME"] == str(tmp_path) and env[agents.CODEX_KEY_ENV] == "k"
    assert os.path.exists(os.path.join(env["CODEX_HOME"], "config.toml"))
    argv, env = agents.client_command("claude", "/bin/claude", str(tmp_path), "http://127.0.0.1:9", "m", "k", 64)
    assert argv == ["/bin/claude", "-p", agents.PROMPT]
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9" and env["ANTHROPIC_MODEL"] == "m"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "64" and "OPENAI_API_KEY" not in env
    with pytest.raises(ValueError, match="unknown client 'gemini'"):
        agents.client_command("gemini", "", str(tmp_path), "", "m", "k", 1)


def test_clis_installed_at_the_pins_are_not_reinstalled_and_old_node_is_named(tmp_path, monkeypatch):
    for package, version in agents.PINS.items():
        os.makedirs(tmp_path / "node_modules" / package)
        (tmp_path / "node_modules" / package / "package.json").write_text(json.dumps({"version": version}))
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=node_version, stderr="")

    monkeypatch.setattr(agents.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(agents.subprocess, "run", run)
    node_version = "v20.20.2\n"
    binaries = agents.ensure_clis(str(tmp_path))
    assert calls == [["/usr/bin/node", "--version"]]  # no npm
    assert binaries["codex"] == str(tmp_path / "node_modules" / ".bin" / "codex")
    node_version = "v16.1.0\n"
    with pytest.raises(RuntimeError, match="Node.js 18 or newer on PATH; found v16.1.0"):
        agents.ensure_clis(str(tmp_path))
    monkeypatch.setattr(agents.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="found none"):
        agents.ensure_clis(str(tmp_path))


def _sse(*events: dict) -> bytes:
    return b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in events)


RESPONSES_STREAM = _sse(
    {"type": "response.created", "response": {"usage": None}},
    {"type": "response.output_text.delta", "delta": "hi"},
    {"type": "response.completed", "response": {"usage": {
        "input_tokens": 11292, "input_tokens_details": {"cached_tokens": 11000}, "output_tokens": 3}}})
MESSAGES_STREAM = _sse(
    {"type": "message_start", "message": {"usage": {"input_tokens": 292, "cache_read_input_tokens": 33000,
                                                    "output_tokens": 0}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
     "usage": {"input_tokens": 292, "cache_read_input_tokens": 33000, "output_tokens": 64}})


def test_usage_from_both_apis_streams_and_bodies():
    assert agents.usage_of(RESPONSES_STREAM) == {"prompt_tokens": 11292, "cached_tokens": 11000}
    # Anthropic counts the cached tokens apart from input_tokens.
    assert agents.usage_of(MESSAGES_STREAM) == {"prompt_tokens": 33292, "cached_tokens": 33000}
    assert agents.usage_of(b'{"usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0}}}') == \
        {"prompt_tokens": 5, "cached_tokens": 0}
    assert agents.usage_of(b'{"type":"error","error":{"message":"too long"}}') == \
        {"prompt_tokens": None, "cached_tokens": None}
    assert agents.usage_of(b"") == {"prompt_tokens": None, "cached_tokens": None}


def test_summary_takes_the_first_request_with_tools():
    exchanges = [{"method": "HEAD", "path": "/", "status": 401},
                 {"method": "POST", "path": "/v1/messages/count_tokens", "status": 200},
                 {"method": "POST", "path": "/v1/messages?beta=true", "tools": 24, "body_bytes": 76208,
                  "status": 200, "prompt_tokens": 33292, "cached_tokens": 33000, "ttft_s": 0.5},
                 {"method": "POST", "path": "/v1/messages?beta=true", "tools": 24, "status": 200, "ttft_s": 9.0}]
    row = agents.summarize("claude", 2, 0, 3.0, exchanges, "x" * 5000)
    assert (row["path"], row["tools"], row["prompt_tokens"], row["cached_tokens"], row["ttft_s"]) == \
        ("/v1/messages?beta=true", 24, 33292, 33000, 0.5)
    assert row["statuses"] == [401, 200, 200, 200] and len(row["output_tail"]) == 2000
    assert agents.summarize("codex", 1, None, 1.0, [], "")["prompt_tokens"] is None


def test_proxy_forwards_the_stream_and_logs_the_exchange():
    class Stub(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            status = 200 if self.headers.get("x-api-key") == "k" else 401
            self.send_response(status)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(MESSAGES_STREAM)))
            self.end_headers()
            self.wfile.write(MESSAGES_STREAM)

    stub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    try:
        with agents.Proxy(f"http://127.0.0.1:{stub.server_address[1]}") as proxy:
            body = {"model": "m", "stream": True, "max_tokens": 8, "tools": [{"name": "Bash"}, {"name": "Read"}]}
            r = httpx.post(proxy.url + "/v1/messages?beta=true", content=json.dumps(body), headers={"x-api-key": "k"})
            assert r.status_code == 200 and r.content == MESSAGES_STREAM
            assert httpx.post(proxy.url + "/v1/messages", json={}).status_code == 401
            (ok, refused) = proxy.take()
    finally:
        stub.shutdown()
        stub.server_close()
    assert ok["path"] == "/v1/messages?beta=true" and ok["tools"] == 2 and ok["max_tokens"] == 8
    assert ok["body_bytes"] == len(json.dumps(body)) and ok["status"] == 200
    assert (ok["prompt_tokens"], ok["cached_tokens"]) == (33292, 33000)
    assert 0 <= ok["first_byte_s"] <= ok["ttft_s"] <= ok["total_s"] and "answer" not in ok
    assert refused["status"] == 401 and refused["answer"] == MESSAGES_STREAM.decode()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
