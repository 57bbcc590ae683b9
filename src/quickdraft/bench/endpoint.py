"""``quickdraft bench --endpoint URL``: the benchmark's workloads against any OpenAI-compatible server.

The same prompts as the local benchmark (Spec-Bench categories, HumanEval; ``bench.workloads``)
go as streamed chat requests (greedy by default, ``ignore_eos`` so that every request generates
``--max-new-tokens`` tokens) to one or more servers, at each ``--concurrency`` level, through
the load generator's client (``server.loadgen.send_all``). With several ``--endpoint`` options
the first is the baseline: each level runs on every endpoint in turn before the next level
starts, so that the machine's drift hits all of them alike. ``--baseline-results`` takes the
baseline from an earlier run instead (a server restarted with other options), after checking
that it sent the same requests.

Before and after each level the server's ``/metrics`` are read, and the speculative counters
found there (``COUNTERS``, ``GAUGES``) give the level's acceptance and tokens per step.

Nothing a server does stops the run: refused and dropped connections, HTTP errors and broken
streams are recorded per request (``error``) and counted in the report. Only what makes the
whole run pointless is refused up front, with what to do (``EndpointError``): a URL that does
not parse or answer, a rejected API key, a server whose ``/v1/models`` is not an OpenAI model list.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quickdraft.errors import QuickdraftError

if TYPE_CHECKING:
    from quickdraft.bench.workloads import Prompt
    from quickdraft.server.loadgen import Result

# Speculative counters on /metrics, by engine, as sample names (a counter's samples carry the
# ``_total`` suffix in the text format). ``steps`` are verify steps: quickdraft counts every
# target forward (plain ones too), vLLM the steps that drafted. Sources: quickdraft.server.metrics;
# vLLM vllm/v1/spec_decode/metrics.py (SpecDecodingProm); docs/scale-out.md lists them.
COUNTERS = {
    "quickdraft": {"steps": "quickdraft_spec_steps_total", "drafted": "quickdraft_spec_drafted_tokens_total",
                   "accepted": "quickdraft_spec_accepted_tokens_total"},
    "vllm": {"steps": "vllm:spec_decode_num_drafts_total", "drafted": "vllm:spec_decode_num_draft_tokens_total",
             "accepted": "vllm:spec_decode_num_accepted_tokens_total"},
}
# Engines that publish only running averages as gauges (SGLang: python/sglang/srt/metrics/collector.py,
# enabled by --enable-metrics): read after the level, averaged over the label sets (ranks).
GAUGES = {
    "sglang": {"tokens_per_step": "sglang:spec_accept_length", "acceptance": "sglang:spec_accept_rate"},
}
PROBE_TIMEOUT = 10.0


class EndpointError(QuickdraftError):
    """An endpoint cannot be benchmarked at all (the message says what to do)."""


@dataclass(frozen=True)
class Endpoint:
    """A server as the benchmark addresses it.

    Attributes:
        label: its name in the report (``--endpoint-label``, else ``A``, ``B``, ...).
        url: the base URL, without ``/v1``.
        model: the model id sent with every request.
        models: every model id the server's ``/v1/models`` lists.
    """

    label: str
    url: str
    model: str
    models: tuple[str, ...]


def base_url(url: str) -> str:
    """``url`` without trailing slashes and without a trailing ``/v1`` (both spellings are common)."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def probe(url: str, label: str, api_key: str | None, model: str | None, timeout: float = PROBE_TIMEOUT) -> Endpoint:
    """Read the server's model list; raise ``EndpointError`` saying what is wrong and what to do."""
    import httpx

    url = base_url(url)
    target = f"{url}/v1/models"
    try:
        response = httpx.get(target, headers=_headers(api_key), timeout=timeout)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as error:
        raise EndpointError(f"{url!r} is not a server URL ({error}): give its base URL, e.g. "
                            "--endpoint http://127.0.0.1:8000") from None
    except httpx.ConnectError as error:
        raise EndpointError(f"cannot connect to {url} ({error}): is the server running and listening on that "
                            "address and port?") from None
    except httpx.TimeoutException:
        raise EndpointError(f"{url} did not answer GET /v1/models within {timeout:g} s: is it overloaded, or is "
                            "this the right port?") from None
    except httpx.HTTPError as error:
        raise EndpointError(f"the connection to {url} failed ({type(error).__name__}: {error}): check the URL "
                            "(http vs https) and that an HTTP server listens there") from None
    if response.status_code in (401, 403):
        raise EndpointError(f"{url} refused the API key (HTTP {response.status_code} on GET /v1/models): "
                            f"{'pass the right key with --api-key' if api_key else 'it needs one: pass --api-key KEY'}")
    kind = response.headers.get("content-type", "no content type")
    not_openai = (f"{target} answered HTTP {response.status_code} ({kind}) instead of an OpenAI model list: this "
                  "does not look like an OpenAI-compatible server; give its base URL (the part before /v1)")
    if response.status_code != 200:
        raise EndpointError(not_openai)
    try:
        models = tuple(str(m["id"]) for m in response.json()["data"])
    except (ValueError, KeyError, TypeError):
        raise EndpointError(not_openai) from None
    if not models:
        raise EndpointError(f"{url} lists no models on /v1/models: has it finished loading?")
    if model is not None and model not in models:
        raise EndpointError(f"{url} does not serve model {model!r}; it lists {', '.join(models)}: pick one with --model")
    return Endpoint(label=label, url=url, model=model or models[0], models=models)


