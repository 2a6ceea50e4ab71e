#!/usr/bin/env python3
"""Checks the GPU engine's logits (written by `inflight gpu-logits --out PREFIX`) against
HF transformers in fp32 on the same checkpoint: per position, relative error
||ours - hf|| / ||hf|| and top-1 agreement. Pass: max relative error < 2e-2 and top-1
agreement >= 99%. Prints a Markdown table; exits 1 on failure.

    python3 scripts/hf_compare.py CHECKPOINT_DIR PREFIX
"""
import json
import sys

import numpy as np
import torch
from transformers import LlamaForCausalLM


def main():
    ckpt, prefix = sys.argv[1], sys.argv[2]
    meta = json.load(open(prefix + ".json"))
    vocab = meta["vocab"]
    ours_all = np.fromfile(prefix + ".f32", dtype=np.float32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32,
                                             attn_implementation="eager").cuda().eval()
    # HF itself in bf16, for scale: what bf16 arithmetic alone costs against fp32.
    model16 = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.bfloat16,
                                               attn_implementation="eager").cuda().eval()
    off = 0
    rows = []
    errs, agree, total = [], 0, 0
    errs16, agree16 = [], 0
    # Each disagreement: the fp32 margin between HF's top token and ours, and the row's
    # largest |ours - hf| (a margin below it is a near-tie 16-bit noise can flip).
    flips = []
    for i, toks in enumerate(meta["tokens"]):
        n = len(toks)
        ours = ours_all[off:off + n * vocab].reshape(n, vocab)
        off += n * vocab
        with torch.no_grad():
            ref = model(torch.tensor([toks], device="cuda")).logits[0].float().cpu().numpy()
            ref16 = model16(torch.tensor([toks], device="cuda")).logits[0].float().cpu().numpy()
        rel = np.linalg.norm(ours - ref, axis=1) / np.linalg.norm(ref, axis=1)
        rel16 = np.linalg.norm(ref16 - ref, axis=1) / np.linalg.norm(ref, axis=1)
        errs16.extend(rel16.tolist())
        agree16 += int((ref16.argmax(1) == ref.argmax(1)).sum())
        top = (ours.argmax(1) == ref.argmax(1))
        for r in np.nonzero(~top)[0]:
            a, b = ref[r].argmax(), ours[r].argmax()
            flips.append((float(ref[r, a] - ref[r, b]), float(np.abs(ours[r] - ref[r]).max())))
        p = meta["prompt_lens"][i]
        rows.append((i, p, n - p, rel[:p].max(), rel[p:].max() if n > p else 0.0, top.mean()))
        errs.extend(rel.tolist())
        agree += int(top.sum())
        total += n
    assert off == ours_all.size, "logits file size does not match the tokens"
    print("| seq | prompt | decode steps | max rel err (prefill) | max rel err (decode) | top-1 agree |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2e} | {r[4]:.2e} | {100 * r[5]:.1f}% |")
    mx, mean, top1 = max(errs), float(np.mean(errs)), agree / total
    ok = mx < 2e-2 and top1 >= 0.99
    print(f"\nfor scale, HF transformers in bf16 against fp32 on the same positions: max rel err "
          f"{max(errs16):.2e}, mean {float(np.mean(errs16)):.2e}, top-1 agreement "
          f"{100 * agree16 / total:.2f}%")
    if flips:
        near = sum(m <= e for m, e in flips)
        print(f"top-1 disagreements: {len(flips)}; {near} of them are near-ties (HF fp32's margin "
              f"between the two tokens below that row's max |ours - hf|); margins "
              + ", ".join(f"{m:.2e} (row err {e:.2e})" for m, e in flips[:8]))
    print(f"all {total} positions: max rel err {mx:.2e}, mean {mean:.2e}, top-1 agreement "
          f"{100 * top1:.2f}% -> {'PASS' if ok else 'FAIL'} (need < 2e-2 and >= 99%)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
