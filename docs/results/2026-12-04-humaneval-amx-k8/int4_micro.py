import time, torch
from torch.ao.nn.quantized.dynamic import Linear as DQ
torch.set_num_threads(2)
def bench(f, n=200):
    for _ in range(10): f()
    ts=[]
    for _ in range(5):
        t=time.perf_counter()
        for _ in range(n): f()
        ts.append((time.perf_counter()-t)/n)
    return sorted(ts)[2]*1e6
print(hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"), hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"))
for (K, N) in [(896, 4864), (4864, 896), (896, 896)]:
    w = torch.randn(N, K) * 0.02
    x = torch.randn(1, K)
    lin = torch.nn.Linear(K, N, bias=False); lin.weight.data = w
    dq = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)
    with torch.inference_mode():
        t8 = bench(lambda: dq(x))
        res = {}
        for g in (32, 64, 128):
            wg = w.reshape(N, K // g, g)
            mn, mx = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
            scale = ((mx - mn) / 15).clamp(min=1e-8)
            zero = mn + scale * 8  # int4pack: w = (q - 8) * scale + zero
            q = ((wg - mn) / scale).round().clamp(0, 15).to(torch.int32).reshape(N, K)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            sz = torch.stack([scale.reshape(N, K // g), zero.reshape(N, K // g)], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
            xb = x.to(torch.bfloat16)
            f = lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, g, sz)
            y = f().float(); ref = x @ w.T
            err = ((y - ref).norm() / ref.norm()).item()
            res[g] = (bench(f), err)
        wb = w.to(torch.bfloat16); xb = x.to(torch.bfloat16)
        tb = bench(lambda: torch.nn.functional.linear(xb, wb))
    print(f"{K}x{N}: dyn int8 {t8:.1f}us, bf16 {tb:.1f}us, " + ", ".join(f"int4 g{g} {t:.1f}us err {e:.4f}" for g, (t, e) in res.items()))
