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
//
// qdequant and qembed dequantize every value with the arithmetic, in the order, of the
// host's dequantizers (no contraction into fused multiply-adds), so qdequant's 16-bit panels
// are the host's dequantized weights rounded once. Their work is cut in units: a block of 32
// (q8, q4), two sub-blocks of 32 sharing their 32 code bytes (q4k, q5k), or 32 values of one
// half of a super-block (q6k), dequantized in chunks of 8 consecutive columns.
//
// qgemv computes as llama.cpp's CUDA and CPU backends and our CPU engine do: each block
// first quantizes the n x rows to int8 in blocks of 32 (d = amax / 127, q = round(x / d),
// and d·Σq for the minima) into shared memory, then the weight codes meet them in integer
// dot products (dp4a, four products an instruction, codes unpacked four at a time by masks),
// scaled once per block. A weight row is one warp's or `split` warps' (each a segment of
// its units); a warp's lane l takes its dot units l, l + 32, ...
// A dot unit is 32 values whose codes are 16 contiguous bytes (or, q8, 32): a block of 32
// (q8, q4), 16 code bytes of a Q4_K/Q5_K sub-block pair (low nibbles: 16 values of sub-block
// 2g, high: the same 16 of 2g + 1), or 16 ql bytes of a Q6_K half (low nibbles: 16 values of
// its 32-block j, high: of j + 2). The prologue writes each unit's 32 int8 x values as two
// 16-byte halves (low-nibble values, high-nibble values) where the warp's 32 lanes read them
// as consecutive 16-byte words: no shared-memory bank conflicts.
// qgemv: y[t, c0 + cs·r] (= or +=) sum_i x[t, i] · w[r, i] for t < n (n <= QG_ROWS; qgemv1:
// n = 1); y_mode 0: fp32, 1: 16-bit, 2: fp32 added to; row t of y at t·ldy; split divides
// QG_WARPS. grid: persistent (qgemm.rs's qgemv_plan); block: 32 · QG_WARPS; dynamic shared
// memory qgemv_smem(n, cols).
#define QG_WARPS 8
#define QG_ROWS 8
// Dot units a lane loads before it multiplies them (the first ones before the
// predecessor's wait: weights do not depend on it).
#define QG_U 4
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

// Weight loads of qgemv: EARLY ones are issued before the predecessor wait (a volatile load
// keeps its place ahead of griddepcontrol.wait: common.cuh), the others stream past L1.
template <bool EARLY>
__device__ __forceinline__ uint4 wload16(const unsigned char* p) {
    uint4 v;
    if (EARLY) {
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
    } else {
        v = qload16(p);
    }
    return v;
}
template <bool EARLY>
__device__ __forceinline__ uint2 wload8(const unsigned char* p) {
    uint2 v;
    if (EARLY) {
        asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    } else {
        v = qload8(p);
    }
    return v;
}
template <bool EARLY>
__device__ __forceinline__ float wload_f16(const unsigned short* p) {
    unsigned short h;
    if (EARLY) {
        asm volatile("ld.volatile.global.u16 %0, [%1];" : "=h"(h) : "l"(p));
    } else {
        asm("ld.global.nc.u16 %0, [%1];" : "=h"(h) : "l"(p));
    }
    return f16_bits(h);
}

