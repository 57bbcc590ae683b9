"""The arithmetic and tables of ``bench --endpoint``: pure functions of its raw results.

Definitions (written into ``report.md`` too):

* **tok/s (aggregate)**: tokens all requests of a level generated / the level's wall time (what
  the server delivered to all its clients together). Tokens are the server's ``usage`` counts
  (``stream_options.include_usage``), or the content chunks when it sends none.
* **tok/s per request**: a request's tokens / its total time, TTFT included (what one user
  waits for); the median over the level's requests.
* **TTFT**: time from sending a request to its first non-empty content chunk, queue wait included.
* **ITL**: the gaps between a request's successive content chunks, over every request of the
  level. A speculative server may send several tokens in one chunk: its gaps are then longer and
  fewer, which is why **TPOT** is also given: (last chunk - first chunk) / (tokens - 1), the mean
  time per token after the first (median over requests).
* **p50 / p99**: nearest-rank percentiles (with fewer than 100 samples, p99 is the largest).
* **speedup**: against the first endpoint (the baseline), at the same number of clients:
  aggregate tok/s over the baseline's, and the median of the paired per-request ratios (request
  i of both endpoints carries the same prompt), overall and by category. When a server runs
  fewer requests at once than there are clients, a request's time includes its wait in the
  queue, which depends on the order requests finish in: the paired ratios then compare queue
  positions as much as speed, and the aggregate is the figure to read.
* **server tok/step, accept**: from the server's /metrics, read before and after the level
  (counters: quickdraft's and vLLM's; gauges: SGLang's running averages). Tokens per verify step
  count the bonus/recovered token: 1 + accepted / steps. Requests that failed still count there.
"""

from __future__ import annotations

import statistics
from collections import Counter
from itertools import pairwise

from quickdraft.bench.report import ALL, _fmt, _pct, _table, median
from quickdraft.server.loadgen import percentile


def _ok(request: dict) -> bool:
    return request["error"] is None and request["status"] == 200


def _tokens_per_second(request: dict) -> float | None:
    return request["tokens"] / request["total"] if request["total"] > 0 else None


def _tpot(request: dict) -> float | None:
    times = request["chunk_times"]
    if request["tokens"] < 2 or len(times) < 2:
        return None
    return (times[-1] - times[0]) / (request["tokens"] - 1)


def level_row(level: dict) -> dict:
    """One endpoint at one concurrency: counts, throughput, latency percentiles, server figures."""
    requests = level["requests"]
    ok = [r for r in requests if _ok(r)]
    tokens = sum(r["tokens"] for r in ok)
    gaps = [b - a for r in ok for a, b in pairwise(r["chunk_times"])]
    wall = level["wall_seconds"]
    server = level.get("server") or {}
    return {
        "endpoint": level["endpoint"], "concurrency": level["concurrency"], "requests": len(requests),
        "ok": len(ok), "failed": len(requests) - len(ok), "wall_seconds": wall, "tokens": tokens,
        "tokens_per_second": tokens / wall if wall > 0 else None,
        "request_tokens_per_second": median(_tokens_per_second(r) for r in ok),
        "ttft_p50": percentile([r["ttft"] for r in ok if r["ttft"] is not None], 50),
        "ttft_p99": percentile([r["ttft"] for r in ok if r["ttft"] is not None], 99),
        "itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99),
        "tpot": median(_tpot(r) for r in ok),
        "tokens_from_chunks": sum(r["tokens_from"] == "chunks" for r in ok),
        "server_tokens_per_step": server.get("tokens_per_step"), "server_acceptance": server.get("acceptance"),
        "server_engine": server.get("engine"),
        "errors": dict(Counter(r["error"] for r in requests if not _ok(r)).most_common(5)),
    }


def _paired(runs: list[dict], base: list[dict]) -> list[float]:
    """Per-request tok/s ratios of the same request index on two endpoints, where both succeeded."""
    ratios = []
    for r, b in zip(runs, base):
        mine, theirs = _tokens_per_second(r), _tokens_per_second(b)
        if _ok(r) and _ok(b) and mine and theirs:
            ratios.append(mine / theirs)
    return ratios


def summarize_endpoints(results: dict) -> dict:
    """Rows per endpoint x concurrency, and speedups of every other endpoint over the first."""
    levels = results["levels"]
    rows = [level_row(level) for level in levels]
    baseline = results["endpoints"][0]["label"]
    categories = results["config"]["categories"]
    by = {(level["endpoint"], level["concurrency"]): level for level in levels}
    row_by = {(r["endpoint"], r["concurrency"]): r for r in rows}
    speedups = []
    for level in levels:
        base = by.get((baseline, level["concurrency"]))
        if level["endpoint"] == baseline or base is None:
            continue
        mine, theirs = row_by[(level["endpoint"], level["concurrency"])], row_by[(baseline, level["concurrency"])]
        row = {"endpoint": level["endpoint"], "concurrency": level["concurrency"],
               "aggregate": mine["tokens_per_second"] / theirs["tokens_per_second"]
               if mine["tokens_per_second"] and theirs["tokens_per_second"] else None,
               "by_category": {}}
        for category in categories + [ALL]:
            keep = [i for i, r in enumerate(level["requests"]) if category == ALL or r["category"] == category]
            ratios = _paired([level["requests"][i] for i in keep], [base["requests"][i] for i in keep])
            row["by_category"][category] = statistics.median(ratios) if ratios else None
        speedups.append(row)
    return {"baseline": baseline, "categories": categories, "levels": rows, "speedups": speedups}