def scrape_metrics(url: str, api_key: str | None, timeout: float = PROBE_TIMEOUT) -> dict[str, list[float]] | None:
    """Every sample of the server's ``/metrics`` by name (one value per label set), or None when
    it has none (no route, not Prometheus text, unreachable, or prometheus-client not installed)."""
    import httpx

    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return None
    try:
        response = httpx.get(f"{url}/metrics", headers=_headers(api_key), timeout=timeout)
        if response.status_code != 200:
            return None
        samples: dict[str, list[float]] = defaultdict(list)
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                samples[sample.name].append(float(sample.value))
        return dict(samples)
    except (httpx.HTTPError, ValueError):
        return None


def speculative_figures(before: dict[str, list[float]] | None, after: dict[str, list[float]] | None) -> dict | None:
    """The speculative figures of what ran between two scrapes, from the first engine whose names
    ``after`` holds: counters as differences (summed over label sets), gauges as read after.

    ``tokens_per_step`` counts the bonus/recovered token: 1 + accepted / steps (vLLM's mean
    acceptance length; quickdraft's ``mean_tokens_per_step``).
    """
    if after is None:
        return None
    for engine, names in COUNTERS.items():
        if names["steps"] in after:
            delta = {key: sum(after.get(name, [])) - sum((before or {}).get(name, [])) for key, name in names.items()}
            if min(delta.values()) < 0:  # the counters went back: the server restarted during the level
                return None
            steps, drafted, accepted = delta["steps"], delta["drafted"], delta["accepted"]
            return {"engine": engine, "steps": steps, "drafted_tokens": drafted, "accepted_tokens": accepted,
                    "acceptance": accepted / drafted if drafted else None,
                    "tokens_per_step": 1 + accepted / steps if steps else None}
    for engine, names in GAUGES.items():
        if names["tokens_per_step"] in after:
            def mean(name: str) -> float | None:
                values = after.get(name)
                return sum(values) / len(values) if values else None
            return {"engine": engine, "acceptance": mean(names["acceptance"]),
                    "tokens_per_step": mean(names["tokens_per_step"]), "since": "server's running average"}
    return None


def request_row(prompt: Prompt, index: int, result: Result) -> dict:
    """One request of a level as results.json keeps it."""
    error = result.error
    if result.status not in (0, 200):  # 0: no HTTP response at all (the error names the exception)
        error = f"HTTP {result.status}" + (f": {result.error}" if result.error else "")
    return {
        "index": index, "prompt_id": prompt.id, "category": prompt.category, "status": result.status,
        "error": error, "ttft": result.ttft, "total": result.total,
        # usage when the server sends it; otherwise content chunks, which undercount when a chunk holds several tokens
        "tokens": result.completion_tokens or len(result.chunk_times),
        "tokens_from": "usage" if result.completion_tokens else "chunks",
        "chunk_times": [round(t, 5) for t in result.chunk_times],
        "mean_tokens_per_step": result.mean_tokens_per_step,
    }


