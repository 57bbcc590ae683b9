"""The server against hostile, slow and careless clients and against web pages: each test runs a
real uvicorn server on 127.0.0.1 (configured as ``quickdraft serve`` configures it) and talks to
it over real sockets. Every request loop is bounded in count and time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

pytest.register_assert_rewrite("server_support")  # before its import: its asserts explain themselves too
from server_support import (  # noqa: E402  (first: it skips this module without the server and dev extras)
    API_KEY,
    MESSAGES,
    MODEL,
    PROMPT,
    RunningServer,
    auth,
    first_sse_with_text,
    httpx,
    plain_greedy,
    rss_bytes,
    serve,
    speculative,
    tiny,
    wait_for,
)

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from quickdraft import LoadedModel, SamplingParams, SpeculativeDecoder
from quickdraft.errors import InvalidParameterError
from quickdraft.server.http import HTTPLimits

pytest_plugins = ("server_support",)  # its fixtures: tokenizer, target, draft, server, client

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
# 240 tokens at >= 30 ms a forward: a generation that runs for seconds, long enough to act during it.
LONG = {"model": MODEL, "prompt": PROMPT, "max_tokens": 240, "ignore_eos": True, "stream": True}


def health(running: RunningServer) -> dict:
    return httpx.get(f"{running.url}/health").json()


def metric(running: RunningServer, name: str, **labels: str) -> float:
    return running.metrics().get((name, tuple(sorted(labels.items()))), 0.0)


def slow_decoder(tokenizer, delay: float = 0.03, delay_per_token: float = 0.0) -> SpeculativeDecoder:
    return SpeculativeDecoder(tiny(1, tokenizer, "tiny-slow", delay, delay_per_token), None)


def raw_connection(running: RunningServer, timeout: float = 5.0) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", running.port), timeout=timeout)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def read_until_closed(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout if it does not)."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def head(host: str, content_length: int) -> bytes:
    """A completion request's head, with the API key (servers without one ignore it)."""
    return (f"POST {COMPLETIONS} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: {content_length}\r\n\r\n").encode()


@pytest.fixture(scope="module")
def open_server(target, draft) -> Iterator[RunningServer]:
    """No API key, as ``quickdraft serve`` starts by default."""
    with serve(speculative(target, draft), api_key=None) as running:
        yield running


# -- 1. long prompts: chunked prefill, cancellation between chunks, a prompt limit -------------------


def test_a_long_prompt_s_prefill_stops_when_its_client_leaves(tokenizer):
    """200 prompt tokens at 20 ms each take 4 s to prefill in one forward; in chunks of 16 the
    worker sees the cancellation within a chunk (0.3 s) and the next client is served at once."""
    decoder = slow_decoder(tokenizer, delay=0.0, delay_per_token=0.02)
    prompt = " ".join(["cat"] * 200)
    with serve(decoder, api_key=None, max_queue=1, kv_cache_budget_mb=1, prefill_chunk_tokens=16,
               max_prompt_tokens=210) as running:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{running.url}{COMPLETIONS}", json={"prompt": prompt, "max_tokens": 4}, timeout=0.6)
        left = time.monotonic()
        wait_for(lambda: health(running)["running"] == 0, timeout=5)
        assert time.monotonic() - left < 1.5, "the prefill went on after its client left"
        reply = httpx.post(f"{running.url}{COMPLETIONS}", json={"prompt": PROMPT, "max_tokens": 3}, timeout=10)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
        too_long = httpx.post(f"{running.url}{COMPLETIONS}", json={"prompt": prompt + " cat" * 20, "max_tokens": 1})
        assert too_long.status_code == 400, too_long.text
        error = too_long.json()["error"]
        assert error["code"] == "prompt_too_long" and error["param"] == "prompt"
        assert "--max-prompt-tokens" in error["message"] and "210" in error["message"]


