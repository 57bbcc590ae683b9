"""The benchmark's arithmetic and its tables: pure functions of the raw results (``results.json``).

Definitions used throughout (written into ``report.md`` too):

* **tokens/s**: new tokens / wall time of the whole generation, prefill included (what a user
  waits for). Every method produces exactly ``max_new_tokens`` tokens.
* **speedup**: against the **baseline**, the plain method (quickdraft's ``plain`` or
  transformers' ``hf-plain``) with the highest median tokens/s in the main phase. It is the
  median, over prompts and repeats, of the paired ratio method tokens/s / baseline tokens/s on
  the same prompt and repeat (pairs share the machine's drift: they ran back to back).
* **tokens per target forward** (``tok/fwd``): tokens emitted per target forward that emits
  tokens, counting the recovered/bonus token: 1.00 for plain decoding. quickdraft's come from
  ``DecodeStats.mean_tokens_per_step``; transformers' from counting the target's forwards
  (its prefill forward emits the first token).
* **acceptance**: accepted draft tokens / drafted tokens (``DecodeStats.acceptance_rate``).
  **By position** i: of the steps that drafted a token at position i, the share in which it was
  accepted (so it includes steps rejected earlier: it falls with i).
* **a**: the per-token acceptance probability of the i.i.d. model of Leviathan et al. that
  gives the measured tokens per step at the mean draft length ``K_eff`` (drafted / steps):
  solves ``(1 - a^(K_eff+1)) / (1 - a) = tok/fwd``. (accepted / drafted is not ``a``: it counts
  drafted tokens after the first rejection as failures too.)
* **c**: cost ratio of drafting one token to one target step: the median time of a
  one-position draft-model forward / the median one-position target forward of plain
  decoding, same category, same run. For a drafter without a model, or with prompt lookup in
  front of the model (whose drafts cost nothing), its drafting time per drafted token instead.
* **theory**: ``(1 - a^(K+1)) / ((1 - a)(K c + 1))`` with K = ``K_eff``: the speedup this
  acceptance and draft cost allow if verifying K+1 tokens cost one target step and nothing else
  took time. **achieved** = measured speedup over quickdraft's own plain decoding / theory.
* **v**: measured cost of a K+1-position target forward / a one-position one (1 in the theory);
  for a tree, of its most common verify forward (the root and the tree's nodes).
* **lookup**: the share of steps that prompt lookup drafted in front of the draft model.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence

from quickdraft.hardware import draft_format
from quickdraft.costs import expected_tokens

ALL = "all"
# Other processes using this many cores or more during a run: the run was contended.
CONTENDED = 0.3


# ---------------------------------------------------------------------------------------------
# Arithmetic


def median(values: Iterable[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fit_acceptance(tokens_per_step: float, k: float) -> float:
    """The ``a`` for which ``expected_tokens(a, k)`` equals the measured tokens per step.

    Example: 3.0 tokens per step at K = 4 gives a = 0.75 (1 + .75 + .56 + .42 + .32 = 3.05).
    """
    if k <= 0 or tokens_per_step <= 1.0:
        return 0.0
    if tokens_per_step >= k + 1.0:
        return 1.0
    lo, hi = 0.0, 1.0  # expected_tokens increases with a
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < tokens_per_step:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def theoretical_speedup(a: float, k: float, c: float) -> float:
    """``(1 - a^(k+1)) / ((1 - a)(k c + 1))`` (Leviathan et al. 2023, with cost ratio c)."""
    return expected_tokens(a, k) / (k * c + 1.0)


def paired_ratios(runs: Sequence[dict], baseline_runs: Sequence[dict]) -> list[float]:
    """Method tokens/s over baseline tokens/s, run by run, paired on prompt, repeat,
    temperature and top-p (K is ignored: the baseline does not draft)."""
    base = {_pair_key(r): r for r in baseline_runs}
    ratios = []
    for r in runs:
        b = base.get(_pair_key(r))
        if b is not None and b["tokens_per_second"] > 0:
            ratios.append(r["tokens_per_second"] / b["tokens_per_second"])
    return ratios


def _pair_key(run: dict) -> tuple:
    return (run["prompt_id"], run["repeat"], run["temperature"], run["top_p"])


def _forward_times(runs: Iterable[dict], model: str, positions: int) -> list[float]:
    return [s for r in runs for p, s in r["forwards"].get(model, []) if p == positions]


def _verify_times(runs: Sequence[dict], k: int) -> list[float]:
    """Times of the target forwards that verified K drafts (K + 1 positions); for trees, whose
    forwards verify a varying number of nodes, of the most common verify size."""
    times = _forward_times(runs, "target", k + 1)
    if times:
        return times
    # Each run's first target forward is its prefill.
    sizes = [p for r in runs for p, _ in r["forwards"].get("target", [])[1:] if p > 1]
    if not sizes:
        return []
    return _forward_times(runs, "target", statistics.mode(sizes))


# ---------------------------------------------------------------------------------------------
# Aggregation


def _aggregate(runs: list[dict]) -> dict:
    """Totals and derived figures over a group of runs of one method."""
    tps = [r["tokens_per_second"] for r in runs]
    row: dict = {
        "runs": len(runs),
        "tokens_per_second": median(tps),
        "tokens_per_second_min": min(tps) if tps else None,
        "tokens_per_second_max": max(tps) if tps else None,
        "new_tokens": sum(r["new_tokens"] for r in runs),
        "seconds": sum(r["seconds"] for r in runs),
    }
    target_time = sum(s for r in runs for _, s in r["forwards"].get("target", []))
    draft_time = sum(s for r in runs for _, s in r["forwards"].get("draft", []))
    if not draft_time:
        # A drafter whose forwards were not watched (an EAGLE head; results from before the
        # decoders were watched): the engine's own draft clock.
        draft_time = sum(r["stats"]["time_draft"] for r in runs if r.get("stats"))
    total = row["seconds"]
    row["share_target"] = target_time / total if total else None
    row["share_draft"] = draft_time / total if total else None
    row["share_other"] = max(0.0, 1.0 - (target_time + draft_time) / total) if total else None
    peaks = [r["memory"].get("peak_rss") for r in runs if r["memory"].get("peak_rss")]
    extra = [r["memory"]["peak_rss"] - r["memory"]["rss_before"] for r in runs
             if r["memory"].get("peak_rss") and r["memory"].get("rss_before")]
    cuda = [r["memory"].get("cuda_peak") for r in runs if r["memory"].get("cuda_peak")]
    row["peak_rss"] = max(peaks) if peaks else None
    row["peak_rss_increase"] = max(extra) if extra else None
    row["cuda_peak"] = max(cuda) if cuda else None
    stats = [r["stats"] for r in runs if r.get("stats")]
    if stats:
        steps = sum(s["steps"] for s in stats)
        drafted = sum(s["drafted_tokens"] for s in stats)
        accepted = sum(s["accepted_tokens"] for s in stats)
        width = max((len(s["drafted_by_position"]) for s in stats), default=0)
        by_drafted = [sum(s["drafted_by_position"][i] for s in stats if i < len(s["drafted_by_position"]))
                      for i in range(width)]
        by_accepted = [sum(s["accepted_by_position"][i] for s in stats if i < len(s["accepted_by_position"]))
                       for i in range(width)]
        lookup_steps = sum(s.get("lookup_steps", 0) for s in stats)
        row.update(
            steps=steps, drafted_tokens=drafted, accepted_tokens=accepted,
            lookup_share=lookup_steps / steps if lookup_steps else None,
            tokens_per_forward=(accepted + steps) / steps if steps else None,
            acceptance_rate=accepted / drafted if drafted else None,
            acceptance_by_position=[a / d if d else None for a, d in zip(by_accepted, by_drafted)],
            drafted_by_position=by_drafted,
            mean_draft_length=drafted / steps if steps else None,
            time_draft_engine=sum(s["time_draft"] for s in stats),
        )
    else:
        forwards = sum(len(r["forwards"].get("target", [])) for r in runs)
        row["tokens_per_forward"] = row["new_tokens"] / forwards if forwards else None
        row["acceptance_rate"] = None
        row["draft_forwards"] = sum(len(r["forwards"].get("draft", [])) for r in runs)
    return row


def _costs(runs: list[dict], plain_runs: list[dict], k: int) -> dict:
    """c and v for one method's runs against the plain runs of the same category and phase."""
    t_target = median(_forward_times(plain_runs, "target", 1))
    t_draft = median(_forward_times(runs, "draft", 1))
    out = {"t_target_step": t_target, "t_draft_step": t_draft, "c": None, "v": None}
    if t_target:
        lookup = any(r["stats"].get("lookup_steps") for r in runs if r.get("stats"))
        if t_draft is not None and not lookup:
            out["c"] = t_draft / t_target
        else:
            stats = [r["stats"] for r in runs if r.get("stats")]
            drafted = sum(s["drafted_tokens"] for s in stats)
            if drafted:
                per_token = sum(s["time_draft"] for s in stats) / drafted
                out["t_draft_step"] = per_token
                out["c"] = per_token / t_target
        t_verify = median(_verify_times(runs, k))
        if t_verify is not None:
            out["v"] = t_verify / t_target
    return out


