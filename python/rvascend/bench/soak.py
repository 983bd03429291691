"""Soak: many clients for a while against a fresh server, the valid and the hostile mixed.

`./dev bench --parts=soak` starts `serve` as a subprocess and runs --clients
threads for --seconds. Each client loops over a mix of:

- valid greedy requests (completions and chat, streaming and not), each of a
  fixed set whose answer alone was taken before the load;
- every hostile input of the reliability review: a 500 KB single-word prompt,
  a lone continuation byte forced for hundreds of tokens (logit_bias), too
  many and too long stop strings, explicit nulls, an oversize chunked body, a
  huge logit_bias, a DNS-rebound Host, a GET /flush_cache, malformed JSON;
- clients that leave mid-stream;
- with n-gram drafts on (the server's default flags here), requests that end inside
  accepted draft runs: a passage to repeat, with a stop token id or a stop string
  taken from its own answer, and chats whose history quotes the answer and its end
  token, under a regex, so that drafts carry EOS right after the grammar's last token.

A prober reads /health every 100 ms throughout. At the end the server must be
idle again: nothing running or waiting, no KV slot reserved or used, no
prefix-cache lock held, every recurrent-state slot free; its RSS growth is
reported. The run fails on any 5xx, a /health p99 over 1 s, a valid greedy
answer that differs from the same request alone (except where the lone run's
top two tokens were within --near-tie of each other: batch-dependent rounding
decides those; see the batch-invariance issue), a hostile request answered
other than as expected, or anything left held.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging as std_logging
import random
import re
import threading
import time
from typing import Any, Callable, Optional, Sequence

import httpx
import psutil
from absl import app, flags, logging

from rvascend.bench.results import percentile, print_table, write_jsonl
from rvascend.server.limits import API_KEY_ENV
from rvascend.server.loopback import server_process

FLAGS = flags.FLAGS
API_KEY = "soak-key"
# N-gram drafts on: every request is verified in runs, and the draft cases below need them.
SERVER_ARGS = ("--enable-cpu-kernels", "--speculative-algorithm=NGRAM", "--speculative-num-draft-tokens=4")


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_string("model-path", None, "Checkpoint (default: the random-weight test model).")
    flags.DEFINE_integer("seconds", 60, "How long the clients run.")
    flags.DEFINE_integer("clients", 16, "Concurrent clients.")
    flags.DEFINE_float("near-tie", 0.05, "Lone-run log-probability margin under which a differing answer is "
                       "counted as a near tie, not a failure.")
    flags.DEFINE_string("server-args", " ".join(SERVER_ARGS), "Extra flags for the server, space-separated.")
    flags.DEFINE_string("output", "bench_results/soak.jsonl", "jsonl file to append to.")


# -- the requests ------------------------------------------------------------------
def _valid_requests(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of greedy requests whose answers are compared with their lone runs."""
    topics = ["the sea", "a fruit", "prime numbers", "the moon", "a red bicycle", "bread", "rivers", "owls"]
    out = []
    for i, topic in enumerate(topics):
        n = 6 + rng.randrange(10)
        if i % 2:
            out.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": f"Tell me about {topic}."}],
                                                 "max_tokens": n, "temperature": 0}))
        else:
            out.append(("/v1/completions", {"prompt": f"A short note about {topic}:", "max_tokens": n,
                                            "temperature": 0}))
    return out


def _text(path: str, body: dict[str, Any]) -> str:
    return body["choices"][0]["message"]["content"] if path.endswith("chat/completions") else \
        body["choices"][0]["text"]


def _streamed_text(path: str, lines: list[str]) -> str:
    text = []
    for line in lines:
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                piece = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
                text.append(piece or "")
    return "".join(text)


def _lone_margin(http: httpx.Client, path: str, body: dict[str, Any]) -> tuple[str, list[float]]:
    """The request's answer alone, and at each token the log-probability margin between
    the chosen token and the runner-up."""
    extra = {"logprobs": True, "top_logprobs": 2} if path.endswith("chat/completions") else {"logprobs": 2}
    r = http.post(path, json={**body, **extra})
    r.raise_for_status()
    data = r.json()
    choice = data["choices"][0]
    if path.endswith("chat/completions"):
        tops = [[t["logprob"] for t in c["top_logprobs"]] for c in choice["logprobs"]["content"]]
    else:
        tops = [sorted(t.values(), reverse=True) for t in choice["logprobs"]["top_logprobs"]]
    margins = [t[0] - t[1] if len(t) > 1 else float("inf") for t in tops]
    return _text(path, data), margins