def test_the_decoder_checks_for_cancellation_between_prefill_chunks(target):
    """The engine's hook the worker uses: a prompt of 100 tokens in chunks of 10, cancelled
    after three chunks, yields nothing and runs no more forwards."""
    decoder = SpeculativeDecoder(target, None)
    ids = decoder.encode(" ".join(["cat"] * 100))
    polls: list[int] = []

    def cancelled() -> bool:
        polls.append(len(polls))
        return len(polls) > 3

    steps = decoder.stream(ids, SamplingParams(max_new_tokens=4), prefill_chunk_tokens=10, cancelled=cancelled)
    assert list(steps) == [] and len(polls) == 4
    with pytest.raises(InvalidParameterError, match="prefill_chunk_tokens"):
        decoder.stream(ids, prefill_chunk_tokens=0)


def test_chunked_prefill_keeps_the_output_of_the_target_alone(target, draft):
    """A prompt fed 8 tokens at a time: the same greedy text as the target alone, prefilled at once."""
    prompt = " ".join([PROMPT, "jumps over the lazy dog"] * 8)  # 88 tokens: 11 chunks
    with serve(speculative(target, draft), kv_cache_budget_mb=1, prefill_chunk_tokens=8) as running:
        reply = httpx.post(f"{running.url}{COMPLETIONS}", headers=auth(), timeout=30,
                           json={"prompt": prompt, "max_tokens": 30, "temperature": 0})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] > 64
    assert reply.json()["choices"][0]["text"] == plain_greedy(target, prompt, 30)


# -- 2. abandoned requests leave the queue at once ---------------------------------------------------


def test_queued_clients_that_leave_free_their_slots_at_once(tokenizer):
    # A batch of one request, so that the others queue.
    with serve(slow_decoder(tokenizer), api_key=None, max_queue=4, max_batch_size=1) as running, \
            httpx.Client(timeout=30) as http:
        url = f"{running.url}{COMPLETIONS}"
        with http.stream("POST", url, json=LONG) as first:
            lines = first.iter_lines()
            first_sse_with_text(lines)  # the decoder is busy with it for seconds
            with contextlib.ExitStack() as queued:
                for _ in range(4):
                    assert queued.enter_context(http.stream("POST", url, json=LONG)).status_code == 200
                wait_for(lambda: health(running)["waiting"] == 4, timeout=5)
                assert httpx.post(url, json=LONG).status_code == 429
            # The four clients closed their connections.
            wait_for(lambda: health(running)["waiting"] == 0, timeout=2)
            assert health(running)["running"] == 1
            with http.stream("POST", url, json=LONG) as next_client:
                assert next_client.status_code == 200  # not a 429
                wait_for(lambda: health(running)["waiting"] == 1, timeout=5)
        wait_for(lambda: health(running) == {"status": "ok", "waiting": 0, "running": 0})
        assert metric(running, "quickdraft_generations_total", outcome="cancelled") == 6
        assert metric(running, "quickdraft_queue_depth") == 0


# -- 3. browsers: Content-Type, Host allow-list, CORS -------------------------------------------------


def test_a_web_page_cannot_drive_the_server(open_server):
    """The issue's request: a page on another site, via DNS rebinding (Host) and a CORS-free
    Content-Type. Each of the two defences stops it on its own."""
    url = f"{open_server.url}{COMPLETIONS}"
    body = json.dumps({"prompt": "hi", "max_tokens": 2})
    evil = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    rebound = httpx.post(url, content=body, headers={**evil, "Host": "attacker.example"})
    assert rebound.status_code == 421, rebound.text
    error = rebound.json()["error"]
    assert error["code"] == "host_not_allowed" and "--allowed-hosts" in error["message"]
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        simple = httpx.post(url, content=body, headers={"Origin": "http://evil.example", "Content-Type": content_type})
        assert simple.status_code == 415, simple.text
        assert "Content-Type: application/json" in simple.json()["error"]["message"]
    assert httpx.post(url, content=body).status_code == 415  # no Content-Type at all
    preflight = httpx.options(url, headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
                                            "Access-Control-Request-Headers": "content-type"})
    assert "access-control-allow-origin" not in preflight.headers  # CORS is off: the browser refuses
    for host in ("127.0.0.1", "localhost", "LOCALHOST", "[::1]"):
        ok = httpx.post(url, content=body, headers={"Host": f"{host}:{open_server.port}",
                                                    "Content-Type": "application/json; charset=utf-8"})
        assert ok.status_code == 200, (host, ok.text)


