#!/usr/bin/env python3
"""llama.cpp reference fixtures for inflight's tokenizer and greedy decoding.

Uses llama-cpp-python (`pip install llama-cpp-python`) on a GGUF file and writes:

  tests/fixtures/tokenize_llamacpp.json  ids for ~80 varied strings (parse_special on,
      and off for strings holding special tokens), llama.cpp's detokenized text, the
      vocabulary's BOS/EOS/EOG ids, and the same strings' ids under other
      `tokenizer.ggml.pre` values (the file's metadata rewritten, vocabulary kept).
  tests/fixtures/greedy_llamacpp.json    5 prompts and their 64-token greedy
      continuations: prompt evaluated once, then one token at a time, argmax of the
      logits (no sampler, no stop at EOS), 2 threads, n_ctx 512, with the top-1/top-2
      logit margin of every step.

    python3 scripts/llama_ref.py MODEL.gguf [--out-dir tests/fixtures] [--bench]

--bench also prints llama.cpp's single-stream decode speed (2 threads, 128 tokens after
a fixed prompt, best of 3) for docs/perf.md.
"""

import argparse
import ctypes
import json
import os
import sys
import tempfile
import time

import numpy as np

import llama_cpp
from llama_cpp import Llama

N_THREADS = 2
N_CTX = 512
GREEDY_TOKENS = 64
BENCH_TOKENS = 128
PRE_VARIANTS = ["default", "gpt-2", "llama-bpe", "qwen2"]

SPECIAL_STRINGS = [
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text before<|endoftext|>text after",
    "<|im_start|><|im_end|><|im_start|>",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start|",
    "<repo_name>inflight<file_sep>src/lib.rs<empty_output>",
    "literal <|not_a_token|> stays text",
]

STRINGS = [
    "",
    " ",
    "Hello",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far, far away, there lived a curious little robot.",
    "I can't believe it's not butter; you're right, we'll see, they'd've known.",
    "DON'T SHOUT, IT'S LOUD. I'M HERE, WE'LL GO, THEY'D KNOW.",
    "rock 'n' roll, 'quoted', 'single'",
    "Café, naïve, résumé, façade, jalapeño, Ångström, Zürich",
    "Straße, Øresund, Łódź, Český Krumlov, İstanbul",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "ภาษาไทย",
    "Emoji: 😀🎉🚀 and 👍🏽",
    "Family: 👨‍👩‍👧‍👦 and flag 🏳️‍🌈 and 🇫🇷",
    "❤️ ✨ ☕ ∑ ∫ √ ∞ ≠ ≤",
    "e\u0301 (combining acute) vs é",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "0",
    "12",
    "123",
    "1234567890",
    "3.14159265358979323846",
    "1,000,000 and 2.5e-10 and -42 and +7",
    "Phone: +1 (555) 123-4567, year 2024, 10:30am",
    "٣٤٥ and ۱۲۳ and ४५६",
    "Ⅻ ½ ² ³ ①",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{v:?}\");\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "const add = (a, b) => a + b; // arrow\nconsole.log(`sum=${add(1, 2)}`);",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<html><body class=\"main\">&nbsp;&amp;</body></html>",
    "{\"key\": [1, 2, {\"nested\": null}], \"ok\": true}",
    "x += 1; y -= 2; z *= 3; w /= 4; a ||= b; c &&= d; e ??= f;",
    "if (a != b && c == d || !e) { return; }",
    "https://example.com/path?query=1&lang=en#frag",
    "user@example.com",
    "C:\\Users\\name\\file.txt",
    "    four leading spaces",
    "trailing spaces    ",
    "  both  ",
    "a  b   c    d",
    "\t\ttabs\tinside\t",
    "line1\nline2\n\nline4\n",
    "\n\n\n",
    "\r\nwindows\r\nnewlines\r\n",
    " \n \t \n ",
    "mixed \t\n whitespace \u00a0 nbsp \u3000 ideographic",
    "...!!!???",
    "—–-‒ dashes “quotes” ‘single’ «guillemets»",
    "$$$ %%% ^^^ &&& *** ((( )))",
    "!@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "Mr. Smith's car—a 1967 Mustang—was \"mint\".",
    "UPPERCASE lowercase MiXeDcAsE camelCase snake_case kebab-case",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "The year 1999 was followed by 2000, then 2001.",
    "Version v1.2.3-beta+build.45",
    "    \n    indented\n        more\n",
    "A\u00adsoft\u00adhyphen",
    "Tab\tseparated\tvalues\t1\t2\t3",
    "  Leading and trailing newline\n",
    "'s 't 're 've 'm 'll 'd",
    "hello'world's",
    "call(a,\n" + " " * 40 + "b)",
    "12345678901234567890 digits",
] + SPECIAL_STRINGS


def text_of(raw):
    return raw.decode("utf-8", errors="replace")