def add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``quickdraft bench --endpoint`` (the workload options are the bench's own)."""
    group = parser.add_argument_group("measuring a running server (bench --endpoint; docs/scale-out.md)")
    group.add_argument("--endpoint", action="append", default=None, metavar="URL",
                       help="benchmark the OpenAI-compatible server at URL (its base URL, e.g. http://127.0.0.1:8000) "
                            "instead of decoding locally; repeat to compare servers, the first being the baseline")
    group.add_argument("--endpoint-label", action="append", default=None, metavar="NAME",
                       help="a name per --endpoint, in the same order, for the report (default: A, B, ...)")
    group.add_argument("--model", default=None,
                       help="the model id to request (default: the first one each server lists on /v1/models)")
    group.add_argument("--api-key", default=None,
                       help="sent as 'Authorization: Bearer KEY' to every endpoint (default: none)")
    group.add_argument("--concurrency", default="1,4,16", metavar="N,N,...",
                       help="clients sending requests at once, one level each; a level sends every prompt once, "
                            "and at least one request per client (default: 1,4,16)")
    group.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of the requests (default: 0)")
    group.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                       help="ask the server to generate --max-new-tokens tokens past end-of-sequence, so that every "
                            "endpoint does the same work (an extra parameter vLLM and SGLang accept, as quickdraft "
                            "does; default: on)")
    group.add_argument("--baseline-results", default=None, metavar="RESULTS.json",
                       help="compare with an earlier bench --endpoint run (its results.json) as the baseline, e.g. "
                            "the same server before it was restarted with speculation; it must have sent the same "
                            "prompts, tokens and temperature")
    group.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                       help="a request still unfinished after SECONDS is recorded as an error (default: 600)")


def _concurrency(text: str) -> list[int]:
    try:
        levels = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise EndpointError(f"--concurrency takes positive integers such as 1,4,16, got {text!r}")
    return levels


def _labels(args: argparse.Namespace) -> list[str]:
    labels = args.endpoint_label or []
    if labels and len(labels) != len(args.endpoint):
        raise EndpointError(f"give one --endpoint-label per --endpoint ({len(args.endpoint)}), or none")
    return labels or [chr(ord("A") + i) for i in range(len(args.endpoint))]


def run_endpoints(endpoints: list[Endpoint], prompts: list[Prompt], levels: list[int], template: dict, api_key: str | None,
                  timeout: float, progress: bool = True) -> list[dict]:
    """Every level on every endpoint, level by level; the raw results (``levels`` of results.json)."""
    from tqdm.auto import tqdm

    from quickdraft.server.loadgen import send_all

    sizes = {c: max(len(prompts), c) for c in levels}
    bar = tqdm(total=sum(sizes.values()) * len(endpoints), desc="endpoint bench", unit="req", disable=not progress)
    raw = []
    for concurrency in levels:
        chosen = [prompts[i % len(prompts)] for i in range(sizes[concurrency])]
        for endpoint in endpoints:
            bar.set_postfix_str(f"{endpoint.label}, {concurrency} clients")
            bodies = [dict(template, model=endpoint.model,
                           messages=[{"role": "user", "content": p.chat_text or p.text}]) for p in chosen]
            before = scrape_metrics(endpoint.url, api_key)
            results, wall = asyncio.run(send_all(endpoint.url, bodies, concurrency, api_key, timeout,
                                                 on_result=lambda _: bar.update()))
            after = scrape_metrics(endpoint.url, api_key)
            raw.append({"endpoint": endpoint.label, "concurrency": concurrency, "wall_seconds": wall,
                        "server": speculative_figures(before, after),
                        "requests": [request_row(p, i, r) for i, (p, r) in enumerate(zip(chosen, results))]})
    bar.close()
    return raw


