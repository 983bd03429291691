"""Agents: the Codex CLI and Claude Code run end to end against this server.

`./dev bench --parts=agents` installs both clients at pinned versions under
.deps/agents_cli (npm, once), writes a small random-weight Qwen3-shaped checkpoint
whose context holds their prompts, starts `serve`, and runs each client twice:
`codex exec` over the Responses API, `claude -p` over the Messages API. The second
turn resends the same long system prompt and tools, so the prefix cache should
serve most of it.

A logging proxy on loopback sits between the clients and the server: per request it
keeps the path, the body's size and tool count, the status, the time to the first
event that carries a delta (TTFT as the client sees it: both APIs open their streams
before the prefill) and the usage the answer reports (prompt and cached tokens).

The weights are random, so what the model says is gibberish: the measure is whether
each client gets a whole turn through and what the second turn's prompt costs. A
turn ends when sampling draws the end token (about one token in 2048). Codex 0.171
has no output bound of its own; Claude Code's (CLAUDE_CODE_MAX_OUTPUT_TOKENS) stays
well above that, since Claude Code fails a turn whose answer still hits max_tokens
after three continuation requests.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any, Optional

import httpx
from absl import app, flags, logging

from rvascend import checkout
from rvascend.bench.results import print_table, write_jsonl
from rvascend.server.limits import API_KEY_ENV
from rvascend.server.loopback import server_process

FLAGS = flags.FLAGS
PINS = {"@openai/codex": "0.171.0", "@anthropic-ai/claude-code": "2.1.197"}
BINARIES = {"codex": "codex", "claude": "claude"}
MIN_NODE = 18  # Claude Code's `engines`
API_KEY = "agents-bench-key"
CODEX_KEY_ENV = "RVASCEND_AGENTS_KEY"
MODEL_NAME = "rvascend-agents"
# The clients' first requests are about 11 k (Codex) and 34 k (Claude Code) tokens of the
# random model's 2048-entry tokenizer (a real model's takes about 10 k and 20 k): 64 k of
# context holds them, and both clients' prompts stay cached side by side in 140 k.
CONTEXT = 65536
SERVER_ARGS = (f"--context-length={CONTEXT}", "--max-total-tokens=140000")
PROMPT = "Say hello"

# A small Qwen3: prefill of 30 k tokens in seconds on one host core.
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 768,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "vocab_size": 2048, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": CONTEXT,
    "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 4, "torch_dtype": "bfloat16"}

# Qwen3's chat template cut to what the clients exercise (system, tools, tool calls and
# results, the generation prompt); its <|im_*|> markers are plain text to this tokenizer.
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments if call.function.arguments is string \
else call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_string("model-path", None, "Checkpoint (default: the small random Qwen3 of this module).")
    flags.DEFINE_list("clients", ["codex", "claude"], "Which CLIs to run.")
    flags.DEFINE_integer("turns", 2, "Runs of each CLI in a row.")
    flags.DEFINE_integer("max-output-tokens", 8192,
                         "Claude Code's output bound (CLAUDE_CODE_MAX_OUTPUT_TOKENS); Codex has no such setting.")
    flags.DEFINE_float("timeout", 600, "Seconds per CLI run.")
    flags.DEFINE_string("server-args", " ".join(SERVER_ARGS), "Extra flags for the server, space-separated.")
    flags.DEFINE_string("output", "bench_results/agents.jsonl", "jsonl file to append to.")


# -- the clients ---------------------------------------------------------------------
def cli_dir() -> str:
    """Where the pinned CLIs are installed: .deps/agents_cli of the checkout."""
    return os.path.join(checkout.root(), ".deps", "agents_cli")


def installed_version(prefix: str, package: str) -> Optional[str]:
    """The version of `package` under prefix/node_modules, or None."""
    try:
        with open(os.path.join(prefix, "node_modules", package, "package.json"), encoding="utf-8") as f:
            return json.load(f).get("version")
    except (OSError, ValueError):
        return None


def ensure_clis(prefix: str) -> dict[str, str]:
    """The pinned CLIs installed under `prefix` (npm, only when a version differs):
    {binary name: path}."""
    node = shutil.which("node")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip() if node else ""
    if not version.startswith("v") or int(version[1:].split(".")[0]) < MIN_NODE:
        raise RuntimeError(f"the Codex CLI and Claude Code need Node.js {MIN_NODE} or newer on PATH; found "
                           f"{version or 'none'} (Debian: apt-get install nodejs npm)")
    missing = [f"{p}@{v}" for p, v in PINS.items() if installed_version(prefix, p) != v]
    if missing:
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not on PATH: the agents bench installs the Codex CLI and Claude Code with it "
                               "(Debian: apt-get install npm)")
        logging.info("installing %s into %s", " ".join(missing), prefix)
        os.makedirs(prefix, exist_ok=True)
        # Not --ignore-scripts: Claude Code's postinstall puts its platform package's native binary in place.
        subprocess.run([npm, "install", "--prefix", prefix, "--no-audit", "--no-fund",
                        *[f"{p}@{v}" for p, v in PINS.items()]], check=True)
        wrong = {p: installed_version(prefix, p) for p in PINS if installed_version(prefix, p) != PINS[p]}
        if wrong:
            raise RuntimeError(f"npm left {wrong} under {prefix}, not the pinned {PINS}")
    return {name: os.path.join(prefix, "node_modules", ".bin", binary) for name, binary in BINARIES.items()}


def write_codex_config(codex_home: str, base_url: str, model: str, env_key: str) -> str:
    """CODEX_HOME/config.toml pointing Codex at `base_url` (…/v1) over the Responses API,
    its key read from the environment variable `env_key`, no retries; the file's path.
    (Codex 0.171 has no setting that bounds its output: it sends no max_output_tokens.)"""
    os.makedirs(codex_home, exist_ok=True)
    lines = ['model_provider = "local"', f"model = {json.dumps(model)}", "",
             "[model_providers.local]", 'name = "rvascend"', f"base_url = {json.dumps(base_url)}",
             'wire_api = "responses"', f"env_key = {json.dumps(env_key)}", "request_max_retries = 0",
             "stream_max_retries = 0", ""]
    path = os.path.join(codex_home, "config.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path


def client_command(name: str, binary: str, home: str, base: str, model: str, key: str,
                   max_output_tokens: int) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of one run of client `name` against the server at `base`."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "TERM": "dumb", "NO_COLOR": "1",
           "LANG": "C.UTF-8"}
    if name == "codex":
        codex_home = os.path.join(home, ".codex")
        write_codex_config(codex_home, base + "/v1", model, CODEX_KEY_ENV)
        return [binary, "exec", "--skip-git-repo-check", PROMPT], {**env, "CODEX_HOME": codex_home,
                                                                     CODEX_KEY_ENV: key}
    if name == "claude":
        return [binary, "-p", PROMPT], {**env, "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": key,
                                        "ANTHROPIC_MODEL": model, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                                        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output_tokens)}
    raise ValueError(f"unknown client {name!r}; known: {sorted(BINARIES)}")


# -- the proxy -----------------------------------------------------------------------
def usage_of(events: bytes) -> dict[str, Optional[int]]:
    """Prompt and cached tokens from an answer: a JSON body or an SSE stream of the
    Responses API (`usage.input_tokens`, `input_tokens_details.cached_tokens`) or the
    Messages API (`input_tokens` uncached plus `cache_read_input_tokens`). The last
    usage seen wins; None where the answer reports none."""
    found: dict[str, Optional[int]] = {"prompt_tokens": None, "cached_tokens": None}
    text = events.decode("utf-8", "replace")
    chunks = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")] or [text]
    for chunk in chunks:
        try:
            data = json.loads(chunk)
        except ValueError:
            continue
        for holder in (data, data.get("response") or {}, data.get("message") or {}) if isinstance(data, dict) else ():
            usage = holder.get("usage") if isinstance(holder, dict) else None
            if not isinstance(usage, dict) or "input_tokens" not in usage:
                continue
            if "cache_read_input_tokens" in usage:  # Anthropic: input_tokens excludes the cached ones
                cached = usage.get("cache_read_input_tokens") or 0
                found = {"prompt_tokens": usage["input_tokens"] + cached, "cached_tokens": cached}
            else:
                details = usage.get("input_tokens_details") or {}
                found = {"prompt_tokens": usage["input_tokens"], "cached_tokens": details.get("cached_tokens")}
    return found


def describe_request(path: str, body: bytes) -> dict[str, Any]:
    """What a client sent: path, body size (bytes), tool count, a few top-level fields."""
    out: dict[str, Any] = {"path": path, "body_bytes": len(body)}
    try:
        data = json.loads(body)
    except ValueError:
        return out
    if isinstance(data, dict):
        out.update(tools=len(data.get("tools") or []), stream=data.get("stream"),
                   max_tokens=data.get("max_output_tokens", data.get("max_tokens")),
                   fields=sorted(data))
    return out


class Proxy:
    """A loopback HTTP proxy to `upstream` that logs each exchange (see the module docstring)."""

    _HOP = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding", "keep-alive"}

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # the exchanges are logged in proxy.log
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                entry = {**describe_request(self.path, body), "method": self.command, "t_sent": time.time(),
                         "content_encoding": self.headers.get("content-encoding")}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in proxy._HOP}
                t0 = time.monotonic()
                answer = b""

                def log() -> None:  # before the client has the last byte: its next request sees this one
                    entry["total_s"] = time.monotonic() - t0
                    entry.update(usage_of(answer))
                    if entry.get("status", 200) >= 400:
                        entry["answer"] = answer[:2000].decode("utf-8", "replace")
                    with proxy._lock:
                        proxy.log.append(entry)

                self.close_connection = True
                try:
                    with httpx.stream(self.command, proxy.upstream + self.path, headers=headers, content=body,
                                      timeout=None) as r:
                        entry["status"] = r.status_code
                        self.send_response(r.status_code)
                        for k, v in r.headers.items():
                            if k.lower() not in proxy._HOP and k.lower() != "content-encoding":
                                self.send_header(k, v)
                        chunked = self.command != "HEAD"
                        self.send_header("transfer-encoding" if chunked else "content-length",
                                         "chunked" if chunked else "0")
                        self.send_header("connection", "close")
                        self.end_headers()
                        for piece in r.iter_raw() if chunked else ():
                            entry.setdefault("first_byte_s", time.monotonic() - t0)
                            answer += piece
                            # Both APIs open a stream before the prefill (response.created,
                            # message_start): the first token is the first event with a delta.
                            if "ttft_s" not in entry and b'delta"' in answer[-len(piece) - 16:]:
                                entry["ttft_s"] = time.monotonic() - t0
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                            self.wfile.flush()
                        log()
                        if chunked:
                            self.wfile.write(b"0\r\n\r\n")
                except (httpx.HTTPError, OSError) as e:
                    if "total_s" not in entry:  # not logged yet
                        entry["error"] = repr(e)
                        log()

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "Proxy":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self.log = self.log, []
        return out


def summarize(client: str, turn: int, rc: Optional[int], wall_s: float, exchanges: list[dict[str, Any]],
              output: str) -> dict[str, Any]:
    """One row: the run (exit code None: timed out; `output`: its stderr and stdout) and
    its first model request (the first POST with tools, else the first POST) as the
    server answered it."""
    posts = [e for e in exchanges if e.get("method") == "POST"]
    first = next((e for e in posts if e.get("tools")), posts[0] if posts else {})
    return {"client": client, "turn": turn, "exit_code": rc, "wall_s": wall_s, "requests": len(exchanges),
            "statuses": [e.get("status") for e in exchanges], "path": first.get("path"),
            "tools": first.get("tools"), "body_bytes": first.get("body_bytes"), "status": first.get("status"),
            "prompt_tokens": first.get("prompt_tokens"), "cached_tokens": first.get("cached_tokens"),
            "ttft_s": first.get("ttft_s"), "first_byte_s": first.get("first_byte_s"), "exchanges": exchanges,
            "output_tail": output[-2000:]}


def run_client(name: str, binary: str, home: str, base: str, model: str, key: str, turn: int, proxy: Proxy,
               max_output_tokens: int, timeout: float) -> dict[str, Any]:
    """One run of client `name` in `home` (its HOME and working directory: the same for
    every turn, as a user's repeated runs in one project, since the clients put the
    working directory into their prompts)."""
    argv, env = client_command(name, binary, home, base, model, key, max_output_tokens)
    proxy.take()
    t0 = time.monotonic()
    try:
        done = subprocess.run(argv, env=env, cwd=home, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)
        rc, output = done.returncode, done.stderr + done.stdout
    except subprocess.TimeoutExpired as e:  # its captured output is bytes, text=True or not
        rc, output = None, f"timed out after {timeout:.0f} s: " + (e.stderr or b"").decode("utf-8", "replace")
    wall = time.monotonic() - t0
    time.sleep(0.2)  # a client stopped mid-stream: the proxy logs it once its next write fails
    return summarize(name, turn, rc, wall, proxy.take(), output)


# -- the model -----------------------------------------------------------------------
def write_checkpoint(path: str) -> None:
    """CONFIG with random weights, the random test model's tokenizer and CHAT_TEMPLATE."""
    from safetensors.torch import save_file

    from rvascend.models.random_model import ensure_random_model, random_weights
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(CONFIG, f, indent=2)
    source = ensure_random_model()
    shutil.copy(os.path.join(source, "tokenizer.json"), os.path.join(path, "tokenizer.json"))
    with open(os.path.join(source, "tokenizer_config.json"), encoding="utf-8") as f:
        tokenizer_config = json.load(f)
    tokenizer_config.update(chat_template=CHAT_TEMPLATE, model_max_length=CONFIG["max_position_embeddings"])
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config, f, indent=2)
    save_file(random_weights(CONFIG, seed=0), os.path.join(path, "model.safetensors"))