// Four byte products summed into c: a's bytes unsigned or signed (us / ss), b's signed.
__device__ __forceinline__ int dot4_us(unsigned a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ int dot4_ss(unsigned a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
#define LOW4 0x0f0f0f0fu
#define ONES 0x01010101u

// An integer (|s| < 2^22) as a float without the quarter-rate conversion.
__device__ __forceinline__ float int_f(int s) {
    return __int_as_float(0x4b400000 + s) - 12582912.0f;
}

// The int8 x rows of one qgemv block in shared memory, as quantize_rows wrote them.
struct XS {
    const signed char* q;  // row t at t * stride; unit v's half h at unit_at(v, h)
    const float2* ds;      // per block of 32: (d, d·Σq); row t at t * (cols / 32)
    int stride, blocks;
    __device__ static int unit_at(int v, int h) { return 1024 * (v >> 5) + 512 * h + 16 * (v & 31); }
    __device__ int4 half(int t, int v, int h) const {
        return *reinterpret_cast<const int4*>(q + t * stride + unit_at(v, h));
    }
    __device__ float2 block(int t, int b) const { return ds[t * blocks + b]; }
};

// Integer dot products of 16 codes (four words) with 16 int8 x values; sum16: Σ of the x.
__device__ __forceinline__ int dot16_us(const unsigned* w, int4 x) {
    return dot4_us(w[3], x.w, dot4_us(w[2], x.z, dot4_us(w[1], x.y, dot4_us(w[0], x.x, 0))));
}
__device__ __forceinline__ int dot16_ss(const unsigned* w, int4 x) {
    return dot4_ss(w[3], x.w, dot4_ss(w[2], x.z, dot4_ss(w[1], x.y, dot4_ss(w[0], x.x, 0))));
}
__device__ __forceinline__ int sum16(int4 x) {
    return dot4_ss(ONES, x.w, dot4_ss(ONES, x.z, dot4_ss(ONES, x.y, dot4_ss(ONES, x.x, 0))));
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

    // qgemv's dot unit v: block v.
    static constexpr int G = 2;
    struct D {
        uint4 a, b;
        float d, m;
    };
    template <bool EARLY>
    __device__ static D dload(const Planes& p, int row, int v, int cols) {
        D r;
        const unsigned char* q = p.qs + (size_t)row * cols + 32 * v;
        r.a = wload16<EARLY>(q);
        r.b = wload16<EARLY>(q + 16);
        const size_t bi = (size_t)row * (cols / 32) + v;
        r.d = wload_f16<EARLY>(p.d + bi);
        r.m = p.m != nullptr ? wload_f16<EARLY>(p.m + bi) : 0.0f;
        return r;
    }
    template <int R>
    __device__ static void dot(const Planes& p, const D& r, int v, const XS& x, int n, float* acc) {
        const unsigned a[4] = {r.a.x, r.a.y, r.a.z, r.a.w}, b[4] = {r.b.x, r.b.y, r.b.z, r.b.w};
#pragma unroll
        for (int t = 0; t < R; ++t) {
            if (t < n) {
                const int4 x0 = x.half(t, v, 0), x1 = x.half(t, v, 1);
                const int s = p.m != nullptr ? dot16_us(a, x0) + dot16_us(b, x1)
                                             : dot16_ss(a, x0) + dot16_ss(b, x1);
                const float2 e = x.block(t, v);
                acc[t] += r.d * e.x * int_f(s) + r.m * e.y;
            }
        }
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

    // qgemv's dot unit v: block v, its low nibbles values 0..16, high 16..32.
    static constexpr int G = 2;
    struct D {
        uint4 a;
        float d, m;
    };
    template <bool EARLY>
    __device__ static D dload(const Planes& p, int row, int v, int cols) {
        D r;
        r.a = wload16<EARLY>(p.qs + (size_t)row * (cols / 2) + 16 * v);
        const size_t bi = (size_t)row * (cols / 32) + v;
        r.d = wload_f16<EARLY>(p.d + bi);
        r.m = p.m != nullptr ? wload_f16<EARLY>(p.m + bi) : -8.0f * r.d;
        return r;
    }
    template <int R>
    __device__ static void dot(const Planes&, const D& r, int v, const XS& x, int n, float* acc) {
        const unsigned w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
        const unsigned lo[4] = {w[0] & LOW4, w[1] & LOW4, w[2] & LOW4, w[3] & LOW4};
        const unsigned hi[4] = {(w[0] >> 4) & LOW4, (w[1] >> 4) & LOW4, (w[2] >> 4) & LOW4,
                                (w[3] >> 4) & LOW4};
#pragma unroll
        for (int t = 0; t < R; ++t) {
            if (t < n) {
                const int s = dot16_us(lo, x.half(t, v, 0)) + dot16_us(hi, x.half(t, v, 1));
                const float2 e = x.block(t, v);
                acc[t] += r.d * e.x * int_f(s) + r.m * e.y;
            }
        }
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

    // qgemv's dot unit v: code bytes 16k..16k+16 of sub-block pair g of super-block sb
    // (v = 8sb + 2g + k): low nibbles values 16k.. of sub-block 2g, high of 2g + 1.
    static constexpr int G = 4;
    struct D {
        uint4 hdr, c, h;
    };
    template <bool EARLY>
    __device__ static D dload(const Planes& p, int row, int v, int cols) {
        D r;
        const int sb = v >> 3, g = (v >> 1) & 3, k = v & 1;
        const unsigned char* base = p.qs + ((size_t)row * (cols / 256) + sb) * BYTES;
        r.hdr = wload16<EARLY>(base);
        r.c = wload16<EARLY>(base + CODES + 32 * g + 16 * k);
        if (HIGH) r.h = wload16<EARLY>(base + 16 + 16 * k);
        return r;
    }
    // The 6-bit scales and minima of sub-blocks 2g and 2g + 1 from the header's words
    // (kquant.rs's get_scale_min_k4 for two sub-blocks at once).
    __device__ static void scales2(const uint4& hdr, int g, unsigned& sc1, unsigned& m1,
                                   unsigned& sc2, unsigned& m2) {
        const int sh = 16 * (g & 1);
        const unsigned a = hdr.y >> sh, b = hdr.z >> sh;
        if (g < 2) {
            sc1 = a & 63u;
            sc2 = (a >> 8) & 63u;
            m1 = b & 63u;
            m2 = (b >> 8) & 63u;
        } else {
            const unsigned c = hdr.w >> sh;
            sc1 = (c & 15u) | ((a >> 2) & 0x30u);
            sc2 = ((c >> 8) & 15u) | ((a >> 10) & 0x30u);
            m1 = ((c >> 4) & 15u) | ((b >> 2) & 0x30u);
            m2 = ((c >> 12) & 15u) | ((b >> 10) & 0x30u);
        }
    }
    template <int R>
    __device__ static void dot(const Planes&, const D& r, int v, const XS& x, int n, float* acc) {
        const int sb = v >> 3, g = (v >> 1) & 3, k = v & 1;
        const unsigned w[4] = {r.c.x, r.c.y, r.c.z, r.c.w};
        unsigned lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            lo[i] = w[i] & LOW4;
            hi[i] = (w[i] >> 4) & LOW4;
        }
        if (HIGH) {
            const unsigned hw[4] = {r.h.x, r.h.y, r.h.z, r.h.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                lo[i] |= ((hw[i] >> (2 * g)) & ONES) << 4;
                hi[i] |= ((hw[i] >> (2 * g + 1)) & ONES) << 4;
            }
        }
        unsigned sc1, m1, sc2, m2;
        scales2(r.hdr, g, sc1, m1, sc2, m2);
        const float d = f16_bits((unsigned short)(r.hdr.x & 0xffffu));
        const float dmin = f16_bits((unsigned short)(r.hdr.x >> 16));
        const float d1 = d * code_f(sc1), d2 = d * code_f(sc2);
        // The minima weigh whole sub-blocks: lane k = 0 of the pair adds them.
        const float mm1 = k == 0 ? dmin * code_f(m1) : 0.0f;
        const float mm2 = k == 0 ? dmin * code_f(m2) : 0.0f;
        const int b1 = 8 * sb + 2 * g;
#pragma unroll
        for (int t = 0; t < R; ++t) {
            if (t < n) {
                const int s1 = dot16_us(lo, x.half(t, v, 0));
                const int s2 = dot16_us(hi, x.half(t, v, 1));
                const float2 e1 = x.block(t, b1), e2 = x.block(t, b1 + 1);
                acc[t] += d1 * e1.x * int_f(s1) + d2 * e2.x * int_f(s2) - mm1 * e1.y - mm2 * e2.y;
            }
        }
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

    // qgemv's dot unit v: ql bytes 32j + 16k..+16 of half n of super-block sb (v = 8sb +
    // 4n + 2j + k): low nibbles values 16k.. of its 32-block j, high of block j + 2.
    static constexpr int G = 8;
    struct D {
        uint4 ql, qh;
        uint2 sc;
        float d;
    };
    template <bool EARLY>
    __device__ static D dload(const Planes& p, int row, int v, int cols) {
        D r;
        const int sb = v >> 3, n = (v >> 2) & 1, j = (v >> 1) & 1, k = v & 1;
        const size_t at = (size_t)row * (cols / 256) + sb;
        const unsigned char* base = p.qs + at * 208;
        r.ql = wload16<EARLY>(base + 64 * n + 32 * j + 16 * k);
        r.qh = wload16<EARLY>(base + 128 + 32 * n + 16 * k);
        r.sc = wload8<EARLY>(base + 192 + 8 * n);
        r.d = wload_f16<EARLY>(p.d + at);
        return r;
    }
    template <int R>
    __device__ static void dot(const Planes&, const D& r, int v, const XS& x, int n, float* acc) {
        const int sb = v >> 3, hf = (v >> 2) & 1, j = (v >> 1) & 1, k = v & 1;
        const unsigned l[4] = {r.ql.x, r.ql.y, r.ql.z, r.ql.w};
        const unsigned h[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
        unsigned a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            a[i] = (l[i] & LOW4) | (((h[i] >> (2 * j)) & 0x03030303u) << 4);
            b[i] = ((l[i] >> 4) & LOW4) | (((h[i] >> (2 * j + 4)) & 0x03030303u) << 4);
        }
        // Scales of 16 values: index 2j + k of the half's 8 (low), 2j + 4 + k (high).
        const int sh = 8 * (2 * j + k);
        const float da = r.d * (float)(signed char)((r.sc.x >> sh) & 0xffu);
        const float db = r.d * (float)(signed char)((r.sc.y >> sh) & 0xffu);
        const int ba = 8 * sb + 4 * hf + j;
#pragma unroll
        for (int t = 0; t < R; ++t) {
            if (t < n) {
                const int4 x0 = x.half(t, v, 0), x1 = x.half(t, v, 1);
                // Codes are q + 32, unsigned: the offset comes off as 32·Σx.
                const int sa = dot16_us(a, x0) - 32 * sum16(x0);
                const int sbb = dot16_us(b, x1) - 32 * sum16(x1);
                acc[t] += da * x.block(t, ba).x * int_f(sa) + db * x.block(t, ba + 2).x * int_f(sbb);
            }
        }
    }
};

// The n x rows of `cols` (16-bit, contiguous) as int8 blocks of 32 into shared memory for
// format F (XS: unit v's half h at unit_at(v, h), G 16-value chunks to a group whose dot
// units interleave them), by the whole block: a thread takes 8 values, four threads a block.
template <int G>
__device__ __forceinline__ void quantize_rows(const half_t* __restrict__ x, int n, int cols,
                                              int stride, signed char* xq, float2* xds) {
    const int per = cols / 8;
    const int chunks = n * per;
    // Whole block-widths of iterations, so that every lane of a warp shuffles.
    const int lim = (chunks + blockDim.x - 1) / blockDim.x * blockDim.x;
    for (int c = threadIdx.x; c < lim; c += blockDim.x) {
        const bool in = c < chunks;
        const uint4 raw = in ? __ldg(reinterpret_cast<const uint4*>(x) + c) : make_uint4(0, 0, 0, 0);
        const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
        float v[8];
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[2 * i] = half_to_f32((half_t)(w[i] & 0xffffu));
            v[2 * i + 1] = half_to_f32((half_t)(w[i] >> 16));
            amax = fmaxf(amax, fmaxf(fabsf(v[2 * i]), fabsf(v[2 * i + 1])));
        }
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        const float d = amax / 127.0f;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        unsigned packed[2] = {0u, 0u};
        int sum = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = (int)roundf(v[i] * id);
            sum += q;
            packed[i >> 2] |= ((unsigned)q & 0xffu) << (8 * (i & 3));
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (in) {
            const int t = c / per, cc = c - t * per;
            const int c16 = cc >> 1, w16 = c16 % G;
            const int pos = 2 * (w16 % (G / 2)) + w16 / (G / 2);
            const int u = (c16 / G) * (G / 2) + (pos >> 1);
            *reinterpret_cast<uint2*>(xq + t * stride + XS::unit_at(u, pos & 1) + 8 * (cc & 1)) =
                make_uint2(packed[0], packed[1]);
            if ((c & 3) == 0) xds[c >> 2] = make_float2(d, d * (float)sum);
        }
    }
}

// This warp's place in its block's share of a qgemv: step k·upl + j of a lane is unit
// u0 + lane + 32j of row `row(k)` (its group k-th of the block's, its row within the group
// w / split).
struct QgStep {
    int k, j;
    __device__ void next(int upl) {
        if (++j == upl) {
            j = 0;
            ++k;
        }
    }
};

// R: the most rows the build takes (QG_ROWS, or 1 for decode's one row, whose build keeps
// fewer registers live and so more blocks resident). The grid is persistent: block b takes
// groups b, b + gridDim.x, ... of QG_WARPS / split weight rows; `split` warps share a row,
// each a segment of its units, and add their sums through shared memory. A lane streams its
// units of all its groups as one sequence, QG_U loads ahead of its products.
template <class F, int R>
__device__ __forceinline__ void qgemv_body(Planes p, int rows, int cols, const half_t* x, int n,
                                           void* y, int ldy, int y_mode, int c0, int cs,
                                           int split) {
    extern __shared__ int4 qg_smem[];
    __shared__ float part[QG_WARPS][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int units = cols / 32;
    const int rpg = QG_WARPS / split;
    const int groups = (rows + rpg - 1) / rpg;
    const int per = (units + split - 1) / split;
    const int u0 = (warp % split) * per, u1 = min(units, u0 + per);
    const int upl = (per + 31) / 32;
    const int mine =
        groups > (int)blockIdx.x ? (groups - (int)blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const int total = mine * upl;
    const int in_group = warp / split;
    auto row_of = [&](int k) { return ((int)blockIdx.x + k * (int)gridDim.x) * rpg + in_group; };
    typename F::D u[QG_U];
    QgStep ld{0, 0};
#pragma unroll
    for (int i = 0; i < QG_U; ++i) {
        const int row = row_of(ld.k), v = u0 + lane + 32 * ld.j;
        if (i < total && row < rows && v < u1) u[i] = F::template dload<true>(p, row, v, cols);
        ld.next(upl);
    }
    grid_dep_enter();
    const int stride = (cols + 1023) / 1024 * 1024;
    signed char* xq = reinterpret_cast<signed char*>(qg_smem);
    float2* xds = reinterpret_cast<float2*>(xq + n * stride);
    quantize_rows<F::G>(x, n, cols, stride, xq, xds);
    __syncthreads();
    const XS xs{xq, xds, stride, cols / 32};
    float acc[R];
#pragma unroll
    for (int t = 0; t < R; ++t) acc[t] = 0.0f;
    QgStep at{0, 0};
    for (int s0 = 0; s0 < total; s0 += QG_U) {
#pragma unroll
        for (int i = 0; i < QG_U; ++i) {
            if (s0 + i < total) {
                const int row = row_of(at.k), v = u0 + lane + 32 * at.j;
                if (row < rows && v < u1) F::template dot<R>(p, u[i], v, xs, n, acc);
                const int rn = row_of(ld.k), vn = u0 + lane + 32 * ld.j;
                if (s0 + i + QG_U < total && rn < rows && vn < u1) {
                    u[i] = F::template dload<false>(p, rn, vn, cols);
                }
                ld.next(upl);
                if (at.j == upl - 1) {
                    // The group's last step: its rows' sums out.
#pragma unroll
                    for (int t = 0; t < R; ++t) {
                        float sum = acc[t];
#pragma unroll
                        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                        acc[t] = sum;
                    }
                    if (split > 1) {
                        if (lane == 0) {
#pragma unroll
                            for (int t = 0; t < R; ++t) part[warp][t] = acc[t];
                        }
                        __syncthreads();
                        if (warp % split == 0) {
#pragma unroll
                            for (int t = 0; t < R; ++t) {
                                float sum = 0.0f;
                                for (int w = 0; w < split; ++w) sum += part[warp + w][t];
                                acc[t] = sum;
                            }
                        }
                    }
                    if (warp % split == 0 && row < rows) {
                        const size_t col = (size_t)c0 + (size_t)cs * row;
#pragma unroll
                        for (int t = 0; t < R; ++t) {
                            if (t < n && lane == t) {
                                const size_t o = (size_t)t * ldy + col;
                                if (y_mode == 1) {
                                    reinterpret_cast<half_t*>(y)[o] = f32_to_half(acc[t]);
                                } else if (y_mode == 2) {
                                    reinterpret_cast<float*>(y)[o] += acc[t];
                                } else {
                                    reinterpret_cast<float*>(y)[o] = acc[t];
                                }
                            }
                        }
                    }
                    if (split > 1) __syncthreads();
#pragma unroll
                    for (int t = 0; t < R; ++t) acc[t] = 0.0f;
                }
                at.next(upl);
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
        int cols, const half_t *x, int n, void *y, int ldy, int y_mode, int c0, int cs, int split
#define QDEQUANT_ARGS                                                                     \
    const unsigned char *qs, const unsigned short *d, const unsigned short *m, int r_lo,  \
        int r_hi, int cols, half_t *out, int c0, int cs, int p0
#define QEMBED_ARGS                                                                       \
    const unsigned char *qs, const unsigned short *d, const unsigned short *m, int cols,  \
        const int *ids, const int *fed, float *x, const float *pos_table, const int *pos, \
        float scale

extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv_q8)(QGEMV_ARGS) {
    qgemv_body<Q8, QG_ROWS>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs, split);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS, 3) KERNEL(qgemv1_q8)(QGEMV_ARGS) {
    qgemv_body<Q8, 1>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs, split);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv_q4)(QGEMV_ARGS) {
    qgemv_body<Q4, QG_ROWS>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs, split);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS, 3) KERNEL(qgemv1_q4)(QGEMV_ARGS) {
    qgemv_body<Q4, 1>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs, split);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv_q4k)(QGEMV_ARGS) {
    qgemv_body<QK45<false>, QG_ROWS>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs, split);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS, 3) KERNEL(qgemv1_q4k)(QGEMV_ARGS) {
    qgemv_body<QK45<false>, 1>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs, split);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv_q5k)(QGEMV_ARGS) {
    qgemv_body<QK45<true>, QG_ROWS>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs, split);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv1_q5k)(QGEMV_ARGS) {
    qgemv_body<QK45<true>, 1>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs, split);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS) KERNEL(qgemv_q6k)(QGEMV_ARGS) {
    qgemv_body<Q6K, QG_ROWS>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs, split);
}
extern "C" __global__ void __launch_bounds__(32 * QG_WARPS, 3) KERNEL(qgemv1_q6k)(QGEMV_ARGS) {
    qgemv_body<Q6K, 1>({qs, d, m}, rows, cols, x, n, y, ldy, y_mode, c0, cs, split);
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
