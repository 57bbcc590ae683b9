"""Worker threads that own the decoder: continuous batching, or one request at a time.

Every request goes through a bounded FIFO queue to one worker thread, which alone runs forward
passes; it hands each decoding step back to the request's event loop with
``loop.call_soon_threadsafe``, so the loop keeps accepting, validating, refusing and streaming
while the worker decodes. ``max_queue`` requests may wait; one more gets a ``QueueFullError``
(the server's 429).

``BatchScheduler`` (the default) runs a ``quickdraft.batch.BatchEngine``: between two steps it
admits waiting requests, in arrival order, while the batch has fewer than ``max_batch_size``
rows and the caches of every row (prompt + max_tokens + one step's drafts, both models) fit
``cache_budget_bytes``; the first that does not fit waits for rows to leave. Each step runs
one prefill chunk of the joining rows (``prefill_chunk_tokens`` in all) and one decoding step
of every other row, so a running request waits at most one chunk's forward for a newcomer.
``Scheduler`` decodes one request at a time with a ``SpeculativeDecoder`` (``--scheduler
sequential``, and the drafters the batched engine does not take: trees, trained heads, drafts
with another tokenizer).

Cancellation: a request whose client goes away cancels its job. A queued job leaves the queue at
once; a running one is dropped by the worker before its next step or prefill chunk, which frees
its cache rows at once.

When the decoder goes idle, the last requests' KV caches are dropped and freed memory is handed
back to the operating system, so one long prompt does not leave the process hundreds of MiB larger.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from quickdraft.allocator import give_back_memory
from quickdraft.batch import BatchEngine
from quickdraft.batch.cache import BatchKVCache
from quickdraft.config import SamplingParams
from quickdraft.engine import SpeculativeDecoder, StreamChunk
from quickdraft.server.metrics import ServerMetrics

logger = logging.getLogger("quickdraft.server")


class QueueFullError(Exception):
    """The queue already holds ``max_queue`` waiting requests."""


class ShutdownError(Exception):
    """The server is stopping; the request was not (fully) decoded."""


@dataclass
class Job:
    """One request's generation, shared by its handler (event loop) and the worker thread.

    The worker puts on ``events``, in order: ``StreamChunk``s (the last one has ``finish_reason``
    and ``stats``), or an exception that ends the job. A cancelled job gets nothing more.
    """

    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    # Whose earlier requests a suffix cache may draft from for it (None: the server's one scope).
    scope: str | None = None
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    # Called by cancel(): the scheduler takes the job out of its queue if it is still waiting.
    withdraw: Callable[[Job], None] = lambda job: None
    arrived: float = field(default_factory=time.perf_counter)
    started: float | None = None
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Stop this job: take it out of the queue, or ask the worker to stop it; safe from any
        thread, idempotent."""
        self._cancelled.set()
        self.withdraw(self)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def queue_seconds(self) -> float:
        return (self.started or time.perf_counter()) - self.arrived

    def put(self, item: StreamChunk | BaseException) -> None:
        """Hand an event to the job's event loop (called from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancel()


class _JobQueue:
    """The bounded FIFO of jobs and the worker thread's life; subclasses decode (``_run``).

    Args:
        max_queue: how many jobs may wait (running jobs are not counted).
        metrics: updated with queue depth, generations and speculative counters.
    """

    def __init__(self, max_queue: int, metrics: ServerMetrics) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.max_queue = max_queue
        self.metrics = metrics
        self._waiting: collections.deque[Job] = collections.deque()
        self._condition = threading.Condition()
        self._closed = False  # no new jobs; the queued ones still run
        self._stopping = False  # the worker ends
        self._thread = threading.Thread(target=self._run, name="quickdraft-decoder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, scope: str | None = None) -> Job:
        """Queue a generation; call from the event loop that will read the job's events.

        Raises:
            QueueFullError: ``max_queue`` jobs are already waiting.
            ShutdownError: the server is stopping.
        """
        job = Job(list(prompt_ids), params, asyncio.get_running_loop(), scope=scope, withdraw=self._withdraw)
        with self._condition:
            if self._closed:
                raise ShutdownError("the server is shutting down: retry on another instance or once it is back")
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(
                    f"the queue is full: {len(self._waiting)} requests are waiting for the decoder ({self._capacity}; "
                    f"--max-queue {self.max_queue}); retry later"
                )
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self._condition.notify()
        return job

    _capacity = "which runs one request at a time"

    def _withdraw(self, job: Job) -> None:
        """Take a cancelled job out of the queue, so that it frees its slot at once."""
        with self._condition:
            if job in self._waiting:
                self._waiting.remove(job)
                self.metrics.queue_depth.set(len(self._waiting))
                self.metrics.generations.labels("cancelled").inc()
            self._condition.notify()  # a running job's cancellation wakes an idle worker too

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Jobs being decoded now."""
        return len(self._running_jobs())

    @property
    def busy(self) -> bool:
        return self.running > 0

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Refuse new jobs (``ShutdownError``); the queued and running ones go on."""
        with self._condition:
            self._closed = True

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, end every queued and running one with a ``ShutdownError``, end the
        worker thread and wait for it. Idempotent."""
        with self._condition:
            self._closed = self._stopping = True
            for job in list(self._waiting) + self._running_jobs():
                job.put(ShutdownError("the server shut down before this request finished: retry it"))
                job.cancel()
            self._condition.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _running_jobs(self) -> list[Job]:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError

    def _finished(self, job: Job, outcome: str, produced: int) -> None:
        """Count a job that left the decoder."""
        self.metrics.generations.labels(outcome).inc()
        self.metrics.prompt_tokens.inc(len(job.prompt_ids))
        self.metrics.generation_tokens.inc(produced)


