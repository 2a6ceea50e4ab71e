#!/usr/bin/env python3
"""Soak: mixed traffic with disconnects against a running server for --minutes, sampling
the server's resident memory and open descriptors (from /proc/<pid>) every --every
seconds; prints the curve and checks it is flat: memory at the end within --rss-tol of its
level after --warmup minutes (half the run by default), descriptors back to the baseline once the traffic stops,
the server idle (no request running, no KV block held) and ready. The CPU engine's KV
cache is committed as its blocks are first written, so serve a cache the warm-up fills
(scripts/soak.sh does). Standard library only.

Traffic, `--clients` threads each picking at random: Triton generate (text and ids),
generate_stream read whole or dropped after its first event, OpenAI chat (whole, or
streamed and dropped), KServe infer, beam search, a JSON-schema guided answer, a request
cancelled by Triton's stop request, and a malformed body.

    python3 scripts/soak.py http://localhost:18400 --pid PID [--metrics http://localhost:18402]
        [--minutes 30] [--clients 6]

Exits 1 when a check failed or a request got a 5xx.
"""
import argparse
import http.client
import json
import random
import threading
import time
import urllib.parse


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fds(pid):
    import os
    return len(os.listdir(f"/proc/{pid}/fd"))


class Client:
    def __init__(self, base):
        u = urllib.parse.urlparse(base)
        self.host, self.port = u.hostname, u.port

    def conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=120)

    def post(self, path, body, read=True):
        c = self.conn()
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        c.request("POST", path, body=data, headers={"content-type": "application/json"})
        r = c.getresponse()
        out = r.read() if read else r.read(64)
        c.close()
        return r.status, out

    def get(self, path):
        c = self.conn()
        c.request("GET", path)
        r = c.getresponse()
        out = r.read()
        c.close()
        return r.status, out


KINDS = ["generate", "ids", "stream_whole", "stream_drop", "chat", "chat_drop", "kserve", "beams",
         "guided", "stopped", "malformed"]


def one(cl, rng, n):
    """One request of a random kind; returns (kind, status)."""
    prompt = rng.choice(["Tell me about the sea.", "Write a haiku on rust.", "List three colours.",
                         "What is 2 + 2?", "Describe a quiet morning in a long sentence."])
    kind = rng.choice(KINDS)
    if kind == "generate":
        return kind, cl.post("/v2/models/ensemble/generate",
                             {"text_input": prompt, "max_tokens": rng.randint(4, 48)})[0]
    if kind == "ids":
        return kind, cl.post("/v2/models/tensorrt_llm/generate",
                             {"input_ids": [1, 2, 3, 4, 5, 6], "request_output_len": 16})[0]
    if kind in ("stream_whole", "stream_drop"):
        return kind, cl.post("/v2/models/ensemble/generate_stream",
                             {"text_input": prompt, "max_tokens": 64, "stream": True},
                             read=kind == "stream_whole")[0]
    if kind in ("chat", "chat_drop"):
        body = {"model": "ensemble", "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 48, "stream": kind == "chat_drop"}
        return kind, cl.post("/v1/chat/completions", body, read=kind == "chat")[0]
    if kind == "kserve":
        body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [prompt]},
                           {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [12]}]}
        return kind, cl.post("/v2/models/ensemble/infer", body)[0]
    if kind == "beams":
        return kind, cl.post("/v2/models/ensemble/generate",
                             {"text_input": prompt, "max_tokens": 12, "beam_width": 3})[0]
    if kind == "guided":
        body = {"model": "ensemble", "messages": [{"role": "user", "content": prompt}], "max_tokens": 40,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}}
        return kind, cl.post("/v1/chat/completions", body)[0]
    if kind == "stopped":
        rid = f"soak-{n}"
        t = threading.Thread(target=cl.post, args=("/v2/models/ensemble/generate",
                             {"id": rid, "text_input": prompt, "max_tokens": 200}))
        t.start()
        time.sleep(0.3)
        status = cl.post("/v2/models/ensemble/generate", {"id": rid, "stop": True})[0]
        t.join()
        return kind, status
    return kind, cl.post("/v2/models/ensemble/generate", b'{"text_input": "x", "max_tokens": -3')[0]


