#!/usr/bin/env python3
"""Reference dequantization fixture for inflight's GGUF block types (src/model/kquant.rs,
src/model/quant.rs).

Writes random raw blocks of each type and their f32 values as the `gguf` package's
`gguf.quants.dequantize` (which mirrors ggml) computes them:

    pip install gguf numpy
    python3 scripts/kquant_ref.py [--out tests/fixtures/kquant_ref.bin]

The blocks are random bytes (seed 20250) with their f16 scale fields (`d`, and `dmin` or
`m` where the type has one) replaced by small finite values, so every code, packed scale
and high bit is exercised without overflow. A few blocks carry edge scales: zero, negative
zero, a subnormal, a negative and a large one.

File layout (little-endian): the 8 bytes `KQREF001`, then per type: u32 ggml type id, u32
block count, the raw blocks, then block count x block length f32 values.
"""

import argparse
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

# type -> (blocks, byte offsets of the f16 scale fields: (d offsets, dmin/m offsets))
TYPES = {
    T.Q2_K: (8, [80], [82]),
    T.Q3_K: (8, [108], []),
    T.Q4_K: (8, [0], [2]),
    T.Q5_K: (8, [0], [2]),
    T.Q6_K: (8, [208], []),
    T.IQ4_NL: (48, [0], []),
    T.IQ4_XS: (8, [0], []),
    T.Q5_0: (48, [0], []),
    T.Q5_1: (48, [0], [2]),
    T.Q4_0: (32, [0], []),
    T.Q4_1: (32, [0], [2]),
    T.Q8_0: (32, [0], []),
}

EDGE = [0.0, -0.0, 6e-8, -0.02, 3.5]


def blocks_for(ty, n_blocks, d_at, m_at, rng):
    block_len, block_bytes = GGML_QUANT_SIZES[ty]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    d = rng.uniform(-0.01, 0.01, size=n_blocks).astype(np.float16)
    m = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
    # Edge scales on the first blocks: d, then dmin / m the other way round.
    for i, v in enumerate(EDGE[: n_blocks]):
        d[i] = v
        m[len(EDGE) - 1 - i] = v
    for off in d_at:
        raw[:, off : off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    for off in m_at:
        raw[:, off : off + 2] = m.view(np.uint8).reshape(n_blocks, 2)
    values = quants.dequantize(raw.reshape(-1), ty).astype(np.float32)
    assert values.shape == (n_blocks * block_len,), (ty, values.shape)
    assert np.all(np.isfinite(values)), ty
    return raw, values


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/kquant_ref.bin")
    args = ap.parse_args()
    rng = np.random.default_rng(20250)
    out = bytearray(b"KQREF001")
    for ty, (n_blocks, d_at, m_at) in TYPES.items():
        raw, values = blocks_for(ty, n_blocks, d_at, m_at, rng)
        out += struct.pack("<II", int(ty), n_blocks)
        out += raw.tobytes()
        out += values.astype("<f4").tobytes()
        print(f"{ty.name}: {n_blocks} blocks, {values.size} values")
    with open(args.out, "wb") as f:
        f.write(out)
    print(f"wrote {args.out} ({len(out)} bytes)")


if __name__ == "__main__":
    main()
