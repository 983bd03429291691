"""Prometheus metrics of one server: requests, tokens, latencies, batch, KV pool, policy routes."""

from __future__ import annotations

from typing import Callable, Iterator, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from rvascend.policy import KernelPolicy

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _Twin:
    """One observation under the project's name and under SGLang's (its dashboards read those)."""

    def __init__(self, *metrics) -> None:
        self._metrics = metrics

    def inc(self, amount: float = 1) -> None:
        for m in self._metrics:
            m.inc(amount)

    def observe(self, value: float) -> None:
        for m in self._metrics:
            m.observe(value)


class ServerMetrics:
    def __init__(self, engine_stats: Callable[[], dict[str, int]], policy: Optional[KernelPolicy]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rvascend_requests", "Finished requests by endpoint and status",
                                ["endpoint", "status"], registry=r)

        def counter(name: str, help_text: str) -> _Twin:
            return _Twin(Counter(f"rvascend_{name}", help_text, registry=r),
                         Counter(f"sglang:{name}", help_text, registry=r))

        def histogram(name: str, help_text: str) -> _Twin:
            return _Twin(Histogram(f"rvascend_{name}", help_text, buckets=_LATENCY_BUCKETS, registry=r),
                         Histogram(f"sglang:{name}", help_text, buckets=_LATENCY_BUCKETS, registry=r))

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed")
        self.generation_tokens = counter("generation_tokens", "Tokens generated")
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token")
        self.itl = histogram("inter_token_latency_seconds", "Time between output tokens")
        self.e2e = histogram("e2e_request_latency_seconds", "Request latency")
        self.batch_rows = Gauge("rvascend_last_batch_rows", "Rows (M) of the last forward pass", registry=r)
        r.register(_EngineCollector(engine_stats, policy))

    def observe_sequence(self, seq) -> None:
        """A finished sequence's tokens and latencies."""
        self.prompt_tokens.inc(len(seq.prompt_ids))
        self.generation_tokens.inc(len(seq.output_ids))
        if seq.first_token_time is not None:
            self.ttft.observe(seq.first_token_time - seq.arrival)
            self.e2e.observe(seq.token_times[-1] - seq.arrival)
        for a, b in zip(seq.token_times, seq.token_times[1:]):
            self.itl.observe(b - a)


class _EngineCollector:
    def __init__(self, engine_stats: Callable[[], dict[str, int]], policy: Optional[KernelPolicy]) -> None:
        self._stats = engine_stats
        self._policy = policy

    def collect(self) -> Iterator[object]:
        stats = self._stats()
        for key, help_text in (("running", "Requests decoding"), ("waiting", "Requests queued"),
                               ("kv_used_tokens", "KV pool slots in use"),
                               ("kv_reserved_tokens", "KV pool slots reserved by admitted requests"),
                               ("kv_total_tokens", "KV pool size"),
                               ("kv_locked_tokens", "Prefix-cache slots pinned by running requests"),
                               ("state_slots_free", "Recurrent-state slots free (hybrid models)"),
                               ("state_slots_total", "Recurrent-state slots (hybrid models)"),
                               ("mamba_cache_snapshots", "Recurrent-state snapshots the prefix cache holds"),
                               ("mamba_cache_size", "Recurrent-state snapshots the prefix cache may hold")):
            g = GaugeMetricFamily(f"rvascend_{key}", help_text)
            g.add_metric([], stats[key])
            yield g
        for key, help_text in (("spec_drafted_tokens", "Draft tokens verified (speculative decoding)"),
                               ("spec_accepted_tokens", "Draft tokens accepted (speculative decoding)"),
                               ("spec_failed_draft_passes", "Drafting passes that raised; their steps drafted "
                                                            "nothing (speculative decoding)"),
                               ("mamba_cache_evictions", "Recurrent-state snapshots evicted for newer ones")):
            c = CounterMetricFamily(f"rvascend_{key}", help_text)
            c.add_metric([], stats[key])
            yield c
        tiers = [t for t in ("host", "disk") if f"hicache_{t}_bytes" in stats]  # the hierarchical cache's
        for key, kind, help_text in (("entries", GaugeMetricFamily, "Entries held"),
                                     ("bytes", GaugeMetricFamily, "Bytes held"),
                                     ("capacity_bytes", GaugeMetricFamily, "Bytes it may hold"),
                                     ("hits", CounterMetricFamily, "Entries found"),
                                     ("misses", CounterMetricFamily, "Entries looked for and not found"),
                                     ("evicted", CounterMetricFamily, "Entries evicted to stay in bounds"),
                                     ("rejected", CounterMetricFamily, "Files removed as corrupt or foreign"),
                                     ("load_seconds", CounterMetricFamily, "Seconds reading and verifying entries")):
            if tiers:
                m = kind(f"rvascend_hicache_{key}", f"{help_text}, per tier of the hierarchical cache",
                         labels=["tier"])
                for tier in tiers:
                    m.add_metric([tier], stats[f"hicache_{tier}_{key}"])
                yield m
        for key, help_text in (("hicache_loaded_tokens", "Prompt tokens loaded from the cache tiers, not prefilled"),
                               ("hicache_stored_pages", "Pages written through to the cache tiers")):
            if key in stats:
                c = CounterMetricFamily(f"rvascend_{key}", help_text)
                c.add_metric([], stats[key])
                yield c
        for name, help_text, value in (
                ("num_running_reqs", "Requests decoding", stats["running"]),
                ("num_queue_reqs", "Requests queued", stats["waiting"]),
                ("token_usage", "Share of the KV pool in use", stats["kv_used_tokens"] / max(1, stats["kv_total_tokens"])),
                ("cache_hit_rate", "Share of prompt tokens served from the prefix cache",
                 stats.get("cache_hit_rate", 0.0))):
            g = GaugeMetricFamily(f"sglang:{name}", help_text)
            g.add_metric([], value)
            yield g
        if self._policy is not None:
            gate = GaugeMetricFamily("rvascend_shape_gate", "The shape gate in force (1)", labels=["gate"])
            gate.add_metric([self._policy.shape_gate], 1)
            yield gate
            c = CounterMetricFamily("rvascend_projection_calls", "Linear calls per projection and route",
                                    labels=["projection", "route", "reason"])
            for row in self._policy.counters.snapshot():
                c.add_metric([row["projection"], row["route"], row["reason"]], row["calls"])
            yield c
            k = CounterMetricFamily("rvascend_kernel_calls", "Calls of the kernels beyond Linear per route",
                                    labels=["kernel", "route", "reason"])
            for row in self._policy.kernels.counters.snapshot():
                k.add_metric([row["projection"], row["route"], row["reason"]], row["calls"])
            yield k
            rows = CounterMetricFamily("rvascend_packed_calls_by_rows", "Packed-kernel calls per M",
                                       labels=["rows"])
            for m, n in sorted(self._policy.counters.rows_seen(route="packed").items()):
                rows.add_metric([str(m)], n)
            yield rows
