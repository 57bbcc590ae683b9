"""PNG plots of a benchmark summary (matplotlib, Agg backend: no display needed).

Each function writes one file and returns its path; ``write_plots`` writes those that have data.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from quickdraft.bench.report import ALL  # noqa: E402

DPI = 90


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def speedup_by_category(summary: dict, path: Path) -> Path:
    """Grouped bars: speedup over the baseline for each category and method."""
    cats = summary["categories"] + [ALL]
    methods = list(dict.fromkeys(r["method"] for r in summary["main"]))
    by = {(r["method"], r["category"]): r.get("speedup") for r in summary["main"]}
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(cats))]
        ax.bar(xs, [by.get((method, c)) or 0 for c in cats], width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(cats)), cats, rotation=20)
    ax.set_ylabel(f"speedup over {summary['baseline']}")
    ax.set_title("Speedup by category and method (greedy)")
    ax.legend(fontsize=8, ncol=4)
    return _save(fig, path)


def k_sweep(summary: dict, path: Path) -> Path:
    """Speedup and tokens per target forward against K, one line per method and category;
    dashed: the theoretical speedup from measured acceptance and cost."""
    lines: dict[tuple, list[dict]] = defaultdict(list)
    for r in summary["k_sweep"]:
        lines[(r["method"], r["category"])].append(r)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for (method, category), rows in lines.items():
        rows.sort(key=lambda r: r["k"])
        ks = [r["k"] for r in rows]
        (line,) = left.plot(ks, [r["speedup"] or 0 for r in rows], marker="o", label=f"{method} / {category}")
        if all(r.get("theory") for r in rows):
            left.plot(ks, [r["theory"] for r in rows], linestyle="--", color=line.get_color(), alpha=0.6)
        right.plot(ks, [r.get("tokens_per_forward") or 0 for r in rows], marker="o", color=line.get_color())
    ks = sorted({r["k"] for r in summary["k_sweep"]})
    left.set_xticks(ks)
    right.set_xticks(ks)
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xlabel("K (draft tokens per step)")
    left.set_ylabel(f"speedup over {summary['baseline']}")
    left.set_title("Speedup vs K (dashed: theory)")
    left.legend(fontsize=8)
    right.set_xlabel("K")
    right.set_ylabel("tokens per target forward")
    right.set_title("Accepted length vs K")
    return _save(fig, path)


def temperature(summary: dict, path: Path) -> Path:
    """Speedup against temperature, one line per method and top-p (all sweep prompts)."""
    lines: dict[tuple, list[dict]] = defaultdict(list)
    for r in summary["temperature"]:
        if r["category"] == ALL:
            lines[(r["method"], r["top_p"])].append(r)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for (method, top_p), rows in lines.items():
        rows.sort(key=lambda r: r["temperature"])
        ts = [r["temperature"] for r in rows]
        label = method if top_p == 1.0 else f"{method}, top-p {top_p:g}"
        (line,) = left.plot(ts, [r["speedup"] or 0 for r in rows], marker="o", label=label)
        right.plot(ts, [r.get("tokens_per_forward") or 0 for r in rows], marker="o", color=line.get_color())
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xlabel("temperature")
    left.set_ylabel(f"speedup over {summary['baseline']}")
    left.set_title("Speedup vs temperature")
    left.legend(fontsize=8)
    right.set_xlabel("temperature")
    right.set_ylabel("tokens per target forward")
    right.set_title("Accepted length vs temperature")
    return _save(fig, path)


def acceptance_by_position(summary: dict, path: Path) -> Path:
    """For each drafting method: share of steps accepting draft position i, by category."""
    rows = [r for r in summary["main"] if r.get("acceptance_by_position")]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, max(len(methods), 1), figsize=(4.2 * max(len(methods), 1), 3.8), squeeze=False)
    for ax, method in zip(axes[0], methods):
        for r in rows:
            if r["method"] != method:
                continue
            values = r["acceptance_by_position"]
            style = {"color": "black", "linewidth": 2.2} if r["category"] == ALL else {}
            ax.plot(range(1, len(values) + 1), [v if v is not None else float("nan") for v in values],
                    marker="o", label=r["category"], **style)
        ax.set_ylim(0, 1.02)
        width = max(len(r["acceptance_by_position"]) for r in rows if r["method"] == method)
        ax.set_xticks(range(1, width + 1))
        ax.set_xlim(0.5, width + 0.5)
        ax.set_xlabel("draft position")
        ax.set_title(method)
    axes[0][0].set_ylabel("accepted share of drafted")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("Acceptance by draft position (greedy, main phase)")
    return _save(fig, path)


def write_plots(summary: dict, folder: Path) -> list[Path]:
    """Write every plot that has data into ``folder``; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [speedup_by_category(summary, folder / "speedup_by_category.png")]
    if summary["k_sweep"]:
        written.append(k_sweep(summary, folder / "k_sweep.png"))
    if summary["temperature"]:
        written.append(temperature(summary, folder / "temperature.png"))
    if any(r.get("acceptance_by_position") for r in summary["main"]):
        written.append(acceptance_by_position(summary, folder / "acceptance_by_position.png"))
    return written


def endpoint_levels(summary: dict, path: Path) -> Path:
    """``bench --endpoint``: aggregate tokens/s and TTFT p50 against clients, one line per endpoint."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label in dict.fromkeys(r["endpoint"] for r in summary["levels"]):
        rows = sorted((r for r in summary["levels"] if r["endpoint"] == label), key=lambda r: r["concurrency"])
        clients = [r["concurrency"] for r in rows]
        left.plot(clients, [r["tokens_per_second"] or 0 for r in rows], marker="o", label=label)
        right.plot(clients, [r["ttft_p50"] or 0 for r in rows], marker="o", label=label)
    for ax, ylabel in ((left, "tokens/s, all clients together"), (right, "time to first token, p50 (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("clients")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    fig.suptitle("Endpoints by number of clients")
    return _save(fig, path)
