"""The FastAPI application: OpenAI-compatible routes in front of one scheduler (continuous
batching, or one request at a time: ``quickdraft.server.scheduler``).

Everything a request needs checking is checked here, on the event loop, before it is queued:
the Host header, the Content-Type, the body's size, shape and upload time, the model name, the
sampling parameters, the prompt limit, the context window and the KV-cache budget. Only
requests that can run reach the worker thread; tokenization runs in a helper thread so a long
prompt does not stall the loop either.

Browser safety: a web page can make the user's browser send requests to a server on localhost.
Requiring ``Content-Type: application/json`` makes every such cross-site request need a CORS
preflight, which is refused unless ``cors_origins`` allows the page; checking the Host header
against ``allowed_hosts`` stops DNS rebinding (an attacker's name resolving to 127.0.0.1), which
would otherwise let the page read the replies.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from quickdraft.allocator import freeze_long_lived, thaw
from quickdraft.batch import BatchEngine, GoodputPolicy
from quickdraft.batch.limits import KByBatchSize
from quickdraft.config import SamplingParams
from quickdraft.drafters.registry import batch_form, suffix_store
from quickdraft.engine import SpeculativeDecoder, StreamChunk, TokenLogprob
from quickdraft.errors import QuickdraftError
from quickdraft.memory import sequence_kv_bytes, weight_bytes
from quickdraft.policy import FixedK
from quickdraft.prompts import chat_prompt_ids
from quickdraft.server.metrics import ServerMetrics
from quickdraft.server.protocol import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    SSE_DONE,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    ResponseBuilder,
    SamplingRequest,
    check_unsupported,
    parse_request,
    speculative_stats,
    sse,
    usage,
)
from quickdraft.server.scheduler import BatchScheduler, Job, QueueFullError, Scheduler, ShutdownError

logger = logging.getLogger("quickdraft.server")

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
SCHEDULERS = ("batch", "sequential")
MIB = 2**20
# A body over the limit is still read (and dropped) up to this many times the limit, so the
# client can read the 413 instead of a connection reset; beyond it the connection is closed.
_DRAIN_FACTOR = 8
# nginx's "client closed request": recorded for non-streaming requests whose client left.
STATUS_CLIENT_CLOSED = 499


@dataclass(frozen=True)
class ServerConfig:
    """How the server admits requests.

    Attributes:
        model_name: the id clients pass as ``model`` and ``/v1/models`` lists.
        max_queue: requests that may wait for the decoder (the running one is not counted);
            one more gets a 429.
        kv_cache_budget_mb: KV cache one request may use (target + draft or EAGLE head, prompt + max_tokens
            positions, in MiB); a request that needs more gets a 400.
        max_body_bytes: larger request bodies get a 413.
        api_key: when set, every route but ``/health`` needs ``Authorization: Bearer <key>``;
            several keys are separated by commas.
        default_max_tokens: chat requests without ``max_tokens`` generate up to this many
            (never past the context window). Completions default to 16, as OpenAI's do.
        max_prompt_tokens: longer prompts get a 400 (the context window also applies).
        prefill_chunk_tokens: prompts are fed to the model this many tokens at a time; a request
            whose client leaves stops after the current chunk.
        body_timeout: seconds a client has to send its whole body; slower ones get a 408.
        allowed_hosts: host names (no port) the ``Host`` header may carry; others get a 421.
            ``"*"`` allows any.
        cors_origins: web origins whose pages may call the server (CORS); none by default.
        scheduler: ``"batch"`` (continuous batching, ``BatchScheduler``) or ``"sequential"``
            (one request at a time, ``Scheduler``). Every chain drafter is served batched; a
            tree is served one request at a time, which the start-up log and ``/v1/models`` say.
        max_batch_size: the most requests decoded together (batch scheduler).
        batch_kv_cache_mb: KV cache all running requests may reserve together (both models,
            prompt + max_tokens each, in MiB); requests that would go over it wait in the queue.
        k_by_batch_size: a ceiling on the tokens a row drafts per step by the number of running
            requests (``quickdraft.batch.limits``; batch scheduler); None: K at every size.
        suffix_cache_scope: ``"server"``: a suffix cache drafts for every request from every
            earlier one; ``"key"``: only from those sent with the same API key.
    """

    model_name: str
    max_queue: int = 64
    kv_cache_budget_mb: float = 1024.0
    max_body_bytes: int = MIB
    api_key: str | None = None
    default_max_tokens: int = 256
    max_prompt_tokens: int = 4096
    prefill_chunk_tokens: int = 512
    body_timeout: float = 30.0
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS
    cors_origins: tuple[str, ...] = ()
    scheduler: str = "batch"
    max_batch_size: int = 32
    batch_kv_cache_mb: float = 4096.0
    k_by_batch_size: KByBatchSize | None = None
    suffix_cache_scope: str = "server"

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        if self.k_by_batch_size is not None and self.scheduler != "batch":
            raise ValueError("k_by_batch_size sets K by the size of a batch: it needs the batch scheduler, "
                             f"got scheduler {self.scheduler!r}")
        if self.batch_kv_cache_mb < self.kv_cache_budget_mb:
            raise ValueError(f"batch_kv_cache_mb ({self.batch_kv_cache_mb:g}) must be at least kv_cache_budget_mb "
                             f"({self.kv_cache_budget_mb:g}): a request the server takes must fit the batch alone")


def unbatched_reason(decoder: SpeculativeDecoder, config: ServerConfig) -> str | None:
    """Why requests are decoded one at a time (one line), or None when they are batched."""
    if config.scheduler != "batch":
        return "the sequential scheduler was asked for (--scheduler sequential)"
    if decoder.tree is not None:
        return (f"{decoder.drafter.name} drafts trees, which the batched engine does not verify (it verifies "
                "chains): requests are decoded one at a time; drop --tree / --tree-budget to batch them")
    return None


def bearer(http: Request) -> tuple[str, str]:
    """The scheme and the key of a request's ``Authorization`` header ("" for what is missing)."""
    scheme, _, key = http.headers.get("authorization", "").partition(" ")
    return scheme, key.strip()


