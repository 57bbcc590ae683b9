"""quickdraft bench with AdaptiveK's choices logged (verify-cost estimates, room, acceptance) to bench_policy_log.jsonl."""
import json, sys
import quickdraft.policy as pm
orig_choose, orig_begin = pm.AdaptiveK.choose, pm.AdaptiveK.begin
log = open("bench_policy_log.jsonl", "w")
def begin(self):
    orig_begin(self)
    log.write(json.dumps({"begin": id(self)}) + "\n")
def choose(self, max_k, lookup_tokens=0, catch_up=0, remaining=None):
    c = orig_choose(self, max_k, lookup_tokens, catch_up, remaining)
    log.write(json.dumps({"p": id(self), "src": c.source[0], "k": c.k, "cu": catch_up, "a": round(self.acceptance(), 3),
                          "room": round(self._loss_room(), 3) if self.verify_cost.measured(0) else None,
                          "v": [round(self.verify_cost(j) or 0, 3) for j in range(6)],
                          "m": [self.verify_cost.measured(j) for j in range(6)],
                          "td": round(self._draft_seconds.get("model").value, 4) if "model" in self._draft_seconds else None}) + "\n")
    log.flush()
    return c
pm.AdaptiveK.begin, pm.AdaptiveK.choose = begin, choose
from quickdraft.cli import main
sys.exit(main(sys.argv[1:]))
