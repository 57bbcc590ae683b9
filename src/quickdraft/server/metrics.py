"""Prometheus metrics of one server, in a registry of its own (never the global one).

Counting conventions:

* ``quickdraft_requests_total{route, status}`` counts every HTTP request once, when its response
  ends, errors included; ``route`` is the path for the server's routes and ``other`` for the rest.
* Token counters count every request the decoder ran, cancelled ones included (the tokens made
  before the cancellation).
* The speculative counters follow ``DecodeStats``'s conventions: a **step** is one target verify
  forward; ``accepted`` counts accepted draft tokens only. They are added when a generation
  finishes: the library hands its statistics over with the last chunk only, so a cancelled
  generation's steps are not counted.
* ``quickdraft_spec_mean_accepted_length`` = (accepted + steps) / steps over every finished
  generation: tokens per target forward, **counting the bonus/recovered token** (1.0 for plain
  decoding), i.e. ``DecodeStats.mean_tokens_per_step`` over the server's life.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from quickdraft.stats import DecodeStats

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class ServerMetrics:
    """The server's counters, gauges and histograms; safe to update from any thread."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("quickdraft_requests", "HTTP requests by route and status code",
                                ["route", "status"], registry=r)
        self.request_seconds = Histogram("quickdraft_request_duration_seconds",
                                         "Time from request to the end of its response", ["route"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.first_token_seconds = Histogram("quickdraft_time_to_first_token_seconds",
                                             "Time from request to its first generated token (queue wait included)",
                                             buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_seconds = Histogram("quickdraft_queue_wait_seconds",
                                       "Time a request waited for the decoder", buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("quickdraft_prompt_tokens", "Prompt tokens of decoded requests", registry=r)
        self.generation_tokens = Counter("quickdraft_generation_tokens", "Generated tokens", registry=r)
        self.generations = Counter("quickdraft_generations", "Generations the decoder ran, by outcome "
                                   "(finished, cancelled, failed)", ["outcome"], registry=r)
        self.rejected = Counter("quickdraft_rejected_requests", "Requests refused before decoding, by reason "
                                "(queue_full, kv_cache_budget)", ["reason"], registry=r)
        self.queue_depth = Gauge("quickdraft_queue_depth", "Requests waiting for the decoder", registry=r)
        self.running = Gauge("quickdraft_running_requests", "Requests being decoded (0 or 1)", registry=r)
        self.spec_steps = Counter("quickdraft_spec_steps", "Target verify forwards (decoding steps)", registry=r)
        self.spec_drafted = Counter("quickdraft_spec_drafted_tokens", "Draft tokens proposed", registry=r)
        self.spec_accepted = Counter("quickdraft_spec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.spec_lookup_steps = Counter("quickdraft_spec_lookup_steps",
                                         "Steps drafted by prompt lookup in front of the draft model", registry=r)
        self.spec_drafted_by_position = Counter(
            "quickdraft_spec_drafted_tokens_by_position", "Draft tokens proposed at draft position i (0-based)",
            ["position"], registry=r)
        self.spec_accepted_by_position = Counter(
            "quickdraft_spec_accepted_tokens_by_position", "Draft tokens accepted at draft position i (0-based)",
            ["position"], registry=r)
        self.spec_mean_accepted_length = Gauge(
            "quickdraft_spec_mean_accepted_length",
            "Tokens per target forward, counting the bonus/recovered token: (accepted + steps) / steps",
            registry=r)
        self._lock = threading.Lock()
        self._steps = 0
        self._accepted = 0

    def record_generation(self, stats: DecodeStats) -> None:
        """Add a finished generation's speculative counters."""
        self.spec_steps.inc(stats.steps)
        self.spec_drafted.inc(stats.drafted_tokens)
        self.spec_accepted.inc(stats.accepted_tokens)
        self.spec_lookup_steps.inc(stats.lookup_steps)
        by_position = zip(stats.drafted_by_position, stats.accepted_by_position, strict=True)
        for position, (drafted, accepted) in enumerate(by_position):
            self.spec_drafted_by_position.labels(str(position)).inc(drafted)
            self.spec_accepted_by_position.labels(str(position)).inc(accepted)
        with self._lock:
            self._steps += stats.steps
            self._accepted += stats.accepted_tokens
            if self._steps:
                self.spec_mean_accepted_length.set((self._accepted + self._steps) / self._steps)

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
