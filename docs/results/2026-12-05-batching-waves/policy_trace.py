"""The goodput policy's predicted step cost against what each step took, the batched engine alone
driven as run.sh drives a server: waves of CLIENTS requests in flight, each client sending
PER_CLIENT requests one after another (loadgen prompts, 32 greedy tokens), the engine released
between waves as the idle scheduler does. One request runs alone first, so that the draft
model's acceptance is measured (at one row it drafts) before the batch fills. Prints a line per
step that drafted (and every 20th that did not), then the predicted and realized seconds of both
kinds of steps. Usage: python policy_trace.py PER_CLIENT CLIENTS [CLIENTS ...] (one wave each)"""
import statistics
import sys
import time
from dataclasses import replace

from quickdraft.batch.engine import BatchEngine
from quickdraft.batch.policy import JOINING_ROW, GoodputPolicy, step_cost
from demo_setup import PARAMS as params, load_demo


class TracingPolicy(GoodputPolicy):
    """The goodput policy, remembering what it predicted the chosen step would cost."""

    def choose(self, rows, joining=0):
        k = super().choose(rows, joining)
        chosen = [replace(row, fixed=d) for row, d in zip(rows, self.drafts)] + [JOINING_ROW] * joining
        self.predicted = step_cost(chosen, 0, self.costs)
        self.predicted_plain = step_cost(rows + [JOINING_ROW] * joining, 0, self.costs)
        self.catch_up_seconds = 0.0
        return k

    def observe_catch_up(self, positions, seconds):
        super().observe_catch_up(positions, seconds)
        self.catch_up_seconds += seconds


target, draft, ids = load_demo()
PER_CLIENT, WAVES = int(sys.argv[1]), [int(a) for a in sys.argv[2:]]
policy = TracingPolicy(5)
engine = BatchEngine(target, draft, policy=policy)
engine.generate_batch(ids[:1], params)  # one row: it drafts, and the acceptance is measured
print("acceptance after one request alone:", {s: round(v, 2) for s, v in engine.acceptance.items()})

records = []  # (drafted, rows, predicted, predicted plain, realized without prefill, catch-up, tokens)
tokens_total, start, step = 0, time.perf_counter(), 0
for wave, CLIENTS in enumerate(WAVES):
    print(f"wave {wave + 1}: {CLIENTS} clients")
    left = {c: PER_CLIENT for c in range(CLIENTS)}
    owner, sent = {}, 0
    for c in range(CLIENTS):
        owner[engine.add(ids[sent % len(ids)], params)] = c; sent += 1; left[c] -= 1
    while owner:
        events = engine.step()
        step += 1
        if not engine.last_drafted:
            continue
        emitted = sum(len(e.chunk.token_ids) for e in events)
        tokens_total += emitted
        s = engine.last_seconds
        realized = s["draft"] + s["verify"] + s["accept"]
        drafted = any(engine.last_drafted)
        records.append((drafted, len(engine.last_drafted), policy.predicted, policy.predicted_plain, realized,
                        policy.catch_up_seconds, emitted))
        if drafted or step % 20 == 0:
            print(f"step {step:4d} rows {len(engine.last_drafted):2d} k {policy.last_k} probe {int(policy.probing)} "
                  f"drafted {sum(engine.last_drafted):3d} predicted {policy.predicted or 0:.3f} (plain "
                  f"{policy.predicted_plain or 0:.3f}) took {realized:.3f} (draft {s['draft']:.3f}, catch-up "
                  f"{policy.catch_up_seconds:.3f}, verify {s['verify']:.3f}) prefill {s['prefill']:.3f} "
                  f"tokens {emitted}")
        for event in events:
            if event.done:
                c = owner.pop(event.request_id)
                if left[c]:
                    owner[engine.add(ids[sent % len(ids)], params)] = c; sent += 1; left[c] -= 1
    engine.release()
print(f"{tokens_total / (time.perf_counter() - start):.1f} tok/s over {step} steps")
for kind in (False, True):
    sel = [r for r in records if r[0] == kind and r[2]]
    if sel:
        print(f"{'steps that drafted' if kind else 'steps without drafts'}: {len(sel)}, predicted median "
              f"{statistics.median(r[2] for r in sel):.3f} s, took median {statistics.median(r[4] for r in sel):.3f} s, "
              f"took / predicted median {statistics.median(r[4] / r[2] for r in sel):.2f}, tokens per row "
              f"{sum(r[6] for r in sel) / sum(r[1] for r in sel):.2f}")
