"""levels.py with TRACE=1, printing before each step of 4 rows the rates the goodput policy weighed
for each set of drafting rows it considered: the set's caps (0: kept from drafting), the factor
on drafting (``Realized.gain``), and for each k its expected tokens/s over plain decoding's, its
estimated seconds, and those seconds without the catch-up share.

Usage (from this folder): TRACE=1 PYTHONPATH=SRC python trace_rates.py "LEVELS" REPEATS PER_CLIENT ARMS
"""
import runpy
import sys

from quickdraft.batch import policy as P

_best = P.GoodputPolicy._best


def traced_best(self, rows):
    if len(rows) == 4:
        plain = self._step_cost(rows, 0)
        rates = []
        for k in range(min(self.max_k, max(row.cap for row in rows)) + 1):
            cost = self._step_cost(rows, k)
            if cost is None or plain is None:
                break
            bare = P.step_cost(rows, k, self.costs, self.ragged, catch_up=False)
            rate = P.step_tokens(rows, k) / cost * (self.gain if k else 1.0) / (P.step_tokens(rows, 0) / plain)
            rates.append((k, round(rate, 3), round(cost, 3), round(bare, 3)))
        print(f"    set caps {[row.cap for row in rows]} gain {self.gain:.3f} (k, rate over plain, seconds, "
              f"without catch-up) {rates}")
    return _best(self, rows)


P.GoodputPolicy._best = traced_best
runpy.run_path("levels.py", run_name="__main__")
