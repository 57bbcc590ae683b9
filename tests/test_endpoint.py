"""``quickdraft bench --endpoint``: real ``quickdraft serve`` apps on 127.0.0.1 (tiny models), a
fake server that refuses and drops requests, and servers that are no OpenAI server at all."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.register_assert_rewrite("server_support")
from server_support import API_KEY, MODEL, WORDS, serve  # noqa: E402  (skips without the extras)

from quickdraft import SpeculativeDecoder  # noqa: E402
from quickdraft.bench.endpoint import speculative_figures  # noqa: E402
from quickdraft.bench.endpoint_report import summarize_endpoints  # noqa: E402
from quickdraft.cli import main  # noqa: E402

pytest_plugins = ("server_support",)  # its fixtures: tokenizer, target, draft, server


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    """Two categories of prompts in the tiny tokenizer's words (the built-in ones would be <unk>s)."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [{"prompt": " ".join(WORDS[i:i + 6]), "category": "code" if i % 2 else "qa"} for i in range(4)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


@pytest.fixture(scope="module")
def plain_server(target):
    with serve(SpeculativeDecoder(target, None), max_queue=8) as running:
        yield running


def bench(*args: str) -> int:
    return main(["bench", "--no-progress", "--max-new-tokens", "6", *args])


# -- two real servers ------------------------------------------------------------------------------


def test_two_servers_compared_with_reports_and_counters(server, plain_server, prompts_file, tmp_path):
    out = tmp_path / "out"
    code = bench("--endpoint", server.url + "/v1/", "--endpoint", plain_server.url, "--endpoint-label", "spec",
                 "--endpoint-label", "plain", "--api-key", API_KEY, "--prompts", str(prompts_file),
                 "--concurrency", "1,3", "--output", str(out))
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert [e["label"] for e in results["endpoints"]] == ["spec", "plain"]
    assert results["endpoints"][0]["url"] == server.url and results["endpoints"][0]["models"] == [MODEL]
    assert [(lvl["endpoint"], lvl["concurrency"]) for lvl in results["levels"]] == [
        ("spec", 1), ("plain", 1), ("spec", 3), ("plain", 3)]
    for level in results["levels"]:
        assert len(level["requests"]) == 4  # every prompt once (more prompts than clients)
        assert all(r["error"] is None and r["tokens"] == 6 and r["tokens_from"] == "usage" for r in level["requests"])
        assert all(r["chunk_times"] and r["ttft"] == pytest.approx(r["chunk_times"][0], abs=1e-4)
                   for r in level["requests"])
        figures = level["server"]
        assert figures["engine"] == "quickdraft"
        # every step emits its accepted drafts and one token of the target's: the counters of this
        # level alone (differenced) account for exactly the tokens its requests received
        assert figures["steps"] + figures["accepted_tokens"] == sum(r["tokens"] for r in level["requests"])
        if level["endpoint"] == "spec":  # drafts at most K = 3 tokens a step
            assert 0 < figures["drafted_tokens"] <= 3 * figures["steps"]
            assert figures["tokens_per_step"] == 1 + figures["accepted_tokens"] / figures["steps"]
        else:
            assert figures["drafted_tokens"] == 0 and figures["tokens_per_step"] == 1.0
            assert figures["acceptance"] is None
    summary = results["summary"]
    assert [(s["endpoint"], s["concurrency"]) for s in summary["speedups"]] == [("plain", 1), ("plain", 3)]
    assert all(s["by_category"]["all"] > 0 and s["by_category"]["code"] > 0 for s in summary["speedups"])
    report = (out / "report.md").read_text()
    assert server.url in report and plain_server.url in report and "models the server lists" in report
    assert "## Speedup over spec" in report and "TTFT p50 / p99" in report and "## Errors" not in report
    again = tmp_path / "again"
    assert main(["bench", "--report-from", str(out / "results.json"), "--output", str(again)]) == 0
    assert (again / "report.md").read_text() == report


