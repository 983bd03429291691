"""Several servers behind SGLang's own router (sglang-router, unmodified), on loopback.

Three workers of the random-weight test model: two are server processes started by
`scale_out.Cluster` (what `./dev serve --workers N` runs), which the tests kill and
restart; the third is in this process, so a test can make its engine steps slow and
its /health answer the watchdog's 503. Every request is a few tokens of greedy
decoding, so the answers are the same on every worker.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest

from rvascend.models.random_model import ensure_random_model
from rvascend.server import scale_out
from rvascend.server.loopback import free_port, wait_healthy
from rvascend.server.limits import API_KEY_ENV
from rvascend.server.testing import API_KEY, Server, slow_steps

# A board-sized KV pool: it holds three of the test's six system prompts (about 375 tokens
# each) with room for the requests in flight, not four.
POOL_TOKENS = 1280
# The in-process worker's watchdog: short, so a stuck step is reported soon, and still long
# enough that no ordinary step on a loaded CI machine trips it (a 503 takes the worker out of
# the routers' rotation, and round robin over two workers hits the cache like cache-aware).
WATCHDOG_SECONDS = 5.0
# The seed's shape gate: every worker routes alike (the measured gate times each worker's host
# on its own, and workers that differ in speed make the router balance load instead of prefixes).
WORKER_ARGS = [f"--model-path={ensure_random_model()}", "--enable-cpu-rvv-inductor", "--cpu-compile-mode=eager",
               "--cpu-kernels-shape-gate=bucketed", f"--max-total-tokens={POOL_TOKENS}", "--max-running-requests=8"]
# (The key reaches the workers and the router through the environment: Cluster(api_key=...).)
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
TIMEOUT = 120.0


def _requests_served(url: str) -> float:
    """Finished requests a worker counted (its /metrics)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(r'^rvascend_requests_total\{[^}]*\} (\S+)$', text, re.M))


MODEL = "rvascend-random-llama-v2"  # the router's OpenAI routes need the model's name


def _complete(client: httpx.Client, prompt: str, max_tokens: int = 4) -> httpx.Response:
    return client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                                "temperature": 0})


@pytest.fixture(scope="module")
def cluster():
    logs = tempfile.mkdtemp(prefix="scale_out_")
    c = scale_out.Cluster(2, WORKER_ARGS, api_key=API_KEY, log_dir=logs, startup_timeout=300)
    local = Server(app_options={"watchdog_timeout": WATCHDOG_SECONDS}, max_total_tokens=POOL_TOKENS)
    try:
        r = httpx.post(c.url + "/workers", json={"url": local.url, "api_key": API_KEY}, headers=HEADERS, timeout=30)
        assert r.status_code < 300, r.text
        scale_out.wait_router(c.url, c.router, 3, API_KEY, 60)
        assert local.name == MODEL
        c.local = local
        c.client = httpx.Client(base_url=c.url, headers=HEADERS, timeout=TIMEOUT)
        c.logs = logs
        yield c
    finally:
        c.stop()
        local.stop()



def test_the_key_is_on_no_command_line_and_still_guards_every_process(cluster):
    """Every user can read a process's command line (`ps`): the key travels in the
    environment of the workers and the router instead."""
    import psutil
    for proc in [cluster.router, *cluster.procs]:
        assert API_KEY not in " ".join(psutil.Process(proc.pid).cmdline())
    for url in [cluster.url, *cluster.urls]:
        assert httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1},
                          timeout=TIMEOUT).status_code == 401, url
        assert _complete(httpx.Client(base_url=url, headers=HEADERS, timeout=TIMEOUT), "hi").status_code == 200, url

