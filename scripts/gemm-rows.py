# Times the 8B's four linear layers (f16, through PyTorch's cuBLAS) at M rows as one GEMM
# and as row pieces of at most 1,024 (even pieces, or 1,024 and the rest; the better one
# is shown), 30 interleaved repetitions of 3 calls each, medians: whether a served
# iteration's GEMMs gain from cutting their rows to whole waves (docs/perf.md, twentieth
# pass). GPU machine: python3 scripts/gemm-rows.py [ROWS...]
import torch, statistics, sys
dev = "cuda"; dt = torch.float16
shapes = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
ms = [int(a) for a in sys.argv[1:]] or [768, 1024, 1280, 1536, 1664, 1792, 1836, 1920, 2048, 2304, 2560, 3072, 4096]
top = max(ms)
W = {k: torch.randn(o, i, device=dev, dtype=dt) * 0.01 for k, (i, o) in shapes.items()}
X = {k: torch.randn(top, i, device=dev, dtype=dt) for k, (i, o) in shapes.items()}
Y = {k: torch.empty(top, o, device=dev, dtype=dt) for k, (i, o) in shapes.items()}
def run(k, pieces):
    s = 0
    for p in pieces:
        torch.matmul(X[k][s:s+p], W[k].t(), out=Y[k][s:s+p]); s += p
def pieces_of(m, cap):
    n = -(-m // cap); base = -(-m // n); out = []
    while m > 0: out.append(min(base, m)); m -= base
    return out
st = torch.cuda.Event(enable_timing=True); en = torch.cuda.Event(enable_timing=True)
for k in shapes:
    for m in ms: run(k, [m])
torch.cuda.synchronize()
print("| rows | layer | one GEMM µs | TFLOP/s | pieces | pieces µs | TFLOP/s | gain |")
for m in ms:
    for k, (i, o) in shapes.items():
        variants = {"one": [m], "split": pieces_of(m, 1024), "first1024": ([1024, m - 1024] if m > 1024 else [m])}
        t = {v: [] for v in variants}
        for rep in range(30):
            for v, pcs in variants.items():
                st.record(); 
                for _ in range(3): run(k, pcs)
                en.record(); en.synchronize(); t[v].append(st.elapsed_time(en) * 1e3 / 3)
        fl = 2 * m * i * o / 1e6
        one = statistics.median(t["one"]); sp = statistics.median(t["split"]); f1 = statistics.median(t["first1024"])
        best = min(sp, f1); bp = variants["split"] if sp <= f1 else variants["first1024"]
        print(f"| {m} | {k} | {one:.1f} | {fl/one:.0f} | {bp} | {best:.1f} | {fl/best:.0f} | {100*(one-best)/one:+.1f}% |")