def detokenize(llm, ids, special):
    """llama_detokenize itself: Llama.detokenize drops pieces longer than 32 bytes."""
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    tokens = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, tokens, len(ids), buf, size, False, special)
    assert 0 <= n <= size, n
    return text_of(buf.raw[:n])


def load(path, **kw):
    return Llama(model_path=path, verbose=False, n_threads=N_THREADS, **kw)


def vocab_info(llm):
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n = llm.n_vocab()
    return {
        "n_vocab": n,
        "bos": llm.token_bos(),
        "eos": llm.token_eos(),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog_ids": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)],
    }


def tokenize_cases(llm):
    cases = []
    for s in STRINGS:
        ids = llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)
        case = {
            "text": s,
            "ids": ids,
            "detok": detokenize(llm, ids, False),
            "detok_special": detokenize(llm, ids, True),
        }
        plain = llm.tokenize(s.encode("utf-8"), add_bos=False, special=False)
        if plain != ids or s in SPECIAL_STRINGS:
            case["ids_plain"] = plain
        cases.append(case)
    return cases


def copy_with_pre(src, dst, pre):
    """The GGUF's metadata with tokenizer.ggml.pre replaced, and no tensors."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch=arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = pre if field.name == "tokenizer.ggml.pre" else field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def pre_variant_cases(path):
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            dst = os.path.join(tmp, f"{pre}.gguf")
            copy_with_pre(path, dst, pre)
            llm = load(dst, vocab_only=True)
            out[pre] = [
                llm.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in STRINGS
            ]
            del llm
    return out


def chat_prompt(path):
    import gguf
    import jinja2

    template = gguf.GGUFReader(path).fields["tokenizer.chat_template"].contents()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


def last_logits(llm):
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def greedy(llm, prompt_ids, n):
    llm.reset()
    llm.eval(prompt_ids)
    out, margins = [], []
    for _ in range(n):
        logits = last_logits(llm)
        top2 = np.argpartition(logits, -2)[-2:]
        best = int(np.argmax(logits))
        second = int(top2[0] if top2[1] == best else top2[1])
        out.append(best)
        margins.append(round(float(logits[best] - logits[second]), 4))
        llm.eval([best])
    return out, margins


def greedy_cases(llm, path):
    prompts = [
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        chat_prompt(path),
        "Here is a numbered list of the planets in the solar system:\n1.",
        "Once upon a time, in a small village at the edge of a dark forest,",
    ]
    cases = []
    for p in prompts:
        ids = llm.tokenize(p.encode("utf-8"), add_bos=False, special=True)
        gen, margins = greedy(llm, ids, GREEDY_TOKENS)
        cases.append({
            "prompt": p,
            "prompt_ids": ids,
            "generated_ids": gen,
            "generated_text": detokenize(llm, gen, True),
            "top2_margins": margins,
        })
    return cases


def bench(llm):
    prompt = "Write a short essay about the history of computing, from the abacus to modern GPUs."
    ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    best = None
    for _ in range(3):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(BENCH_TOKENS):
            llm.eval([int(np.argmax(last_logits(llm)))])
        t2 = time.perf_counter()
        run = (len(ids) / (t1 - t0), BENCH_TOKENS / (t2 - t1))
        best = run if best is None or run[1] > best[1] else best
    print(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}), {N_THREADS} threads: "
          f"prompt {len(ids)} tokens at {best[0]:.1f} tok/s, "
          f"decode {BENCH_TOKENS} tokens at {best[1]:.1f} tok/s (best of 3)")


def write(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="GGUF file")
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    ap.add_argument("--bench", action="store_true", help="print llama.cpp decode tokens/s")
    ap.add_argument("--no-fixtures", action="store_true", help="skip writing fixtures")
    args = ap.parse_args()
    model = os.path.basename(args.model)
    meta = {"llama_cpp_python": llama_cpp.__version__, "model": model}

    if not args.no_fixtures:
        os.makedirs(args.out_dir, exist_ok=True)
        vocab = load(args.model, vocab_only=True)
        write(os.path.join(args.out_dir, "tokenize_llamacpp.json"), {
            **meta,
            "tokenize": "add_bos=False; ids: special=True; ids_plain: special=False",
            "vocab": vocab_info(vocab),
            "cases": tokenize_cases(vocab),
            "pre_variants": pre_variant_cases(args.model),
        })
        del vocab

    llm = load(args.model, n_ctx=N_CTX, n_batch=N_CTX)
    if not args.no_fixtures:
        write(os.path.join(args.out_dir, "greedy_llamacpp.json"), {
            **meta,
            "n_threads": N_THREADS,
            "n_ctx": N_CTX,
            "method": "eval(prompt); repeat: argmax(last logits), eval([id]); no EOS stop",
            "cases": greedy_cases(llm, args.model),
        })
    if args.bench:
        bench(llm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