def summarize(results: dict) -> dict:
    """Tables (as lists of dicts) from the raw results: main, sweeps, costs, checks."""
    runs = results["runs"]
    methods = {m["name"]: m for m in results["methods"]}
    order = list(methods)
    baseline = results["baseline"]
    k_main = results["config"]["k"]
    main = [r for r in runs if r["phase"] == "main"]
    categories = list(dict.fromkeys(r["category"] for r in main))
    own_plain = "plain" if "plain" in methods else baseline

    def select(phase_runs, method, category):
        return [r for r in phase_runs if r["method"] == method and category in (ALL, r["category"])]

    rows = []
    for category in categories + [ALL]:
        for name in order:
            group = select(main, name, category)
            if not group:
                continue
            row = {"method": name, "family": methods[name]["family"], "category": category, "k": k_main}
            row.update(_aggregate(group))
            row["speedup"] = median(paired_ratios(group, select(main, baseline, category)))
            row["speedup_over_own_plain"] = median(paired_ratios(group, select(main, own_plain, category)))
            if not methods[name]["plain"] and row.get("steps"):
                # Costs are per category: context length changes a forward's cost.
                if category == ALL:
                    per_cat = [_costs(select(main, name, c), select(main, own_plain, c), k_main) for c in categories]
                    row["c"] = median(x["c"] for x in per_cat)
                    row["v"] = median(x["v"] for x in per_cat)
                else:
                    row.update(_costs(group, select(main, own_plain, category), k_main))
                _add_theory(row)
            rows.append(row)

    sweep = [r for r in runs if r["phase"] == "k_sweep"]
    k_rows = []
    for category in dict.fromkeys(r["category"] for r in sweep):
        base = select(sweep, baseline, category)
        plain_main = select(main, own_plain, category)
        for name in dict.fromkeys(r["method"] for r in sweep if r["method"] != baseline):
            for k in sorted({r["k"] for r in sweep if r["method"] == name}):
                group = [r for r in select(sweep, name, category) if r["k"] == k]
                row = {"method": name, "category": category, "k": k}
                row.update(_aggregate(group))
                row["speedup"] = median(paired_ratios(group, base))
                if row.get("steps"):
                    row.update(_costs(group, plain_main, k))
                    _add_theory(row)
                k_rows.append(row)

    temp = [r for r in runs if r["phase"] == "temperature"]
    t_rows = []
    for category in list(dict.fromkeys(r["category"] for r in temp)) + ([ALL] if temp else []):
        for name in dict.fromkeys(r["method"] for r in temp):
            for t, p in sorted({(r["temperature"], r["top_p"]) for r in temp}):
                group = [r for r in select(temp, name, category) if (r["temperature"], r["top_p"]) == (t, p)]
                base = [r for r in select(temp, baseline, category) if (r["temperature"], r["top_p"]) == (t, p)]
                if not group:
                    continue
                row = {"method": name, "category": category, "temperature": t, "top_p": p}
                row.update(_aggregate(group))
                row["speedup"] = median(paired_ratios(group, base))
                t_rows.append(row)

    # The benchmark itself loads the machine with its own threads; more than one core above
    # that means another process was competing for the CPU.
    loads = [r["load_average"] for r in runs if r.get("load_average") is not None]
    others = [r["other_load"] for r in runs if r.get("other_load") is not None]
    return {
        "load_average": {"median": median(loads), "max": max(loads) if loads else None},
        "competition": {"median": median(others), "max": max(others) if others else None,
                        "runs_contended": sum(1 for x in others if x >= CONTENDED), "runs": len(others),
                        "seconds_waited": sum(r.get("waited") or 0.0 for r in runs)},
        "baseline": baseline,
        "baseline_family": methods[baseline]["family"],
        "baseline_tokens_per_second": median(r["tokens_per_second"] for r in main if r["method"] == baseline),
        "categories": categories,
        "main": rows,
        "k_sweep": k_rows,
        "temperature": t_rows,
        "check": _check_summary(results.get("check", {}).get("comparisons", []), methods),
        "agreement": _check_summary(results.get("greedy_agreement", []), methods),
    }


