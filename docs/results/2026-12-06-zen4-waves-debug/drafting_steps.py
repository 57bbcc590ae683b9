"""The draft server's steps that drafted, from its DEBUG lines (`quickdraft serve --log-level
debug`): each one's rows, k, rows and tokens drafted, positions the draft model read catching up,
tokens emitted, the policy's estimated tokens/s for the step and for a plain one, the gain, and
the step's own tokens/s (emitted over its draft, verify and accept seconds; the prefill left out,
as the policy's estimate leaves it out); and the median plain step's tokens/s at each width.

Usage: python drafting_steps.py SERVE_LOG [MIN_ROWS]
"""
import re
import statistics
import sys

LINE = re.compile(
    r"step: (?P<rows>\d+) rows decoding, (?P<joining>\d+) joining; k (?P<k>\d+)(?P<probe> \(probe\))?; "
    r"(?P<drafting>\d+) rows drafted (?P<drafted>\d+) tokens, the draft model read (?P<read>\d+) positions "
    r"catching up; (?P<emitted>\d+) tokens emitted(?:; estimated (?P<estimated>[\d.]+) tok/s, plain "
    r"(?P<plain>[\d.]+))?; gain (?P<gain>[\d.]+); seconds prefill (?P<prefill>[\d.]+) draft (?P<draft>[\d.]+) "
    r"verify (?P<verify>[\d.]+) accept (?P<accept>[\d.]+)")

min_rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1
plain: dict[int, list[float]] = {}
print("| rows | joining | k | rows drafting | tokens drafted | caught up | emitted | estimated / plain tok/s | gain | seconds draft / verify | tok/s |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: |")
for match in map(LINE.search, open(sys.argv[1])):
    if not match:
        continue
    m = match.groupdict()
    rows = int(m["rows"])
    seconds = float(m["draft"]) + float(m["verify"]) + float(m["accept"])
    rate = int(m["emitted"]) / seconds
    if int(m["drafted"]) == 0:
        plain.setdefault(rows, []).append(rate)
    elif rows >= min_rows:
        print(f"| {rows} | {m['joining']} | {m['k']}{' probe' if m['probe'] else ''} | {m['drafting']} | {m['drafted']} "
              f"| {m['read']} | {m['emitted']} | {m['estimated'] or '-'} / {m['plain'] or '-'} | {m['gain']} "
              f"| {m['draft']} / {m['verify']} | {rate:.1f} |")
print()
print("plain steps' tok/s by width (median, steps): "
      + ", ".join(f"{rows}: {statistics.median(r):.1f} ({len(r)})" for rows, r in sorted(plain.items()) if rows >= min_rows))
