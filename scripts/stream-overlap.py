# Can a decode pass (memory-bound attention + small GEMMs) run beside a prefill pass's GEMMs
# on a second stream? Times each alone, one after the other, and both on two streams (also
# with the decode stream at high priority), 8B shapes (f16), 32 layers, medians of 5
# (docs/perf.md, twentieth pass). GPU machine:
#   python3 scripts/stream-overlap.py [PREFILL_ROWS DECODES CONTEXT]   # 8192 512 2100
import torch, torch.nn.functional as F, statistics, sys
dev = "cuda"; dt = torch.float16
P = int(sys.argv[1]) if len(sys.argv) > 1 else 8192   # prefill rows
D = int(sys.argv[2]) if len(sys.argv) > 2 else 512    # decode sequences
CTX = int(sys.argv[3]) if len(sys.argv) > 3 else 2100 # their context
L = 32
shapes = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]
W = [torch.randn(o, i, device=dev, dtype=dt) * 0.01 for i, o in shapes]
xp = [torch.randn(P, i, device=dev, dtype=dt) for i, o in shapes]
yp = [torch.empty(P, o, device=dev, dtype=dt) for i, o in shapes]
xd = [torch.randn(D, i, device=dev, dtype=dt) for i, o in shapes]
yd = [torch.empty(D, o, device=dev, dtype=dt) for i, o in shapes]
q = torch.randn(D, 32, 1, 128, device=dev, dtype=dt)
k = torch.randn(D, 8, CTX, 128, device=dev, dtype=dt)
v = torch.randn(D, 8, CTX, 128, device=dev, dtype=dt)
def prefill():
    for _ in range(L):
        for j in range(4): torch.matmul(xp[j], W[j].t(), out=yp[j])
def decode():
    for _ in range(L):
        torch.matmul(xd[0], W[0].t(), out=yd[0])
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        for j in range(1, 4): torch.matmul(xd[j], W[j].t(), out=yd[j])
lo = torch.cuda.Stream(priority=0); hi = torch.cuda.Stream(priority=-1)
def timed(fn):
    st = torch.cuda.Event(enable_timing=True); en = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); st.record(); fn(); en.record(); en.synchronize()
    return st.elapsed_time(en)
b2 = torch.cuda.Stream(priority=0)
def two_streams(other):
    """The prefill pass on `lo`, the decode pass on `other`, both after what came before."""
    cur = torch.cuda.current_stream(); ev = torch.cuda.Event(); ev.record(cur)
    lo.wait_event(ev); other.wait_event(ev)
    with torch.cuda.stream(lo): prefill()
    with torch.cuda.stream(other): decode()
    cur.wait_stream(lo); cur.wait_stream(other)
def both_same(): two_streams(b2)
def both_hi(): two_streams(hi)
def serial(): prefill(); decode()
for f in (prefill, decode, serial, both_same, both_hi): f()
torch.cuda.synchronize()
res = {n: [] for n in ("prefill", "decode", "serial", "two streams", "two streams, decode high priority")}
fns = dict(zip(res, (prefill, decode, serial, both_same, both_hi)))
for rep in range(5):
    for n, f in fns.items(): res[n].append(timed(f))
print(f"P={P} prefill rows, D={D} decodes at context {CTX}, {L} layers")
for n, t in res.items(): print(f"{n}: {statistics.median(t):.1f} ms  (all: {', '.join(f'{x:.1f}' for x in t)})")
