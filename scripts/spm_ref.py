#!/usr/bin/env python3
"""llama.cpp reference fixtures for inflight's SentencePiece (GGUF `llama`) tokenizer.

Reads the vocab-only GGUFs of llama.cpp's own tokenizer tests (its `models/` folder,
also vendored in the llama-cpp-python sdist under `vendor/llama.cpp/models`) and writes,
under tests/fixtures/spm/:

  ggml-vocab-llama-spm.gguf(.inp/.out)  copied as they are: Llama-2's vocabulary and
      llama.cpp's test-tokenizer-0 strings with their expected ids.
  phi3_vocab.json   ggml-vocab-phi-3.gguf as changes to the Llama vocabulary (Phi-3's
      extends it: 64 more tokens, other types for ids 0 and 2, other scores for a few,
      its name, eos and chat template); checked here to rebuild the file's vocabulary.
  tokenize_spm_llamacpp.json  for three vocabularies (llama-spm; the same with
      `tokenizer.ggml.add_space_prefix = false`, as Gemma's files have; phi-3): llama.cpp's
      ids for ~150 strings with special tokens parsed and not, llama_detokenize's text of
      those ids and of BOS + ids, the BOS/EOS/EOG ids, and a digest of every id's
      `token_to_piece(special = true)` bytes.

Uses llama-cpp-python (`pip install llama-cpp-python`; or its sdist's python package with
LLAMA_CPP_LIB_PATH naming a libllama built from the same sources):

    python3 scripts/spm_ref.py LLAMA_CPP_MODELS_DIR [--out-dir tests/fixtures/spm]
"""

import argparse
import ctypes
import hashlib
import json
import os
import shutil
import sys
import tempfile

import gguf
import llama_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import SPECIAL_STRINGS, STRINGS, detokenize, load, vocab_info  # noqa: E402

LLAMA = "ggml-vocab-llama-spm.gguf"
PHI3 = "ggml-vocab-phi-3.gguf"
SEP = "\n__ggml_vocab_test__\n"

# Special tokens of the Llama and Phi-3 vocabularies, written in every position: alone,
# glued to text, around spaces and newlines (Phi-3 strips whitespace after most of its
# own), unfinished, and Mistral's [INST] (plain text in these vocabularies).
SPM_SPECIAL_STRINGS = [
    "<s>",
    "</s>",
    "<unk>",
    "<s>[INST] Hello [/INST]",
    "<s>[INST] What is 2+2? [/INST] 4</s>[INST] And 3+3? [/INST]",
    "text<s>text",
    "<s> leading space after",
    " <s> ",
    "</s></s>",
    "<s>\nnewline after",
    "hi</s>  there",
    "<s",
    "<|user|>\nHello<|end|>\n<|assistant|>\n",
    "<|system|> You are helpful. <|end|>\n<|user|>\n  Hi!<|end|>",
    "<|endoftext|> x",
    "</s>  \n x",
    " <|user|>  spaced \t\n",
    "<|placeholder1|><|placeholder2|>",
    "[PAD32011] pad",
    "<|user|",
    "<s> <s>",
    "<unk> unk",
]

# Byte fallback (characters with no token), whitespace in runs and kinds, the ▁ character
# itself, and longer prose.
SPM_STRINGS = [
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕕𝕠𝕦𝕓𝕝𝕖",
    "nul\x00byte and \x7f del and \x01 soh",
    "私はガラスを食べられます。それは私を傷つけません。",
    "ꦧꦱꦗꦮ Javanese, ᎣᏏᏲ Cherokee, ⴰⵣⵓⵍ Tifinagh",
    "\U0010ffff\U0001f9d1\u200d\U0001f4bb",
    "▁ lower one eighth ▁▁ block",
    " ",
    "  ",
    "     ",
    "\n",
    " \n",
    "\n ",
    "\t \t",
    "a\n\n\nb",
    "end with space ",
    "Ça va? Ünïcödé ŝpëçïàl çhàrs",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness, it was the epoch of belief, it was the epoch of "
    "incredulity, it was the season of Light, it was the season of Darkness.",
]


def inp_strings(models):
    with open(os.path.join(models, LLAMA + ".inp"), encoding="utf-8") as f:
        raw = f.read()
    parts = raw.split(SEP)
    assert parts[-1] == "", "the .inp file ends with the separator"
    return parts[:-1]


def all_strings(models):
    seen, out = set(), []
    plain = [s for s in STRINGS if s not in SPECIAL_STRINGS]
    for s in plain + inp_strings(models) + SPM_STRINGS + SPM_SPECIAL_STRINGS:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def pieces_digest(llm):
    """sha256 over every id's token_to_piece(special = true): u32 LE length, bytes."""
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    h = hashlib.sha256()
    buf = ctypes.create_string_buffer(256)
    for i in range(llm.n_vocab()):
        n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, True)
        assert 0 <= n <= len(buf), (i, n)
        h.update(n.to_bytes(4, "little"))
        h.update(buf.raw[:n])
    return h.hexdigest()