def write_endpoint_outputs(results: dict, folder: Path) -> dict:
    """Summarise ``results`` and write results.json, report.md and the plot into ``folder``."""
    from quickdraft.bench.endpoint_report import endpoint_markdown, summarize_endpoints

    folder.mkdir(parents=True, exist_ok=True)
    summary = summarize_endpoints(results)
    results["summary"] = summary
    (folder / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    plots = []
    try:
        from quickdraft.bench.plots import endpoint_levels

        plots.append(endpoint_levels(summary, folder / "endpoint_levels.png").name)
    except ImportError:  # matplotlib is the bench extra's; the tables need nothing
        pass
    (folder / "report.md").write_text(endpoint_markdown(results, summary, plots), encoding="utf-8")
    return summary


def _baseline_results(path: str | None, config: dict, labels: list[str]) -> dict | None:
    """The earlier run of ``--baseline-results``, checked to have sent the same requests; its
    labels get a ``baseline:`` prefix where they clash with this run's."""
    if path is None:
        return None
    try:
        earlier = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise EndpointError(f"cannot read --baseline-results {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise EndpointError(f"--baseline-results {path} is not JSON ({error})") from None
    if not isinstance(earlier, dict) or earlier.get("kind") != "endpoint":
        raise EndpointError(f"--baseline-results {path} is not the results.json of a 'quickdraft bench --endpoint' run")
    same = ("max_new_tokens", "temperature", "ignore_eos", "prompt_ids")
    differ = [key for key in same if earlier["config"].get(key) != config[key]]
    if differ:
        raise EndpointError(f"--baseline-results {path} sent other requests ({', '.join(differ)} differ): rerun "
                            "with the same --categories, --prompts-per-category, --prompts, --max-new-tokens, "
                            "--temperature and --ignore-eos")
    rename = {e["label"]: f"baseline:{e['label']}" if e["label"] in labels else e["label"] for e in earlier["endpoints"]}
    earlier.pop("summary", None)
    for item in earlier["endpoints"] + earlier["levels"]:
        key = "label" if "label" in item else "endpoint"
        item[key] = rename[item[key]]
    return earlier


def rebuild_endpoint_report(results: dict, folder: Path) -> int:
    """``bench --report-from`` on an endpoint run's results.json: the tables again, no requests."""
    from quickdraft.bench.endpoint_report import endpoint_terminal

    print(endpoint_terminal(write_endpoint_outputs(results, folder)))
    print(f"\nwrote {folder}/report.md", file=sys.stderr)
    return 0


def run_endpoint_bench(args: argparse.Namespace) -> int:
    """``quickdraft bench --endpoint ...`` (after the bench's defaults were resolved)."""
    import torch

    from quickdraft.cli_common import comma_list
    from quickdraft.bench.endpoint_report import endpoint_terminal
    from quickdraft.bench.measure import environment, load_average
    from quickdraft.bench.workloads import CATEGORIES, load_workload

    levels = _concurrency(args.concurrency)
    labels = _labels(args)
    categories = comma_list(args.categories) if args.categories else CATEGORIES
    prompts = load_workload(categories, args.prompts_per_category, args.prompts)
    if any(p.token_ids is not None for p in prompts):
        raise EndpointError("a server takes text: the prompts file holds token_ids; give 'prompt' or 'turns'")
    endpoints = [probe(url, label, args.api_key, args.model) for url, label in zip(args.endpoint, labels)]
    for e in endpoints:
        print(f"{e.label}: {e.url}, model {e.model} (serves {', '.join(e.models)})", file=sys.stderr)
    template = {"max_tokens": args.max_new_tokens, "temperature": args.temperature, "stream": True,
                "stream_options": {"include_usage": True}}
    if args.ignore_eos:
        template["ignore_eos"] = True
    config = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "ignore_eos": args.ignore_eos,
              "concurrency": levels, "categories": list(dict.fromkeys(p.category for p in prompts)),
              "prompts": len(prompts), "prompt_ids": [p.id for p in prompts], "request_template": template}
    earlier = _baseline_results(args.baseline_results, config, [e.label for e in endpoints])
    env = environment(torch.device("cpu"))  # the client's machine; the servers' are the reader's to state
    raw = run_endpoints(endpoints, prompts, levels, template, args.api_key, args.request_timeout,
                        progress=not args.no_progress)
    results = {"kind": "endpoint", "environment": env, "load_average_end": load_average(),
               "endpoints": [asdict(e) for e in endpoints], "config": config, "levels": raw}
    if earlier is not None:
        results["endpoints"] = earlier["endpoints"] + results["endpoints"]
        results["levels"] = earlier["levels"] + results["levels"]
        results["baseline_results"] = {"file": args.baseline_results,
                                       "date_utc": earlier.get("environment", {}).get("date_utc")}
    if "bench" in sys.argv[1:2]:  # run from the command line (not through main(argv) in a test)
        results["command"] = "quickdraft " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    folder = Path(args.output)
    summary = write_endpoint_outputs(results, folder)
    print(endpoint_terminal(summary))
    print(f"\nwrote {folder}/results.json and report.md", file=sys.stderr)
    failed = sum(row["failed"] for row in summary["levels"])
    if failed:
        print(f"quickdraft: {failed} request(s) failed; their errors are in {folder}/report.md", file=sys.stderr)
    return 1 if failed else 0