def test_allowed_hosts_and_cors_origins_open_the_server_deliberately(target):
    decoder = SpeculativeDecoder(target, None)
    with serve(decoder, api_key=None, allowed_hosts=("api.example",), cors_origins=("https://app.example",)) as running:
        url = f"{running.url}{COMPLETIONS}"
        body = {"prompt": "hi", "max_tokens": 2}
        assert httpx.post(url, json=body, headers={"Host": "api.example"}).status_code == 200
        assert httpx.post(url, json=body).status_code == 421  # 127.0.0.1 is no longer in the list
        preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type",
                     "Host": "api.example"}
        allowed = httpx.options(url, headers={**preflight, "Origin": "https://app.example"})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "https://app.example"
        refused = httpx.options(url, headers={**preflight, "Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in refused.headers


# -- 4. a client that leaves while uploading its body -------------------------------------------------


def test_a_client_leaving_mid_upload_is_a_499_logged_once(open_server, caplog, capfd):
    caplog.set_level(logging.INFO, logger="quickdraft.server")
    before = open_server.metrics()
    with raw_connection(open_server) as connection:
        connection.sendall(head("127.0.0.1", 1000) + b'{"prompt": ')
        time.sleep(0.2)  # the server is reading the body
    closed = ("quickdraft_requests_total", (("route", COMPLETIONS), ("status", "499")))
    wait_for(lambda: open_server.metrics().get(closed, 0) == before.get(closed, 0) + 1, timeout=5)
    errors = ("quickdraft_requests_total", (("route", COMPLETIONS), ("status", "500")))
    assert open_server.metrics().get(errors, 0) == 0
    records = [r for r in caplog.records if "disconnected while sending its body" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert "Traceback" not in capfd.readouterr().err


# -- 5. connection limits, timeouts, graceful shutdown --------------------------------------------------


@pytest.fixture(scope="module")
def strict_server(target) -> Iterator[RunningServer]:
    limits = HTTPLimits(header_timeout=0.5)
    with serve(SpeculativeDecoder(target, None), limits, api_key=None, body_timeout=0.5) as running:
        yield running


def test_connections_that_do_not_finish_their_headers_are_closed(strict_server):
    with raw_connection(strict_server) as silent, raw_connection(strict_server) as half:
        half.sendall(f"POST {COMPLETIONS} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-".encode())
        start = time.monotonic()
        assert read_until_closed(half) == b""
        assert read_until_closed(silent) == b""
        assert time.monotonic() - start < 2


def test_a_body_slower_than_its_content_length_gets_408(strict_server):
    with raw_connection(strict_server) as connection:
        connection.sendall(head("127.0.0.1", 100) + b'{"prompt": "hi"')
        start = time.monotonic()
        reply = read_until_closed(connection)
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
    assert b"--body-timeout" in reply and time.monotonic() - start < 2


def test_idle_kept_alive_connections_are_closed(target):
    with serve(SpeculativeDecoder(target, None), HTTPLimits(keep_alive_timeout=0.5), api_key=None) as running:
        with raw_connection(running) as connection:
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            start = time.monotonic()
            reply = read_until_closed(connection)  # the response, then the close after 0.5 s idle
    assert reply.startswith(b"HTTP/1.1 200 ") and b'"status":"ok"' in reply
    assert time.monotonic() - start < 2


def test_connections_beyond_the_limit_get_503(target):
    with serve(SpeculativeDecoder(target, None), HTTPLimits(max_connections=3), api_key=None) as running:
        with contextlib.ExitStack() as stack:
            for _ in range(3):  # three connections that sit on unfinished headers
                stack.enter_context(raw_connection(running)).sendall(b"GET /health HTTP/1.1\r\n")
            over = httpx.get(f"{running.url}/health")
            assert over.status_code == 503
        wait_for(lambda: httpx.get(f"{running.url}/health").status_code == 200, timeout=5)


def test_shutdown_drains_with_a_deadline_and_503s_what_arrives_meanwhile(tokenizer):
    # A batch of one request, so that the second one queues.
    running = serve(slow_decoder(tokenizer), HTTPLimits(shutdown_timeout=2.0), api_key=None, max_queue=4,
                    max_batch_size=1)
    url = f"{running.url}{COMPLETIONS}"
    queued: dict = {}

    def queued_client() -> None:
        queued["response"] = httpx.post(url, json={**LONG, "stream": False}, timeout=30)

    with running, httpx.Client(timeout=30) as http, http.stream("POST", url, json=LONG) as streaming:
        lines = streaming.iter_lines()
        first_sse_with_text(lines)
        waiter = threading.Thread(target=queued_client)
        waiter.start()
        wait_for(lambda: health(running)["waiting"] == 1, timeout=5)
        running.server.should_exit = True  # what uvicorn's SIGTERM handler does
        asked = time.monotonic()
        wait_for(lambda: httpx.get(f"{running.url}/health").status_code == 503, timeout=2)
        assert httpx.get(f"{running.url}/health").json()["status"] == "shutting_down"
        late = httpx.post(url, json={"prompt": PROMPT, "max_tokens": 2})
        assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events[-1]["error"]["code"] == "shutting_down"  # the running stream, at the deadline
        waiter.join(10)
        assert queued["response"].status_code == 503
        assert queued["response"].json()["error"]["code"] == "shutting_down"
        assert 1.8 < time.monotonic() - asked < 4
        running.thread.join(10)
        assert not running.thread.is_alive() and time.monotonic() - asked < 6


# -- 6. the smaller items ---------------------------------------------------------------------------


def _sse_chunks(running: RunningServer, body: dict, route: str = COMPLETIONS) -> list[dict]:
    with httpx.stream("POST", f"{running.url}{route}", json={**body, "stream": True}, headers=auth(),
                      timeout=30) as response:
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


@pytest.mark.parametrize("route,body", [(COMPLETIONS, {"prompt": PROMPT}), (CHAT, {"messages": MESSAGES})])
def test_a_stream_reports_usage_once_and_only_when_asked(server, route, body):
    body = {**body, "max_tokens": 5, "temperature": 0}
    plain = _sse_chunks(server, body, route)
    assert plain and not [c for c in plain if "usage" in c]
    chunks = _sse_chunks(server, {**body, "stream_options": {"include_usage": True}}, route)
    with_usage = [c for c in chunks if c["usage"] is not None]  # every chunk has the key, as OpenAI's
    assert with_usage == [chunks[-1]] and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize(
    "route,field,value,message",
    [
        (COMPLETIONS, "stream_options", "x", "stream_options must be a JSON object"),
        (COMPLETIONS, "temperature", 2.5, "less than or equal to 2"),
        (COMPLETIONS, "temperature", 1e308, "less than or equal to 2"),
        (CHAT, "tools", [{"type": "function", "function": {"name": "f"}}], "tools are not supported"),
        (CHAT, "tool_choice", "required", "tool_choice is not supported"),
        (CHAT, "functions", [{"name": "f"}], "functions are not supported"),
        (CHAT, "response_format", {"type": "xml"}, "response_format"),
    ],
)
def test_what_is_not_supported_is_refused_by_name(server, route, field, value, message):
    base = {"prompt": PROMPT} if route == COMPLETIONS else {"messages": MESSAGES}
    response = httpx.post(f"{server.url}{route}", headers=auth(), json={**base, "max_tokens": 2, field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and message in error["message"]


def test_the_edges_of_what_is_accepted_still_work(client):
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=2).choices
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                           response_format={"type": "text"}, tool_choice="none")
    assert reply.choices[0].message.content is not None


def test_model_card_head_health_and_bearer_in_any_case(server, client):
    assert client.models.retrieve(MODEL).id == MODEL
    missing = httpx.get(f"{server.url}/v1/models/gpt-4", headers=auth())
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    head_ = httpx.head(f"{server.url}/health")
    assert head_.status_code == 200 and head_.content == b""
    for scheme in ("bearer", "BEARER", "Bearer"):
        assert httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"{scheme} {API_KEY}"}).status_code == 200
    for header in (f"Basic {API_KEY}", f"Bearer {API_KEY}x", "Bearer", API_KEY):
        assert httpx.get(f"{server.url}/v1/models", headers={"Authorization": header}).status_code == 401, header


def _wide_cache_decoder(tokenizer) -> SpeculativeDecoder:
    """A random Llama whose KV cache is wide (16 heads of 128 per layer, 8 layers: 128 KiB a token)
    and whose matrices are small, so a 2,000-token prompt holds 250 MiB of cache after two seconds of
    prefill."""
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=16, head_dim=128,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(3)
    return SpeculativeDecoder(LoadedModel(LlamaForCausalLM(config).eval(), tokenizer, "tiny-wide-cache"), None)


@pytest.mark.slow
@pytest.mark.skipif(rss_bytes() is None, reason="needs /proc/self/status")
def test_the_memory_of_a_long_prompt_is_given_back(tokenizer):
    """Measured: 3 MiB larger after each on one VM; on another (2-core AMX VM, 2026-12-02) under
    48 MiB in one run of two and 51-53 MiB after the second prompt in the other, on the same code.
    Without dropping the cache the process stays 320 MiB larger; without handing freed pages back
    to the system, 65 to 90 MiB larger."""
    prompt = " ".join(["cat"] * 2000)
    limit = 64 * 2**20
    with serve(_wide_cache_decoder(tokenizer), api_key=None, kv_cache_budget_mb=1024) as running:
        url = f"{running.url}{COMPLETIONS}"
        assert httpx.post(url, json={"prompt": PROMPT, "max_tokens": 2}, timeout=30).status_code == 200
        baseline = rss_bytes()
        for attempt in range(2):
            reply = httpx.post(url, json={"prompt": prompt, "max_tokens": 2}, timeout=120)
            assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] >= 2000
            wait_for(lambda: health(running)["running"] == 0)
            try:  # the worker frees and trims just after it marks itself idle
                wait_for(lambda: rss_bytes() - baseline < limit, timeout=5)
            except AssertionError:
                pytest.fail(f"RSS is {(rss_bytes() - baseline) / 2**20:.0f} MiB larger after long prompt {attempt + 1}")


