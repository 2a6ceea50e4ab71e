#!/usr/bin/env python3
"""Greedy answers to prompts that share prefixes, for comparing prefix caching on and off.

  shared_prefix_greedy.py run URL OUT.json [--words A,B,C,D] [--n 64] [--max-tokens 32]
  shared_prefix_greedy.py compare A.json B.json

`run` builds `--n` prompts over four shared prefixes of the given word counts (each
prompt its group's prefix and a tail of 0-12 words of its own), sends one prompt of each
group alone (so that the others may find its prefix cached), then all of them at once,
greedy, to Triton's generate endpoint at URL, and writes every answer to OUT.json.
`compare` counts the answers that differ between two runs and where they first do.
Standard library only.
"""

import json
import random
import sys
import threading
import urllib.request

WORDS = (
    "river stone light water field house garden window morning evening mountain valley "
    "forest story letter paper table chair music voice summer winter city street market "
    "bridge harbor island cloud storm thunder silver golden quiet gentle ancient modern"
).split()


def prompts(word_counts, n):
    rng = random.Random(7)
    prefixes = [" ".join(rng.choice(WORDS) for _ in range(w)) for w in word_counts]
    out = []
    for i in range(n):
        tail = " ".join(rng.choice(WORDS) for _ in range(i % 13))
        out.append((prefixes[i % len(prefixes)] + " " + tail).strip())
    return out


def generate(url, prompt, max_tokens):
    body = json.dumps(
        {"text_input": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    ).encode()
    req = urllib.request.Request(
        url.rstrip("/") + "/v2/models/ensemble/generate",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.load(resp)["text_output"]


def run(url, out_path, word_counts, n, max_tokens):
    groups = len(word_counts)
    if n < groups:
        sys.exit(f"--n {n}: at least one prompt per group ({groups}) is needed")
    ps = prompts(word_counts, n)
    answers = [None] * n
    for i in range(groups):
        answers[i] = generate(url, ps[i], max_tokens)
    errors = []

    def one(i):
        try:
            answers[i] = generate(url, ps[i], max_tokens)
        except Exception as e:  # reported below; the run fails
            errors.append(f"prompt {i}: {e}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit("\n".join(errors))
    with open(out_path, "w") as f:
        json.dump({"word_counts": word_counts, "max_tokens": max_tokens, "answers": answers}, f)
    print(f"{n} answers written to {out_path}")


def compare(a_path, b_path):
    ra, rb = json.load(open(a_path)), json.load(open(b_path))
    for key in ("word_counts", "max_tokens"):
        if ra[key] != rb[key]:
            sys.exit(f"the runs differ in {key}: {ra[key]} against {rb[key]}")
    a, b = ra["answers"], rb["answers"]
    groups = len(ra["word_counts"])
    if len(a) != len(b):
        sys.exit(f"{len(a)} answers against {len(b)}")
    differ = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            at = next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            differ.append((i, at))
    print(f"{len(a) - len(differ)} of {len(a)} answers identical")
    for i, at in differ:
        print(f"  prompt {i} (group {i % groups}) differs from character {at}")
    return 0 if not differ else 1


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "compare":
        sys.exit(compare(args[1], args[2]))
    if len(args) >= 3 and args[0] == "run":
        opts = dict(zip(args[3::2], args[4::2]))
        unknown = set(opts) - {"--words", "--n", "--max-tokens"}
        if unknown or len(args[3:]) % 2:
            sys.exit(f"unknown or incomplete options: {sorted(unknown) or args[3:]}\n{__doc__}")
        words = [int(w) for w in opts.get("--words", "8,40,120,300").split(",")]
        run(args[1], args[2], words, int(opts.get("--n", 64)), int(opts.get("--max-tokens", 32)))
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
