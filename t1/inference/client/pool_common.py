"""What both inference pools share (the gRPC `InferencePool` and the HTTP `OpenAIPool`): their
Prometheus metrics, what a weight update did, and the error an episode sees when no replica answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from t1.errors import InfraError
from t1.inference.types import GenerateResult


class InferenceUnavailable(InfraError, RuntimeError):
    """Every attempt failed with a retryable error; the caller treats the turn as an infra failure."""


@dataclass(frozen=True, slots=True)
class WeightsUpdate:
    """What `update_weights` did: replicas now serving `version`, and those skipped (caught up on recovery)."""

    version: int
    updated: tuple[str, ...]
    skipped: tuple[str, ...]


class PoolMetrics:
    """Prometheus metrics of one pool, on the given registry (the coordinator passes its own)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.latency = Histogram("t1_inference_request_seconds", "Generate latency per request (all attempts).",
                                 buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300), registry=r)
        self.tokens_per_s = Histogram("t1_inference_tokens_per_second", "Completion tokens per second of a request.",
                                      buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000), registry=r)
        self.completion_tokens = Counter("t1_inference_completion_tokens", "Sampled tokens.", registry=r)
        self.prefill_tokens = Counter("t1_inference_prefill_tokens", "Prompt tokens the servers prefilled.", registry=r)
        self.cached_tokens = Counter("t1_inference_cached_tokens", "Prompt tokens served from session caches.",
                                     registry=r)
        self.retries = Counter("t1_inference_pool_retries", "Attempts retried after a retryable error.", registry=r)
        self.failovers = Counter("t1_inference_failovers", "Sessions moved to another replica.", registry=r)
        self.outstanding = Gauge("t1_inference_outstanding", "Requests in flight per replica.", ["replica"], registry=r)
        self.healthy = Gauge("t1_inference_replica_healthy", "1 while a replica is not avoided.", ["replica"],
                             registry=r)
        self.weight_skips = Counter("t1_inference_weight_skips", "Replicas skipped by a weight update.", registry=r)
        self.catch_ups = Counter("t1_inference_weight_catch_ups",
                                 "Recovered or new replicas brought up to the latest weights.", registry=r)
        self.prompt_deltas = Counter("t1_inference_prompt_deltas",
                                     "Requests sent as a delta on the session's previous context.", registry=r)
        self.prompt_resends = Counter("t1_inference_prompt_resends",
                                      "Deltas a replica could not take, resent with the whole prompt.", registry=r)
        self.kv_waits = Counter("t1_inference_kv_waits", "Turns that waited for KV room (kv_admission).", registry=r)
        self.kv_wait_seconds = Counter("t1_inference_kv_wait_seconds", "Time turns waited for KV room.", registry=r)
        self.stalls = Counter("t1_inference_stalls", "Replicas found stalled (no tokens, no answer, or a weight "
                              "load that does not finish) while busy.", registry=r)

    def kv_waited(self, seconds: float) -> None:
        """A turn admitted by KV headroom after `seconds` of waiting (0: it did not wait)."""
        if seconds:
            self.kv_waits.inc()
            self.kv_wait_seconds.inc(seconds)

    def observe(self, result: GenerateResult, seconds: float) -> None:
        """One finished request: its latency, tokens/s, sampled, prefilled and cached tokens."""
        n = len(result.token_ids)
        self.latency.observe(seconds)
        if seconds > 0:
            self.tokens_per_s.observe(n / seconds)
        self.completion_tokens.inc(n)
        self.prefill_tokens.inc(result.prompt_tokens - result.cached_tokens)
        self.cached_tokens.inc(result.cached_tokens)
