// Shared helpers of the inflight kernels: the 16-bit float type of the module (bf16 or
// f16, stored as raw 16-bit words so NVRTC needs no CUDA headers), its conversions, and
// warp and block reductions.
// Each module is compiled twice: with INFLIGHT_F16 its 16-bit type is IEEE half (entry
// points end in _f16), without it bfloat16 (_bf16). Both are stored as raw 16-bit words.
typedef unsigned short half_t;

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

#ifdef INFLIGHT_F16
#define KERNEL(name) name##_f16
__device__ __forceinline__ float half_to_f32(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ half_t f32_to_half(float f) {
    half_t r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
#else
#define KERNEL(name) name##_bf16
__device__ __forceinline__ float half_to_f32(half_t h) {
    return __uint_as_float(((unsigned int)h) << 16);
}
// Round to nearest even, as the host's `half` crate does.
__device__ __forceinline__ half_t f32_to_half(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (half_t)((u >> 16) | 0x40u);  // NaN stays NaN (quiet)
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (half_t)(u >> 16);
}
#endif

// SwiGLU's product for one gate value and its up value: silu(g) * u.
__device__ __forceinline__ float silu_times(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// Programmatic dependent launch (sm_90 and later). The host launches every kernel so that
// it may begin while the kernel before it on the stream is still finishing. So each kernel
// calls grid_dep_wait() before it reads anything an earlier kernel wrote, or writes anything
// at all: it returns once that kernel has completed and its writes are visible. Only
// immutable data (weights) may be read before it. grid_dep_launch() then lets the next
// kernel start launching into the SMs this one leaves free (rms_norm may call it before
// its wait: norm.cu). Both are no-ops for a launch without the attribute and before sm_90.
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#ifdef INFLIGHT_TIMELINE
// The kernel timeline of `gpu-profile` (INFLIGHT_TIMELINE=1, profiling runs only): the host
// points every module's `inflight_timeline` at one buffer of TIMELINE_SLOTS (time, tag)
// pairs. Once its predecessor has completed, the first thread of a kernel's first block
// writes %globaltimer and where it is (module INFLIGHT_MODULE_ID, source line) into the
// slot of that time's 256 ns tick: no atomics, and the buffer's address is read before the
// wait, so the mark adds no round trip to the chain. Kernels of one chain pass their waits
// microseconds apart, so they never share a slot.
#define TIMELINE_SLOTS (1 << 20)
__device__ unsigned long long* inflight_timeline;
__device__ __forceinline__ bool timeline_marker() {
    return (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) == 0;
}
// A volatile load, so that it stays ahead of the wait (the compiler may move a plain load
// of a variable it knows does not change in the kernel to where it is used).
__device__ __forceinline__ unsigned long long* timeline_buffer() {
    return timeline_marker() ? *reinterpret_cast<unsigned long long* volatile*>(&inflight_timeline)
                             : nullptr;
}
__device__ __forceinline__ void timeline_mark(unsigned long long* b, unsigned line) {
    if (b != nullptr) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        const unsigned long long slot = (t >> 8) & (TIMELINE_SLOTS - 1);
        const unsigned long long tag = ((unsigned long long)INFLIGHT_MODULE_ID << 32) | line;
        asm volatile("st.global.v2.u64 [%0], {%1, %2};" ::"l"(b + 2 * slot), "l"(t), "l"(tag)
                     : "memory");
    }
}
#else
__device__ __forceinline__ unsigned long long* timeline_buffer() { return nullptr; }
__device__ __forceinline__ void timeline_mark(unsigned long long*, unsigned) {}
#endif

// Both, at the top of a kernel that reads nothing before its predecessor is done (a macro,
// so that the timeline names the kernel's own line).
__device__ __forceinline__ void grid_dep_enter_at(unsigned line) {
    unsigned long long* mark = timeline_buffer();
    grid_dep_wait();
    timeline_mark(mark, line);
    grid_dep_launch();
}
#define grid_dep_enter() grid_dep_enter_at(__LINE__)

// Data ready before the predecessor (weights, the step's upload), loaded where the load
// stands in the program, ahead of the predecessor wait. Moving a read later is always
// legal, and both compilers do it: NVVM sinks plain loads to their first use, and ptxas
// schedules even an asm volatile ld.global.nc after griddepcontrol.wait (ACQBULK in the
// SASS). A volatile load keeps its place.
__device__ __forceinline__ float4 load_early(const float4* p) {
    float4 v;
    asm volatile("ld.volatile.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ int load_early(const int* p) {
    int v;
    asm volatile("ld.volatile.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// Four floats as four 16-bit values, one 8-byte store (dst 8-byte aligned).
__device__ __forceinline__ void store_half4(half_t* dst, float a, float b, float c, float d) {
    uint2 v;
    v.x = (unsigned)f32_to_half(a) | ((unsigned)f32_to_half(b) << 16);
    v.y = (unsigned)f32_to_half(c) | ((unsigned)f32_to_half(d) << 16);
    *reinterpret_cast<uint2*>(dst) = v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v, float* scratch /* 32 floats */) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    float t = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(t);
}

// Tensor-core and asynchronous-copy helpers (the flash attention kernels).

// Shared-space address (bytes) of a pointer into shared memory.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// The PTX spelling of the module's 16-bit type in cvt and mma.
#ifdef INFLIGHT_F16
#define FA_X2 "f16x2"
#define FA_AB "f16.f16"
#else
#define FA_X2 "bf16x2"
#define FA_AB "bf16.bf16"
#endif

// Two floats as one register of two 16-bit values, `lo` in the low half.
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn." FA_X2 ".f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// c += a * b on the tensor cores: a 16x16 (row-major fragments), b 16x8, c 16x8 fp32.
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    // Not volatile: a pure function of its registers, which the compiler may schedule
    // around the shared-memory loads.
    asm("mma.sync.aligned.m16n8k16.row.col.f32." FA_AB ".f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix from a shared-space address (bytes), so constant offsets fold into the
// instruction.
__device__ __forceinline__ void ldsm_x4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 16 bytes global -> shared (a shared-space address); `bytes` 0 writes zeros (src is not
// read).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// One step of the online softmax (base 2) for row i (0: lane / 4, 1: lane / 4 + 8) of a
// warp's mma.m16n8 accumulator tile of NB n-blocks: the row's scores in s become their
// exponentials against the new running maximum `m`, the running sum `l` takes them in, and
// the return value is the factor that rescales the row's earlier accumulators. The maximum
// and the sum over the thread's keys reduce as trees (short dependency chains), then over
// the row's four lanes.
template <int NB>
__device__ __forceinline__ float softmax_row_step(float (&s)[NB][4], int i, float& m, float& l) {
    float t[NB];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) t[nb] = fmaxf(s[nb][2 * i], s[nb][2 * i + 1]);
#pragma unroll
    for (int w = NB / 2; w > 0; w /= 2) {
#pragma unroll
        for (int nb = 0; nb < w; ++nb) t[nb] = fmaxf(t[nb], t[nb + w]);
    }
    float mx = t[0];
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m, mx);
    const float base = mn == -INFINITY ? 0.0f : mn;
    const float corr = ex2(m - base);
    m = mn;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        s[nb][2 * i] = ex2(s[nb][2 * i] - base);
        s[nb][2 * i + 1] = ex2(s[nb][2 * i + 1] - base);
        t[nb] = s[nb][2 * i] + s[nb][2 * i + 1];
    }
#pragma unroll
    for (int w = NB / 2; w > 0; w /= 2) {
#pragma unroll
        for (int nb = 0; nb < w; ++nb) t[nb] += t[nb + w];
    }
    l = l * corr + t[0];
    return corr;
}

// Writes row i (0: lane / 4, 1: lane / 4 + 8) of a warp's mma.m16n8 accumulator tile of
// HD / 8 n-blocks, divided by the row's running sum l (this lane's part: the row's four lanes
// add theirs here, so every lane calls it), as 16-bit values: batch row `row` (nothing where
// it is negative), query head `head`; dimensions past hd are not written.
template <int HD>
__device__ __forceinline__ void store_out_row(const float (&o)[HD / 8][4], int i, float l, half_t* __restrict__ out,
                                              int row, int head, int heads, int hd) {
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (row < 0) return;
    const float inv = 1.0f / l;
    half_t* dst = out + (size_t)row * heads * hd + head * hd + 2 * (threadIdx.x & 3);
#pragma unroll
    for (int dn = 0; dn < HD / 8; ++dn) {
        if (dn * 8 < hd) {
            *reinterpret_cast<unsigned*>(dst + dn * 8) = pack2(o[dn][2 * i] * inv, o[dn][2 * i + 1] * inv);
        }
    }
}

// Shared address of 16-byte piece p (8 columns) of row r in a region of `rows` rows laid out
// as wgmma's 128-byte swizzle wants it: each 64-column half of the rows in turn, 128 bytes a
// row, a row's pieces XOR-ed with the row's index mod 8 (the region 1,024-byte aligned).
__device__ __forceinline__ unsigned sw128_at(unsigned region, int rows, int r, int p) {
    return region + (unsigned)((p >> 3) * rows * 128 + r * 128 + (((p & 7) ^ (r & 7)) << 4));
}

// Flash attention stage loader: keys [from, min(from + STAGE, kend)) of KV head g, K rows
// then V rows at shared address `stage_k`, gathered through the sequence's block table with
// cp.async: rows of LD halves (V STAGE rows on), or with LD 0 the 128-byte swizzled layout
// (sw128_at; V STAGE * HD halves on). Thread t of THREADS copies 16-byte piece t % (HD / 8)
// of STAGE * (HD / 8) / THREADS consecutive keys, walking the table (one lookup per KV block
// it enters, not per key); pieces past hd and keys past kend are zeros. bs_shift is
// log2(block_size) when that is a power of two (no division), else -1. Only the rows of keys
// in [lo, hi) are copied (the stage in two parts: keys written before the kernel, then the
// rest).
template <int HD, int STAGE, int THREADS, int LD>
__device__ __forceinline__ void load_kv_stage(unsigned stage_k, const half_t* __restrict__ k_cache,
                                              const half_t* __restrict__ v_cache,
                                              const int* __restrict__ table, int from, int kend,
                                              int g, int hd, int kvd, int block_size,
                                              int bs_shift, int lo = -2147483647 - 1,
                                              int hi = 2147483647) {
    constexpr int PIECES = HD / 8, KEYS_PER = STAGE * PIECES / THREADS;
    const int nk = min(STAGE, kend - from);
    const int piece = threadIdx.x % PIECES, jfirst = (threadIdx.x / PIECES) * KEYS_PER;
    const bool in_row = piece * 8 < hd;
    const size_t col = (size_t)g * hd + piece * 8;
    int p = from + jfirst;
    int blk = bs_shift >= 0 ? p >> bs_shift : p / block_size;
    int within = p - blk * block_size;
    // Element offset of key p's piece in the cache (valid while p < kend).
    size_t off = p < kend ? ((size_t)table[blk] * block_size + within) * kvd + col : 0;
    const unsigned dst = stage_k + (unsigned)((jfirst * LD + piece * 8) * 2);
    auto copy = [&](int i) {
        if (from + jfirst + i < lo || from + jfirst + i >= hi) return;
        const bool valid = jfirst + i < nk && in_row;
        const size_t at = valid ? off : 0;
        const int bytes = valid ? 16 : 0;
        if constexpr (LD > 0) {
            cp_async16(dst + i * LD * 2, k_cache + at, bytes);
            cp_async16(dst + (STAGE + i) * LD * 2, v_cache + at, bytes);
        } else {
            const unsigned sw = sw128_at(stage_k, STAGE, jfirst + i, piece);
            cp_async16(sw, k_cache + at, bytes);
            cp_async16(sw + STAGE * HD * 2, v_cache + at, bytes);
        }
    };
    if (within + KEYS_PER <= block_size) {
        // The thread's keys lie in one KV block (always so where block_size is a multiple of
        // KEYS_PER, stages starting at multiples of STAGE): no table walk.
#pragma unroll
        for (int i = 0; i < KEYS_PER; ++i) {
            copy(i);
            off += kvd;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < KEYS_PER; ++i) {
        copy(i);
        ++p;
        if (++within == block_size) {
            within = 0;
            ++blk;
            off = p < kend ? (size_t)table[blk] * block_size * kvd + col : 0;
        } else {
            off += kvd;
        }
    }
}

// A prefill tile's queries into shared memory with cp.async (not committed): M row r (atom
// r / 16, row m = r % 16 of it) of ROWS is position (r / 16) * pw + m / group of the tile
// (`cnt` batch rows from row0), query head g * group + m % group; rows past the tile and
// dimensions past hd are zeros. Rows of LD halves at shared address `smem`, or with LD 0
// the 128-byte swizzled layout (sw128_at). The block's threads step by `step`.
template <int HD, int ROWS, int LD>
__device__ __forceinline__ void gather_q_tile(unsigned smem, const half_t* __restrict__ q, int row0, int cnt,
                                              int heads, int g, int group, int pw, int hd, int step) {
    for (int t = threadIdx.x; t < ROWS * (HD / 8); t += step) {
        const int r = t / (HD / 8), d = (t % (HD / 8)) * 8;
        const int m = r & 15, pi = (r >> 4) * pw + m / group;
        const bool valid = m < pw * group && pi < cnt && d < hd;
        const half_t* src = valid ? q + (size_t)(row0 + pi) * heads * hd + (g * group + m % group) * hd + d : q;
        const unsigned dst = LD > 0 ? smem + (unsigned)((r * LD + d) * 2) : sw128_at(smem, ROWS, r, d / 8);
        cp_async16(dst, src, valid ? 16 : 0);
    }
}

// The arguments of the prefill attention kernels (flash_prefill.cu, flash_prefill_sm90.cu),
// in the host's order: q [n, heads * hd] (16-bit, pre-scaled), k_cache and v_cache [slots,
// kv_heads * hd], tables [seqs, table_stride], row_seq and row_pos [n], tiles [tiles, 2]
// (first row, rows), out [n, heads * hd]; and the same names passed on.
#define PREFILL_ARGS                                                                             \
    const half_t* __restrict__ q, const half_t* __restrict__ k_cache,                            \
        const half_t* __restrict__ v_cache, const int* __restrict__ tables,                      \
        const int* __restrict__ row_seq, const int* __restrict__ row_pos,                        \
        const int* __restrict__ tiles, half_t* __restrict__ out, int heads, int kv_heads, int hd, \
        int block_size, int table_stride
#define PREFILL_PASS \
    q, k_cache, v_cache, tables, row_seq, row_pos, tiles, out, heads, kv_heads, hd, block_size, \
        table_stride