def key_scope(key: str) -> str:
    """The suffix-cache scope of API key ``key`` (``--suffix-cache-scope key``): a digest, so that
    the key itself is never held in the cache's names."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]


def batch_engine(decoder: SpeculativeDecoder, config: ServerConfig) -> BatchEngine | None:
    """The batched engine serving ``decoder``'s models and drafter (``registry.batch_form``),
    or None where ``unbatched_reason`` gives one."""
    if unbatched_reason(decoder, config) is not None:
        return None
    draft, lookup = batch_form(decoder.drafter)
    lookup = False if lookup is None else lookup
    k = decoder.num_speculative_tokens
    policy = GoodputPolicy(k) if decoder.policy.adaptive else FixedK(k)
    return BatchEngine(decoder.target, draft, k, policy, prompt_lookup=lookup,
                       prefill_chunk_tokens=config.prefill_chunk_tokens, k_by_batch_size=config.k_by_batch_size)


def cache_bytes_per_token(decoder: SpeculativeDecoder) -> int:
    """Bytes one token of a request holds: the target's KV cache and what the drafter keeps
    per token (``Drafter.footprint``: a draft model's cache, a head's and the feature kept for it)."""
    drafter = 0 if decoder.drafter is None else decoder.drafter.footprint().cache_bytes_per_token
    return sequence_kv_bytes([decoder.target], 1) + drafter


def memory_report(decoder: SpeculativeDecoder, config: ServerConfig) -> list[str]:
    """Lines for the startup log: the target's and the drafter's weights, and the KV-cache budget."""
    target = decoder.target
    lines = [f"target {target.name}: weights {weight_bytes(target) / MIB:,.1f} MiB ({target.precision}, {target.device})"]
    if decoder.drafter is not None:
        footprint = decoder.drafter.footprint()
        lines.append(f"draft {decoder.drafter.name}: " + (
            f"weights {footprint.weight_bytes / MIB:,.1f} MiB ({footprint.note})" if footprint.weight_bytes
            else "no weights"))
    per_token = cache_bytes_per_token(decoder)
    budget = config.kv_cache_budget_mb * MIB
    lines.append(
        f"KV cache budget {config.kv_cache_budget_mb:,.0f} MiB per request: {per_token:,} bytes per token "
        f"(every cache), so up to {int(budget // per_token):,} tokens of prompt + max_tokens "
        f"(context window {decoder.context_length:,})"
    )
    return lines


class _Metered:
    """ASGI middleware: counts every HTTP request by route and status, and times it."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client gets if the app raises before responding

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope["path"] if scope["path"] in ROUTES else "other"
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - start)