def test_an_earlier_run_as_the_baseline(server, plain_server, prompts_file, tmp_path, capsys):
    """The same server restarted with other options: the earlier run's results are the baseline."""
    common = ["--api-key", API_KEY, "--prompts", str(prompts_file), "--concurrency", "2"]
    assert bench("--endpoint", plain_server.url, *common, "--output", str(tmp_path / "before")) == 0
    earlier = str(tmp_path / "before" / "results.json")
    assert bench("--endpoint", server.url, *common, "--baseline-results", earlier, "--output", str(tmp_path / "after")) == 0
    results = json.loads((tmp_path / "after" / "results.json").read_text())
    assert [e["label"] for e in results["endpoints"]] == ["baseline:A", "A"]
    assert [lvl["endpoint"] for lvl in results["levels"]] == ["baseline:A", "A"]
    (speedup,) = results["summary"]["speedups"]
    assert speedup["endpoint"] == "A" and speedup["concurrency"] == 2 and speedup["by_category"]["all"] > 0
    assert "from an earlier run" in (tmp_path / "after" / "report.md").read_text()
    capsys.readouterr()
    assert bench("--endpoint", server.url, *common, "--max-new-tokens", "5", "--baseline-results", earlier,
                 "--output", str(tmp_path / "other")) == 2
    assert "sent other requests (max_new_tokens differ)" in capsys.readouterr().err


# -- failures during the run: recorded, not raised ----------------------------------------------------


