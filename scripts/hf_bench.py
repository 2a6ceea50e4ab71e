#!/usr/bin/env python3
"""HF transformers baseline for scripts/gpu-bench.sh (issue 6): the same checkpoint on
the same GPU, bf16, SDPA attention, greedy `model.generate` with the KV cache, every
answer forced to its full length (min_new_tokens = max_new_tokens), random prompt ids.

  - batch-1 decode, ms per output token: (t(1 + n tokens) - t(1 token)) / n, the median
    of --reps runs each, after a warm-up;
  - with --batch B: output tok/s of one generate of B prompts of --batch-in tokens and
    --batch-out new tokens (prefill included, as the server's throughput counts it);
  - with --ttft N: one N-token prompt, 1 new token, median of --reps (ms).

Whatever fails (out of memory, an old transformers) is recorded under "errors" and left
out; the JSON is written in any case.

    python3 scripts/hf_bench.py CHECKPOINT_DIR --json OUT.json [--batch 64] [--ttft 2048]
"""
import argparse
import json
import statistics
import sys
import time
import traceback

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--json", required=True)
    ap.add_argument("--b1-in", type=int, default=128)
    ap.add_argument("--b1-out", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=0, help="0: no batched run")
    ap.add_argument("--batch-in", type=int, default=128)
    ap.add_argument("--batch-out", type=int, default=128)
    ap.add_argument("--ttft", type=int, default=0, help="prompt length; 0: no TTFT run")
    ap.add_argument("--cache", default="dynamic",
                    help="dynamic (default) or static (cache_implementation='static')")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    res = {"checkpoint": args.checkpoint, "torch": torch.__version__, "cache": args.cache,
           "attn": args.attn, "errors": []}

    def save():
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)

    def fail(what, e):
        msg = f"{what}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        res["errors"].append(msg)
        print(msg, file=sys.stderr)
        traceback.print_exc(limit=2)
        torch.cuda.empty_cache()
        save()

    try:
        import transformers
        from transformers import AutoModelForCausalLM
        res["transformers"] = transformers.__version__
        t0 = time.perf_counter()
        kw = dict(torch_dtype=torch.bfloat16, attn_implementation=args.attn)
        try:  # straight onto the GPU (needs accelerate)
            model = AutoModelForCausalLM.from_pretrained(args.checkpoint, device_map="cuda", **kw)
        except Exception:  # noqa: BLE001
            model = AutoModelForCausalLM.from_pretrained(args.checkpoint, **kw).cuda()
        model = model.eval()
        res["load_s"] = time.perf_counter() - t0
        res["device"] = torch.cuda.get_device_name()
    except Exception as e:  # noqa: BLE001
        fail("load", e)
        print(json.dumps(res))
        return
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    extra = {}
    if args.cache != "dynamic":
        extra["cache_implementation"] = args.cache

    def prompt(batch, n):
        # Ids below the special range, like the server's prompts.
        return torch.randint(0, min(vocab, 128000), (batch, n), generator=gen).cuda()

    @torch.inference_mode()
    def generate(ids, n):
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             use_cache=True, pad_token_id=0, **extra)
        got = out.shape[1] - ids.shape[1]
        assert got == n, f"generated {got} tokens, asked {n}"

    def timed(ids, n, reps):
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            generate(ids, n)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    try:
        ids = prompt(1, args.b1_in)
        generate(ids, 8)  # warm-up
        t1 = timed(ids, 1, args.reps)
        tn = timed(ids, 1 + args.b1_out, args.reps)
        res.update(b1_in=args.b1_in, b1_out=args.b1_out, b1_first_token_ms=t1 * 1e3,
                   b1_ms_per_token=(tn - t1) / args.b1_out * 1e3)
        print(f"HF batch-1 decode: {res['b1_ms_per_token']:.2f} ms/token "
              f"({args.b1_in} in, {args.b1_out} out)")
        save()
    except Exception as e:  # noqa: BLE001
        fail("batch-1 decode", e)

    if args.ttft:
        try:
            ids = prompt(1, args.ttft)
            generate(ids, 1)  # warm-up at this length
            t = timed(ids, 1, args.reps)
            res.update(ttft_len=args.ttft, ttft_ms=t * 1e3)
            print(f"HF TTFT, {args.ttft}-token prompt: {t * 1e3:.1f} ms")
            save()
        except Exception as e:  # noqa: BLE001
            fail(f"TTFT {args.ttft}", e)

    if args.batch:
        try:
            ids = prompt(args.batch, args.batch_in)
            generate(ids, 4)  # warm-up at this batch
            t = timed(ids, args.batch_out, 1)
            res.update(batch=args.batch, batch_in=args.batch_in, batch_out=args.batch_out,
                       batch_s=t, batch_tok_s=args.batch * args.batch_out / t)
            print(f"HF batch {args.batch}, {args.batch_in}/{args.batch_out}: "
                  f"{res['batch_tok_s']:,.0f} output tok/s")
            save()
        except Exception as e:  # noqa: BLE001
            fail(f"batch {args.batch}", e)
    save()
    print(json.dumps({k: v for k, v in res.items() if k != "errors"}))


if __name__ == "__main__":
    main()