def _host_name(host: str) -> str:
    """The name in a Host header or an allow-list entry, without port or IPv6 brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8000
        return host[1:].partition("]")[0]
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() and ":" not in name else host


class _HostCheck:
    """ASGI middleware: answers requests whose Host header is not allowed with a 421.

    A browser sends the name it resolved, so a page served from an attacker's name that resolves
    to 127.0.0.1 (DNS rebinding) is refused here even though it reached the socket.
    """

    def __init__(self, app: ASGIApp, allowed_hosts: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = frozenset(_host_name(host) for host in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and "*" not in self.allowed:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if _host_name(host) not in self.allowed:
                error = APIError(421, f"the Host header {host!r} is not one this server answers to: it allows "
                                      f"{', '.join(sorted(self.allowed))} (--allowed-hosts)", code="host_not_allowed")
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def check_json_content_type(request: Request) -> None:
    """A 415 unless the body is declared JSON: browsers send other types cross-site without asking."""
    declared = request.headers.get("content-type", "")
    if declared.partition(";")[0].strip().lower() != "application/json":
        raise APIError(415, f"send the body as JSON with the header 'Content-Type: application/json' "
                            f"(got {declared or 'no Content-Type'!r})", code="unsupported_media_type")


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request body; a 413 when it is larger than ``limit`` bytes, a 408 when it takes longer
    than ``timeout`` seconds to arrive, a 499 when the client disconnects while sending it."""
    too_large = APIError(413, f"the request body is larger than the server's limit of {limit:,} bytes "
                              "(--max-body-bytes)", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > _DRAIN_FACTOR * limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > _DRAIN_FACTOR * limit:
                    break
                if size <= limit:
                    chunks.append(chunk)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:g} s (--body-timeout)",
                       code="request_timeout", headers={"Connection": "close"}) from None
    except ClientDisconnect:
        logger.info("%s: the client disconnected while sending its body (%d of %s bytes)",
                    request.url.path, size, declared or "?")
        raise APIError(STATUS_CLIENT_CLOSED, "the client disconnected while sending its body",
                       code="client_closed_request") from None
    if size > limit:
        raise too_large
    return b"".join(chunks)