def _add_theory(row: dict) -> None:
    k, tau, c = row.get("mean_draft_length"), row.get("tokens_per_forward"), row.get("c")
    row["a"] = fit_acceptance(tau, k) if k and tau else None
    if row["a"] is not None and c is not None:
        row["theory"] = theoretical_speedup(row["a"], k, c)
        own = row.get("speedup_over_own_plain", row.get("speedup"))
        row["achieved"] = own / row["theory"] if own and row["theory"] else None
    else:
        row["theory"] = row["achieved"] = None


def _check_summary(comparisons: list[dict], methods: dict) -> dict:
    """Verdict counts per method, and whether quickdraft's methods (and the peer's) passed."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"identical": 0, "near-tie": 0, "MISMATCH": 0})
    for row in comparisons:
        counts[row["method"]][row["verdict"]] += 1
    def passed(family):
        return all(c["MISMATCH"] == 0 for m, c in counts.items() if methods.get(m, {}).get("family") == family)
    return {"by_method": dict(counts), "passed": passed("quickdraft"), "peer_passed": passed("transformers"),
            "compared": len(comparisons)}


# ---------------------------------------------------------------------------------------------
# Formatting


def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


def _gib(value) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def speedup_matrix(summary: dict, markdown: bool = False) -> str:
    """Methods x categories: speedup over the baseline (the headline table)."""
    cats = summary["categories"] + [ALL]
    by = {(r["method"], r["category"]): r for r in summary["main"]}
    methods = list(dict.fromkeys(r["method"] for r in summary["main"]))
    rows = [[m] + [_fmt(by.get((m, c), {}).get("speedup"), ".2f", "x") for c in cats] for m in methods]
    return _table(["method"] + cats, rows, markdown)


def overall_table(summary: dict, markdown: bool = False) -> str:
    """One line per method over all categories."""
    rows = []
    for r in summary["main"]:
        if r["category"] != ALL:
            continue
        rows.append([
            r["method"],
            f"{_fmt(r['tokens_per_second'])} ({_fmt(r['tokens_per_second_min'])}-{_fmt(r['tokens_per_second_max'])})",
            _fmt(r["speedup"], ".2f", "x"), _fmt(r.get("tokens_per_forward")), _pct(r.get("acceptance_rate")),
            _pct(r.get("lookup_share")),
            _fmt(r.get("a")), _fmt(r.get("c"), ".2f"), _fmt(r.get("v"), ".2f"), _fmt(r.get("theory"), ".2f", "x"),
            _pct(r.get("achieved")),
            f"{_pct(r['share_draft'])}/{_pct(r['share_target'])}/{_pct(r['share_other'])}",
            _gib(r.get("peak_rss")),
        ])
    header = ["method", "tok/s median (min-max)", "speedup", "tok/fwd", "accept", "lookup", "a", "c", "v", "theory",
              "achieved", "draft/target/other", "peak RSS GiB"]
    return _table(header, rows, markdown)


def detail_table(summary: dict, markdown: bool = True) -> str:
    """Every method x category row with all its figures."""
    rows = []
    for r in summary["main"]:
        rows.append([
            r["category"], r["method"], str(r["runs"]),
            f"{_fmt(r['tokens_per_second'])} ({_fmt(r['tokens_per_second_min'])}-{_fmt(r['tokens_per_second_max'])})",
            _fmt(r["speedup"], ".2f", "x"), _fmt(r.get("tokens_per_forward")), _pct(r.get("acceptance_rate")),
            _pct(r.get("lookup_share")),
            _fmt(r.get("a")), _fmt(r.get("c"), ".2f"), _fmt(r.get("v"), ".2f"), _fmt(r.get("theory"), ".2f", "x"),
            _pct(r.get("achieved")),
            f"{_pct(r['share_draft'])}/{_pct(r['share_target'])}/{_pct(r['share_other'])}",
            _by_position(r.get("acceptance_by_position")),
            _gib(r.get("peak_rss")), _fmt((r.get("peak_rss_increase") or 0) / 2**20, ".0f"),
        ])
    header = ["category", "method", "runs", "tok/s median (min-max)", "speedup", "tok/fwd", "accept", "lookup", "a",
              "c", "v", "theory", "achieved", "draft/target/other", "accept by position", "peak RSS GiB",
              "RSS increase MiB"]
    return _table(header, rows, markdown)


def _by_position(values) -> str:
    return "/".join(_fmt(v, ".2f") for v in values) if values else "-"


def k_sweep_table(summary: dict, markdown: bool = True) -> str:
    rows = [[r["category"], r["method"], str(r["k"]), _fmt(r["tokens_per_second"]), _fmt(r["speedup"], ".2f", "x"),
             _fmt(r.get("tokens_per_forward")), _pct(r.get("acceptance_rate")), _fmt(r.get("a")),
             _fmt(r.get("c")), _fmt(r.get("v")), _fmt(r.get("theory"), ".2f", "x")]
            for r in summary["k_sweep"]]
    return _table(["category", "method", "K", "tok/s", "speedup", "tok/fwd", "accept", "a", "c", "v", "theory"],
                  rows, markdown)


def temperature_table(summary: dict, markdown: bool = True) -> str:
    rows = [[r["category"], r["method"], _fmt(r["temperature"], "g"), _fmt(r["top_p"], "g"),
             _fmt(r["tokens_per_second"]), _fmt(r["speedup"], ".2f", "x"), _fmt(r.get("tokens_per_forward")),
             _pct(r.get("acceptance_rate"))]
            for r in summary["temperature"]]
    return _table(["category", "method", "temperature", "top-p", "tok/s", "speedup", "tok/fwd", "accept"],
                  rows, markdown)


def comparison_table(comparisons: list[dict], markdown: bool = True) -> str:
    """Prompts x methods: ``=`` (identical), near-tie or MISMATCH with the position and logit gaps."""
    def label(c):
        return f"{c['method']} K={c['k']}" if c["phase"] == "k_sweep" else c["method"]

    prompts = list(dict.fromkeys((c["prompt_id"], c["category"]) for c in comparisons))
    labels = list(dict.fromkeys(label(c) for c in comparisons))
    cells: dict[tuple, set[str]] = defaultdict(set)
    for c in comparisons:
        if c["verdict"] == "identical":
            text = "="
        else:
            text = (f"{c['verdict']} @{c['first_difference']} (gap {_fmt(c.get('gap'), '.3f')}, "
                    f"top-2 {_fmt(c.get('top2_gap'), '.3f')})")
        cells[(c["prompt_id"], label(c))].add(text)
    rows = [[pid, cat] + [", ".join(sorted(cells.get((pid, m), {"-"}))) for m in labels] for pid, cat in prompts]
    return _table(["prompt", "category"] + labels, rows, markdown)


def hardware_line(env: dict) -> str:
    """The instructions the kernels could use, and what ``dtype="auto"`` chose on them."""
    hw, chosen = env["hardware"], env.get("machine_config") or {}
    restricted = "".join(f", {k}={v}" for k, v in hw.get("restrictions", {}).items())
    line = f"instructions: {hw['isa_level']} ({' '.join(hw['flags'])}{restricted})"
    if chosen:
        line += (f"; dtype=auto here: target {chosen['dtype']}{' packed' if chosen['pack_weights'] else ''}, "
                 f"draft {draft_format(chosen['draft_quantization'], chosen['draft_dtype'])} ({chosen['reason']})")
    return line


def terminal_report(results: dict, summary: dict) -> str:
    """What ``quickdraft bench`` prints at the end."""
    env = results.get("environment", {})
    lines = [f"Machine: {env.get('cpu', '-')}, {env.get('torch_threads', '-')} threads; {hardware_line(env)}"
             if env.get("hardware") else ""]
    check = summary["check"]
    if results.get("check"):
        status = "PASSED" if check["passed"] else "FAILED"
        lines.append(f"Greedy check ({results['check']['dtype']}, {check['compared']} comparisons): quickdraft {status}"
                     f"; transformers {'passed' if check['peer_passed'] else 'differs'}")
        lines.append(_verdict_line(check))
    agreement = summary["agreement"]
    lines.append(f"Greedy agreement in the timed runs ({results['models']['target']['dtype']}): {_verdict_line(agreement)}")
    lines.append("")
    lines.append(f"Speedup over the fastest plain decoding: {summary['baseline']} ({summary['baseline_family']}, "
                 f"{_fmt(summary['baseline_tokens_per_second'])} tok/s median)")
    lines.append(speedup_matrix(summary))
    lines.append("")
    lines.append(overall_table(summary))
    return "\n".join(lines)


def _verdict_line(check: dict) -> str:
    parts = []
    for method, c in check["by_method"].items():
        parts.append(f"{method}: {c['identical']} identical, {c['near-tie']} near-tie, {c['MISMATCH']} mismatch")
    return "; ".join(parts) if parts else "nothing compared"


def _competition_line(summary: dict) -> str:
    load, comp = summary.get("load_average", {}), summary.get("competition", {})
    line = (f"- load average (1 min) as the timed runs started: median {_fmt(load.get('median'))}, "
            f"max {_fmt(load.get('max'))}")
    if comp.get("runs"):
        line += (f"; CPU used by other processes during each run: median {_fmt(comp['median'])} cores, "
                 f"max {_fmt(comp['max'])}; {comp['runs_contended']} of {comp['runs']} runs had "
                 f"{CONTENDED} cores or more taken by others; {comp['seconds_waited']:.0f} s spent waiting "
                 "for quiet (--quiet-wait)")
    return line


def markdown_report(results: dict, summary: dict, plots: Sequence[str] = ()) -> str:
    """``report.md``: environment, checks, the tables, the plots, and the definitions."""
    env = results.get("environment", {})
    config = results["config"]
    models = results.get("models", {})
    out = ["# quickdraft benchmark", ""]
    if results.get("command"):
        out += ["Command:", "", "```", results["command"], "```", ""]
    out += [
        f"- date (UTC): {env.get('date_utc', '-')}; git commit: {env.get('git_commit') or 'unavailable'}",
        f"- machine: {env.get('cpu', '-')}, {env.get('cpu_count', '-')} CPUs, torch threads "
        f"{env.get('torch_threads', '-')}, device {env.get('device', '-')}; load average (1 min) at start "
        f"{_fmt(env.get('load_average_1min'))}, at end {_fmt(results.get('load_average_end'))}",
        *([f"- {hardware_line(env)}"] if env.get("hardware") else []),
        _competition_line(summary),
        f"- torch {env.get('torch', '-')}, transformers {env.get('transformers', '-')}, "
        f"quickdraft {env.get('quickdraft', '-')}, Python {env.get('python', '-')}",
    ]
    for role in ("target", "draft"):
        m = models.get(role)
        if m:
            out.append(f"- {role}: {m['name']} ({m['parameters'] / 1e6:,.0f}M parameters, {m['dtype']})")
    out += [
        f"- {config['max_new_tokens']} new tokens per run (end-of-sequence does not stop any method), "
        f"K = {config['k']}, {config['repeats']} repeat(s), chat template {'on' if config['chat'] else 'off'}, "
        f"seed {config['seed']}",
        f"- baseline: **{summary['baseline']}** ({summary['baseline_family']}), the faster plain decoding here "
        f"({_fmt(summary['baseline_tokens_per_second'])} tok/s median)",
        "",
        "Methods:",
        "",
    ]
    out += [f"- `{m['name']}`: {m['description']}" for m in results["methods"]]
    out.append("")
    if results.get("check"):
        check = summary["check"]
        out += [f"## Greedy check ({results['check']['dtype']}, {results['check']['max_new_tokens']} tokens)", "",
                f"quickdraft: **{'PASSED' if check['passed'] else 'FAILED'}**; transformers: "
                f"{'identical' if check['peer_passed'] else 'differs (see below)'}. "
                "Each method's greedy tokens against quickdraft's plain decoding; `=` identical, otherwise "
                "the first differing position and the target's logit gap there between the two tokens "
                "(near-tie when within the dtype's margin).", "",
                comparison_table(results["check"]["comparisons"]), ""]
    if results.get("greedy_agreement"):
        dtype = models.get("target", {}).get("dtype", "")
        out += [f"## Greedy agreement in the timed runs ({dtype})", "", _verdict_line(summary["agreement"]), "",
                comparison_table(results["greedy_agreement"]), ""]
    out += ["## Speedup by category", "", speedup_matrix(summary, markdown=True), ""]
    if "speedup_by_category.png" in plots:
        out += ["![speedup by category](speedup_by_category.png)", ""]
    out += ["## All categories, per method", "", overall_table(summary, markdown=True), "",
            "## Every method x category", "", detail_table(summary), ""]
    if summary["k_sweep"]:
        out += ["## K sweep", "", k_sweep_table(summary), ""]
        if "k_sweep.png" in plots:
            out += ["![K sweep](k_sweep.png)", ""]
    if summary["temperature"]:
        out += ["## Temperature sweep", "", temperature_table(summary), ""]
        if "temperature.png" in plots:
            out += ["![temperature sweep](temperature.png)", ""]
    if "acceptance_by_position.png" in plots:
        out += ["## Acceptance by draft position", "", "![acceptance by position](acceptance_by_position.png)", ""]
    out += ["## Definitions", "", __doc__.split("Definitions used throughout (written into ``report.md`` too):")[1].strip(), ""]
    return "\n".join(out)
