// GGUF weights kept quantized on the device (src/kernels/cuda/qgemm.rs): products of a few
// token rows read the quantized bytes (qgemv), larger ones dequantize the weights a panel of
// rows at a time into 16 bits for cuBLAS (qdequant), and a quantized embedding table gives
// its rows to the residual stream (qembed).
//
// A band is rows of one format in planes (qgemm.rs writes them from the CPU engine's
// blocks), scales as IEEE f16 bits whatever the module's 16-bit type:
//   q8:  qs [rows][cols] 8-bit codes, d [rows][cols / 32]; with m (not null) the codes are
//        unsigned and the value is d·q + m (Q5_1 widened), else signed, d·q (Q8_0, Q5_0).
//   q4:  qs [rows][cols / 2]: per block of 32, byte l holds value l (low nibble) and
//        l + 16 (high); value d·q + m, m = -8·d where m is null (Q4_0).
//   q4k: GGUF Q4_K super-blocks of 256 values, 144 bytes, as stored.
//   q5k: GGUF Q5_K super-blocks, 176 bytes, as stored.
//   q6k: GGUF Q6_K super-blocks without their d, 208 bytes (ql 128, qh 64, scales 16), and
//        d [rows][cols / 256] apart, so every super-block starts 16-byte aligned.
// Every value is dequantized with the arithmetic, in the order, of the host's dequantizers
// (no contraction into fused multiply-adds), so qdequant's 16-bit panels are the host's
// dequantized weights rounded once.
//
// Work is cut in units: a block of 32 (q8, q4), two sub-blocks of 32 sharing their 32 code
// bytes (q4k, q5k), or 32 values of one half of a super-block (q6k). A warp owns a weight
// row, its lanes take the row's units in turn; each unit is dequantized in chunks of 8
// consecutive columns, each chunk meeting the 16-bit x rows as one 16-byte load a row.
// qgemv: y[t, c0 + cs·r] (= or +=) sum_i x[t, i] · w[r, i] for t < n (n <= QG_ROWS; qgemv1:
// n = 1),
// y_mode 0: fp32, 1: 16-bit, 2: fp32 added to; row t of y at t·ldy. grid: ceil(rows /
// QG_WARPS); block: 32 · QG_WARPS.
#define QG_WARPS 8
#define QG_ROWS 8

struct Planes {
    const unsigned char* qs;
    const unsigned short* d;
    const unsigned short* m;
};

