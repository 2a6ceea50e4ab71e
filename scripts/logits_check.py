#!/usr/bin/env python3
"""End-to-end check of return_context_logits / return_generation_logits on a server (the
GPU's in scripts/gpu-check.sh step 3e) against a CPU-engine server of the same model:
the shapes, each greedy token the argmax of its row, the last prompt position's row the
first token's, and every row within --tol (max |a - b| / max |b|) of the CPU engine's
fp32 rows for the same tokens. Standard library only.

    python3 scripts/logits_check.py http://localhost:18500 --cpu http://localhost:18510 [--tol 2e-2]

Prints one line per check and exits 1 when one failed.
"""
import argparse
import sys

import checkutil

IDS = [5, 17, 43, 9, 20, 7, 7, 50, 31, 64, 12, 88]
N = 6


def rel_err(a, b):
    scale = max(max(abs(x) for x in b), 1e-6)
    return max(abs(x - y) for x, y in zip(a, b)) / scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--cpu", required=True)
    ap.add_argument("--tol", type=float, default=2e-2)
    args = ap.parse_args()
    check = checkutil.Checks()
    body = {"input_ids": IDS, "request_output_len": N, "ignore_eos": True,
            "return_context_logits": True, "return_generation_logits": True}
    got = checkutil.post(args.base, "/v2/models/tensorrt_llm/generate", body)
    out = got["output_ids"]
    ctx, gen = got["context_logits"], got["generation_logits"]
    vocab = len(ctx) // len(IDS)
    check("shapes: [prompt, vocab] and [1, tokens, vocab]",
          len(out) == N and len(ctx) == len(IDS) * vocab and len(gen) == N * vocab,
          (len(out), len(ctx), len(gen)))
    rows = [gen[i * vocab:(i + 1) * vocab] for i in range(N)]
    argmax = [max(range(vocab), key=r.__getitem__) for r in rows]
    check("greedy: each token is its generation row's argmax", argmax == out, (argmax, out))
    check("the last prompt position's row is the first token's", ctx[-vocab:] == rows[0])
    # The CPU engine's rows for the same tokens: prompt + output as one prompt scores them.
    ref = checkutil.post(args.cpu, "/v2/models/tensorrt_llm/generate",
                         {"input_ids": IDS + out, "request_output_len": 1, "ignore_eos": True,
                          "return_context_logits": True})["context_logits"]
    p = len(IDS)
    e_ctx = rel_err(ctx, ref[:p * vocab])
    e_gen = rel_err(gen, ref[(p - 1) * vocab:(p - 1 + N) * vocab])
    check(f"context logits within {args.tol} of the CPU engine's", e_ctx < args.tol, e_ctx)
    check(f"generation logits within {args.tol} of the CPU engine's", e_gen < args.tol, e_gen)
    print(f"INFO logits vs CPU: context {e_ctx:.2e}, generation {e_gen:.2e}")
    plain = checkutil.post(args.base, "/v2/models/tensorrt_llm/generate",
                           {"input_ids": IDS, "request_output_len": 2})
    check("none when not asked", "context_logits" not in plain and "generation_logits" not in plain, plain)
    sys.exit(1 if check.failed else 0)


if __name__ == "__main__":
    main()
