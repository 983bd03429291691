"""Prometheus metrics of one server: requests, tokens, latencies, batch, KV pool, policy routes."""

from __future__ import annotations

from typing import Callable, Iterator, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from rvascend.policy import RvvPolicy

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    def __init__(self, engine_stats: Callable[[], dict[str, int]], policy: Optional[RvvPolicy]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rvascend_requests", "Finished requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("rvascend_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("rvascend_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("rvascend_time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("rvascend_inter_token_latency_seconds", "Time between output tokens",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("rvascend_e2e_request_latency_seconds", "Request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_rows = Gauge("rvascend_last_batch_rows", "Rows (M) of the last forward pass", registry=r)
        r.register(_EngineCollector(engine_stats, policy))


class _EngineCollector:
    def __init__(self, engine_stats: Callable[[], dict[str, int]], policy: Optional[RvvPolicy]) -> None:
        self._stats = engine_stats
        self._policy = policy

    def collect(self) -> Iterator[object]:
        stats = self._stats()
        for key, help_text in (("running", "Requests decoding"), ("waiting", "Requests queued"),
                               ("kv_used_tokens", "KV pool slots in use"),
                               ("kv_reserved_tokens", "KV pool slots reserved by admitted requests"),
                               ("kv_total_tokens", "KV pool size")):
            g = GaugeMetricFamily(f"rvascend_{key}", help_text)
            g.add_metric([], stats[key])
            yield g
        if self._policy is not None:
            c = CounterMetricFamily("rvascend_rvv_projection_calls", "Linear calls per projection and route",
                                    labels=["projection", "route", "reason"])
            for row in self._policy.counters.snapshot():
                c.add_metric([row["projection"], row["route"], row["reason"]], row["calls"])
            yield c
            rows = CounterMetricFamily("rvascend_rvv_packed_calls_by_rows", "Packed-kernel calls per M",
                                       labels=["rows"])
            for m, n in sorted(self._policy.counters.rows_seen(route="packed").items()):
                rows.add_metric([str(m)], n)
            yield rows