__device__ __forceinline__ float f16_bits(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// An integer code (0 <= q < 2^23) as a float without the integer-to-float conversion
// (a quarter-rate instruction): 2^23 + q is exact in the mantissa, then 2^23 comes off.
__device__ __forceinline__ float code_f(unsigned q) {
    return __fsub_rn(__uint_as_float(0x4b000000u | q), 8388608.0f);
}

// Weight bytes are read once: past L1.
__device__ __forceinline__ uint4 qload16(const unsigned char* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 qload8(const unsigned char* p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned byte_of(uint2 w, int i) {
    return ((i < 4 ? w.x : w.y) >> (8 * (i & 3))) & 0xffu;
}
// Bytes 8c..8c+8 of a 16-byte load.
__device__ __forceinline__ uint2 half_of(uint4 v, int c) {
    return c == 0 ? make_uint2(v.x, v.y) : make_uint2(v.z, v.w);
}

// The 6-bit scale and minimum of sub-block j of a Q4_K / Q5_K super-block (kquant.rs).
__device__ __forceinline__ void k_scale_min(const unsigned char* s, int j, unsigned& sc,
                                            unsigned& m) {
    if (j < 4) {
        sc = s[j] & 63u;
        m = s[j + 4] & 63u;
    } else {
        sc = (s[j + 4] & 0x0fu) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

struct Q8 {
    static constexpr int VALS = 32;
    struct Raw {
        uint4 a, b;
        float d, m;
        bool min;
    };
    __device__ static int units(int cols) { return cols / 32; }
    __device__ static Raw load(const Planes& p, int row, int u, int cols) {
        Raw r;
        const unsigned char* q = p.qs + (size_t)row * cols + 32 * u;
        r.a = qload16(q);
        r.b = qload16(q + 16);
        const size_t bi = (size_t)row * (cols / 32) + u;
        r.d = f16_bits(p.d[bi]);
        r.min = p.m != nullptr;
        r.m = r.min ? f16_bits(p.m[bi]) : 0.0f;
        return r;
    }
    __device__ static int chunk(const Raw& r, int u, int c, float* v) {
        const uint2 w = half_of(c < 2 ? r.a : r.b, c & 1);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const unsigned b = byte_of(w, i);
            v[i] = r.min ? __fadd_rn(__fmul_rn(code_f(b), r.d), r.m)
                         : __fmul_rn(__fsub_rn(code_f(b ^ 0x80u), 128.0f), r.d);
        }
        return 32 * u + 8 * c;
    }
};

struct Q4 {
    static constexpr int VALS = 32;
    struct Raw {
        uint4 a;
        float d, m;
    };
    __device__ static int units(int cols) { return cols / 32; }
    __device__ static Raw load(const Planes& p, int row, int u, int cols) {
        Raw r;
        r.a = qload16(p.qs + (size_t)row * (cols / 2) + 16 * u);
        const size_t bi = (size_t)row * (cols / 32) + u;
        r.d = f16_bits(p.d[bi]);
        r.m = p.m != nullptr ? f16_bits(p.m[bi]) : -8.0f * r.d;
        return r;
    }
    __device__ static int chunk(const Raw& r, int u, int c, float* v) {
        const uint2 w = half_of(r.a, c & 1);
        const int shift = c < 2 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const unsigned q = (byte_of(w, i) >> shift) & 0x0fu;
            v[i] = __fadd_rn(__fmul_rn(code_f(q), r.d), r.m);
        }
        return 32 * u + (c < 2 ? 8 * c : 16 + 8 * (c - 2));
    }
};

// Q4_K and Q5_K (HIGH): a unit is sub-blocks 2g and 2g + 1 of a super-block, the low and
// high nibbles of the same 32 code bytes (and bits 2g, 2g + 1 of the 32 high-bit bytes).
template <bool HIGH>
struct QK45 {
    static constexpr int VALS = 64;
    static constexpr int BYTES = HIGH ? 176 : 144;
    static constexpr int CODES = HIGH ? 48 : 16;
    struct Raw {
        uint4 a, b, ha, hb;
        float d1, m1, d2, m2;
        int g;
    };
    __device__ static int units(int cols) { return cols / 256 * 4; }
    __device__ static Raw load(const Planes& p, int row, int u, int cols) {
        Raw r;
        const int sb = u >> 2;
        r.g = u & 3;
        const unsigned char* base = p.qs + ((size_t)row * (cols / 256) + sb) * BYTES;
        r.a = qload16(base + CODES + 32 * r.g);
        r.b = qload16(base + CODES + 32 * r.g + 16);
        if (HIGH) {
            r.ha = qload16(base + 16);
            r.hb = qload16(base + 32);
        }
        const unsigned dm = *reinterpret_cast<const unsigned*>(base);
        const float d = f16_bits((unsigned short)(dm & 0xffffu));
        const float dmin = f16_bits((unsigned short)(dm >> 16));
        unsigned sc, m;
        k_scale_min(base + 4, 2 * r.g, sc, m);
        r.d1 = __fmul_rn(d, (float)sc);
        r.m1 = __fmul_rn(dmin, (float)m);
        k_scale_min(base + 4, 2 * r.g + 1, sc, m);
        r.d2 = __fmul_rn(d, (float)sc);
        r.m2 = __fmul_rn(dmin, (float)m);
        return r;
    }
    __device__ static int chunk(const Raw& r, int u, int c, float* v) {
        // Chunk c: code bytes 8(c % 4)..+8, low nibbles (sub-block 2g) for c < 4.
        const int k = c & 3;
        const uint2 w = half_of(k < 2 ? r.a : r.b, k & 1);
        const uint2 h = HIGH ? half_of(k < 2 ? r.ha : r.hb, k & 1) : make_uint2(0, 0);
        const bool low = c < 4;
        const float dl = low ? r.d1 : r.d2, ml = low ? r.m1 : r.m2;
        const int j = 2 * r.g + (low ? 0 : 1);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            unsigned q = (byte_of(w, i) >> (low ? 0 : 4)) & 0x0fu;
            if (HIGH) q |= ((byte_of(h, i) >> j) & 1u) << 4;
            v[i] = __fsub_rn(__fmul_rn(dl, code_f(q)), ml);
        }
        return (u >> 2) * 256 + 64 * r.g + (low ? 0 : 32) + 8 * k;
    }
};

// Q6_K: a unit is l in 8k..8k+8 of half n of a super-block: values 128n + 32j + l, j < 4.
struct Q6K {
    static constexpr int VALS = 32;
    struct Raw {
        uint2 ql0, ql1, qh, sc;
        float d;
    };
    __device__ static int units(int cols) { return cols / 256 * 8; }
    __device__ static Raw load(const Planes& p, int row, int u, int cols) {
        Raw r;
        const int sb = u >> 3, n = (u >> 2) & 1, k = u & 3;
        const size_t at = (size_t)row * (cols / 256) + sb;
        const unsigned char* base = p.qs + at * 208;
        r.ql0 = qload8(base + 64 * n + 8 * k);
        r.ql1 = qload8(base + 64 * n + 32 + 8 * k);
        r.qh = qload8(base + 128 + 32 * n + 8 * k);
        r.sc = *reinterpret_cast<const uint2*>(base + 192 + 8 * n);
        r.d = f16_bits(p.d[at]);
        return r;
    }
    __device__ static int chunk(const Raw& r, int u, int j, float* v) {
        const int k = u & 3;
        const float dl = __fmul_rn(r.d, (float)(signed char)byte_of(r.sc, 2 * j + k / 2));
        const uint2 ql = (j & 1) ? r.ql1 : r.ql0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const unsigned low = (byte_of(ql, i) >> (4 * (j >> 1))) & 0x0fu;
            const unsigned high = (byte_of(r.qh, i) >> (2 * j)) & 3u;
            v[i] = __fmul_rn(dl, __fsub_rn(code_f(low | (high << 4)), 32.0f));
        }
        return (u >> 3) * 256 + 128 * ((u >> 2) & 1) + 32 * j + 8 * k;
    }
};

// R: the most rows the build takes (QG_ROWS, or 1 for decode's one row, whose build keeps
// fewer registers live and so more warps resident).
template <class F, int R>
__device__ __forceinline__ void qgemv_body(Planes p, int rows, int cols, const half_t* x, int n,
                                           void* y, int ldy, int y_mode, int c0, int cs) {
    grid_dep_enter();
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * QG_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    float acc[R];
#pragma unroll
    for (int t = 0; t < R; ++t) acc[t] = 0.0f;
    const int units = F::units(cols);
    for (int u = lane; u < units; u += 32) {
        const typename F::Raw r = F::load(p, row, u, cols);
#pragma unroll
        for (int c = 0; c < F::VALS / 8; ++c) {
            float v[8];
            const int col = F::chunk(r, u, c, v);
#pragma unroll
            for (int t = 0; t < R; ++t) {
                if (t < n) {
                    const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + (size_t)t * cols + col));
                    const unsigned xw[4] = {xv.x, xv.y, xv.z, xv.w};
                    float s = acc[t];
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        s = fmaf(v[2 * q], half_to_f32((half_t)(xw[q] & 0xffffu)), s);
                        s = fmaf(v[2 * q + 1], half_to_f32((half_t)(xw[q] >> 16)), s);
                    }
                    acc[t] = s;
                }
            }
        }
    }
    const size_t col = (size_t)c0 + (size_t)cs * row;
