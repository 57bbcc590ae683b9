"""Profile the int8 demo draft's one-token decoder step (run with the project .venv's python)."""
import sys, time, torch
from quickdraft import load_model
torch.set_num_threads(2)
q = sys.argv[1] if len(sys.argv) > 1 else "int8"
if q == "int8":
    m = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", quantization="int8")
else:
    m = load_model("qwen2.5-coder-0.5b-instruct", dtype=q)
print(m.module.model.layers[0])
ids = torch.randint(0, 30000, (1, 150))
with torch.inference_mode():
    out = m.module(ids, use_cache=True)
    pkv = out.past_key_values
    tok = ids[:, -1:]
    def step(n):
        nonlocal_pkv = pkv
        for i in range(n):
            o = m.module.model(tok, past_key_values=nonlocal_pkv, use_cache=True)
            h = o.last_hidden_state
    for _ in range(3): step(1)
    ts=[]
    for _ in range(5):
        t=time.perf_counter(); step(10); ts.append((time.perf_counter()-t)/10)
    print("decoder-only step ms (median of 5x10):", sorted(ts)[2]*1e3)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as p:
        step(10)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