def gauges(metrics):
    """(active requests, KV blocks used) from the metrics port's text; (0, 0) without one."""
    if not metrics:
        return (0, 0)
    _, body = Client(metrics).get("/metrics")
    active = used = None
    for line in body.decode().splitlines():
        if line.startswith("nv_trt_llm_request_metrics") and 'request_type="active"' in line:
            active = float(line.split()[-1])
        if line.startswith("nv_trt_llm_kv_cache_block_metrics") and 'kv_cache_block_type="used"' in line:
            used = float(line.split()[-1])
    return (active, used)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--every", type=float, default=60)
    ap.add_argument("--rss-tol", type=float, default=0.10)
    ap.add_argument("--warmup", type=float,
                    help="minutes after which memory must stay within --rss-tol (default: half the run)")
    ap.add_argument("--kinds", help="only these kinds of request (comma-separated)")
    ap.add_argument("--metrics", help="the metrics port's URL: active requests and KV blocks used end at 0")
    args = ap.parse_args()
    if args.kinds:
        KINDS[:] = args.kinds.split(",")
    cl = Client(args.base)
    base_fds = fds(args.pid)
    stop = time.monotonic() + args.minutes * 60
    counts, fivexx, lock = {}, [], threading.Lock()

    def worker(i):
        rng = random.Random(i)
        n = 0
        while time.monotonic() < stop:
            n += 1
            try:
                kind, status = one(cl, rng, f"{i}-{n}")
            except Exception as e:  # a dropped connection on our side is part of the test
                kind, status = "error", repr(e)[:80]
            with lock:
                counts[(kind, status)] = counts.get((kind, status), 0) + 1
                if isinstance(status, int) and status >= 500:
                    fivexx.append((kind, status))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    curve = []
    while time.monotonic() < stop:
        curve.append((round((time.monotonic() - t0) / 60, 1), rss_kib(args.pid) // 1024, fds(args.pid)))
        print(f"t {curve[-1][0]:5.1f} min  rss {curve[-1][1]} MiB  fds {curve[-1][2]}", flush=True)
        time.sleep(min(args.every, max(0.0, stop - time.monotonic())))
    for t in threads:
        t.join()
    # Idle: what is left once the traffic stops.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if fds(args.pid) <= base_fds + 2 and gauges(args.metrics) == (0, 0):
            break
        time.sleep(1)
    end = (round((time.monotonic() - t0) / 60, 1), rss_kib(args.pid) // 1024, fds(args.pid))
    print(f"end {end[0]:5.1f} min  rss {end[1]} MiB  fds {end[2]} (baseline fds {base_fds})")
    total = sum(counts.values())
    print(f"INFO {total} requests: " + ", ".join(f"{k[0]} {k[1]}: {v}" for k, v in sorted(counts.items(), key=str)))
    warmup = args.minutes / 2 if args.warmup is None else args.warmup
    warm = next((r for m, r, _ in curve if m >= warmup), curve[-1][1])
    ok = True
    checks = [
        (f"memory flat: {end[1]} MiB at the end against {warm} MiB after the warm-up (tol {args.rss_tol:.0%})",
         end[1] <= warm * (1 + args.rss_tol)),
        (f"descriptors back to the baseline: {end[2]} against {base_fds}", end[2] <= base_fds + 2),
        (f"no 5xx ({len(fivexx)})", not fivexx),
        ("ready at the end", cl.get("/v2/health/ready")[0] == 200),
        (f"idle at the end: (active requests, KV blocks used) = {gauges(args.metrics)}",
         gauges(args.metrics) == (0, 0)),
    ]
    for name, passed in checks:
        print(("PASS " if passed else "FAIL ") + name)
        ok &= passed
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