class FlakyHandler(BaseHTTPRequestHandler):
    """Lists a model, then answers chat requests in turn by: closing the connection without a
    response, HTTP 503, and a stream cut after one chunk (no [DONE])."""

    protocol_version = "HTTP/1.1"
    calls = 0
    lock = threading.Lock()

    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "flaky"}]}).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            turn = FlakyHandler.calls % 3
            FlakyHandler.calls += 1
        if turn == 0:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif turn == 1:
            self._send(503, b'{"error": {"message": "overloaded"}}')
        else:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunk = {"choices": [{"index": 0, "delta": {"content": "hello"}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)


@contextmanager
def http_server(handler) -> Iterator[str]:
    """``handler`` served on a free port of 127.0.0.1 in a thread; yields the base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_refused_and_dropped_requests_are_recorded_as_errors(prompts_file, tmp_path, capsys):
    FlakyHandler.calls = 0
    with http_server(FlakyHandler) as url:
        code = bench("--endpoint", url, "--prompts", str(prompts_file), "--prompts-per-category", "2",
                     "--concurrency", "1,2", "--request-timeout", "10", "--output", str(tmp_path))
    assert code == 1  # the report is written; the exit status says that requests failed
    results = json.loads((tmp_path / "results.json").read_text())
    requests = [r for level in results["levels"] for r in level["requests"]]
    assert len(requests) == 8 and all(r["error"] for r in requests)
    errors = " ".join(r["error"] for r in requests)
    assert "RemoteProtocolError: Server disconnected without sending a response" in errors
    assert 'HTTP 503: {"error": {"message": "overloaded"}}' in errors
    assert "the stream ended without [DONE]" in errors
    assert all(level["server"] is None for level in results["levels"])  # no /metrics there
    report = (tmp_path / "report.md").read_text()
    assert "## Errors" in report and "overloaded" in report
    assert "request(s) failed" in capsys.readouterr().err


class VanishingHandler(FlakyHandler):
    """Lists a model, then stops listening: every request after that is refused."""

    def do_GET(self) -> None:
        super().do_GET()
        self.server.socket.close()  # new connections are refused from now on


def test_a_server_that_stops_listening_mid_run_is_recorded_not_raised(prompts_file, tmp_path):
    with http_server(VanishingHandler) as url:
        code = bench("--endpoint", url, "--prompts", str(prompts_file), "--concurrency", "2", "--output", str(tmp_path))
    assert code == 1
    (level,) = json.loads((tmp_path / "results.json").read_text())["levels"]
    assert len(level["requests"]) == 4 and all("ConnectError" in r["error"] for r in level["requests"])


# -- servers that cannot be benchmarked: clear errors ---------------------------------------------------


class HTMLHandler(BaseHTTPRequestHandler):
    """A web server that is not an OpenAI server: HTML for every path."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        body = b"<html><body>It works!</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unusable_endpoints_get_clear_errors(server, tmp_path, capsys):
    def error(*args: str) -> str:
        assert bench("--output", str(tmp_path), *args) == 2
        return capsys.readouterr().err

    assert "is not a server URL" in error("--endpoint", "localhost:8000")
    assert "cannot connect to http://127.0.0.1:" in error("--endpoint", f"http://127.0.0.1:{free_port()}")
    assert "refused the API key (HTTP 401" in error("--endpoint", server.url, "--api-key", "wrong")
    assert "it needs one: pass --api-key" in error("--endpoint", server.url)
    assert "does not serve model 'gpt-4'" in error("--endpoint", server.url, "--api-key", API_KEY, "--model", "gpt-4")
    assert "--concurrency takes positive integers" in error("--endpoint", server.url, "--concurrency", "0")
    with http_server(HTMLHandler) as url:
        message = error("--endpoint", url)
    assert "(text/html) instead of an OpenAI model list" in message and "base URL" in message
    assert not (tmp_path / "results.json").exists()


# -- the arithmetic -------------------------------------------------------------------------------------


def metrics(text: str) -> dict[str, list[float]]:
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s.value)
    return samples


def test_vllm_counters_are_differenced_and_summed_over_engines():
    def vllm(drafts: int, drafted: int, accepted: int) -> str:
        lines = []
        for name, value in (("num_drafts", drafts), ("num_draft_tokens", drafted), ("num_accepted_tokens", accepted)):
            lines.append(f"# TYPE vllm:spec_decode_{name} counter")
            for engine in ("0", "1"):  # two engines, half each
                lines.append(f'vllm:spec_decode_{name}_total{{engine="{engine}",model_name="m"}} {value / 2}')
        return "\n".join(lines) + "\n"

    figures = speculative_figures(metrics(vllm(10, 40, 20)), metrics(vllm(30, 120, 80)))
    assert figures == {"engine": "vllm", "steps": 20, "drafted_tokens": 80, "accepted_tokens": 60,
                       "acceptance": 0.75, "tokens_per_step": 4.0}
    assert speculative_figures(metrics(vllm(30, 120, 80)), metrics(vllm(10, 40, 20))) is None  # restarted


def test_sglang_gauges_are_averaged_over_ranks():
    text = ("# TYPE sglang:spec_accept_length gauge\n"
            'sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.5\n'
            'sglang:spec_accept_length{model_name="m",tp_rank="1"} 3.5\n'
            "# TYPE sglang:spec_accept_rate gauge\n"
            'sglang:spec_accept_rate{model_name="m",tp_rank="0"} 0.5\n')
    figures = speculative_figures(None, metrics(text))
    assert figures["engine"] == "sglang" and figures["tokens_per_step"] == 3.0 and figures["acceptance"] == 0.5
    assert speculative_figures(None, metrics("# TYPE other counter\nother_total 3\n")) is None
    assert speculative_figures(None, None) is None


def request(category: str, total: float, chunks: list[float], tokens: int = 4, error: str | None = None) -> dict:
    return {"prompt_id": category, "category": category, "status": 200 if error is None else 503, "error": error,
            "ttft": chunks[0] if chunks else None, "total": total, "tokens": tokens, "tokens_from": "usage",
            "chunk_times": chunks}


def test_summary_pairs_requests_and_computes_latencies():
    base = [request("code", 2.0, [0.5, 1.0, 1.5, 2.0]), request("qa", 4.0, [1.0, 2.0, 3.0, 4.0])]
    fast = [request("code", 1.0, [0.4, 1.0]), request("qa", 1.0, [0.5, 1.0], error="HTTP 503")]
    results = {"endpoints": [{"label": "A"}, {"label": "B"}], "config": {"categories": ["code", "qa"]},
               "levels": [{"endpoint": "A", "concurrency": 2, "wall_seconds": 4.0, "requests": base},
                          {"endpoint": "B", "concurrency": 2, "wall_seconds": 2.0, "requests": fast}]}
    summary = summarize_endpoints(results)
    a, b = summary["levels"]
    assert (a["ok"], a["failed"], a["tokens_per_second"]) == (2, 0, 2.0)
    assert (b["ok"], b["failed"], b["tokens_per_second"]) == (1, 1, 2.0)
    assert a["request_tokens_per_second"] == 1.5  # median of 2 and 1
    assert (a["ttft_p50"], a["ttft_p99"]) == (0.5, 1.0)
    assert (a["itl_p50"], a["itl_p99"]) == (0.5, 1.0)  # gaps 0.5 x3 and 1.0 x3
    assert a["tpot"] == pytest.approx((0.5 + 1.0) / 2)  # (last - first) / 3 per request
    assert b["tpot"] == pytest.approx(0.2) and b["errors"] == {"HTTP 503": 1}
    (speedup,) = summary["speedups"]
    assert speedup["aggregate"] == 1.0
    assert speedup["by_category"] == {"code": 2.0, "qa": None, "all": 2.0}  # the failed pair is left out