def test_the_router_gives_a_single_servers_answers(cluster):
    direct = cluster.local.http
    for prompt in ["The capital of France", "hello world", "1 2 3 4"]:
        via = _complete(cluster.client, prompt)
        assert via.status_code == 200, via.text
        assert via.json()["choices"][0]["text"] == _complete(direct, prompt).json()["choices"][0]["text"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    assert (cluster.client.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]
            == direct.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"])
    # /generate with the fields the router adds (log_metrics, return_hidden_states, ...).
    gen = {"text": "hello world", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    via = cluster.client.post("/generate", json=gen)
    assert via.status_code == 200, via.text
    assert via.json()["text"] == direct.post("/generate", json=gen).json()["text"]
    with cluster.client.stream("POST", "/v1/chat/completions", json=dict(chat, stream=True)) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


def test_the_router_discovers_workers_without_fallbacks(cluster):
    log = open(f"{cluster.logs}/router.log", errors="replace").read()
    assert "returned 404" not in log, [line for line in log.splitlines() if "returned 404" in line][:2]
    loads = cluster.client.get("/get_loads").json()["workers"]
    assert len(loads) == 3 and all(w["load"] >= 0 for w in loads), loads
    flushed = cluster.client.post("/flush_cache").json()
    assert flushed["workers_flushed"] == 3, flushed


def _hit_rate(url: str, workers: list[str], systems: list[str]) -> float:
    """Prompt tokens served from the workers' prefix caches over all prompt tokens, for 40
    chats over the shared system prompts, 4 at a time, from empty caches."""
    for worker in workers:
        assert httpx.post(worker + "/flush_cache", headers=HEADERS, timeout=30).status_code == 200
    usage: list[dict] = []

    def chat(i: int) -> None:
        r = httpx.post(url + "/v1/chat/completions", headers=HEADERS, timeout=TIMEOUT, json={
            "model": MODEL, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": systems[i % len(systems)]},
                         {"role": "user", "content": f"question {i}"}]})
        assert r.status_code == 200, r.text
        usage.append(r.json()["usage"])
    for start in range(0, 40, 4):
        threads = [threading.Thread(target=chat, args=(i,)) for i in range(start, start + 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    assert len(usage) == 40
    return (sum(u["prompt_tokens_details"]["cached_tokens"] for u in usage) /
            sum(u["prompt_tokens"] for u in usage))


def test_cache_aware_routing_hits_the_prefix_cache_more_than_round_robin(cluster):
    # Six system prompts, three per worker's pool. Cache-aware routing keeps each prompt on the
    # worker that holds it: two per worker, or three if a worker drops out of its rotation.
    # Round robin sends each worker the prompts in turn; four chats run at once and reach the
    # router in any order, so it still hits at times: 0.35 of tokens in a simulation of this
    # schedule with least-recently-used pools (0.32 over two workers), against 0.85 at best
    # for cache-aware (each prompt's first chat misses). Measured with five prompts: pools of
    # two prompts let a 3/1/1 split thrash one worker under load (0.47 against 0.35), pools of
    # three let round robin hit 0.45-0.50. The ratio asked is 1.2, not the 2.1-2.5 measured on an
    # idle machine: under a full test run's load the router balances load as well as prefixes,
    # and this schedule measured 0.49 against 0.38 (1.3). Routing that ignored prefixes would
    # be round robin's equal (1.0).
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
    systems = [" ".join(rng.choice(words) for _ in range(120)) for _ in range(6)]
    workers = [*cluster.urls, cluster.local.url]
    port = free_port()
    with open(f"{cluster.logs}/round_robin.log", "w") as log:
        round_robin = subprocess.Popen(
            scale_out.router_command(workers, "127.0.0.1", port, API_KEY, prometheus_port=free_port(),
                                     policy="round_robin"), stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, API_KEY_ENV: API_KEY})  # the router reads its key there, not from argv
    try:
        url = f"http://127.0.0.1:{port}"
        scale_out.wait_router(url, round_robin, 3, API_KEY, 60)
        cache_aware_rate = _hit_rate(cluster.url, workers, systems)
        round_robin_rate = _hit_rate(url, workers, systems)
    finally:
        round_robin.terminate()
        round_robin.wait(30)
    assert cache_aware_rate >= 1.2 * round_robin_rate, (cache_aware_rate, round_robin_rate)


def _concurrent(client: httpx.Client, tag: str, n: int = 8) -> list[int]:
    """n requests at once (cache-aware routing balances only under load), their status codes."""
    codes: list[int] = []
    threads = [threading.Thread(target=lambda i=i: codes.append(_complete(client, f"{tag} {i}", 24).status_code))
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    return codes


def _until_used(cluster, url: str, tag: str, timeout: float = 60) -> None:
    """Batches of concurrent requests through the router (each all 200) until the worker at
    `url` has served one more request; cache-aware routing reaches an idle worker only once
    the others are loaded, so which batch does it varies."""
    before = _requests_served(url)
    deadline = time.time() + timeout
    round_ = 0
    while _requests_served(url) == before:
        assert time.time() < deadline, f"{url} got no request through the router in {timeout:.0f} s ({tag})"
        assert _concurrent(cluster.client, f"{tag} {round_}") == [200] * 8
        round_ += 1


def _stream(client: httpx.Client, prompt: str, out: dict) -> None:
    try:
        with client.stream("POST", "/v1/completions",
                           json={"model": MODEL, "prompt": prompt, "max_tokens": 200, "temperature": 0, "ignore_eos": True,
                                 "stream": True}) as r:
            out["status"] = r.status_code
            out["lines"] = [line for line in r.iter_lines() if line]
    except httpx.HTTPError as e:  # a cut stream may end the connection
        out["error"] = repr(e)


def test_a_killed_worker_costs_no_client_an_error_and_comes_back(cluster):
    # Streams in flight on every worker, then worker 0 dies.
    results = [dict() for _ in range(6)]
    threads = [threading.Thread(target=_stream, args=(cluster.client, f"stream {i} " * (i + 1), results[i]))
               for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(3)
    cluster.kill_worker(0)
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a stream through the router hung after its worker died"
    done = [r for r in results if r.get("lines", [""])[-1:] == ["data: [DONE]"]]
    assert len(done) >= 3, results  # the streams on live workers finish
    # The router ends a stream whose worker died by closing the connection before the
    # chunked body is complete (no error event, no [DONE]): the client sees an error at
    # once, never a hang and never a body that looks finished.
    cut = [r for r in results if r not in done]
    assert all("incomplete chunked read" in r.get("error", "") for r in cut), cut
    # New requests: none fails.
    codes = [_complete(cluster.client, f"after the kill {i}").status_code for i in range(20)]
    assert codes == [200] * 20, codes
    # The survivors' pools return to idle (nothing of the cut streams is left running or reserved).
    for url in (cluster.urls[1], cluster.local.url):
        deadline = time.time() + 60
        while True:
            info = httpx.get(url + "/get_server_info", headers=HEADERS, timeout=10).json()
            if info["running"] == info["waiting"] == info["kv_reserved_tokens"] == 0:
                break
            assert time.time() < deadline, f"{url} did not return to idle: {info}"
            time.sleep(0.5)
    # Back on its port, it is used again (the router's health checks re-admit it; its
    # cache-aware policy sends it requests once the others are loaded).
    cluster.start_worker(0)
    wait_healthy(cluster.urls[0], cluster.procs[0], 300)
    time.sleep(3)  # a health check
    _until_used(cluster, cluster.urls[0], "after the restart")


def test_a_worker_whose_watchdog_reports_503_is_taken_out_and_back(cluster):
    local = cluster.local
    _until_used(cluster, local.url, "control: in rotation")
    # One step (a one-token request's prefill) that outlasts the checks below: the
    # watchdog reports 503 once WATCHDOG_SECONDS have passed.
    undo = slow_steps(local.engine, 30.0)
    stuck = threading.Thread(target=lambda: _complete(local.http, "slow", max_tokens=1))
    try:
        stuck.start()
        time.sleep(WATCHDOG_SECONDS + 0.5)
        assert local.http.get("/health").status_code == 503
        time.sleep(3)  # a health check of the router's
        before = _requests_served(local.url)
        assert _concurrent(cluster.client, "while it is stuck") == [200] * 8
        assert _requests_served(local.url) <= before + 1  # at most the stuck request itself
    finally:
        undo()
        stuck.join(TIMEOUT)
    # The step's results go out before the step is over (the engine commits them inside
    # it), so the stuck request's answer can arrive just before the watchdog sees the end.
    deadline = time.time() + 10
    while local.http.get("/health").status_code != 200:
        assert time.time() < deadline, "the worker is not healthy 10 s after its stuck step answered"
        time.sleep(0.1)
    time.sleep(3)
    _until_used(cluster, local.url, "healthy again")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
