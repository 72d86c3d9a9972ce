"""Prometheus metrics of one server (its own registry, so two apps in one process never mix).

    minfer_requests_total{endpoint, status}      requests by HTTP status; a stream counts when it
                                                 ends: 200 finished, 499 client went away, 500
                                                 failed after it started
    minfer_active_sequences                      sequences holding a KV slot (running)
    minfer_queued_sequences                      sequences waiting for a slot
    minfer_prompt_tokens_total                   prompt tokens of finished requests
    minfer_generation_tokens_total               tokens generated (aborted requests included)
    minfer_prefix_cache_hit_tokens_total         prompt tokens not run: their KV came from the cache
                                                 (cached prefix blocks, or the slot's own chat turn)
    minfer_prefix_cache_miss_tokens_total        prompt tokens run
    minfer_time_to_first_token_seconds           request received -> first token sampled
    minfer_inter_token_latency_seconds           between two tokens of one request
    minfer_e2e_request_latency_seconds           request received -> last token
    minfer_engine_restarts_total                 engine processes restarted after they died
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("minfer_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.active = Gauge("minfer_active_sequences", "sequences holding a KV-cache slot", registry=r)
        self.queued = Gauge("minfer_queued_sequences", "sequences waiting for a slot", registry=r)
        self.prompt_tokens = Counter("minfer_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generated_tokens = Counter("minfer_generation_tokens", "generated tokens", registry=r)
        self.prefix_hits = Counter("minfer_prefix_cache_hit_tokens", "prompt tokens whose KV came from the cache",
                                   registry=r)
        self.prefix_misses = Counter("minfer_prefix_cache_miss_tokens", "prompt tokens run", registry=r)
        self.ttft = Histogram("minfer_time_to_first_token_seconds", "request received to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("minfer_inter_token_latency_seconds", "time between two tokens of a request",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.engine_restarts = Counter("minfer_engine_restarts", "engine processes restarted after they died",
                                       registry=r)
        self.e2e = Histogram("minfer_e2e_request_latency_seconds", "request received to last token",
                             buckets=LATENCY_BUCKETS, registry=r)

    def request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def finished(self, arrival: float, n_prompt: int, token_times: list[float], end: float, cached: int = 0) -> None:
        """One sequence ended (finished or aborted): its tokens and latencies; `cached`: its prompt
        tokens reused from the cache."""
        self.prompt_tokens.inc(n_prompt)
        self.prefix_hits.inc(cached)
        self.prefix_misses.inc(n_prompt - cached)
        self.generated_tokens.inc(len(token_times))
        if token_times:
            self.ttft.observe(token_times[0] - arrival)
            for a, b in zip(token_times, token_times[1:], strict=False):
                self.itl.observe(b - a)
        self.e2e.observe(end - arrival)

    def sequences(self) -> tuple[int, int]:
        """(active, queued) sequences, as the gauges last heard from the engine."""
        return tuple(int(next(iter(g.collect())).samples[0].value) for g in (self.active, self.queued))

    def render(self) -> bytes:
        return generate_latest(self.registry)
