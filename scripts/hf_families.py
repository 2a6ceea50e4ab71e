#!/usr/bin/env python3
"""Tiny random checkpoints of every model family inflight serves, written by HF
transformers, and transformers' own fp32 logits for them: the fixtures of
tests/families_reference.rs.

For each family: a seeded random model (every parameter drawn, biases and norms too),
saved as config.json + model.safetensors (fp32) under OUT/<family>/, and
OUT/<family>/reference.json with the token sequence (a 12-token prompt and 32 more
tokens fed one at a time) and transformers' logits for the prompt's last position and
each of the 32 decode steps, run through transformers' own KV cache (eager attention).

    python3 scripts/hf_families.py [--out tests/fixtures/families]

`--long` writes only OUT/phi3/reference-long.json, for the phi3 checkpoint already there:
transformers' logits past LongRoPE's original context (128 positions), as its `generate`
computes them: a 140-token prompt and 8 decode steps (the long factors throughout), and a
120-token prompt decoded to 136 tokens, short until the token at position 128, where the
cache is dropped and the whole sequence computed again with the long factors
(`Phi3ForCausalLM.prepare_inputs_for_generation`); and for each prompt, `generate`'s own
greedy tokens (tests/long_rope_served.rs asks the server for them).

Needs torch and transformers (pip); runs on the CPU in seconds.
"""
import argparse
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM

PROMPT = 12
DECODE = 32
VOCAB = 96

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

FAMILIES = {
    "qwen2": ("Qwen2Config", dict(COMMON, rope_theta=10000.0, rms_norm_eps=1e-6)),
    "qwen3": ("Qwen3Config", dict(COMMON, head_dim=16, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                  tie_word_embeddings=True)),
    "mistral": ("MistralConfig", dict(COMMON, rope_theta=10000.0, rms_norm_eps=1e-5,
                                      sliding_window=8)),
    "gemma2": ("Gemma2Config", dict(COMMON, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                                    query_pre_attn_scalar=16, sliding_window=8,
                                    attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                    hidden_activation="gelu_pytorch_tanh",
                                    tie_word_embeddings=True, num_hidden_layers=3)),
    "gemma3": ("Gemma3TextConfig", dict(COMMON, head_dim=16, rms_norm_eps=1e-6,
                                        query_pre_attn_scalar=16, sliding_window=8,
                                        hidden_activation="gelu_pytorch_tanh",
                                        tie_word_embeddings=True, num_hidden_layers=6,
                                        rope_parameters={
                                            "full_attention": {"rope_type": "linear",
                                                               "factor": 4.0,
                                                               "rope_theta": 1000000.0},
                                            "sliding_attention": {"rope_type": "default",
                                                                  "rope_theta": 10000.0}})),
    "phi3": ("Phi3Config", dict(COMMON, hidden_size=64, head_dim=16, rope_theta=10000.0,
                                rms_norm_eps=1e-5,
                                max_position_embeddings=512,
                                original_max_position_embeddings=128,
                                rope_parameters={
                                    "rope_type": "longrope", "rope_theta": 10000.0,
                                    "short_factor": [1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0],
                                    "long_factor": [1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0],
                                    "original_max_position_embeddings": 128})),
    "gpt2": ("GPT2Config", dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                n_positions=128, n_ctx=128, n_inner=None, layer_norm_epsilon=1e-5,
                                activation_function="gelu_new", bos_token_id=1,
                                eos_token_id=2)),
}


def randomize(model, family, seed):
    g = torch.Generator().manual_seed(seed)
    gemma = family.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "norm" in name or name.endswith("ln_1.weight") or name.endswith(
                    "ln_2.weight") or name.endswith("ln_f.weight"):
                # Gemma's norms scale by 1 + w; the others by w.
                p.copy_(0.2 * r if gemma else 1.0 + 0.2 * r)
            elif "embed" in name or "wte" in name or "wpe" in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(r / (p.shape[-1] ** 0.5 if p.dim() > 1 else 4.0))


def tokens(seed):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(3, VOCAB, (PROMPT + DECODE,), generator=g).tolist()


def phi3_long(out):
    """The LongRoPE cases of the phi3 checkpoint in OUT/phi3 (see the module's docstring)."""
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "phi3"),
                                                 attn_implementation="eager",
                                                 dtype=torch.float32)
    model.eval()
    orig = model.config.original_max_position_embeddings
    g = torch.Generator().manual_seed(77)
    cases = []
    for name, prompt, total in (("long prompt", 140, 148), ("crossing", 120, 136)):
        ids = torch.randint(3, VOCAB, (total,), generator=g).tolist()
        res = model(torch.tensor([ids[:prompt]]), use_cache=True)
        cache = res.past_key_values
        logits = [res.logits[0, -1].tolist()]
        recompute_at = None
        for pos in range(prompt, total):
            if pos == orig and prompt <= orig:
                # generate's rule: the sequence reaches orig + 1 tokens with orig cached.
                recompute_at = pos
                res = model(torch.tensor([ids[:pos + 1]]), use_cache=True)
            else:
                res = model(torch.tensor([[ids[pos]]]), past_key_values=cache, use_cache=True)
            cache = res.past_key_values
            logits.append(res.logits[0, -1].tolist())
        # generate's own greedy answer to the prompt (its crossing rule in action), with no
        # end token: what the server must answer.
        model.generation_config.eos_token_id = None
        gen = model.generate(torch.tensor([ids[:prompt]]), max_new_tokens=total - prompt,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        greedy = gen[0, prompt:].tolist()
        cases.append(dict(name=name, prompt=prompt, tokens=ids, logits=logits,
                          recompute_at=recompute_at, greedy=greedy))
    ref = dict(family="phi3", transformers=transformers.__version__, original=orig,
               cases=cases)
    with open(os.path.join(out, "phi3", "reference-long.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    print("phi3 long cases", [(c["name"], len(c["logits"])) for c in cases])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/families")
    ap.add_argument("--long", action="store_true")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    if args.long:
        phi3_long(args.out)
        return
    for seed, (family, (cls, kw)) in enumerate(FAMILIES.items()):
        cfg = getattr(transformers, cls)(**kw)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                 dtype=torch.float32)
        model.eval()
        randomize(model, family, seed)
        out = os.path.join(args.out, family)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        ids = tokens(seed)
        res = model(torch.tensor([ids[:PROMPT]]), use_cache=True)
        cache = res.past_key_values
        logits = [res.logits[0, -1].tolist()]
        for t in ids[PROMPT:PROMPT + DECODE - 1]:
            res = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = res.past_key_values
            logits.append(res.logits[0, -1].tolist())
        # The decode tokens fed are ids[PROMPT..PROMPT+DECODE-1]: 1 + 31 = 32 logits rows
        # after the prompt's.
        res = model(torch.tensor([[ids[PROMPT + DECODE - 1]]]), past_key_values=cache,
                    use_cache=True)
        logits.append(res.logits[0, -1].tolist())
        ref = dict(family=family, transformers=transformers.__version__, prompt=PROMPT,
                   tokens=ids, logits=logits)
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(ref, f, separators=(",", ":"))
        for extra in ("generation_config.json",):
            p = os.path.join(out, extra)
            if os.path.exists(p):
                os.remove(p)
        print(family, cls, "logits rows", len(logits))


if __name__ == "__main__":
    main()
