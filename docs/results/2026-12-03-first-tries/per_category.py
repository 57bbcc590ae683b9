"""Per category: tok/s by method (median of repeats) and default / plain (auto) by the decoder's own time, per repeat and their median.
Usage: python per_category.py results.json [results.json ...] (several runs of the same bench: their repeats pooled)"""
import json, statistics, sys
runs = [{**r, "repeat": (i, r["repeat"])} for i, path in enumerate(sys.argv[1:]) for r in json.load(open(path))["runs"]]
cats = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "code"]
for phase in sorted({r["phase"] for r in runs}):
    temps = sorted({r["temperature"] for r in runs if r["phase"] == phase})
    for t in temps:
        sel = [r for r in runs if r["phase"] == phase and r["temperature"] == t]
        methods = sorted({r["method"] for r in sel})
        print(f"phase {phase} T={t}")
        for m in methods:
            row = []
            for c in cats:
                xs = [r for r in sel if r["method"] == m and r["category"] == c]
                row.append(statistics.median(r["new_tokens"] / r["stats"]["time_total"] for r in xs) if xs else float("nan"))
            print(f"  {m:22}" + " ".join(f"{v:6.2f}" for v in row) + f"  median {statistics.median(row):.2f}")
        ratios = []
        for c in cats:
            per = []
            for rep in sorted({r["repeat"] for r in sel}):
                dft = [r for r in sel if r["method"] == "default" and r["category"] == c and r["repeat"] == rep]
                pl = [r for r in sel if r["method"] == "plain" and r["category"] == c and r["repeat"] == rep]
                if dft and pl:
                    per.append(pl[0]["stats"]["time_total"] / dft[0]["stats"]["time_total"])
            ratios.append(per)
        print("  default/plain per repeat: " + "  ".join(f"{c[:5]} " + ",".join(f"{x:.2f}" for x in p) for c, p in zip(cats, ratios)))
        print("  default/plain (median of repeats): " + " ".join(f"{statistics.median(p):.2f}" for p in ratios if p))
