#!/usr/bin/env python3
"""Writes a random-initialised Llama checkpoint (config.json + safetensors, bf16, fixed
seed) shaped like SmolLM2-135M, Llama-3.2-1B or Llama-3.1-8B, for GPU work without a download
(the 135m shape times as the default GGUF does, without carrying its 98 MB).
Needs PyTorch and transformers (the GPU machine has both); uses the GPU when there is one.

    python3 scripts/random_llama.py 1b /tmp/llama-1b [--seed 0] [--layers N]

--layers keeps the shape's widths with fewer layers (a kernel's time per layer, in seconds
rather than the 8B's minute and a half).
"""
import argparse
import json
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

COMMON = dict(
    vocab_size=128256,
    num_attention_heads=32,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
    bos_token_id=128000,
    eos_token_id=128001,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
    initializer_range=0.02,
)
SHAPES = {
    # SmolLM2-135M (the default model's shapes; the vocabulary's last 256 ids are the
    # specials of gpu_bench.py's tokenizer)
    "135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
                 max_position_embeddings=8192, tie_word_embeddings=True, rope_scaling=None,
                 bos_token_id=49152 - 256, eos_token_id=49152 - 255),
    # Llama-3.2-1B
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64,
               tie_word_embeddings=True,
               rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=8192)),
    # Llama-3.1-8B
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128,
               tie_word_embeddings=False,
               rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=8192)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="layers (default: the shape's)")
    args = ap.parse_args()
    shape = dict(SHAPES[args.shape])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    cfg = LlamaConfig(**{**COMMON, **shape})
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"shape": args.shape, "params": n, "out": args.out, "seed": args.seed}))


if __name__ == "__main__":
    main()