# ---------------------------------------------------------------------------------------------
# Tables


def _seconds(value) -> str:
    return _fmt(value, ".3f")


def levels_table(summary: dict, markdown: bool = True) -> str:
    rows = [[r["endpoint"], str(r["concurrency"]), f"{r['ok']} / {r['failed']}", _fmt(r["tokens_per_second"]),
             _fmt(r["request_tokens_per_second"]), f"{_seconds(r['ttft_p50'])} / {_seconds(r['ttft_p99'])}",
             f"{_seconds(r['itl_p50'])} / {_seconds(r['itl_p99'])}", _seconds(r["tpot"]),
             _fmt(r["server_tokens_per_step"]), _pct(r["server_acceptance"])]
            for r in summary["levels"]]
    header = ["endpoint", "clients", "ok / failed", "tok/s aggregate", "tok/s per request", "TTFT p50 / p99 (s)",
              "ITL p50 / p99 (s)", "TPOT (s)", "server tok/step", "server accept"]
    return _table(header, rows, markdown)


def speedup_table(summary: dict, markdown: bool = True) -> str:
    cats = summary["categories"] + [ALL]
    rows = [[f"{s['endpoint']} vs {summary['baseline']}", str(s["concurrency"]), _fmt(s["aggregate"], ".2f", "x")]
            + [_fmt(s["by_category"].get(c), ".2f", "x") for c in cats] for s in summary["speedups"]]
    header = ["endpoints", "clients", "aggregate"] + [f"{c} (per request)" if c == ALL else c for c in cats]
    return _table(header, rows, markdown)


def errors_lines(summary: dict) -> list[str]:
    return [f"- {r['endpoint']}, {r['concurrency']} clients: {count} x `{error}`"
            for r in summary["levels"] for error, count in r["errors"].items()]


def endpoint_terminal(summary: dict) -> str:
    """What ``bench --endpoint`` prints at the end."""
    out = [levels_table(summary, markdown=False)]
    if summary["speedups"]:
        out += ["", f"Speedup over {summary['baseline']}:", speedup_table(summary, markdown=False)]
    errors = errors_lines(summary)
    if errors:
        out += ["", "Errors:"] + errors
    return "\n".join(out)


def endpoint_markdown(results: dict, summary: dict, plots: list[str] = ()) -> str:
    """``report.md`` of an endpoint benchmark."""
    env, config = results.get("environment", {}), results["config"]
    out = ["# quickdraft endpoint benchmark", ""]
    if results.get("command"):
        out += ["Command:", "", "```", results["command"], "```", ""]
    out += [f"- date (UTC): {env.get('date_utc', '-')}; quickdraft {env.get('quickdraft', '-')}, git commit "
            f"{env.get('git_commit') or 'unavailable'}",
            f"- client machine: {env.get('cpu', '-')}, {env.get('cpu_count', '-')} CPUs; load average (1 min) at "
            f"start {_fmt(env.get('load_average_1min'))}, at end {_fmt(results.get('load_average_end'))}",
            f"- {config['prompts']} prompts ({', '.join(config['categories'])}), streamed chat requests, "
            f"max_tokens {config['max_new_tokens']}, temperature {config['temperature']:g}, ignore_eos "
            f"{'on' if config['ignore_eos'] else 'off'}; clients per level: {', '.join(map(str, config['concurrency']))}",
            "", "## Endpoints", ""]
    out.append(_table(["label", "URL", "model requested", "models the server lists"],
                      [[e["label"], e["url"], e["model"], ", ".join(e["models"])] for e in results["endpoints"]],
                      markdown=True))
    out += ["", f"The first, **{summary['baseline']}**, is the baseline."]
    if results.get("baseline_results"):
        earlier = results["baseline_results"]
        out[-1] += (f" It comes from an earlier run ({earlier['file']}, {earlier.get('date_utc') or 'date unknown'}), "
                    "not interleaved with this one: drift between the two runs counts in the speedups.")
    out += ["",
            "## Throughput and latency", "", levels_table(summary), ""]
    if any(r["tokens_from_chunks"] for r in summary["levels"]):
        out += ["Some servers sent no usage counts: their tokens are content chunks (an undercount when a "
                "chunk holds several tokens).", ""]
    if "endpoint_levels.png" in plots:
        out += ["![throughput and TTFT by clients](endpoint_levels.png)", ""]
    if summary["speedups"]:
        out += [f"## Speedup over {summary['baseline']}", "", speedup_table(summary), ""]
    errors = errors_lines(summary)
    if errors:
        out += ["## Errors", "", "The most frequent errors per level (recorded, not retried):", ""] + errors + [""]
    out += ["## Definitions", "", __doc__.split("Definitions (written into ``report.md`` too):")[1].strip(), ""]
    return "\n".join(out)
