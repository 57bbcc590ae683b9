"""One worker thread owns the decoder and runs requests one at a time, first in, first out.

``SpeculativeDecoder`` decodes one sequence at a time and is not thread-safe, so every request
goes through a bounded queue to a single worker thread. The worker hands each decoding step back
to the request's event loop with ``loop.call_soon_threadsafe``; the loop itself never runs a
forward pass, so it keeps accepting, validating, refusing and streaming while the worker decodes.

Cancellation: a request whose client goes away cancels its job. A queued job leaves the queue at
once; the running one is stopped by the worker, which checks the flag before each prefill chunk
and each decoding step, so a cancelled request holds the decoder for at most one more chunk or step.

When the decoder goes idle, the last request's KV cache is dropped and freed memory is handed
back to the operating system, so one long prompt does not leave the process hundreds of MiB larger.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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


class Scheduler:
    """A bounded FIFO of jobs and the one thread that decodes them.

    Args:
        decoder: used by the worker thread only.
        max_queue: how many jobs may wait (the job being decoded is not counted).
        metrics: updated with queue depth, generations and speculative counters.
        prefill_chunk_tokens: the prompt is fed to the target this many tokens at a time, and a
            cancelled job stops between chunks.
    """

    def __init__(self, decoder: SpeculativeDecoder, max_queue: int, metrics: ServerMetrics,
                 prefill_chunk_tokens: int) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.decoder = decoder
        self.max_queue = max_queue
        self.metrics = metrics
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self._waiting: collections.deque[Job] = collections.deque()
        self._condition = threading.Condition()
        self._current: Job | None = None
        self._closed = False  # no new jobs; the queued ones still run
        self._stopping = False  # the worker ends
        self._thread = threading.Thread(target=self._run, name="quickdraft-decoder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Job:
        """Queue a generation; call from the event loop that will read the job's events.

        Raises:
            QueueFullError: ``max_queue`` jobs are already waiting.
            ShutdownError: the server is stopping.
        """
        job = Job(list(prompt_ids), params, asyncio.get_running_loop(), withdraw=self._withdraw)
        with self._condition:
            if self._closed:
                raise ShutdownError("the server is shutting down: retry on another instance or once it is back")
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(
                    f"the queue is full: {len(self._waiting)} requests are waiting for the decoder, which "
                    f"runs one at a time (--max-queue {self.max_queue}); retry later"
                )
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self._condition.notify()
        return job

    def _withdraw(self, job: Job) -> None:
        """Take a cancelled job out of the queue, so that it frees its slot at once."""
        with self._condition:
            if job in self._waiting:
                self._waiting.remove(job)
                self.metrics.queue_depth.set(len(self._waiting))
                self.metrics.generations.labels("cancelled").inc()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return self._current is not None

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
            jobs = list(self._waiting) + ([self._current] if self._current is not None else [])
            for job in jobs:
                job.put(ShutdownError("the server shut down before this request finished: retry it"))
                job.cancel()
            self._condition.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

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
                    self._release_memory()

    def _release_memory(self) -> None:
        """Give the last request's memory back: its KV cache, then the allocator's free pages
        (glibc keeps them otherwise; a long prompt's prefill leaves hundreds of MiB)."""
        self.decoder.release_caches()
        if _malloc_trim is not None:
            _malloc_trim(0)

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
            self.metrics.generations.labels(outcome).inc()
            self.metrics.prompt_tokens.inc(len(job.prompt_ids))
            self.metrics.generation_tokens.inc(produced)


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, which returns free heap memory to the system; None elsewhere."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


_malloc_trim = _load_malloc_trim()
