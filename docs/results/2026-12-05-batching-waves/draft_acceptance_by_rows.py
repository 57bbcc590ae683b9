"""Draft acceptance of the batched engine with k fixed (FixedBatchK(3)) on the loadgen prompts, 32
greedy tokens: 1, 4 and 16 rows in one batch, 16 requests joining one every 3 steps (rows joining
and leaving, moved in both caches), and 16 rows with prompt lookup in front. Does the quality of
the drafts depend on the batch? Usage: python draft_acceptance_by_rows.py"""
import time
from quickdraft.batch.engine import BatchEngine
from quickdraft.batch.policy import FixedBatchK
from demo_setup import PARAMS as params, load_demo

target, draft, ids = load_demo()


def run(rows, lookup, staggered=False):
    engine = BatchEngine(target, draft, policy=FixedBatchK(3), prompt_lookup=lookup)
    start = time.perf_counter()
    if not staggered:
        outs = engine.generate_batch([ids[i % len(ids)] for i in range(rows)], params)
        stats = [o.stats for o in outs]
    else:  # continuous: a new request joins every 3 steps, up to 2*rows requests
        stats, pending, n = [], list(range(2 * rows)), 0
        live = {}
        while pending or live:
            if pending and (n % 3 == 0 or not live):
                i = pending.pop(0); live[engine.add(ids[i % len(ids)], params)] = i
            for ev in engine.step():
                if ev.done:
                    stats.append(ev.chunk.stats); live.pop(ev.request_id)
            n += 1
    drafted = sum(s.drafted_tokens for s in stats); accepted = sum(s.accepted_tokens for s in stats)
    print(f"rows {rows:2d} lookup {lookup} staggered {staggered}: drafted {drafted} accepted {accepted} "
          f"rate {accepted / max(drafted, 1):.2f}  {time.perf_counter() - start:.1f}s", flush=True)
for rows, lookup, stag in [(1, False, False), (4, False, False), (16, False, False), (8, False, True), (16, True, False)]:
    run(rows, lookup, stag)
