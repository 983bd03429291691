"""Several servers behind SGLang's own router (`sglang-router`, pinned in requirements.txt).

`./dev serve --workers N [SERVER FLAGS]` starts N servers on loopback ports and the
router in front of them on the usual --host/--port; with --riscv64 the workers are the
riscv64 wheel's server under QEMU. For boards, `router_command` is the command line
docs/riscv64.md gives (the router runs on any x86-64 machine of the LAN, not on a board).

The router's reliability settings (`ROUTER_SETTINGS`) are chosen so that a dead
worker costs no client a 5xx: one failed attempt opens that worker's circuit, so the
router's next attempt goes to a live worker, and health checks every 2 s take a
worker out (a refused connection, or the watchdog's 503) and put it back once it
answers again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence

import httpx
from absl import logging

from rvascend.server.limits import API_KEY_ENV, resolve_api_key
from rvascend.server.loopback import address_in_use, free_port, wait_healthy

ROUTER_SETTINGS = (
    # Cache-aware: a prompt goes where its prefix is cached, unless the workers' queues
    # differ by 4 requests and 1.5x (SGLang's defaults, 64 and 1.5, suit GPU servers
    # with hundreds of requests in flight; a board runs 8 at a time).
    "--policy", "cache_aware",
    "--balance-abs-threshold", "4",
    "--balance-rel-threshold", "1.5",
    # Retries re-pick a worker; one failure opens that worker's circuit for 5 s.
    "--retry-max-retries", "3",
    "--cb-failure-threshold", "1",
    "--cb-success-threshold", "1",
    "--cb-timeout-duration-secs", "5",
    # Health: every 2 s; one failure takes a worker out, one success puts it back.
    "--health-check-interval-secs", "2",
    "--health-check-timeout-secs", "5",
    "--health-failure-threshold", "1",
    "--health-success-threshold", "1",
)

WorkerFactory = Callable[[Sequence[str], int, Optional[str]], subprocess.Popen]


def router_command(worker_urls: Sequence[str], host: str, port: int, api_key: Optional[str] = None,
                   python: str = sys.executable, prometheus_port: Optional[int] = None,
                   policy: str = "cache_aware") -> list[str]:
    """sglang-router in front of `worker_urls` with ROUTER_SETTINGS (`policy` instead of
    cache_aware, for comparisons); with `api_key` it asks clients for the key and passes it
    on to the workers. Its Prometheus exporter listens on `prometheus_port` (the router's
    own default, 29000, lets only one router run on a machine)."""
    settings = [policy if value == "cache_aware" else value for value in ROUTER_SETTINGS]
    cmd = [python, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
           "--worker-urls", *worker_urls, *settings]
    if prometheus_port is not None:
        cmd += ["--prometheus-host", host, "--prometheus-port", str(prometheus_port)]
    if api_key:
        # The router takes its key only as a flag: a two-line launcher adds it from the
        # environment inside the process, so it never shows on the command line.
        cmd[1:3] = ["-c", "import os, sys; from sglang_router import launch_router; "
                    f"sys.argv += ['--api-key', os.environ['{API_KEY_ENV}']]; launch_router.main()"]
    return cmd


def _popen_logged(cmd: Sequence[str], log: Optional[str]) -> subprocess.Popen:
    """Starts `cmd` with stdout and stderr into `log` (inherited when None)."""
    if not log:
        return subprocess.Popen(list(cmd))
    with open(log, "w") as out:  # the child keeps its own descriptor
        return subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT)


def local_worker(args: Sequence[str], port: int, log: Optional[str]) -> subprocess.Popen:
    """`python -m rvascend.server ARGS` on 127.0.0.1:PORT with this interpreter."""
    return _popen_logged([sys.executable, "-m", "rvascend.server", *args, "--host=127.0.0.1", f"--port={port}"], log)


def split_args(args: Sequence[str]) -> tuple[list[str], str, int, Optional[str]]:
    """(the workers' flags, the router's host, port, the API key): --host/--port are the
    router's (the workers take loopback ports); the key, from --api-key or API_KEY_ENV as
    a single server takes it, goes to both."""
    rest, host, port, key = [], "127.0.0.1", 30000, None
    it = iter(args)
    for arg in it:
        name, eq, value = arg.partition("=")
        if name in ("--host", "--port", "--api-key", "--api_key"):
            value = value if eq else next(it, None)
            if value is None:
                raise ValueError(f"{name} needs a value")
            if name == "--host":
                host = value
            elif name == "--port":
                if not value.isdigit() or not 0 < int(value) < 65536:
                    raise ValueError(f"--port must be a port number, got {value!r}")
                port = int(value)
            else:
                key = value  # to the workers through the environment (Cluster)
        else:
            rest.append(arg)
    return rest, host, port, resolve_api_key(key)


def wait_router(url: str, proc: subprocess.Popen, workers: int, api_key: Optional[str], timeout: float,
                describe: Callable[[], str] = lambda: "") -> None:
    """Until the router at `url` lists `workers` workers (it registers them in the background);
    RuntimeError if `proc` exits first or `timeout` s pass (with `describe()`, e.g. its log)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the router exited ({proc.returncode}): {describe()}")
        try:
            r = httpx.get(url + "/workers", headers=headers, timeout=5)
            if r.status_code == 200 and len(r.json().get("workers", [])) == workers:
                return
        except (httpx.HTTPError, ValueError):
            pass
        if time.time() > deadline:
            raise RuntimeError(f"the router did not register {workers} workers in {timeout:.0f} s: {describe()}")
        time.sleep(0.5)