class Scheduler(_JobQueue):
    """One request at a time, first in, first out, with a ``SpeculativeDecoder``.

    Args:
        decoder: used by the worker thread only.
        max_queue: how many jobs may wait (the job being decoded is not counted).
        metrics: updated with queue depth, generations and speculative counters.
        prefill_chunk_tokens: the prompt is fed to the target this many tokens at a time, and a
            cancelled job stops between chunks.
    """

    def __init__(self, decoder: SpeculativeDecoder, max_queue: int, metrics: ServerMetrics,
                 prefill_chunk_tokens: int) -> None:
        super().__init__(max_queue, metrics)
        self.decoder = decoder
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self._current: Job | None = None

    def _running_jobs(self) -> list[Job]:
        return [self._current] if self._current is not None else []

    def _next_job(self) -> Job | None:
        with self._condition:
            while not self._waiting and not self._stopping:
                self._condition.wait()
            if self._stopping:
                return None
            job = self._waiting.popleft()
            self.metrics.queue_depth.set(len(self._waiting))
            self._current = job
            return job

    def _run(self) -> None:
        while (job := self._next_job()) is not None:
            try:
                self._decode(job)
            finally:
                with self._condition:
                    self._current = None
                    idle = not self._waiting
                if idle:
                    self.decoder.release_caches()
                    give_back_memory()

    def _decode(self, job: Job) -> None:
        job.started = time.perf_counter()
        self.metrics.queue_seconds.observe(job.queue_seconds)
        self.metrics.running.set(1)
        produced = 0
        outcome = "cancelled"
        try:
            # stream() checks the request before any work; a generator otherwise.
            steps = self.decoder.stream(job.prompt_ids, job.params, prefill_chunk_tokens=self.prefill_chunk_tokens,
                                        cancelled=lambda: job.cancelled)
            with contextlib.closing(steps):
                for chunk in steps:
                    if produced == 0 and chunk.token_ids:
                        self.metrics.first_token_seconds.observe(time.perf_counter() - job.arrived)
                    produced += len(chunk.token_ids)
                    job.put(chunk)
                    if chunk.stats is not None:
                        self.metrics.record_generation(chunk.stats)
                        outcome = "finished"
                    if job.cancelled:
                        break
        except Exception as error:  # reported to the client; the worker keeps serving
            logger.exception("generation failed")
            outcome = "failed"
            job.put(error)
        finally:
            self.metrics.running.set(0)
            self._finished(job, outcome, produced)


@dataclass
class _Running:
    """A job in the batch: its engine request id and the tokens it has had."""

    job: Job
    request_id: int
    produced: int = 0