#pragma unroll
    for (int t = 0; t < R; ++t) {
        if (t < n) {
            float s = acc[t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == t) {
                const size_t at = (size_t)t * ldy + col;
                if (y_mode == 1) {
                    reinterpret_cast<half_t*>(y)[at] = f32_to_half(s);
                } else if (y_mode == 2) {
                    reinterpret_cast<float*>(y)[at] += s;
                } else {
                    reinterpret_cast<float*>(y)[at] = s;
                }
            }
        }
    }
}

// qdequant: band rows r_lo..r_hi into the 16-bit panel `out` of `cols` columns, row r at
// panel row c0 + cs·r - p0. grid: ceil((r_hi - r_lo) / QG_WARPS); block: 32 · QG_WARPS.
template <class F>
__device__ __forceinline__ void qdequant_body(Planes p, int r_lo, int r_hi, int cols,
                                              half_t* out, int c0, int cs, int p0) {
    grid_dep_enter();
    const int lane = threadIdx.x & 31;
    const int row = r_lo + blockIdx.x * QG_WARPS + (threadIdx.x >> 5);
    if (row >= r_hi) return;
    half_t* dst = out + (size_t)(c0 + cs * row - p0) * cols;
    const int units = F::units(cols);
    for (int u = lane; u < units; u += 32) {
        const typename F::Raw r = F::load(p, row, u, cols);
#pragma unroll
        for (int c = 0; c < F::VALS / 8; ++c) {
            float v[8];
            const int col = F::chunk(r, u, c, v);
            uint4 o;
            o.x = f32_to_half(v[0]) | ((unsigned)f32_to_half(v[1]) << 16);
            o.y = f32_to_half(v[2]) | ((unsigned)f32_to_half(v[3]) << 16);
            o.z = f32_to_half(v[4]) | ((unsigned)f32_to_half(v[5]) << 16);
            o.w = f32_to_half(v[6]) | ((unsigned)f32_to_half(v[7]) << 16);
            *reinterpret_cast<uint4*>(dst + col) = o;
        }
    }
}