class Cluster:
    """N workers and the router; `stop()` ends them all."""

    def __init__(self, workers: int, worker_args: Sequence[str], host: str = "127.0.0.1", port: int = 0,
                 api_key: Optional[str] = None, factory: WorkerFactory = local_worker,
                 log_dir: Optional[str] = None, startup_timeout: float = 600.0) -> None:
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, not {workers}")
        self.worker_args, self.factory, self.log_dir = list(worker_args), factory, log_dir
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        if api_key:
            os.environ[API_KEY_ENV] = api_key  # inherited by the workers and the router
        self.ports = [free_port() for _ in range(workers)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.procs: list[Optional[subprocess.Popen]] = [None] * workers
        self.router: Optional[subprocess.Popen] = None
        try:
            for i in range(workers):
                self.start_worker(i)
            for i in range(workers):
                self._wait_worker(i, startup_timeout)
            self.port = port or free_port()
            self.url = f"http://{host}:{self.port}"
            metrics_port = free_port()
            self.metrics_url = f"http://{host}:{metrics_port}/metrics"
            self.router = _popen_logged(router_command(self.urls, host, self.port, api_key,
                                                       prometheus_port=metrics_port),
                                        os.path.join(log_dir, "router.log") if log_dir else None)
            wait_router(self.url, self.router, len(self.urls), api_key, 120.0, lambda: self._log_tail("router"))
        except BaseException:
            self.stop()
            raise

    def _wait_worker(self, i: int, timeout: float, attempts: int = 3) -> None:
        """Until worker i is healthy. Its port was free when picked, not necessarily when the
        worker bound it: a worker that exits because the port was taken gets another."""
        for attempt in range(attempts):
            try:
                wait_healthy(self.urls[i], self.procs[i], timeout, lambda: self._log_tail(f"worker{i}"))
                return
            except RuntimeError as e:
                if attempt == attempts - 1 or not address_in_use(str(e)):
                    raise
                logging.warning("worker %d: port %d was taken meanwhile; starting it on another", i, self.ports[i])
                self.ports[i] = free_port()
                self.urls[i] = f"http://127.0.0.1:{self.ports[i]}"
                self.start_worker(i)

    def start_worker(self, i: int) -> None:
        """(Re)starts worker i on its port."""
        log = os.path.join(self.log_dir, f"worker{i}.log") if self.log_dir else None
        self.procs[i] = self.factory(self.worker_args, self.ports[i], log)

    def kill_worker(self, i: int) -> None:
        """SIGKILL: the worker dies mid-request, as a board that loses power."""
        self.procs[i].kill()
        self.procs[i].wait(30)

    def _log_tail(self, name: str) -> str:
        if not self.log_dir:
            return "(no log)"
        with open(os.path.join(self.log_dir, f"{name}.log"), errors="replace") as f:
            return f.read()[-3000:]

    def wait(self) -> int:
        """Until the router exits (Ctrl-C: everything stops)."""
        try:
            return self.router.wait()
        except KeyboardInterrupt:
            return 0
        finally:
            self.stop()

    def stop(self) -> None:
        for proc in [self.router, *self.procs]:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [self.router, *self.procs]:
            if proc is not None:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()


def serve(workers: int, worker_args: Sequence[str], host: str, port: int, api_key: Optional[str],
          factory: WorkerFactory = local_worker, startup_timeout: float = 600.0) -> int:
    """`./dev serve --workers N ARGS` (ARGS through split_args): the cluster in the foreground."""
    logging.info("starting %d workers on loopback ports, then sglang-router on http://%s:%d", workers, host, port)

    def stop_on_term(signum, frame):  # SIGTERM (a supervisor, `timeout`): stop the workers and router too
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop_on_term)
    cluster = Cluster(workers, worker_args, host, port, api_key, factory, startup_timeout=startup_timeout)
    logging.info("router on %s in front of %s; its metrics on %s", cluster.url, ", ".join(cluster.urls),
                 cluster.metrics_url)
    return cluster.wait()
