#!/usr/bin/env python3
"""Helpers of scripts/gpu-bench.sh (issue 6), one subcommand each; only `ceilings` needs
PyTorch (the GPU machine has it), the rest plain Python 3.

    gpu_bench.py ceilings --json OUT/ceilings.json     # copy GB/s and bf16 GEMM TFLOP/s
    gpu_bench.py tokenizer CHECKPOINT_DIR              # tokenizer.json for a random checkpoint
    gpu_bench.py shape MODEL                           # parameter counts (HF folder or .gguf)
    gpu_bench.py port-free PORT [PORT...]              # exit 1 when something listens there
    gpu_bench.py wait --url URL --pid PID --timeout S  # until URL answers 200
    gpu_bench.py metric METRICS_URL NAME               # a Prometheus counter's value
    gpu_bench.py table --out OUT [--quiet]             # floors, the Markdown table, results.json

The floors (see `floors` below; every quantity is per the measured ceilings of this GPU:
BW = device-to-device copy bandwidth, R = bf16 GEMM rate on 8192^3):
  P_layers = parameters of the transformer layers (+ final norm): the per-token matmuls
  P_head   = vocab x hidden (lm_head, or the tied embedding used as the head)
  W        = 2 bytes x (P_layers + P_head): weights one decode step reads (16-bit on the
             GPU; the input embedding is a row lookup and is not counted)
  kvb      = layers x 2 x kv_dim x 2 bytes: KV cache bytes of one token
  - batch-1 decode, ms/token >= (W + kvb x (in + out/2)) / BW        [memory bound]
  - TTFT of an n-token prompt >= (2 P_layers n + 2 P_head + 2 L q_dim n^2) / R
      (matmuls of every prompt token, lm_head for the last, causal attention QK^T + PV)
  - offline throughput of N requests of in/out tokens, at most B at once, output tok/s
      <= N out / max(N F / R, (steps W + N K) / BW), where per request
      F = 2 P_layers (in+out) + 2 P_head out + 2 L q_dim (in+out)^2     (FLOPs)
      K = kvb x out x (in + out/2)             (KV bytes the decode steps read)
      steps = max(out, N out (in + out/2) / C) (decode steps, each reading the weights:
          a request needs `out` steps one after the other, and a step can hold at most
          C = the server's KV cache tokens; a sequence holds in + out/2 on average.
          max_batch_size is a setting, not a floor, so it does not enter)
The `steps` term is why N matters: with few requests the weights are re-read for few
sequences per step. TensorRT-LLM's published figures come from thousands of requests.
"""
import argparse
import glob
import json
import math
import os
import re
import socket
import struct
import sys
import time
import urllib.request

# ---------------------------------------------------------------------------------------
# ceilings: what this GPU does at best, measured with PyTorch


def cmd_ceilings(args):
    import torch

    assert torch.cuda.is_available(), "no CUDA device"
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)

    def timed(fn, iters):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            torch.cuda.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3 / iters)
        return best

    # Copy: a 2 GiB device-to-device copy reads and writes 2 GiB each.
    nbytes = args.copy_gib << 30
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    x.fill_(1)
    t = timed(lambda: y.copy_(x), 10)
    copy_bw = 2 * nbytes / t
    del x, y
    torch.cuda.empty_cache()
    # bf16 GEMM, fp32 accumulation (torch's default for bf16 matmul).
    n = args.gemm_n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: torch.matmul(a, b, out=c), 20)
    gemm = 2 * n ** 3 / t
    out = {
        "device": props.name,
        "memory_gib": props.total_memory / 2 ** 30,
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "copy_gb_s": copy_bw / 1e9,
        "copy_bytes": nbytes,
        "gemm_tflop_s": gemm / 1e12,
        "gemm_n": n,
    }
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except Exception:
        pass
    print(f"ceilings on {props.name}: copy {copy_bw / 1e9:.0f} GB/s "
          f"({args.copy_gib} GiB device-to-device), bf16 GEMM {gemm / 1e12:.0f} TFLOP/s "
          f"({n}^3)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


# ---------------------------------------------------------------------------------------
# tokenizer: a byte-level BPE filling a Llama-3 vocabulary (128000 + 256 special ids), so
# that `inflight serve` (which needs tokenizer.json) and `inflight bench` (prompts of an
# exact token length from " word" tokens) run on scripts/random_llama.py checkpoints.
# Every id decodes (random weights sample any id). Words are " " + 1 to 4 lowercase
# letters, each built by one merge from its prefix, so " abcd" is one token.


def bytes_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_json(vocab_size, n_special):
    import itertools
    import string

    regular = vocab_size - n_special
    byte_chars = bytes_to_unicode()
    vocab = [byte_chars[b] for b in range(256)]
    merges = []
    space = byte_chars[ord(" ")]
    letters = string.ascii_lowercase
    done = False
    for length in range(1, 5):
        for combo in itertools.product(letters, repeat=length):
            if len(vocab) >= regular:
                done = True
                break
            prefix = space + "".join(combo[:-1])
            merges.append(f"{prefix} {combo[-1]}")
            vocab.append(prefix + combo[-1])
        if done:
            break
    if len(vocab) < regular:
        raise SystemExit(f"vocab {vocab_size} too large for the synthetic words")
    vocab_map = {t: i for i, t in enumerate(vocab)}
    names = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 9: "<|eot_id|>"}
    added = []
    for i in range(n_special):
        content = names.get(i, f"<|reserved_special_token_{i}|>")
        vocab_map[content] = regular + i
        added.append({"id": regular + i, "content": content, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": True})

    def byte_level():
        return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                "use_regex": True}

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level(),
        "post_processor": byte_level(),
        "decoder": byte_level(),
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab_map, "merges": merges,
        },
    }


