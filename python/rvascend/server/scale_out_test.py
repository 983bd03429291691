"""The command lines `./dev serve --workers N` builds (the cluster itself: tests/scale_out)."""

from __future__ import annotations

import sys

import pytest

from rvascend.server import scale_out


def test_host_and_port_are_the_routers_and_the_key_goes_to_both():
    rest, host, port, key = scale_out.split_args(
        ["--model-path", "/m", "--host=0.0.0.0", "--port", "31000", "--api-key", "K", "--enable-cpu-rvv-inductor"])
    assert (host, port, key) == ("0.0.0.0", 31000, "K")
    assert rest == ["--model-path", "/m", "--api-key=K", "--enable-cpu-rvv-inductor"]
    assert scale_out.split_args([])[1:] == ("127.0.0.1", 30000, None)
    with pytest.raises(ValueError, match="--port needs a value"):
        scale_out.split_args(["--port"])
    for bad in ("abc", "0", "70000"):
        with pytest.raises(ValueError, match=f"--port must be a port number, got '{bad}'"):
            scale_out.split_args([f"--port={bad}"])


def test_the_router_command_carries_the_reliability_settings():
    cmd = scale_out.router_command(["http://127.0.0.1:1", "http://127.0.0.1:2"], "0.0.0.0", 30000, "K", python="py")
    assert cmd[:3] == ["py", "-m", "sglang_router.launch_router"]
    def value(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]
    assert value("--policy") == "cache_aware" and value("--cb-failure-threshold") == "1"
    assert value("--api-key") == "K" and value("--port") == "30000" and value("--host") == "0.0.0.0"
    assert cmd[cmd.index("--worker-urls") + 1:cmd.index("--worker-urls") + 3] == ["http://127.0.0.1:1",
                                                                                  "http://127.0.0.1:2"]
    assert "--api-key" not in scale_out.router_command(["u"], "h", 1)
    other = scale_out.router_command(["u"], "h", 1, prometheus_port=29123, policy="round_robin")
    assert other[other.index("--policy") + 1] == "round_robin"
    assert other[other.index("--prometheus-port") + 1] == "29123"


def test_a_cluster_needs_a_worker():
    with pytest.raises(ValueError, match="at least 1"):
        scale_out.Cluster(0, [])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