def cases(llm, strings):
    bos = llm.token_bos()
    out = []
    for s in strings:
        raw = s.encode("utf-8")
        ids = llm.tokenize(raw, add_bos=False, special=True)
        plain = llm.tokenize(raw, add_bos=False, special=False)
        with_bos = llm.tokenize(raw, add_bos=True, special=True)
        assert with_bos == [bos] + ids, s
        out.append(
            {
                "text": s,
                "ids": ids,
                "ids_plain": plain,
                "detok": detokenize(llm, ids, False),
                "detok_special": detokenize(llm, ids, True),
                "detok_bos": detokenize(llm, [bos] + ids, True),
            }
        )
    return out


def vocab_fixture(path, strings):
    llm = load(path, vocab_only=True)
    info = vocab_info(llm)
    info["pieces_sha256"] = pieces_digest(llm)
    result = {"vocab": info, "cases": cases(llm, strings)}
    del llm
    return result


def copy_with(src, dst, extra):
    """The GGUF's metadata, with `extra` ({key: (value, GGUFValueType)}) added or
    replaced, and no tensors."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch=arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name in extra:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for key, (value, vtype) in extra.items():
        writer.add_key_value(key, value, vtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def fields(path):
    r = gguf.GGUFReader(path)
    return {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.")}


def phi3_delta(models):
    """Phi-3's vocabulary as changes to Llama's; rebuilt and compared before returning."""
    base, phi = fields(os.path.join(models, LLAMA)), fields(os.path.join(models, PHI3))
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
    bt, bs, by = (base[k] for k in keys)
    pt, ps, py = (phi[k] for k in keys)
    n = len(bt)
    assert pt[:n] == bt, "Phi-3 keeps Llama's tokens"
    delta = {
        "origin": f"llama.cpp models/{PHI3}, as changes to models/{LLAMA}",
        "general.name": phi["general.name"],
        "tokenizer.ggml.bos_token_id": phi["tokenizer.ggml.bos_token_id"],
        "tokenizer.ggml.eos_token_id": phi["tokenizer.ggml.eos_token_id"],
        "tokenizer.ggml.unknown_token_id": phi["tokenizer.ggml.unknown_token_id"],
        "tokenizer.ggml.padding_token_id": phi["tokenizer.ggml.padding_token_id"],
        "tokenizer.ggml.add_bos_token": phi["tokenizer.ggml.add_bos_token"],
        "tokenizer.chat_template": phi["tokenizer.chat_template"],
        "token_type": {str(i): py[i] for i in range(n) if py[i] != by[i]},
        "scores": {str(i): ps[i] for i in range(n) if ps[i] != bs[i]},
        "appended": [[pt[i], ps[i], py[i]] for i in range(n, len(pt))],
    }
    # Rebuild, as tests/tokenizer_spm.rs does, and compare.
    tokens, scores, types = list(bt), list(bs), list(by)
    for i, t in delta["token_type"].items():
        types[int(i)] = t
    for i, s in delta["scores"].items():
        scores[int(i)] = s
    for text, score, ty in delta["appended"]:
        tokens.append(text)
        scores.append(score)
        types.append(ty)
    assert (tokens, scores, types) == (pt, ps, py)
    for k in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.add_eos_token"):
        assert phi.get(k) == base.get(k), k
    assert "tokenizer.ggml.add_space_prefix" not in phi
    return delta


def dumps(obj, indent=""):
    """JSON with objects and lists of objects one member a line, anything else inline."""
    inner = indent + " "
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        items = [inner + json.dumps(x, ensure_ascii=False) for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return json.dumps(obj, ensure_ascii=False)


def write(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(obj) + "\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", help="llama.cpp's models/ folder")
    ap.add_argument("--out-dir", default="tests/fixtures/spm")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    for name in (LLAMA, LLAMA + ".inp", LLAMA + ".out"):
        shutil.copyfile(os.path.join(args.models, name), os.path.join(args.out_dir, name))
    write(os.path.join(args.out_dir, "phi3_vocab.json"), phi3_delta(args.models))

    strings = all_strings(args.models)
    llama = os.path.join(args.models, LLAMA)
    vocabs = {"llama-spm": vocab_fixture(llama, strings)}
    with tempfile.TemporaryDirectory() as tmp:
        bare = os.path.join(tmp, "llama-spm-no-prefix.gguf")
        copy_with(llama, bare, {"tokenizer.ggml.add_space_prefix": (False, gguf.GGUFValueType.BOOL)})
        vocabs["llama-spm-no-prefix"] = vocab_fixture(bare, strings)
    vocabs["phi-3"] = vocab_fixture(os.path.join(args.models, PHI3), strings)

    # llama.cpp's own expectations for the .inp strings (parse_special off, no BOS).
    with open(os.path.join(args.models, LLAMA + ".out"), encoding="utf-8") as f:
        expected = [[int(t) for t in line.split()] for line in f.read().split("\n")[:-1]]
    by_text = {c["text"]: c["ids_plain"] for c in vocabs["llama-spm"]["cases"]}
    for s, want in zip(inp_strings(args.models), expected):
        assert by_text[s] == want, (s, by_text[s], want)

    write(
        os.path.join(args.out_dir, "tokenize_spm_llamacpp.json"),
        {"llama_cpp_python": llama_cpp.__version__, "vocabs": vocabs},
    )


if __name__ == "__main__":
    main()