def ensure_checkpoint() -> str:
    from rvascend.runtime import model_cache
    return model_cache.ensure_checkpoint("rvascend-random-qwen3-agents-v2", write_checkpoint,
                                         "the agents bench's small random Qwen3")


COLUMNS = [("client", "client", ""), ("turn", "turn", "d"), ("exit_code", "exit", ""), ("wall_s", "wall s", ".1f"),
           ("requests", "requests", "d"), ("tools", "tools", ""), ("body_bytes", "body B", ""),
           ("status", "status", ""), ("prompt_tokens", "prompt", ""), ("cached_tokens", "cached", ""),
           ("ttft_s", "TTFT s", ".2f")]


def main(argv: list[str]) -> int:
    del argv
    from rvascend.repro import manifest
    binaries = ensure_clis(cli_dir())
    model_path = FLAGS["model-path"].value or ensure_checkpoint()
    rows = []
    extra = FLAGS["server-args"].value.split()
    with server_process(model_path, [*extra, f"--served-model-name={MODEL_NAME}"],
                        env={API_KEY_ENV: API_KEY}) as (_, url), Proxy(url) as proxy:
        for name in FLAGS.clients:
            with tempfile.TemporaryDirectory(prefix=f"agents-{name}-") as home:
                for turn in range(1, FLAGS.turns + 1):
                    row = run_client(name, binaries[name], home, proxy.url, MODEL_NAME, API_KEY, turn, proxy,
                                     FLAGS["max-output-tokens"].value, FLAGS.timeout)
                    logging.info("%s turn %d: exit %s in %.1f s, %s", name, turn, row["exit_code"], row["wall_s"],
                                 [(e.get("path"), e.get("status")) for e in row["exchanges"]])
                    rows.append(row)
    print_table([{k: "" if v is None else v for k, v in r.items()} for r in rows], COLUMNS)
    for client in FLAGS.clients:
        ttft = {r["turn"]: r["ttft_s"] for r in rows if r["client"] == client}
        if ttft.get(1) and ttft.get(2):
            print(f"{client}: second turn's TTFT / first's = {ttft[2] / ttft[1]:.3f} (target: at most 0.25)")
    write_jsonl(FLAGS.output, [{"bench": "agents", "pins": PINS, **r} for r in rows],
                manifest.capture(checkpoint_dir=model_path))
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    _define_flags()
    app.run(main)
