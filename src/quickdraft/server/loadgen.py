"""``quickdraft loadgen``: concurrent streaming clients against a running server.

Each concurrency level runs ``max(--requests, concurrency)`` chat requests (streamed, greedy by
default, ``ignore_eos`` so that every request generates exactly ``--max-tokens`` tokens; an
``extraction`` request ends with its JSON document instead), with
``concurrency`` clients sending them back to back. Per request it records the time to the first
content chunk (TTFT), the total time, the tokens the server reports in ``usage`` and the
speculative stats; per level it prints throughput (generated tokens over the level's wall time)
and latency percentiles: time to first token, total time, and the inter-token latency (ITL:
the gaps between a request's consecutive content chunks, over every request of the level; a
speculative step's chunk carries several tokens, so ITL is the stall a reader sees, not time
per token), and the time per output token after the first (TPOT, p50 and p99 over requests:
the decoding speed a client sees once its prompt is read), the mean tokens per step and the
share of the tokens that were the grammar's forced drafts (``grammar_share``). A 429 (queue
full) is counted, not retried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Implement binary search over a sorted list in Python.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python function that counts the words in a text file.",
    "Implement a stack class in Python with push, pop and peek.",
    "Write a Python function that flattens a nested list.",
    "Write a Python function that removes duplicates from a list, keeping the order.",
)


@dataclass
class Result:
    """One request as the client saw it."""

    status: int
    ttft: float | None = None  # seconds to the first non-empty content chunk
    total: float = 0.0
    # Seconds from the request to each non-empty content chunk: their gaps are the
    # inter-chunk latencies (a chunk may carry several tokens, e.g. a speculative step's).
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    mean_tokens_per_step: float | None = None
    grammar_accepted_tokens: int = 0  # of ``completion_tokens``, drafted as the grammar's forced tokens
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (``(total - ttft) / (tokens - 1)``): the decoding
        speed a client sees once its prompt is read, which is what speculation changes."""
        if self.ttft is None or self.completion_tokens < 2:
            return None
        return (self.total - self.ttft) / (self.completion_tokens - 1)


