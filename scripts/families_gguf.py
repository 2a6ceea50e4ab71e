#!/usr/bin/env python3
"""GGUF twins of the family fixtures, made by llama.cpp's own converter.

For each checkpoint scripts/hf_families.py wrote under tests/fixtures/families/<family>/,
runs llama.cpp's convert_hf_to_gguf (tensor names, Q/K permutations, Gemma's norm +1,
fused tensors and metadata as llama.cpp writes them) into <family>/model-f32.gguf (f32). The
fixtures have no tokenizer, so the converter's vocabulary step is replaced by a plain
list of the vocabulary's size (tokenizer model "gpt2", no merges): the weights and
hyper-parameters are llama.cpp's. tests/families_reference.rs then checks the engine on
these files against the same transformers logits.

    python3 scripts/families_gguf.py --llama-cpp DIR [--fixtures tests/fixtures/families]

DIR is a llama.cpp source tree (the llama-cpp-python source package vendors one under
vendor/llama.cpp); needs torch, numpy and that tree's gguf-py.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--fixtures", default="tests/fixtures/families")
    args = ap.parse_args()
    root = Path(args.llama_cpp).resolve()
    sys.path[:0] = [str(root), str(root / "gguf-py")]
    import gguf
    import torch
    import convert_hf_to_gguf as conv

    def plain_vocab(self):
        n = self.hparams.get("vocab_size")
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
        self.gguf_writer.add_bos_token_id(1)
        self.gguf_writer.add_eos_token_id(2)

    for d in sorted(Path(args.fixtures).iterdir()):
        # llama.cpp writes Mistral as a `llama` model without its sliding window: a file
        # that cannot match transformers on the fixture's long-enough sequence.
        if not (d / "config.json").is_file() or d.name == "mistral":
            continue
        out = d / "model-f32.gguf"
        with tempfile.TemporaryDirectory() as tmp:
            # A copy with a stand-in tokenizer.json (Gemma's converter counts the
            # vocabulary from it).
            src = Path(tmp)
            for f in ("config.json", "model.safetensors"):
                shutil.copy(d / f, src / f)
            hparams = conv.ModelBase.load_hparams(src, False)
            n = hparams["vocab_size"]
            vocab = {f"<t{i}>": i for i in range(n)}
            (src / "tokenizer.json").write_text(
                json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
            arch = conv.get_model_architecture(hparams, conv.ModelType.TEXT)
            cls = conv.get_model_class(arch, mmproj=False)
            with torch.inference_mode():
                m = cls(src, gguf.LlamaFileType.ALL_F32, out, eager=True)
                m.set_vocab = types.MethodType(plain_vocab, m)
                m.write()
        print(d.name, arch, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
