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
* Batching (the batch scheduler only): ``quickdraft_batch_size`` is the number of rows the last
  step decoded (rows still prefilling are not counted); ``quickdraft_batch_drafted_tokens_per_row``
  observes, per step and row, the draft tokens that row verified (0: none); ``quickdraft_batch_k``
  is the policy's last choice of k for the batch (``quickdraft_batch_steps_total{k}`` counts
  every choice); ``quickdraft_batch_acceptance{source}`` the running probability that a drafted
  token is accepted, by source (``lookup``, ``model``), that the policy chooses k from;
  ``quickdraft_batch_realized_gain`` the factor the policy last put on drafting's estimated rate:
  how drafting steps kept to their estimated seconds at the batch's width, over how plain steps
  did (``quickdraft.batch.policy.Realized``; below 1, drafting took longer than estimated);
  ``quickdraft_kv_cache_bytes`` is what the batch's KV caches hold now (both
  models, as allocated) and ``quickdraft_kv_cache_peak_bytes`` the most they have held.
  ``quickdraft_batch_step_seconds_total{phase, drafted}`` adds each step's seconds by phase
  (``quickdraft.batch.engine.PHASES``; ``drafted`` is ``true`` where any row verified a draft
  that step): with ``quickdraft_batch_steps_total`` it shows what the steps that drafted cost a
  loaded server against those that did not.
* Suffix cache (where one drafts): ``quickdraft_suffix_cache_bytes`` what it holds now (as Python
  counts it) under ``quickdraft_suffix_cache_limit_bytes``; ``quickdraft_suffix_cache_sequences``
  the requests it holds; ``quickdraft_suffix_cache_lookups`` and ``..._hits`` the drafts asked of
  it and those it found tokens for, since start. Read when ``/metrics`` is scraped.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from quickdraft.drafters.suffix_cache import SuffixCacheStore
from quickdraft.stats import DecodeStats

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class ServerMetrics:
    """The server's counters, gauges and histograms; safe to update from any thread."""

    def __init__(self) -> None:
        self.suffix_cache_bytes: Gauge | None = None  # made by observe_suffix_cache
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
        self.running = Gauge("quickdraft_running_requests", "Requests being decoded", registry=r)
        self.batch_size = Gauge("quickdraft_batch_size", "Rows the last batched step decoded", registry=r)
        self.batch_drafted = Histogram("quickdraft_batch_drafted_tokens_per_row",
                                       "Draft tokens each row verified in a batched step",
                                       buckets=(0, 1, 2, 3, 4, 5, 6, 8, 12, 16), registry=r)
        self.batch_k = Gauge("quickdraft_batch_k", "The policy's last choice of draft tokens per row", registry=r)
        self.batch_steps = Counter("quickdraft_batch_steps", "Batched steps, by the policy's choice of k", ["k"],
                                   registry=r)
        self.batch_step_seconds = Counter("quickdraft_batch_step_seconds", "Seconds of batched steps by phase, "
                                          "and whether any row drafted", ["phase", "drafted"], registry=r)
        self.batch_acceptance = Gauge("quickdraft_batch_acceptance", "The batch's running acceptance of drafted "
                                      "tokens, by source (lookup, model)", ["source"], registry=r)
        self.batch_realized_gain = Gauge("quickdraft_batch_realized_gain", "How drafting steps kept to "
                                         "their estimated seconds at this batch width, over plain steps",
                                         registry=r)
        self.kv_cache_bytes = Gauge("quickdraft_kv_cache_bytes", "KV cache the batch holds now (both models)",
                                    registry=r)
        self.kv_cache_peak_bytes = Gauge("quickdraft_kv_cache_peak_bytes",
                                         "The most KV cache the batch has held (both models)", registry=r)
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
        self._peak_cache = 0

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

    def record_batch_step(self, drafted: list[int], k: int, acceptance: dict[str, float], cache_bytes: int,
                          seconds: dict[str, float], gain: float = 1.0) -> None:
        """One batched step: the tokens each decoding row drafted, the policy's k, the acceptance
        by source it chose from, the cache held, the seconds of each phase, the policy's
        factor on drafting's estimated rate."""
        self.batch_size.set(len(drafted))
        label = "true" if any(drafted) else "false"
        for phase, spent in seconds.items():
            self.batch_step_seconds.labels(phase, label).inc(spent)
        for source, rate in acceptance.items():
            self.batch_acceptance.labels(source).set(rate)
        for count in drafted:
            self.batch_drafted.observe(count)
        self.batch_k.set(k)
        self.batch_realized_gain.set(gain)
        self.batch_steps.labels(str(k)).inc()
        self.kv_cache_bytes.set(cache_bytes)
        with self._lock:
            self._peak_cache = max(self._peak_cache, cache_bytes)
            self.kv_cache_peak_bytes.set(self._peak_cache)

    def observe_suffix_cache(self, store: SuffixCacheStore) -> None:
        """Set the suffix-cache gauges from ``store`` (module docstring)."""
        if self.suffix_cache_bytes is None:
            r = self.registry
            self.suffix_cache_bytes = Gauge("quickdraft_suffix_cache_bytes", "Memory the suffix cache holds",
                                            registry=r)
            self.suffix_cache_limit = Gauge("quickdraft_suffix_cache_limit_bytes", "The suffix cache's memory bound",
                                            registry=r)
            self.suffix_cache_sequences = Gauge("quickdraft_suffix_cache_sequences",
                                                "Requests whose tokens the suffix cache holds", registry=r)
            self.suffix_cache_lookups = Gauge("quickdraft_suffix_cache_lookups",
                                              "Drafts asked of the suffix cache since start", registry=r)
            self.suffix_cache_hits = Gauge("quickdraft_suffix_cache_hits",
                                           "Drafts the suffix cache found tokens for since start", registry=r)
        self.suffix_cache_bytes.set(store.bytes)
        self.suffix_cache_limit.set(store.max_bytes)
        self.suffix_cache_sequences.set(store.sequences)
        self.suffix_cache_lookups.set(store.lookups)
        self.suffix_cache_hits.set(store.hits)

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