# -- the soak: mixed clients, the server keeps serving, memory and counters add up -----------------------


async def _soak_client(kind: str, base: str, port: int) -> int:
    """One client of ``kind``; returns the status the server answered (or recorded) for it."""
    url = f"{base}{COMPLETIONS}"
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    long = {**body, "max_tokens": 150}  # >= 38 steps of >= 10 ms
    async with httpx.AsyncClient(timeout=30, headers=auth()) as http:
        if kind == "good":
            response = await http.post(url, json=body)
            assert response.status_code != 200 or response.json()["usage"]["completion_tokens"] == 8
            return response.status_code
        if kind == "stream":
            async with http.stream("POST", url, json={**body, "stream": True}) as response:
                lines = [line async for line in response.aiter_lines()]
                assert response.status_code != 200 or "data: [DONE]" in lines
                return response.status_code
        if kind == "bad":
            return (await http.post(url, json={**body, "temperature": 9})).status_code
        if kind == "wrong_type":
            return (await http.post(url, content=json.dumps(body), headers={"Content-Type": "text/plain"})).status_code
        if kind == "wrong_host":
            return (await http.post(url, json=body, headers={"Host": "evil.example"})).status_code
        if kind == "wrong_key":
            return (await http.post(url, json=body, headers=auth("nope"))).status_code
        if kind == "cancel_stream":  # reads one token, leaves: recorded as 200 (the stream had started)
            async with http.stream("POST", url, json={**long, "stream": True}) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {") or response.status_code != 200:
                        break
                return response.status_code
        if kind == "cancel_whole":  # gives up before the answer: 499
            try:
                return (await http.post(url, json=long, timeout=0.15)).status_code
            except httpx.ReadTimeout:
                return 499
    # Raw sockets: a body that stalls (408 after --body-timeout), one abandoned mid-upload (499).
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head("127.0.0.1", 500) + b'{"prompt": "he')
    await writer.drain()
    if kind == "slow_body":
        status = int((await reader.read(64)).split()[1])
    else:
        await asyncio.sleep(0.1)
        status = 499
    writer.close()
    return status