class BatchScheduler(_JobQueue):
    """Continuous batching: jobs join and leave a ``BatchEngine`` between its steps.

    Args:
        engine: used by the worker thread only.
        max_queue: how many jobs may wait for a place in the batch.
        metrics: updated with queue depth, batch size, the policy's choice and the counters.
        max_batch_size: the most rows decoded together.
        cache_budget_bytes: the most KV cache (both models) the batch's rows may reserve.
    """

    def __init__(self, engine: BatchEngine, max_queue: int, metrics: ServerMetrics, max_batch_size: int,
                 cache_budget_bytes: int) -> None:
        super().__init__(max_queue, metrics)
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.cache_budget_bytes = cache_budget_bytes
        self._running: dict[int, _Running] = {}  # by engine request id; worker thread only
        self._capacity = (f"the batch holds {max_batch_size} requests and {cache_budget_bytes / 2**20:,.0f} MiB of "
                          "KV cache")

    @property
    def running(self) -> int:
        return len(self._running)  # no lock: /health must answer at once while the worker steps

    def _running_jobs(self) -> list[Job]:
        with self._condition:  # the worker changes the dict under it
            return [running.job for running in self._running.values()]

    def cache_bytes_with(self, jobs: list[Job]) -> int:
        """KV cache the batch would reserve with ``jobs`` as its rows (``BatchKVCache`` rounding)."""
        slots = max(self.engine.slots_needed(len(j.prompt_ids), j.params.max_new_tokens) for j in jobs)
        return BatchKVCache.bytes_for(len(jobs), slots, self.engine.bytes_per_slot())

    def _admit(self) -> list[Job]:
        """Waiting jobs that join now, in arrival order (called with the condition held)."""
        rows = [r.job for r in self._running.values()]
        admitted: list[Job] = []
        while self._waiting and len(rows) < self.max_batch_size:
            job = self._waiting[0]
            # An empty batch takes any job: the server already refused those over the per-request budget.
            if rows and self.cache_bytes_with(rows + [job]) > self.cache_budget_bytes:
                break
            rows.append(self._waiting.popleft())
            admitted.append(job)
        if admitted:
            self.metrics.queue_depth.set(len(self._waiting))
        return admitted

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._stopping and not self._waiting and not self._running:
                    self._condition.wait()
                if self._stopping:
                    break
                admitted = self._admit()
            for job in admitted:
                self._start(job)
            self._drop_cancelled()
            if self._running:
                self._step()
            if not self._running:
                self.engine.release()
                self.metrics.batch_size.set(0)
                self.metrics.kv_cache_bytes.set(0)
                give_back_memory()
        self.engine.release()

    def _start(self, job: Job) -> None:
        job.started = time.perf_counter()
        self.metrics.queue_seconds.observe(job.queue_seconds)
        if job.cancelled:
            self._finished(job, "cancelled", 0)
            return
        try:
            request_id = self.engine.add(job.prompt_ids, job.params, scope=job.scope)
        except Exception as error:  # a bad request the server's checks let through: its own error
            job.put(error)
            self._finished(job, "failed", 0)
            return
        with self._condition:
            self._running[request_id] = _Running(job, request_id)
        self.metrics.running.set(len(self._running))

    def _drop_cancelled(self) -> None:
        """Free the rows of jobs whose clients left (before the next step: at most one step late)."""
        for request_id, running in list(self._running.items()):
            if running.job.cancelled:
                self.engine.cancel(request_id)
                with self._condition:
                    del self._running[request_id]
                self._finished(running.job, "cancelled", running.produced)
        self.metrics.running.set(len(self._running))

    def _step(self) -> None:
        try:
            events = self.engine.step()
        except Exception as error:  # every running job is told; the worker keeps serving
            logger.exception("a batched step failed")
            for request_id, running in list(self._running.items()):
                running.job.put(error)
                self._finished(running.job, "failed", running.produced)
            with self._condition:
                self._running.clear()
            self.engine.release()
            return
        now = time.perf_counter()
        for event in events:
            running = self._running.get(event.request_id)
            if running is None:
                continue
            chunk = event.chunk
            if running.produced == 0 and chunk.token_ids:
                self.metrics.first_token_seconds.observe(now - running.job.arrived)
            running.produced += len(chunk.token_ids)
            running.job.put(chunk)
            if chunk.stats is not None:
                self.metrics.record_generation(chunk.stats)
            if event.done:
                with self._condition:
                    del self._running[event.request_id]
                self._finished(running.job, "finished", running.produced)
        self.metrics.record_batch_step(self.engine.last_drafted, self.engine.last_decision.k, self.engine.acceptance,
                                       self.engine.cache_bytes, self.engine.last_seconds, self.engine.last_decision.gain)
        self.metrics.running.set(len(self._running))
