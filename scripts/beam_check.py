#!/usr/bin/env python3
"""End-to-end check of beam search on a server (the GPU's in scripts/gpu-check.sh step 3g)
against a CPU-engine server of the same model: TensorRT-LLM's shapes, the beams best
first, each beam's cumulative log-probability its tokens' score under the CPU engine's
fp32 logits (within --tol), the best beam as good as the CPU engine's own search's,
beam_width 1 the greedy answer, and streamed events that carry whole beams. Standard
library only.

    python3 scripts/beam_check.py http://localhost:18500 --cpu http://localhost:18510 [--tol 5e-2]

Prints one line per check and exits 1 when one failed.
"""
import argparse
import json
import math
import sys
import urllib.request

import checkutil

IDS = [5, 17, 43, 9, 20, 7, 7, 50, 31, 64, 12, 88]
N = 6
W = 4


def score(cpu, tokens):
    """The CPU engine's log-probability of `tokens` after IDS (its fp32 logits)."""
    got = checkutil.post(cpu, "/v2/models/tensorrt_llm/generate",
                         {"input_ids": IDS + tokens, "request_output_len": 1,
                          "ignore_eos": True, "return_context_logits": True})
    ctx = got["context_logits"]
    vocab = len(ctx) // (len(IDS) + len(tokens))
    total = 0.0
    for i, t in enumerate(tokens):
        row = ctx[(len(IDS) - 1 + i) * vocab:(len(IDS) + i) * vocab]
        m = max(row)
        lse = m + math.log(sum(math.exp(x - m) for x in row))
        total += row[t] - lse
    return total


def beams(base, width, stream=False):
    body = {"input_ids": IDS, "request_output_len": N, "beam_width": width,
            "ignore_eos": True, "return_log_probs": True}
    if not stream:
        return checkutil.post(base, "/v2/models/tensorrt_llm/generate", body)
    body["stream"] = True
    r = urllib.request.Request(base + "/v2/models/tensorrt_llm/generate_stream",
                               data=json.dumps(body).encode(),
                               headers={"content-type": "application/json"})
    with urllib.request.urlopen(r, timeout=300) as f:
        text = f.read().decode()
    return [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: ")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--cpu", required=True)
    ap.add_argument("--tol", type=float, default=5e-2)
    args = ap.parse_args()
    check = checkutil.Checks()
    got = beams(args.base, W)
    out, cum = got["output_ids"], got["cum_log_probs"]
    check(f"shapes: {W} beams of {N} tokens", len(out) == W and all(len(b) == N for b in out)
          and got["sequence_length"] == [N] * W, got)
    check("best first", all(a >= b for a, b in zip(cum, cum[1:])), cum)
    check("output_log_probs sum to cum_log_probs",
          all(abs(sum(l) - c) < 1e-3 for l, c in zip(got["output_log_probs"], cum)), got)
    errs = [abs(score(args.cpu, b) - c) for b, c in zip(out, cum)]
    worst = max(errs)
    check(f"each beam's sum within {args.tol} of its CPU score", worst < args.tol, errs)
    cpu = beams(args.cpu, W)
    same = sum(1 for b in out if b in cpu["output_ids"])
    gpu_best = score(args.cpu, out[0])
    check("the best beam as good as the CPU engine's search's",
          gpu_best >= cpu["cum_log_probs"][0] - args.tol, (gpu_best, cpu["cum_log_probs"][0]))
    print(f"INFO beams vs CPU: worst sum error {worst:.2e}, {same}/{W} beams the CPU's too")
    greedy = checkutil.post(args.base, "/v2/models/tensorrt_llm/generate",
                            {"input_ids": IDS, "request_output_len": N, "ignore_eos": True})
    one = checkutil.post(args.base, "/v2/models/tensorrt_llm/generate",
                         {"input_ids": IDS, "request_output_len": N, "ignore_eos": True,
                          "beam_width": 1})
    check("beam_width 1 is greedy", one["output_ids"] == greedy["output_ids"], (one, greedy))
    events = beams(args.base, W, stream=True)
    whole = all(len(e["output_ids"]) == W and all(len(b) == i + 1 for b in e["output_ids"])
                for i, e in enumerate(events))
    check("streamed: one event a step, each with whole beams", len(events) == N and whole,
          [e.get("output_ids") for e in events][:2])
    check("streamed: the last event is the answer",
          events and events[-1]["output_ids"] == out and events[-1].get("finish_reason") == "length",
          events[-1:] if events else None)
    sys.exit(1 if check.failed else 0)


if __name__ == "__main__":
    main()
