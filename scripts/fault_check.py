#!/usr/bin/env python3
"""Device faults under load, against a server started with `--fault-injection`: --clients
threads send Triton generate requests the whole time while the script injects --faults
faults one after another (POST /v2/debug/fault, kinds alternating between --kinds), each
once the server is ready again. Per fault it measures how long readiness stays false (from
the injection to /v2/health/ready answering 200 again) and checks that it went false at
all; over the run, that every request ended (none outlived --timeout), that the failures
are the fault's (an error answer or a 503 while recovering, never a hang), and that the
server serves after the last one. Standard library only.

    python3 scripts/fault_check.py http://127.0.0.1:18470 [--faults 20]
        [--kinds illegal_address,launch_error] [--clients 8] [--max-tokens 64]

Prints one row per fault and a summary; exits 1 when a check failed.
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse


class Client:
    def __init__(self, base, timeout):
        u = urllib.parse.urlparse(base)
        self.host, self.port, self.timeout = u.hostname, u.port, timeout

    def request(self, method, path, body=None):
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            data = None if body is None else json.dumps(body)
            c.request(method, path, body=data, headers={"content-type": "application/json"})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def ready(self):
        try:
            return self.request("GET", "/v2/health/ready")[0] == 200
        except OSError:
            return False


def load(client, max_tokens, stop, counts, lock, i):
    n = 0
    while not stop.is_set():
        n += 1
        body = {"text_input": f"Request {i}-{n}: tell me a story about the sea",
                "max_tokens": max_tokens, "ignore_eos": True}
        t0 = time.time()
        try:
            status, out = client.request("POST", "/v2/models/ensemble/generate", body)
            kind = "ok" if status == 200 else f"http {status}"
            if status == 200 and b"error" in out[:200]:
                kind = "error answer"
        except TimeoutError:
            kind = "HUNG"
        except OSError as e:
            kind = f"connection: {type(e).__name__}"
        took = time.time() - t0
        with lock:
            counts[kind] = counts.get(kind, 0) + 1
            counts["_slowest"] = max(counts.get("_slowest", 0.0), took)
        if kind != "ok":
            time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--kinds", default="illegal_address,launch_error")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--settle", type=float, default=1.5,
                    help="seconds of load between readiness and the next fault")
    args = ap.parse_args()
    client = Client(args.url, args.timeout)
    probe = Client(args.url, 5.0)
    kinds = args.kinds.split(",")
    stop, lock, counts = threading.Event(), threading.Lock(), {}
    threads = [threading.Thread(target=load, args=(client, args.max_tokens, stop, counts, lock, i),
                                daemon=True) for i in range(args.clients)]
    if not probe.ready():
        raise SystemExit("the server is not ready")
    for t in threads:
        t.start()
    rows, failed = [], False
    print("| fault | kind | readiness went false | not ready for (s) |")
    print("|---|---|---|---|")
    for f in range(args.faults):
        time.sleep(args.settle)
        kind = kinds[f % len(kinds)]
        status, out = probe.request("POST", "/v2/debug/fault", {"fault": kind})
        if status != 200:
            print(f"fault {f}: injection answered {status} {out[:200]!r}")
            failed = True
            break
        t0, went_false, back = time.time(), False, None
        while time.time() - t0 < 120:
            if probe.ready():
                if went_false:
                    back = time.time() - t0
                    break
            else:
                went_false = True
            time.sleep(0.01)
        ok = went_false and back is not None
        failed |= not ok
        rows.append((kind, back))
        print(f"| {f + 1} | {kind} | {'yes' if went_false else 'NO'} | "
              f"{'%.2f' % back if back is not None else 'never ready'} |", flush=True)
        if back is None and went_false:
            break
    stop.set()
    for t in threads:
        t.join(args.timeout + 5)
    status, out = client.request("POST", "/v2/models/ensemble/generate",
                                 {"text_input": "After the faults", "max_tokens": 8})
    served = status == 200
    failed |= not served
    hung = counts.get("HUNG", 0) + sum(t.is_alive() for t in threads)
    failed |= hung > 0
    others = {k: v for k, v in counts.items() if not k.startswith("_")}
    for kind in kinds:
        times = sorted(b for k, b in rows if k == kind and b is not None)
        if times:
            print(f"{kind}: {len(times)} recoveries, not ready for median {times[len(times) // 2]:.2f} s, "
                  f"max {times[-1]:.2f} s")
    print(f"requests by outcome: {json.dumps(others, sort_keys=True)}; slowest "
          f"{counts.get('_slowest', 0):.1f} s; hung {hung}; served after the faults: {served}")
    print("FAIL" if failed else "PASS")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