@dataclass
class LevelReport:
    concurrency: int
    requests: int
    ok: int
    rejected: int  # 429
    failed: int
    wall_seconds: float
    tokens: int
    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)  # gaps between content chunks, all requests
    tpot: list[float] = field(default_factory=list)  # each request's ``Result.tpot``
    tokens_per_step: list[float] = field(default_factory=list)
    grammar_tokens: int = 0  # of ``tokens``, drafted as the grammar's forced tokens and accepted

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall_seconds if self.wall_seconds else 0.0

    def row(self) -> dict:
        return {
            "concurrency": self.concurrency, "requests": self.requests, "ok": self.ok,
            "rejected_429": self.rejected, "failed": self.failed, "wall_s": round(self.wall_seconds, 2),
            "tokens": self.tokens, "tok_per_s": round(self.tokens_per_second, 2),
            "req_per_min": round(60 * self.ok / self.wall_seconds, 2) if self.wall_seconds else 0.0,
            "ttft_p50": percentile(self.ttft, 50), "ttft_p95": percentile(self.ttft, 95),
            "ttft_p99": percentile(self.ttft, 99),
            "itl_p50": percentile(self.itl, 50), "itl_p99": percentile(self.itl, 99),
            "tpot_p50": percentile(self.tpot, 50), "tpot_p99": percentile(self.tpot, 99),
            "total_p50": percentile(self.total, 50), "total_p95": percentile(self.total, 95),
            "tokens_per_step": round(sum(self.tokens_per_step) / len(self.tokens_per_step), 2)
            if self.tokens_per_step else None,
            "grammar_share": round(self.grammar_tokens / self.tokens, 3) if self.tokens else None,
        }


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile, nearest-rank (no interpolation between two requests' times)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return round(ordered[rank - 1], 3)


async def one_request(client, url: str, body: dict, headers: dict) -> Result:
    """Stream one chat completion; never raises."""
    start = time.perf_counter()
    result = Result(status=0)
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            result.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = text[:200]
                return result
            done = False
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    done = True
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    result.error = chunk["error"].get("message", "error")
                    return result
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta", {}).get("content") or choice.get("text")
                    if delta:
                        result.chunk_times.append(time.perf_counter() - start)
                        if result.ttft is None:
                            result.ttft = result.chunk_times[-1]
                if chunk.get("usage"):
                    result.completion_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("quickdraft"):
                    result.mean_tokens_per_step = chunk["quickdraft"]["mean_tokens_per_step"]
                    result.grammar_accepted_tokens = chunk["quickdraft"].get("grammar_accepted_tokens", 0)
            if not done:
                result.error = "the stream ended without [DONE]"
    except Exception as error:  # a load generator reports failures, it does not stop on them
        result.error = f"{type(error).__name__}: {error}"
    finally:
        result.total = time.perf_counter() - start
    return result


async def send_all(base_url: str, bodies: Sequence[dict], concurrency: int, api_key: str | None, timeout: float,
                   on_result: Callable[[Result], None] | None = None) -> tuple[list[Result], float]:
    """Stream every chat request of ``bodies``, ``concurrency`` clients at a time, each client
    sending the next one when its previous response ends; never raises.

    Returns the results in the order of ``bodies`` and the wall time of the whole batch.
    ``on_result`` is called as each request ends (a progress bar).
    """
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/v1/chat/completions"
    todo = list(range(len(bodies)))[::-1]
    results: list[Result | None] = [None] * len(bodies)

    async def client_loop(client) -> None:
        while todo:
            i = todo.pop()
            results[i] = await one_request(client, url, bodies[i], headers)
            if on_result is not None:
                on_result(results[i])

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return results, wall


WORKLOADS = ("chat", "code-edit", "multi-turn", "extraction")


def workload_messages(workload: str, count: int, answer: Callable[[list[dict]], str]) -> list[list[dict]]:
    """The chat messages of ``count`` requests of a workload:

    * ``chat``: short coding requests (``PROMPTS``), cycled;
    * ``code-edit``: a whole HumanEval function to return with type hints: most of the answer
      repeats the request;
    * ``multi-turn``: MT-Bench's second turns, each after its first turn and the server's answer
      to it (``answer(messages)``, asked once per conversation before the level is timed), as a
      chat client resends its history;
    * ``extraction``: a news passage to fill a JSON schema, sent with ``EXTRACTION_FORMAT``
      (``run_loadgen``).
    """
    from quickdraft.bench.workloads import code_edit_requests, extraction_requests, mt_bench_conversations

    if workload == "chat":
        return [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(count)]
    if workload == "code-edit":
        return [[{"role": "user", "content": text}] for text in code_edit_requests(count)]
    if workload == "extraction":
        return [[{"role": "user", "content": text}] for text in extraction_requests(count)]
    conversations = []
    for first, second in mt_bench_conversations(count):
        history = [{"role": "user", "content": first}]
        conversations.append([*history, {"role": "assistant", "content": answer(history)},
                              {"role": "user", "content": second}])
    return conversations


async def run_level(base_url: str, concurrency: int, num_requests: int, body: dict, api_key: str | None,
                    timeout: float, messages: Sequence[list[dict]] | None = None) -> tuple[LevelReport, list[Result]]:
    """One level: ``num_requests`` requests of ``body`` with ``messages`` (default: the chat
    workload), ``concurrency`` clients at a time."""
    if messages is None:
        messages = workload_messages("chat", num_requests, lambda history: "")
    bodies = [dict(body, messages=messages[i % len(messages)]) for i in range(num_requests)]
    results, wall = await send_all(base_url, bodies, concurrency, api_key, timeout)
    ok = [r for r in results if r.ok]
    report = LevelReport(
        concurrency=concurrency, requests=len(results), ok=len(ok),
        rejected=sum(r.status == 429 for r in results),
        failed=sum(not r.ok and r.status != 429 for r in results),
        wall_seconds=wall, tokens=sum(r.completion_tokens for r in ok),
        ttft=[r.ttft for r in ok if r.ttft is not None], total=[r.total for r in ok],
        itl=[later - earlier for r in ok for earlier, later in zip(r.chunk_times, r.chunk_times[1:])],
        tpot=[r.tpot for r in ok if r.tpot is not None],
        tokens_per_step=[r.mean_tokens_per_step for r in ok if r.mean_tokens_per_step is not None],
        grammar_tokens=sum(r.grammar_accepted_tokens for r in ok),
    )
    return report, results


def markdown_table(rows: list[dict], label: str) -> str:
    lines = [
        "| run | clients | requests (ok / 429 / failed) | tok/s | req/min | TTFT p50 / p95 / p99 (s) "
        "| ITL p50 / p99 (s) | TPOT p50 / p99 (s) | total p50 / p95 (s) | tokens per step |",
        "| --- | ---: | --- | ---: | ---: | --- | --- | --- | --- | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {label} | {r['concurrency']} | {r['requests']} ({r['ok']} / {r['rejected_429']} / {r['failed']}) "
            f"| {r['tok_per_s']} | {r['req_per_min']} | {r['ttft_p50']} / {r['ttft_p95']} / {r['ttft_p99']} "
            f"| {r['itl_p50']} / {r['itl_p99']} | {r['tpot_p50']} / {r['tpot_p99']} "
            f"| {r['total_p50']} / {r['total_p95']} | {r['tokens_per_step']} |"
        )
    return "\n".join(lines)


def add_loadgen_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "loadgen", help="measure a running server with concurrent streaming clients",
        description="Send streaming chat requests at several concurrency levels and report throughput "
                    "and latency percentiles.",
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts (default: 1,4,16)")
    parser.add_argument("--requests", type=int, default=8,
                        help="requests per level; at least one per client (default: 8)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request (default: 32)")
    parser.add_argument("--temperature", type=float, default=0.0, help="default: 0 (greedy)")
    parser.add_argument("--workload", choices=WORKLOADS, default="chat",
                        help="chat: short coding requests; code-edit: HumanEval functions to rewrite with type "
                             "hints; multi-turn: MT-Bench second turns after the server's own first answers "
                             "(asked before the timed levels); extraction: news passages to fill a JSON schema, "
                             "each request ending with its document (default: chat)")
    parser.add_argument("--num-speculative-tokens", type=int, default=None, metavar="N",
                        help="ask the server to draft at most N tokens a step for each request (0: no "
                             "speculation), so that one server measures speculation on and off (default: "
                             "the server's K)")
    parser.add_argument("--model", default=None, help="model id to send (default: the server's first)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--label", default="", help="the run's name in the markdown table")
    parser.add_argument("--json", default=None, help="also write every request's result to this file")
    parser.set_defaults(func=run_loadgen)


def run_loadgen(args: argparse.Namespace) -> int:
    import httpx

    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        print(f"quickdraft: error: --concurrency takes positive integers, got {args.concurrency!r}", file=sys.stderr)
        return 2
    if args.num_speculative_tokens is not None and args.num_speculative_tokens < 0:
        print("quickdraft: error: --num-speculative-tokens takes an integer >= 0 (0: no speculation), "
              f"got {args.num_speculative_tokens}", file=sys.stderr)
        return 2
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        model = args.model or httpx.get(args.url.rstrip("/") + "/v1/models", headers=headers,
                                        timeout=10).json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as error:
        print(f"quickdraft: error: cannot reach the server at {args.url}: {error}", file=sys.stderr)
        return 2
    body = {"model": model, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if args.num_speculative_tokens is not None:
        body["num_speculative_tokens"] = args.num_speculative_tokens
    if args.workload == "extraction":
        from quickdraft.bench.workloads import EXTRACTION_FORMAT

        # A document ends where its schema does: --max-tokens is a cap, not the length.
        body.update(response_format=EXTRACTION_FORMAT, ignore_eos=False)
    def answer(history: list[dict]) -> str:
        reply = httpx.post(args.url.rstrip("/") + "/v1/chat/completions", headers=headers, timeout=args.timeout,
                           json={"model": model, "messages": history, "max_tokens": args.max_tokens, "temperature": 0})
        reply.raise_for_status()
        return reply.json()["choices"][0]["message"]["content"]

    most = max(max(args.requests, c) for c in levels)
    if args.workload == "multi-turn":
        print(f"multi-turn: asking the first turns of {most} conversations ...", file=sys.stderr, flush=True)
    try:
        messages = workload_messages(args.workload, most, answer)
    except httpx.HTTPError as error:
        print(f"quickdraft: error: a first turn failed: {error}", file=sys.stderr)
        return 2
    rows, everything = [], []
    for concurrency in levels:
        count = max(args.requests, concurrency)
        print(f"{concurrency} clients, {count} requests ...", file=sys.stderr, flush=True)
        report, results = asyncio.run(run_level(args.url, concurrency, count, body, args.api_key, args.timeout,
                                                messages))
        row = report.row()
        rows.append(row)
        everything.append({"level": row, "results": [asdict(r) for r in results]})
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(markdown_table(rows, args.label or model))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": model, "workload": args.workload, "body": body, "levels": everything}, f, indent=2)
    return 0 if all(r["failed"] == 0 for r in rows) else 1