def cmd_tokenizer(args):
    cfg = json.load(open(os.path.join(args.dir, "config.json")))
    vocab = cfg["vocab_size"]
    n_special = 256 if vocab > 4096 else 2
    tok = tokenizer_json(vocab, n_special)
    with open(os.path.join(args.dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    regular = vocab - n_special
    with open(os.path.join(args.dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                   "add_bos_token": False, "model_max_length": 131072,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)
    print(f"tokenizer: {vocab} ids ({regular} byte-level BPE, {n_special} special) "
          f"in {args.dir}")


# ---------------------------------------------------------------------------------------
# shape: parameter counts of an HF folder (safetensors headers + config.json) or a GGUF


def _safetensors_shapes(path):
    shapes = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                shapes[name] = meta["shape"]
    return shapes


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                 11: "q", 12: "d"}


def _gguf_shapes(path):
    """Tensor name -> dims (ggml order: ne0 = row length) and the metadata scalars."""
    with open(path, "rb") as f:
        def read(fmt):
            size = struct.calcsize("<" + fmt)
            return struct.unpack("<" + fmt, f.read(size))[0]

        def string():
            n = read("Q")
            return f.read(n).decode("utf-8", "replace")

        def skip_value(ty):
            if ty in _GGUF_SCALARS:
                f.seek(struct.calcsize("<" + _GGUF_SCALARS[ty]), 1)
            elif ty == 8:
                f.seek(read("Q"), 1)
            elif ty == 9:
                ety, count = read("I"), read("Q")
                if ety in _GGUF_SCALARS:
                    f.seek(count * struct.calcsize("<" + _GGUF_SCALARS[ety]), 1)
                else:
                    for _ in range(count):
                        skip_value(ety)
            else:
                raise ValueError(f"GGUF value type {ty}")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = read("I")
        if version < 2:
            raise ValueError(f"{path}: GGUF v{version} not supported")
        n_tensors, n_kv = read("Q"), read("Q")
        meta = {}
        for _ in range(n_kv):
            key, ty = string(), read("I")
            if ty in _GGUF_SCALARS:
                meta[key] = read(_GGUF_SCALARS[ty])
            elif ty == 8:
                meta[key] = string()
            else:
                skip_value(ty)
        shapes = {}
        for _ in range(n_tensors):
            name = string()
            nd = read("I")
            dims = [read("Q") for _ in range(nd)]
            read("I")
            read("Q")
            shapes[name] = dims
    return shapes, meta


def shape(path):
    """Counts for the floors; see the module's note."""
    numel = lambda dims: math.prod(dims) if dims else 1  # noqa: E731
    if os.path.isdir(path):
        cfg = json.load(open(os.path.join(path, "config.json")))
        shapes = _safetensors_shapes(path)
        h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
        heads = cfg["num_attention_heads"]
        hd = cfg.get("head_dim") or h // heads
        kv_heads = cfg.get("num_key_value_heads", heads)
        vocab = cfg["vocab_size"]
        embed = numel(shapes.get("model.embed_tokens.weight", [vocab, h]))
        untied_head = numel(shapes["lm_head.weight"]) if "lm_head.weight" in shapes else 0
        fmt, q_dim, kv_dim = "hf", heads * hd, kv_heads * hd
    else:
        shapes, meta = _gguf_shapes(path)
        emb = shapes["token_embd.weight"]
        h, vocab = emb[0], emb[1]
        layers = len({n.split(".")[1] for n in shapes if n.startswith("blk.")})
        q_dim = shapes["blk.0.attn_q.weight"][1]
        kv_dim = shapes["blk.0.attn_k.weight"][1]
        embed = numel(emb)
        untied_head = numel(shapes["output.weight"]) if "output.weight" in shapes else 0
        fmt = "gguf"
    total = sum(numel(d) for d in shapes.values())
    head = untied_head or embed
    p_layers = total - embed - untied_head
    return {
        "format": fmt, "params": total, "p_layers": p_layers, "p_head": head,
        "p_embed": embed, "tied": untied_head == 0, "layers": layers, "hidden": h,
        "vocab": vocab, "q_dim": q_dim, "kv_dim": kv_dim,
        "weight_bytes_per_step": 2 * (p_layers + head),
        "kv_bytes_per_token": layers * 2 * kv_dim * 2,
    }


def cmd_shape(args):
    print(json.dumps(shape(args.model), indent=1))


# ---------------------------------------------------------------------------------------
# port-free, wait: the server's lifecycle without curl


def _listening(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def cmd_port_free(args):
    busy = [p for p in args.ports if _listening(p)]
    if busy:
        print(f"something already listens on port(s) {busy}", file=sys.stderr)
        sys.exit(1)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmd_wait(args):
    deadline = time.time() + args.timeout
    while True:
        try:
            with urllib.request.urlopen(args.url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        if not _alive(args.pid):
            print(f"the server (pid {args.pid}) exited before it was ready", file=sys.stderr)
            sys.exit(2)
        if time.time() > deadline:
            print(f"{args.url} not ready after {args.timeout} s", file=sys.stderr)
            sys.exit(3)
        time.sleep(0.5)


def cmd_metric(args):
    """Sum of a Prometheus metric's samples at URL; -1 when unreachable or absent."""
    try:
        with urllib.request.urlopen(args.url, timeout=5) as r:
            text = r.read().decode()
    except Exception:  # noqa: BLE001
        print(-1)
        return
    vals = re.findall(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(args.name), text, re.M)
    print(int(sum(float(v) for v in vals)) if vals else -1)


# ---------------------------------------------------------------------------------------
# table: floors, the Markdown table and results.json from what the run left in OUT

NAMES = {"8b": "Llama-3.1-8B shape", "1b": "Llama-3.2-1B shape", "smollm2": "SmolLM2-135M",
         "135m": "SmolLM2-135M shape"}
# Issue 6: TensorRT-LLM's published H100 bf16 output tok/s (Llama-3.1-8B), and our targets.
TRT = {(128, 128): ("16,117", 17700), (128, 2048): ("9,894", 10900),
       (2048, 128): ("1,972", 2200), (500, 2000): ("7,953", 8750)}
B1_TARGET_MS = {"8b": 5.9, "1b": 1.0, "smollm2": 1000 / 2500, "135m": 1000 / 2500}


def server_info(log):
    """KV cache tokens, max_batch_size, device and dtype from a server log."""
    info = {}
    try:
        text = re.sub(r"\x1b\[[0-9;]*m", "", open(log, errors="replace").read())
    except OSError:
        return info
    m = re.search(r"KV cache kv_blocks=(\d+) block_size=(\d+) kv_mib=(\d+) max_batch_size=(\d+)",
                  text)
    if m:
        blocks, block, mib, batch = map(int, m.groups())
        info.update(kv_blocks=blocks, block_size=block, kv_tokens=blocks * block, kv_mib=mib,
                    max_batch_size=batch)
    m = re.search(r"GPU engine device=(.+?) arch=(\S+) dtype=\"?(\w+)", text)
    if m:
        info.update(device=m.group(1), arch=m.group(2), dtype=m.group(3))
    return info


def floors(kind, s, c, run, srv):
    """(floor, bound) for one row: tok/s for throughput, ms otherwise; None if unknown."""
    bw, rate = c["copy_gb_s"] * 1e9, c["gemm_tflop_s"] * 1e12
    inp, out, n = run["in"], run["out"], run["n"]
    W, kvb = s["weight_bytes_per_step"], s["kv_bytes_per_token"]
    if kind == "b1":
        return (W + kvb * (inp + out / 2)) / bw * 1e3, "memory"
    if kind == "ttft":
        f = 2 * s["p_layers"] * inp + 2 * s["p_head"] + 2 * s["layers"] * s["q_dim"] * inp ** 2
        return f / rate * 1e3, "compute"
    f = (2 * s["p_layers"] * (inp + out) + 2 * s["p_head"] * out
         + 2 * s["layers"] * s["q_dim"] * (inp + out) ** 2)
    k = kvb * out * (inp + out / 2)
    steps = out
    if srv.get("kv_tokens"):
        steps = max(out, n * out * (inp + out / 2) / srv["kv_tokens"])
    t_compute = n * f / rate
    t_memory = (steps * W + n * k) / bw
    t = max(t_compute, t_memory)
    bound = "compute" if t_compute >= t_memory else "memory"
    return n * out / t, f"{bound}, {n * out / steps:.0f} seqs/step"


def gpu_trace(path):
    """Means of a run's nvidia-smi samples (power.draw, power.limit, clocks.sm,
    clocks.max.sm, temperature.gpu, one CSV line each): a note, or None without samples."""
    rows = []
    try:
        for line in open(path):
            try:
                rows.append([float(v) for v in line.split(",")])
            except ValueError:  # "[N/A]" fields, a line cut short by the end of the run
                continue
    except OSError:
        return None
    rows = [r for r in rows if len(r) == 5]
    if not rows:
        return None
    mean = [sum(r[i] for r in rows) / len(rows) for i in range(5)]
    return (f"GPU {mean[0]:.0f} W of {mean[1]:.0f}, SM clock {mean[2]:,.0f} MHz of "
            f"{mean[3]:,.0f}, {mean[4]:.0f} °C (means of {len(rows)} samples)")


def fmt(x, digits=None):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if digits is None:
        digits = 0 if abs(x) >= 100 else (1 if abs(x) >= 10 else 2)
    return f"{x:,.{digits}f}"


def cmd_table(args):
    out_dir = args.out
    runs = []
    manifest = os.path.join(out_dir, "runs.jsonl")
    if os.path.exists(manifest):
        for line in open(manifest):
            try:
                runs.append(json.loads(line))
            except ValueError:
                if line.strip():
                    print(f"skipping a malformed line of {manifest}: {line.strip()[:120]}",
                          file=sys.stderr)
    try:
        ceil = json.load(open(os.path.join(out_dir, "ceilings.json")))
    except OSError:
        ceil = None
    servers = {r["model"]: r for r in runs if r["kind"] == "server"}
    shapes, infos, hf = {}, {}, {}
    for m, r in servers.items():
        try:
            shapes[m] = shape(r["path"])
        except Exception as e:  # noqa: BLE001
            print(f"shape of {r['path']}: {e}", file=sys.stderr)
        infos[m] = server_info(r["log"])
    for f in glob.glob(os.path.join(out_dir, "hf-*.json")):
        m = os.path.basename(f)[3:-5]
        try:
            hf[m] = json.load(open(f))
        except Exception:  # noqa: BLE001
            pass

    rows, results = [], []
    for r in runs:
        if r["kind"] not in ("tp", "b1", "ttft"):
            continue
        m = r["model"]
        name = NAMES.get(m, m)
        report, summary = None, None
        if r.get("json") and os.path.exists(r["json"]):
            try:
                report = json.load(open(r["json"]))
                summary = report["summary"]
            except Exception:  # noqa: BLE001
                pass
        measured, unit, notes = None, "", []
        if summary:
            if r["kind"] == "tp":
                measured, unit = summary["output_tokens_per_s"], "output tok/s"
            elif r["kind"] == "b1":
                measured, unit = (summary.get("tpot_ms") or {}).get("p50"), "ms / token"
                if measured:
                    notes.append(f"{1e3 / measured:,.0f} tok/s")
            else:
                measured, unit = (summary.get("ttft_ms") or {}).get("p50"), "ms (TTFT p50)"
            notes.append(f"{summary['completed']}/{summary['total_requests']} ok")
            iters = r.get("iters")
            if iters and iters > 0 and r["kind"] == "tp":
                notes.append(f"{iters} engine iterations, "
                             f"{summary['total_output_tokens'] / iters:.0f} output tok/iteration, "
                             f"{summary['duration_s'] * 1e3 / iters:.1f} ms/iteration")
            eng = r.get("engine") or {}
            if iters and iters > 0 and eng.get("compute_us") is not None:
                wait_ms = eng["wait_us"] / 1e3 / max(eng["waits"], 1)
                busy = eng["compute_us"] / max(eng["compute_us"] + eng["wait_us"], 1)
                notes.append(f"engine {eng['compute_us'] / 1e3 / iters:.2f} ms compute per "
                             f"iteration, {wait_ms:.2f} ms idle between back-to-back iterations "
                             f"({100 * (1 - busy):.0f}% of engine time)")
            if eng.get("preemptions"):
                notes.append(f"{eng['preemptions']} preemptions, "
                             f"{eng.get('preempted_tokens', 0):,} computed tokens discarded")
            if eng.get("swaps"):
                notes.append(f"{eng['swaps']} preemptions by swapping")
            trace = gpu_trace(r["gpu_trace"]) if r.get("gpu_trace") else None
            if trace:
                notes.append(trace)
            if summary.get("output_length_mismatches"):
                notes.append(f"{summary['output_length_mismatches']} wrong output lengths")
            if summary.get("errors"):
                notes.append("error: " + str(summary["errors"][0][0])[:80])
        else:
            unit = {"tp": "output tok/s", "b1": "ms / token", "ttft": "ms (TTFT p50)"}[r["kind"]]
            notes.append(r.get("status") or f"bench exit {r.get('rc')}")
        floor, bound = None, ""
        if ceil and m in shapes:
            floor, bound = floors(r["kind"], shapes[m], ceil, r, infos.get(m, {}))
        pct = None
        if floor and measured:
            pct = 100 * (measured / floor if r["kind"] == "tp" else floor / measured)
        trt, target, hf_cell = "–", "–", "n/a"
        h = hf.get(m, {})
        if r["kind"] == "tp":
            label = f"{r['in']}/{r['out']}, max throughput, {r['n']} requests"
            if r.get("conc"):
                label += f" ({r['conc']} in flight)"
            if m == "8b" and (r["in"], r["out"]) in TRT:
                trt, goal = TRT[(r["in"], r["out"])]
                target = f">= {goal:,}" + ("" if measured is None else
                                           (" ✓" if measured >= goal else " ✗"))
            if h.get("batch_tok_s") and (h.get("batch_in"), h.get("batch_out")) == (r["in"], r["out"]):
                hf_cell = f"{h['batch_tok_s']:,.0f} (batch {h['batch']})"
        elif r["kind"] == "b1":
            label = f"batch-1 decode ({r['in']} in, {r['out']} out)"
            if m == "8b":
                trt = "vLLM ~6.5 ms"
            goal = B1_TARGET_MS.get(m)
            if goal:
                target = f"<= {goal:.2f} ms" + ("" if measured is None else
                                               (" ✓" if measured <= goal else " ✗"))
            if h.get("b1_ms_per_token"):
                hf_cell = f"{h['b1_ms_per_token']:.2f} ms"
        else:
            # One prompt every 1/rate s (gpu-bench's TTFT_RATE), or back to back.
            rate = ((report or {}).get("config") or {}).get("request_rate")
            pace = f"{rate:g} request/s" if rate else "back to back"
            label = f"TTFT, {r['in']}-token prompt, {pace}"
            if floor:
                goal = 1.3 * floor
                target = f"<= 1.3x floor ({goal:.1f} ms)" + ("" if measured is None else
                                                            (" ✓" if measured <= goal else " ✗"))
            if h.get("ttft_ms") and h.get("ttft_len") == r["in"]:
                hf_cell = f"{h['ttft_ms']:.1f} ms"
        if bound:
            notes.append(f"floor {bound}")
        if pct and pct > 100:
            notes.append("ABOVE THE FLOOR: check the measurement or the floor")
        rows.append(f"| {name}: {label} | {fmt(measured)} | {unit} | {fmt(floor)} | "
                    f"{fmt(pct, 0) + '%' if pct else 'n/a'} | {trt} | {hf_cell} | {target} | "
                    f"{'; '.join(notes)} |")
        results.append({"model": m, "kind": r["kind"], "in": r["in"], "out": r["out"],
                        "requests": r["n"], "concurrency": r.get("conc"), "measured": measured,
                        "unit": unit, "floor": floor, "floor_bound": bound, "pct_of_floor": pct,
                        "hf": hf_cell, "trt_llm_h100": trt, "target": target,
                        "summary": summary, "bench_json": r.get("json")})

    lines = ["# gpu-bench", ""]
    if ceil:
        lines.append(f"Device: {ceil['device']} ({ceil['memory_gib']:.0f} GiB, "
                     f"{ceil['sm_count']} SMs); measured ceilings: copy {ceil['copy_gb_s']:,.0f} GB/s "
                     f"(device-to-device, {ceil['copy_bytes'] >> 30} GiB), bf16 GEMM "
                     f"{ceil['gemm_tflop_s']:,.0f} TFLOP/s ({ceil['gemm_n']}^3); torch "
                     f"{ceil.get('torch')}, transformers {ceil.get('transformers', '?')}.")
    else:
        lines.append("Ceilings not measured (no ceilings.json): floors are n/a.")
    for m, info in infos.items():
        if info:
            s = shapes.get(m, {})
            lines.append(f"- {NAMES.get(m, m)}: {s.get('params', 0) / 1e9:.2f} B params, "
                         f"{info.get('dtype', '?')} on the GPU; KV cache {info.get('kv_tokens', 0):,} "
                         f"tokens ({info.get('kv_mib', 0):,} MiB), max_batch_size "
                         f"{info.get('max_batch_size', '?')}; log {servers[m]['log']}")
    for m, h in hf.items():
        if h.get("errors"):
            lines.append(f"- HF transformers {m}: " + "; ".join(h["errors"])[:300])
    lines += ["",
              "| workload | measured | unit | floor | % of floor | TensorRT-LLM H100 | "
              "HF transformers | target (issue 6) | notes |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += rows
    lines += ["",
              "% of floor: measured / floor for tok/s, floor / measured for ms. Floors "
              "(scripts/gpu_bench.py): batch-1 = (weights + KV read) / copy bandwidth; TTFT = "
              "prefill FLOPs / GEMM rate; throughput = the slower of all FLOPs / GEMM rate and "
              "(weight re-reads per decode step + KV reads) / copy bandwidth, with as many "
              "sequences per step as the server's KV cache holds. TensorRT-LLM's figures: H100, bf16, "
              "Llama-3.1-8B, many more requests than this run."]
    text = "\n".join(lines) + "\n"
    if not args.quiet:
        print(text)
    with open(os.path.join(out_dir, "gpu-bench.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"ceilings": ceil, "shapes": shapes, "servers": infos, "hf": hf,
                   "rows": results}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ceilings")
    p.add_argument("--json")
    p.add_argument("--copy-gib", type=int, default=2)
    p.add_argument("--gemm-n", type=int, default=8192)
    p.set_defaults(fn=cmd_ceilings)
    p = sub.add_parser("tokenizer")
    p.add_argument("dir")
    p.set_defaults(fn=cmd_tokenizer)
    p = sub.add_parser("shape")
    p.add_argument("model")
    p.set_defaults(fn=cmd_shape)
    p = sub.add_parser("port-free")
    p.add_argument("ports", type=int, nargs="+")
    p.set_defaults(fn=cmd_port_free)
    p = sub.add_parser("wait")
    p.add_argument("--url", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--timeout", type=float, default=300)
    p.set_defaults(fn=cmd_wait)
    p = sub.add_parser("metric")
    p.add_argument("url")
    p.add_argument("name")
    p.set_defaults(fn=cmd_metric)
    p = sub.add_parser("table")
    p.add_argument("--out", required=True)
    p.add_argument("--quiet", action="store_true", help="write the files, print nothing")
    p.set_defaults(fn=cmd_table)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
