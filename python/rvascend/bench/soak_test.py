"""The soak's short version: 16 clients for 60 s, valid and hostile requests mixed,
against a fresh server with the RVV policy and n-gram drafts on. Nothing a client sends may cost a 5xx,
stall /health, change a valid greedy answer, or leave anything held."""

from __future__ import annotations

import sys

import pytest

from rvascend.bench import soak
from rvascend.models.random_model import ensure_random_model


def test_sixty_seconds_of_mixed_load_leave_the_server_whole():
    with soak.soak_server(ensure_random_model(), [*soak.SERVER_ARGS, "--cpu-compile-mode=eager",
                                                  "--max-running-requests=8"]) as (proc, url):
        record = soak.run(url, proc.pid, seconds=60, clients=16)
    print({k: v for k, v in record.items() if k != "end_metrics"})
    assert record["failures"] == [] and record["server_errors"] == 0
    assert record["idle"] and record["health_p99_s"] < 1.0
    assert record["counts"]["valid"] > 100 and len(record["counts"]) >= 15  # every kind was sent
    assert record["end_metrics"]["spec_accepted_tokens_total"] > 0
    assert record["rss_growth_mib"] < 256


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