// qembed: embed.cu's gather from a quantized table: row ids[r] (or the previous step's
// choice, as embed.cu reads it) times `scale`, plus row pos[r] of pos_table where given,
// into the fp32 residual. grid: n rows; block: any width.
template <class F>
__device__ __forceinline__ void qembed_body(Planes p, int cols, const int* ids, const int* fed,
                                            float* x, const float* pos_table, const int* pos,
                                            float scale) {
    const int r = blockIdx.x;
    int id = load_early(ids + r);
    grid_dep_enter();
    if (id < 0) id = max(fed[-id - 1], 0);
    float* dst = x + (size_t)r * cols;
    const float* pe = pos_table != nullptr ? pos_table + (size_t)pos[r] * cols : nullptr;
    const int units = F::units(cols);
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        const typename F::Raw raw = F::load(p, id, u, cols);
#pragma unroll
        for (int c = 0; c < F::VALS / 8; ++c) {
            float v[8];
            const int col = F::chunk(raw, u, c, v);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                dst[col + i] = v[i] * scale + (pe != nullptr ? pe[col + i] : 0.0f);
            }
        }
    }
}

#define QGEMV_ARGS                                                                        \
    const unsigned char *qs, const unsigned short *d, const unsigned short *m, int rows,  \
        int cols, const half_t *x, int n, void *y, int ldy, int y_mode, int c0, int cs
#define QDEQUANT_ARGS                                                                     \
    const unsigned char *qs, const unsigned short *d, const unsigned short *m, int r_lo,  \
        int r_hi, int cols, half_t *out, int c0, int cs, int p0
#define QEMBED_ARGS                                                                       \
    const unsigned char *qs, const unsigned short *d, const unsigned short *m, int cols,  \
        const int *ids, const int *fed, float *x, const float *pos_table, const int *pos, \
        float scale

extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv_q8)(QGEMV_ARGS) {
    qgemv_body<Q8, QG_ROWS>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv1_q8)(QGEMV_ARGS) {
    qgemv_body<Q8, 1>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv_q4)(QGEMV_ARGS) {
    qgemv_body<Q4, QG_ROWS>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv1_q4)(QGEMV_ARGS) {
    qgemv_body<Q4, 1>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv_q4k)(QGEMV_ARGS) {
    qgemv_body<QK45<false>, QG_ROWS>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv1_q4k)(QGEMV_ARGS) {
    qgemv_body<QK45<false>, 1>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv_q5k)(QGEMV_ARGS) {
    qgemv_body<QK45<true>, QG_ROWS>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv1_q5k)(QGEMV_ARGS) {
    qgemv_body<QK45<true>, 1>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv_q6k)(QGEMV_ARGS) {
    qgemv_body<Q6K, QG_ROWS>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv1_q6k)(QGEMV_ARGS) {
    qgemv_body<Q6K, 1>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs);
}

extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qdequant_q8)(QDEQUANT_ARGS) {
    qdequant_body<Q8>({qs, d, m}, r_lo, r_hi, cols, out, c0, cs, p0);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qdequant_q4)(QDEQUANT_ARGS) {
    qdequant_body<Q4>({qs, d, m}, r_lo, r_hi, cols, out, c0, cs, p0);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qdequant_q4k)(QDEQUANT_ARGS) {
    qdequant_body<QK45<false>>({qs, d, m}, r_lo, r_hi, cols, out, c0, cs, p0);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qdequant_q5k)(QDEQUANT_ARGS) {
    qdequant_body<QK45<true>>({qs, d, m}, r_lo, r_hi, cols, out, c0, cs, p0);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qdequant_q6k)(QDEQUANT_ARGS) {
    qdequant_body<Q6K>({qs, d, m}, r_lo, r_hi, cols, out, c0, cs, p0);
}

extern "C" __global__ void KERNEL(qembed_q8)(QEMBED_ARGS) {
    qembed_body<Q8>({qs, d, m}, cols, ids, fed, x, pos_table, pos, scale);
}
extern "C" __global__ void KERNEL(qembed_q4)(QEMBED_ARGS) {
    qembed_body<Q4>({qs, d, m}, cols, ids, fed, x, pos_table, pos, scale);
}
extern "C" __global__ void KERNEL(qembed_q4k)(QEMBED_ARGS) {
    qembed_body<QK45<false>>({qs, d, m}, cols, ids, fed, x, pos_table, pos, scale);
}
extern "C" __global__ void KERNEL(qembed_q5k)(QEMBED_ARGS) {
    qembed_body<QK45<true>>({qs, d, m}, cols, ids, fed, x, pos_table, pos, scale);
}
extern "C" __global__ void KERNEL(qembed_q6k)(QEMBED_ARGS) {
    qembed_body<Q6K>({qs, d, m}, cols, ids, fed, x, pos_table, pos, scale);
}