def _param_of(error: QuickdraftError) -> str | None:
    """The OpenAI parameter a library validation message is about (they start with its name)."""
    message = str(error)
    for name, param in (("temperature", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"),
                        ("max_new_tokens", "max_tokens"), ("stop_token_ids", "stop_token_ids"), ("stop", "stop"),
                        ("prompt", "prompt"), ("min_p", "min_p"), ("repetition_penalty", "repetition_penalty"),
                        ("presence_penalty", "presence_penalty"), ("frequency_penalty", "frequency_penalty"),
                        ("logit_bias", "logit_bias"), ("token id", "logit_bias"), ("top_logprobs", "top_logprobs"),
                        ("n must", "n"), ("response_format", "response_format"), ("the JSON schema", "response_format"),
                        ("the output constraint", "response_format"), ("structured output", "response_format"),
                        ("give at most one", "response_format"), ("ignore_eos", "ignore_eos"),
                        ("num_speculative_tokens", "num_speculative_tokens")):
        if message.startswith(name) or message.startswith(f"the {name}"):
            return param
    return None


class _Server:
    """The state the route handlers share: decoder, scheduler, metrics and configuration."""

    def __init__(self, decoder: SpeculativeDecoder, config: ServerConfig) -> None:
        self.decoder = decoder
        self.config = config
        self.metrics = ServerMetrics()
        self.unbatched = unbatched_reason(decoder, config)
        engine = batch_engine(decoder, config)
        if engine is None:
            self.scheduler: Scheduler | BatchScheduler = Scheduler(decoder, config.max_queue, self.metrics,
                                                                   config.prefill_chunk_tokens)
        else:
            self.scheduler = BatchScheduler(engine, config.max_queue, self.metrics, config.max_batch_size,
                                            int(config.batch_kv_cache_mb * MIB))
        self.context_length = decoder.context_length
        self.bytes_per_token = cache_bytes_per_token(decoder)
        self.created = int(time.time())

    # -- checks, in the order a request meets them -------------------------------------------

    def check_model(self, request: SamplingRequest) -> None:
        if request.model is not None and request.model != self.config.model_name:
            raise APIError(404, f"the model {request.model!r} does not exist: this server serves "
                                f"{self.config.model_name!r} (see GET /v1/models)",
                           param="model", code="model_not_found")

    async def encode_prompt(self, request: CompletionRequest) -> list[int]:
        prompt = request.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: one prompt per request, got a list of {len(prompt)}; "
                                    "send one request each", param="prompt")
            prompt = prompt[0]
        try:
            return await asyncio.to_thread(self.decoder.encode, prompt)
        except QuickdraftError as error:
            raise APIError(400, str(error), param="prompt") from None

    async def encode_messages(self, request: ChatCompletionRequest) -> list[int]:
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        try:
            return await asyncio.to_thread(chat_prompt_ids, self.decoder.target.tokenizer, messages)
        except QuickdraftError as error:
            raise APIError(400, str(error), param="messages") from None

    def sampling_params(self, request: SamplingRequest, prompt_len: int, max_tokens: int | None,
                        default_max_tokens: int, prompt_param: str) -> SamplingParams:
        """Check the request against the prompt limit, the context window and the KV budget;
        build its params."""
        if prompt_len > self.config.max_prompt_tokens:
            self.metrics.rejected.labels("prompt_too_long").inc()
            raise APIError(400, f"the prompt has {prompt_len:,} tokens, over this server's limit of "
                                f"{self.config.max_prompt_tokens:,} (--max-prompt-tokens): shorten it",
                           param=prompt_param, code="prompt_too_long")
        room = self.context_length - prompt_len
        if room <= 0:
            raise APIError(400, f"the prompt has {prompt_len} tokens but the context window holds "
                                f"{self.context_length}: shorten the prompt",
                           param=prompt_param, code="context_length_exceeded")
        budget = self.config.kv_cache_budget_mb * MIB
        budget_tokens = int(budget // self.bytes_per_token)
        if max_tokens is None:  # the default never exceeds what the request is allowed
            max_tokens = max(1, min(default_max_tokens, room, budget_tokens - prompt_len))
        if max_tokens < 1:
            raise APIError(400, f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
        if max_tokens > room:
            raise APIError(400, f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the context "
                                f"window ({self.context_length}): ask for at most {room} tokens",
                           param="max_tokens", code="context_length_exceeded")
        needed = (prompt_len + max_tokens) * self.bytes_per_token
        if needed > budget:
            self.metrics.rejected.labels("kv_cache_budget").inc()
            raise APIError(400, f"this request needs {needed / MIB:,.1f} MiB of KV cache for prompt ({prompt_len}) "
                                f"+ max_tokens ({max_tokens}) tokens, over the server's budget of "
                                f"{self.config.kv_cache_budget_mb:,.1f} MiB (--kv-cache-budget-mb): "
                                f"prompt + max_tokens may be at most {budget_tokens:,} tokens",
                           param="max_tokens", code="kv_cache_budget_exceeded")
        if request.seed is not None and not -(2**63) <= request.seed < 2**64:
            raise APIError(400, "seed must fit in 64 bits", param="seed")
        stop = [request.stop] if isinstance(request.stop, str) else (request.stop or [])
        top_logprobs = request.top_logprobs_asked()
        response_format = None if request.response_format is None else request.response_format.as_dict()
        try:
            return SamplingParams(
                temperature=1.0 if request.temperature is None else request.temperature,
                top_k=0 if request.top_k in (None, -1) else request.top_k,
                top_p=1.0 if request.top_p is None else request.top_p,
                min_p=request.min_p or 0.0,
                max_new_tokens=max_tokens,
                seed=request.seed,
                stop=tuple(stop),
                stop_token_ids=tuple(request.stop_token_ids or ()),
                ignore_eos=request.ignore_eos,
                repetition_penalty=1.0 if request.repetition_penalty is None else request.repetition_penalty,
                presence_penalty=request.presence_penalty or 0.0,
                frequency_penalty=request.frequency_penalty or 0.0,
                logit_bias=request.logit_bias or {},
                logprobs=top_logprobs is not None,
                top_logprobs=top_logprobs or 0,
                n=1 if request.n is None else request.n,
                response_format=response_format,
                regex=request.regex,
                grammar=request.grammar,
                num_speculative_tokens=request.num_speculative_tokens,
            )
        except QuickdraftError as error:
            raise APIError(400, str(error), param=_param_of(error)) from None

    async def check_params(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """What the decoder would refuse (ids outside the vocabulary, a schema llguidance cannot
        compile) is a 400 now, not an error event in a stream that already said 200."""
        try:
            await asyncio.to_thread(self.decoder.check, prompt_ids, params)
        except QuickdraftError as error:
            raise APIError(400, str(error), param=_param_of(error)) from None

    def scope_of(self, http: Request) -> str | None:
        """The suffix-cache scope of a request: its API key's (a digest of it) where the cache is
        scoped by key, else None (the server's one scope)."""
        return key_scope(bearer(http)[1]) if self.config.suffix_cache_scope == "key" else None

    def submit(self, prompt_ids: list[int], params: SamplingParams, scope: str | None = None) -> Job:
        try:
            return self.scheduler.submit(prompt_ids, params, scope)
        except QueueFullError as error:
            self.metrics.rejected.labels("queue_full").inc()
            raise APIError(429, str(error), type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        except ShutdownError as error:
            raise APIError(503, str(error), type="server_error", code="shutting_down") from None

    async def drain(self, timeout: float, forced: Callable[[], bool]) -> None:
        """Shut down gracefully: refuse new requests (503 ``shutting_down``), give the queued and
        running ones ``timeout`` seconds to finish, then end the rest with a 503."""
        self.scheduler.close()
        deadline = time.monotonic() + timeout
        while (self.scheduler.busy or self.scheduler.waiting) and time.monotonic() < deadline and not forced():
            await asyncio.sleep(0.05)
        left = self.scheduler.waiting + self.scheduler.running
        if left:
            logger.warning("shutdown deadline (%g s, --shutdown-timeout) reached: ending %d request(s)", timeout, left)
        await asyncio.to_thread(self.scheduler.stop)

    # -- responses ------------------------------------------------------------------------------

    async def respond(self, http: Request, request: SamplingRequest, chat: bool, prompt_ids: list[int],
                      params: SamplingParams) -> Response:
        job = self.submit(prompt_ids, params, self.scope_of(http))
        if request.stream:
            include_usage = request.stream_options is not None and request.stream_options.include_usage
            builder = ResponseBuilder(chat=chat, model=self.config.model_name, include_usage=include_usage)
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(self._events(job, builder), media_type="text/event-stream", headers=headers)
        return await self._whole(http, job, ResponseBuilder(chat=chat, model=self.config.model_name))

    async def _events(self, job: Job, builder: ResponseBuilder) -> AsyncIterator[bytes]:
        """The SSE stream; the ``n`` choices come one after the other, each opened (chat) and
        closed by its own chunks. Starlette cancels it when the client disconnects; ``finally``
        then cancels the job, and the worker drops it before its next step."""
        try:
            first = builder.first_chunk()
            if first is not None:
                yield sse(first)
            completion_tokens = 0
            while True:
                item = await job.events.get()
                if isinstance(item, BaseException):
                    yield sse(_api_error(item).body())
                    return
                logprobs = self._logprobs(builder, item)
                if item.finish_reason is None:
                    if item.text or logprobs:
                        yield sse(builder.text_chunk(item.text, item.index, logprobs))
                    continue
                assert item.stats is not None
                completion_tokens += item.stats.new_tokens
                if item.index < job.params.n - 1:
                    yield sse(builder.final_chunk(item.text, item.finish_reason, None, item.index, logprobs))
                    opening = builder.first_chunk(item.index + 1)
                    if opening is not None:
                        yield sse(opening)
                    continue
                usage_, extension = self._usage(job, item, completion_tokens)
                yield sse(builder.final_chunk(item.text, item.finish_reason, extension, item.index, logprobs))
                if builder.include_usage:
                    yield sse(builder.usage_chunk(usage_))
                yield SSE_DONE
                return
        finally:
            job.cancel()  # a no-op when the job has finished

    async def _whole(self, http: Request, job: Job, builder: ResponseBuilder) -> Response:
        """Wait for the whole generation; a client that leaves meanwhile cancels it."""
        watcher = asyncio.create_task(_cancel_on_disconnect(http, job))
        try:
            pieces: list[list[str]] = [[] for _ in range(job.params.n)]
            entries: list[list[TokenLogprob]] = [[] for _ in range(job.params.n)]
            choices: list[tuple[str, str, dict | None]] = []
            completion_tokens = 0
            while True:
                item = await job.events.get()
                if isinstance(item, _ClientGone):
                    return Response(status_code=STATUS_CLIENT_CLOSED)
                if isinstance(item, BaseException):
                    raise _api_error(item)
                pieces[item.index].append(item.text)
                entries[item.index].extend(item.logprobs or [])
                if item.finish_reason is None:
                    continue
                assert item.stats is not None
                completion_tokens += item.stats.new_tokens
                logprobs = builder.logprobs(entries[item.index], self._token_text) if job.params.logprobs else None
                choices.append(("".join(pieces[item.index]), item.finish_reason, logprobs))
                if item.index == job.params.n - 1:
                    usage_, extension = self._usage(job, item, completion_tokens)
                    return JSONResponse(builder.whole(choices, usage_, extension))
        finally:
            watcher.cancel()
            job.cancel()

    def _usage(self, job: Job, last: StreamChunk, completion_tokens: int) -> tuple[dict, dict]:
        """Usage counts every choice's tokens; the statistics are the last choice's."""
        stats = last.stats
        assert stats is not None
        return usage(len(job.prompt_ids), completion_tokens), speculative_stats(stats, job.queue_seconds)

    def _token_text(self, token: int) -> str:
        return self.decoder.target.tokenizer.decode([token])

    def _logprobs(self, builder: ResponseBuilder, chunk: StreamChunk) -> dict | None:
        return builder.logprobs(chunk.logprobs, self._token_text) if chunk.logprobs else None


class _ClientGone(Exception):
    """Put on a job's events when its (non-streaming) client disconnects."""


async def _cancel_on_disconnect(http: Request, job: Job) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass
    job.cancel()
    job.events.put_nowait(_ClientGone())


def _api_error(error: BaseException) -> APIError:
    """What the client is told when a queued generation fails."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, ShutdownError):
        return APIError(503, str(error), type="server_error", code="shutting_down")
    if isinstance(error, QuickdraftError):
        return APIError(400, str(error), param=_param_of(error))
    return APIError(500, f"generation failed: {type(error).__name__}: {error}", type="server_error")


def create_app(decoder: SpeculativeDecoder, config: ServerConfig) -> FastAPI:
    """An OpenAI-compatible app around ``decoder``, which only its worker thread will use.

    The worker thread starts and stops with the app's lifespan (uvicorn runs it).
    """
    server = _Server(decoder, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for line in memory_report(decoder, config):
            logger.info(line)
        if isinstance(server.scheduler, BatchScheduler):
            logger.info("scheduler: continuous batching, up to %d requests and %.0f MiB of KV cache together, "
                        "up to %d waiting%s", config.max_batch_size, config.batch_kv_cache_mb, config.max_queue,
                        "" if config.k_by_batch_size is None else f"; K by batch size {config.k_by_batch_size}")
        else:
            if config.scheduler == "batch":
                logger.warning("not batched: %s%s", server.unbatched,
                               "" if config.k_by_batch_size is None else "; K by batch size does not apply")
            logger.info("scheduler: one request decoded at a time, FIFO, up to %d waiting", config.max_queue)
        # The models and tokenizers stay until the server stops: out of the collector's scans.
        freeze_long_lived()
        server.scheduler.start()
        yield
        server.scheduler.stop()
        thaw()

    app = FastAPI(title="quickdraft", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    # The last added runs first: count everything, then check the Host, then CORS.
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(_HostCheck, allowed_hosts=config.allowed_hosts)
    app.add_middleware(_Metered, metrics=server.metrics)

    api_keys = () if config.api_key is None else tuple(key.strip().encode() for key in config.api_key.split(","))

    async def authorize(http: Request) -> None:
        if config.api_key is None:
            return
        scheme, key = bearer(http)
        # Every key is compared (no early exit), so the time taken does not tell which one matched.
        matches = [hmac.compare_digest(key.encode(), allowed) for allowed in api_keys]
        if scheme.lower() != "bearer" or not any(matches):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    async def json_body(http: Request) -> bytes:
        check_json_content_type(http)
        return await read_body(http, config.max_body_bytes, config.body_timeout)

    @app.exception_handler(APIError)
    async def api_error(http: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(http: Request, error: StarletteHTTPException) -> JSONResponse:
        body = APIError(error.status_code, f"{error.detail}: {http.method} {http.url.path}",
                        code="not_found" if error.status_code == 404 else None).body()
        return JSONResponse(body, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def unexpected(http: Request, error: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return JSONResponse(_api_error(error).body(), status_code=500)

    protected = [Depends(authorize)]

    @app.post("/v1/completions", dependencies=protected)
    async def completions(http: Request) -> Response:
        request = parse_request(await json_body(http), CompletionRequest)
        server.check_model(request)
        check_unsupported(request)
        prompt_ids = await server.encode_prompt(request)
        params = server.sampling_params(request, len(prompt_ids), request.max_tokens,
                                        COMPLETIONS_DEFAULT_MAX_TOKENS, "prompt")
        await server.check_params(prompt_ids, params)
        return await server.respond(http, request, False, prompt_ids, params)

    @app.post("/v1/chat/completions", dependencies=protected)
    async def chat_completions(http: Request) -> Response:
        request = parse_request(await json_body(http), ChatCompletionRequest)
        server.check_model(request)
        check_unsupported(request)
        prompt_ids = await server.encode_messages(request)
        max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        params = server.sampling_params(request, len(prompt_ids), max_tokens, config.default_max_tokens, "messages")
        await server.check_params(prompt_ids, params)
        return await server.respond(http, request, True, prompt_ids, params)

    card = {"id": config.model_name, "object": "model", "created": server.created, "owned_by": "quickdraft",
            "max_model_len": server.context_length, "batched": server.unbatched is None}
    if server.unbatched is not None:
        card["not_batched_because"] = server.unbatched

    @app.get("/v1/models", dependencies=protected)
    async def models() -> dict:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}", dependencies=protected)
    async def model(model_id: str) -> dict:
        if model_id != config.model_name:
            raise APIError(404, f"the model {model_id!r} does not exist: this server serves {config.model_name!r}",
                           param="model", code="model_not_found")
        return card

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> JSONResponse:
        """200 while the server takes requests; 503 once it is shutting down (load balancers stop
        sending then)."""
        scheduler = server.scheduler
        status = "shutting_down" if scheduler.closed else "ok"
        return JSONResponse({"status": status, "waiting": scheduler.waiting, "running": scheduler.running},
                            status_code=503 if scheduler.closed else 200)

    store = suffix_store(decoder.drafter)

    @app.get("/metrics", dependencies=protected)
    async def metrics() -> Response:
        if store is not None:
            server.metrics.observe_suffix_cache(store)
        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