SOAK_KINDS = ("good", "stream", "bad", "wrong_type", "wrong_host", "wrong_key", "cancel_stream", "cancel_whole",
              "slow_body", "abandoned_body")


@pytest.mark.slow
def test_soak_of_mixed_clients(target, draft, tokenizer):
    """20 rounds of the ten kinds of client at once, 200 requests in all (about 15 s here)."""
    rounds = 20
    slow_target = tiny(1, tokenizer, "tiny-soak", delay=0.01)
    with serve(speculative(slow_target, draft), max_queue=6, body_timeout=1.0) as running:
        warm = httpx.post(f"{running.url}{COMPLETIONS}", headers=auth(), json={"prompt": PROMPT, "max_tokens": 8})
        assert warm.status_code == 200
        before = running.metrics()
        baseline = rss_bytes()

        async def soak() -> list[tuple[str, int]]:
            results = []
            for _ in range(rounds):
                statuses = await asyncio.gather(*(_soak_client(kind, running.url, running.port) for kind in SOAK_KINDS))
                results += zip(SOAK_KINDS, statuses, strict=True)
            return results

        results = asyncio.run(asyncio.wait_for(soak(), timeout=120))
        wait_for(lambda: health(running) == {"status": "ok", "waiting": 0, "running": 0})
        time.sleep(0.2)
        grown = rss_bytes() - baseline if baseline is not None else 0
        after = running.metrics()
        final = httpx.post(f"{running.url}{COMPLETIONS}", headers=auth(), json={"prompt": PROMPT, "max_tokens": 8})
        assert final.status_code == 200  # still serving

    queued = {200, 429}  # a full queue is a correct answer too
    expected = {"good": queued, "stream": queued, "bad": {400}, "wrong_type": {415}, "wrong_host": {421},
                "wrong_key": {401}, "cancel_stream": queued, "cancel_whole": {499, 429}, "slow_body": {408},
                "abandoned_body": {499}}
    for kind, status in results:
        assert status in expected[kind], (kind, status)
    assert grown < 30 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    seen: dict[int, int] = {}
    for _, status in results:
        seen[status] = seen.get(status, 0) + 1
    for status, count in seen.items():
        assert delta("quickdraft_requests_total", route=COMPLETIONS, status=str(status)) == count, status
    assert delta("quickdraft_requests_total", route=COMPLETIONS, status="500") == 0
    admitted = sum(1 for kind, status in results if status in (200, 499) and kind != "abandoned_body")
    finished = sum(1 for kind, status in results if kind in ("good", "stream") and status == 200)
    assert delta("quickdraft_generations_total", outcome="finished") == finished
    assert delta("quickdraft_generations_total", outcome="failed") == 0
    outcomes = sum(delta("quickdraft_generations_total", outcome=o) for o in ("finished", "cancelled", "failed"))
    assert outcomes == admitted  # every admitted request ended exactly once
    assert delta("quickdraft_rejected_requests_total", reason="queue_full") == seen.get(429, 0)
    assert after[("quickdraft_queue_depth", ())] == 0 and after[("quickdraft_running_requests", ())] == 0
