"""The command lines `./dev serve --workers N` builds (the cluster itself: tests/scale_out)."""

from __future__ import annotations

import sys

import pytest

from rvascend.server import scale_out


def test_host_and_port_are_the_routers_and_the_key_is_on_no_command_line(monkeypatch):
    monkeypatch.delenv(scale_out.API_KEY_ENV, raising=False)
    rest, host, port, key = scale_out.split_args(
        ["--model-path", "/m", "--host=0.0.0.0", "--port", "31000", "--api-key", "K", "--enable-cpu-rvv-inductor"])
    assert (host, port, key) == ("0.0.0.0", 31000, "K")
    assert rest == ["--model-path", "/m", "--enable-cpu-rvv-inductor"]  # the key: RVASCEND_API_KEY
    assert scale_out.split_args([])[1:] == ("127.0.0.1", 30000, None)
    with pytest.raises(ValueError, match="--port needs a value"):
        scale_out.split_args(["--port"])
    for bad in ("abc", "0", "70000"):
        with pytest.raises(ValueError, match=f"--port must be a port number, got '{bad}'"):
            scale_out.split_args([f"--port={bad}"])


def test_the_key_in_the_environment_guards_the_router_too(monkeypatch):
    """RVASCEND_API_KEY alone guards a single server; with --workers it once reached the
    workers but not the router, whose admin API (/add_worker, ...) was then open."""
    monkeypatch.setenv(scale_out.API_KEY_ENV, "E")
    assert scale_out.split_args(["--model-path", "/m"])[3] == "E"
    assert scale_out.split_args(["--api-key=K"])[3] == "K"  # the flag wins, as for a single server
    monkeypatch.setenv(scale_out.API_KEY_ENV, "")
    assert scale_out.split_args([])[3] is None
    monkeypatch.delenv(scale_out.API_KEY_ENV)
    assert scale_out.split_args([])[3] is None


def test_the_router_command_carries_the_reliability_settings():
    cmd = scale_out.router_command(["http://127.0.0.1:1", "http://127.0.0.1:2"], "0.0.0.0", 30000, "K", python="py")
    assert cmd[:2] == ["py", "-c"] and "K" not in cmd  # the key comes from the environment, inside the process
    assert scale_out.router_command(["u"], "h", 1, python="py")[:3] == ["py", "-m", "sglang_router.launch_router"]
    def value(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]
    assert value("--policy") == "cache_aware" and value("--cb-failure-threshold") == "1"
    assert value("--port") == "30000" and value("--host") == "0.0.0.0"
    assert cmd[cmd.index("--worker-urls") + 1:cmd.index("--worker-urls") + 3] == ["http://127.0.0.1:1",
                                                                                  "http://127.0.0.1:2"]
    assert "--api-key" not in scale_out.router_command(["u"], "h", 1)
    other = scale_out.router_command(["u"], "h", 1, prometheus_port=29123, policy="round_robin")
    assert other[other.index("--policy") + 1] == "round_robin"
    assert other[other.index("--prometheus-port") + 1] == "29123"


def test_the_router_launcher_reads_the_key_from_the_environment():
    """The launcher's code runs: it hands sglang-router the key from RVASCEND_API_KEY."""
    import os
    import subprocess
    cmd = scale_out.router_command(["http://127.0.0.1:1"], "127.0.0.1", 1, "K") + ["--help"]
    out = subprocess.run(cmd, env={**os.environ, scale_out.API_KEY_ENV: "K"}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "--api-key" in out.stdout, out.stderr[-2000:]
    missing = subprocess.run(cmd, env={k: v for k, v in os.environ.items() if k != scale_out.API_KEY_ENV},
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and scale_out.API_KEY_ENV in missing.stderr


_HEALTHY_WORKER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_worker_whose_port_was_taken_gets_another(tmp_path):
    """free_port() checks a port, the worker binds it later: another process may take it
    in between. The worker that exits for that reason is started again on a new port."""
    import subprocess
    starts = []

    def factory(args, port, log):
        starts.append(port)
        code = ("import sys; print('ERROR: [Errno 98] error while attempting to bind: address already in use'); "
                "sys.exit(1)") if len(starts) == 1 else _HEALTHY_WORKER
        with open(log, "w") as out:
            return subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=out, stderr=subprocess.STDOUT)
    cluster = scale_out.Cluster.__new__(scale_out.Cluster)
    cluster.worker_args, cluster.factory, cluster.log_dir = [], factory, str(tmp_path)
    cluster.ports = [scale_out.free_port()]
    cluster.urls = [f"http://127.0.0.1:{cluster.ports[0]}"]
    cluster.procs, cluster.router = [None], None
    try:
        cluster.start_worker(0)
        cluster._wait_worker(0, 30)
        assert len(starts) == 2 and cluster.urls[0].endswith(str(starts[1]))
    finally:
        cluster.stop()


def test_a_cluster_needs_a_worker():
    with pytest.raises(ValueError, match="at least 1"):
        scale_out.Cluster(0, [])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
