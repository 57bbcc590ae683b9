"""Why a batch probes: the engine alone (the demo pair, 2 threads) through waves of 1, 4, 16 and 32
clients (two requests each, 32 greedy tokens; two waves at 1 and 4, three at 16 and 32), and at
each probe the sets of rows the policy weighed: how many draft with the model and with lookup
copies, and for each k the step's estimated cost and its tokens per second were every draft
accepted ("ideal"), against a plain step's (a probe needs 1.05x).

Usage: PYTHONPATH=SRC python probe_why.py
import sys
sys.path.insert(0, "../2026-12-05-batching-waves")
from demo_setup import load_demo, serve_clients
from quickdraft import SamplingParams
from quickdraft.batch.engine import BatchEngine
from quickdraft.batch.policy import GoodputPolicy, step_cost, verified_positions

class Why(GoodputPolicy):
    def _best(self, rows):
        out = super()._best(rows)
        self._last_best.append((out, rows))
        return out
    def choose(self, rows, joining=0):
        self._last_best = []
        k = super().choose(rows, joining)
        if self.probing:
            plain = self._step_cost(rows, 0)
            print(f"PROBE rows {len(rows)} joining {joining} gain {self.gain:.2f}")
            for (best, rate, near, could), cand in self._last_best:
                drafting = [r for r in cand if r.k(1)]
                print(f"  set: {len(drafting)} drafting (model {sum(r.model for r in drafting)}, lookup {sum(not r.model for r in drafting)}, caps {sorted(r.cap for r in drafting)[:8]}), best {best} could {could} near {near}")
                top = min(self.max_k, max((r.cap for r in cand), default=0))
                for kk in range(1, top + 1):
                    c = self._step_cost(cand, kk); ideal = sum(1 + r.k(kk) for r in cand) / c
                    print(f"    k {kk}: cost {c:.3f} (verify {self.costs.verify(verified_positions([r.k(kk) for r in cand], self.ragged)):.3f}) ideal {ideal:.1f} vs plain {len(cand)/plain:.1f} x1.05")
        return k

target, draft, ids = load_demo()
engine = BatchEngine(target, draft, policy=Why(5))
engine.generate_batch(ids[:2], SamplingParams(max_new_tokens=4, temperature=0.0))
for clients in (1, 4, 16, 32):
    for _ in range(2 if clients < 16 else 3):
        t, s, sec = serve_clients(engine, ids, clients, 2)
        print(f"wave {clients} clients: {t} tokens {s} steps {t/sec:.1f} tok/s", flush=True)