# Each draft case: (name, path, body, check(response JSON) -> a failure, or None).
_PASSAGE = "one two three four five six seven eight nine ten. "
_GRAMMAR = "[a-c]{12}"


def _draft_cases(http: httpx.Client) -> list[tuple[str, str, dict[str, Any], Callable[[dict], Optional[str]]]]:
    """Requests whose end lands inside runs of accepted drafts: a stop token id or a stop
    string at several places of a repeated passage's own answer, and a regex whose answer
    the chat history quotes with its end token. Checked for what holds in any batch: the
    end is the one asked for, the text obeys it."""
    prompt = f"Repeat after me: {_PASSAGE * 3}"
    r = http.post("/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 40, "temperature": 0}})
    r.raise_for_status()
    ids, text = r.json()["output_ids"], r.json()["text"]
    cases = []
    firsts = [p for p in range(2, len(ids)) if ids[p] not in ids[:p]]  # where a token first appears
    for p in firsts[::max(1, len(firsts) // 5)][:5]:
        def check(data, token=ids[p]):
            out, reason = data["output_ids"], data["meta_info"]["finish_reason"]
            if reason != {"type": "stop", "matched": token} or out[-1] != token or token in out[:-1]:
                return f"ended {reason} after {len(out)} tokens, not at its first {token}"
            return None
        cases.append(("drafts: stop token", "/generate", {"text": prompt, "sampling_params": {
            "max_new_tokens": 40, "temperature": 0, "stop_token_ids": [ids[p]]}}, check))
    # Three-character pieces of the answer where they first appear, spread over it.
    pieces = [at for at in range(1, len(text) - 2) if text[at:at + 3] not in text[:at + 2]]
    for at in pieces[::max(1, len(pieces) // 4)][:4]:
        def check(data, piece=text[at:at + 3]):
            reason = data["meta_info"]["finish_reason"]
            if reason != {"type": "stop", "matched": piece} or piece in data["text"]:
                return f"ended {reason} with {data['text']!r}, not before its first {piece!r}"
            return None
        cases.append(("drafts: stop string", "/generate", {"text": prompt, "sampling_params": {
            "max_new_tokens": 40, "temperature": 0, "stop": [text[at:at + 3]]}}, check))
    ask = {"role": "user", "content": "Twelve letters from a, b and c, please."}
    messages = [ask, {"role": "assistant", "content": "abcabcabcabc"}] * 3 + [ask]

    def obeys(data):
        choice = data["choices"][0]
        content = choice["message"]["content"] or ""
        if choice["finish_reason"] != "stop" or not re.fullmatch(_GRAMMAR, content):
            return f"{choice['finish_reason']}: {content!r} does not match {_GRAMMAR}"
        return None
    for temperature in (0, 0.8):
        cases.append(("drafts: regex with the end token quoted", "/v1/chat/completions", {
            "messages": messages, "regex": _GRAMMAR, "max_tokens": 20, "temperature": temperature, "seed": 1}, obeys))
    return cases


# Each hostile request: (name, call(client) -> response, statuses it must get).
def _hostile(vocab_byte_token: Optional[int]) -> list[tuple[str, Callable[[httpx.Client], httpx.Response], set[int]]]:
    word = "".join(random.Random(1).choice("etaoinshrdlu") for _ in range(500_000))
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    limit_chunks = 40  # 40 x 1 MiB: over any server's body limit for these models

    def chunked():
        yield b'{"prompt": "'
        for _ in range(limit_chunks):
            yield b"x" * (1 << 20)
        yield b'"}'
    cases = [
        ("huge single word", lambda h: h.post("/v1/completions", json={"prompt": word, "max_tokens": 1}),
         {400}),
        ("65 stop strings", lambda h: h.post("/v1/completions", json={
            "prompt": "hi", "max_tokens": 2, "stop": [f"s{i}" for i in range(65)]}), {400}),
        ("a 2000-character stop", lambda h: h.post("/v1/completions", json={
            "prompt": "hi", "max_tokens": 2, "stop": ["y" * 2000]}), {400}),
        ("explicit nulls", lambda h: h.post("/v1/chat/completions", json={
            **chat, "temperature": None, "top_p": None, "n": None, "stream": None, "tools": None}), {200}),
        ("oversize chunked body", lambda h: h.post("/v1/completions", content=chunked(),
                                                      headers={"content-type": "application/json"}), {413}),
        ("huge logit_bias", lambda h: h.post("/v1/completions", json={
            "prompt": "hi", "max_tokens": 2, "logit_bias": {str(i): 1 for i in range(5000)}}), {400}),
        ("rebound Host", lambda h: h.post("/v1/chat/completions", json=chat, headers={"Host": "evil.example"}),
         {421}),
        ("GET /flush_cache", lambda h: h.get("/flush_cache"), {405}),
        ("malformed JSON", lambda h: h.post("/v1/completions", content=b'{"prompt": ',
                                               headers={"content-type": "application/json"}), {400}),
        ("bad token id", lambda h: h.post("/v1/completions", json={"prompt": [10**9], "max_tokens": 1}), {400}),
    ]
    if vocab_byte_token is not None:
        cases.append(("a forced lone continuation byte", lambda h: h.post("/v1/completions", json={
            "prompt": "hi", "max_tokens": 300, "temperature": 0, "ignore_eos": True,
            "logit_bias": {str(vocab_byte_token): 100}}), {200}))
    return cases


def _continuation_byte_token(http: httpx.Client) -> Optional[int]:
    """A token that decodes to U+FFFD alone (a byte-level token holding part of a
    character, such as a lone continuation byte), or None."""
    for token in range(512):
        d = http.post("/detokenize", json={"tokens": [token]})
        if d.status_code == 200 and d.json().get("prompt") == "\ufffd":
            return token
    return None


# -- the run ------------------------------------------------------------------------
class _Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.failures: list[str] = []
        self.near_ties = 0
        self.server_errors = 0

    def count(self, key: str, status: int) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            self.server_errors += status >= 500

    def fail(self, message: str) -> None:
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(message)


def _client(url: str, seed: int, deadline: float, valid: list, lone: dict, hostile: list, drafts: list,
            tally: _Tally, near_tie: float) -> None:
    rng = random.Random(seed)
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)
    while time.monotonic() < deadline:
        roll = rng.random()
        try:
            if roll < 0.55:
                i = rng.randrange(len(valid))
                path, body = valid[i]
                stream = rng.random() < 0.5
                if stream:
                    with http.stream("POST", path, json={**body, "stream": True}) as r:
                        status = r.status_code
                        lines = list(r.iter_lines()) if status == 200 else []
                    text = _streamed_text(path, lines)
                else:
                    r = http.post(path, json=body)
                    status = r.status_code
                    text = _text(path, r.json()) if status == 200 else None
                tally.count("valid", status)
                if status != 200:
                    tally.fail(f"valid request {i}: {status}")
                elif text != lone[i][0]:
                    common = next((j for j, (a, b) in enumerate(zip(text, lone[i][0])) if a != b),
                                  min(len(text), len(lone[i][0])))
                    if min(lone[i][1] or [float("inf")]) < near_tie:
                        tally.near_ties += 1
                    else:
                        tally.fail(f"valid request {i} answered {text!r} under load, {lone[i][0]!r} alone "
                                   f"(first difference at character {common})")
            elif roll < 0.65:
                path, body = valid[rng.randrange(len(valid))]
                with http.stream("POST", path, json={**body, "stream": True, "max_tokens": 64,
                                                     "ignore_eos": True}) as r:
                    status = r.status_code
                    for n, _ in enumerate(r.iter_lines()):
                        if n >= 2:
                            break  # the client leaves mid-stream
                tally.count("left mid-stream", status)
            elif roll < 0.8 and drafts:
                name, path, body, check = drafts[rng.randrange(len(drafts))]
                r = http.post(path, json=body)
                tally.count(name, r.status_code)
                failure = f"{r.status_code}: {r.text[:200]}" if r.status_code != 200 else check(r.json())
                if failure:
                    tally.fail(f"{name}: {failure}")
            else:
                name, call, expected = hostile[rng.randrange(len(hostile))]
                r = call(http)
                tally.count(name, r.status_code)
                if r.status_code not in expected:
                    tally.fail(f"{name}: {r.status_code} (expected {sorted(expected)}): {r.text[:200]}")
        except httpx.HTTPError as e:
            tally.fail(f"client error: {type(e).__name__}: {e}")


def _probe(url: str, stop: threading.Event, times: list[float], failures: list[str]) -> None:
    http = httpx.Client(base_url=url, timeout=10)
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            if http.get("/health").status_code != 200:
                failures.append("/health answered other than 200")
        except httpx.HTTPError as e:
            failures.append(f"/health: {type(e).__name__}")
        times.append(time.monotonic() - t0)
        stop.wait(0.1)


def _metrics(http: httpx.Client) -> dict[str, float]:
    out = {}
    for line in http.get("/metrics").text.splitlines():
        m = re.match(r"rvascend_(\w+) ([-+0-9.e]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def _idle(http: httpx.Client, timeout: float = 60) -> tuple[bool, dict[str, float]]:
    """Whether the server returned to idle within `timeout` s, and its last metrics."""
    deadline = time.monotonic() + timeout
    while True:
        m = _metrics(http)
        idle = (m.get("running") == 0 and m.get("waiting") == 0 and m.get("kv_used_tokens") == 0
                and m.get("kv_reserved_tokens") == 0 and m.get("kv_locked_tokens") == 0
                and m.get("state_slots_free") == m.get("state_slots_total"))
        if idle or time.monotonic() > deadline:
            return idle, m
        time.sleep(0.25)


def run(url: str, server_pid: int, seconds: float, clients: int, near_tie: float = 0.05) -> dict[str, Any]:
    """The soak against a server at `url` (API key API_KEY); a record of what it saw,
    with "passed" and the failures."""
    std_logging.getLogger("httpx").setLevel(std_logging.WARNING)  # a line per request otherwise
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)
    valid = _valid_requests(random.Random(0))
    lone = [_lone_margin(http, path, body) for path, body in valid]
    hostile = _hostile(_continuation_byte_token(http))
    drafts = _draft_cases(http)
    process = psutil.Process(server_pid)
    rss_before = process.memory_info().rss
    tally, health, health_failures, stop = _Tally(), [], [], threading.Event()
    prober = threading.Thread(target=_probe, args=(url, stop, health, health_failures), daemon=True)
    prober.start()
    deadline = time.monotonic() + seconds
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(_client, url, seed, deadline, valid, lone, hostile, drafts, tally, near_tie)
                  for seed in range(clients)]:
            f.result()
    stop.set()
    prober.join()
    idle, metrics = _idle(http)
    rss_after = process.memory_info().rss
    failures = tally.failures + health_failures[:10]
    p99 = percentile(health, 99) if health else float("inf")
    if p99 > 1.0:
        failures.append(f"/health p99 {p99:.2f} s (limit 1 s)")
    if not idle:
        failures.append(f"the server did not return to idle: {metrics}")
    return {
        "seconds": seconds, "clients": clients, "requests": sum(tally.counts.values()), "counts": tally.counts,
        "server_errors": tally.server_errors, "near_ties": tally.near_ties,
        "health_probes": len(health), "health_p99_s": p99, "health_max_s": max(health, default=float("inf")),
        "idle": idle, "end_metrics": metrics,
        "rss_before_mib": rss_before / 2**20, "rss_after_mib": rss_after / 2**20,
        "rss_growth_mib": (rss_after - rss_before) / 2**20,
        "failures": failures, "passed": not failures and tally.server_errors == 0,
    }


def soak_server(model_path: str, extra: Sequence[str]):
    """The server under soak (server_process), asking clients for API_KEY."""
    return server_process(model_path, extra, timeout=900, env={API_KEY_ENV: API_KEY})


def main(argv: list[str]) -> int:
    del argv
    from rvascend.models.random_model import ensure_random_model
    from rvascend.repro import manifest

    model_path = FLAGS["model-path"].value or ensure_random_model()
    with soak_server(model_path, FLAGS["server-args"].value.split()) as (proc, url):
        record = run(url, proc.pid, FLAGS.seconds, FLAGS.clients, FLAGS["near-tie"].value)
    record["model_path"] = model_path
    print_table([record], [("seconds", "s", ".0f"), ("clients", "clients", "d"), ("requests", "requests", "d"),
                           ("server_errors", "5xx", "d"), ("near_ties", "near ties", "d"),
                           ("health_p99_s", "/health p99 s", ".3f"), ("rss_growth_mib", "RSS growth MiB", ".1f"),
                           ("passed", "passed", "")])
    for name, n in sorted(record["counts"].items()):
        print(f"  {n:6d}  {name}")
    for failure in record["failures"]:
        logging.error("%s", failure)
    write_jsonl(FLAGS.output, [record], manifest.capture(checkpoint_dir=model_path))
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    _define_flags()
    app.run(main)
