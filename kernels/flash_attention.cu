// Tensor-core paged causal attention (mma.sync m16n8k16, fp32 accumulation) over tiles of
// query rows. A tile is (first row, count): consecutive rows of one sequence at consecutive
// positions. Its "M rows" are (position, query head of the KV head's group) pairs, 16 to a
// warp: a warp holds 16 / group positions.
//
// Two ways to spread a tile over the block's 4 warps:
//   - flash_attention_rows (prefill): the tile holds 4 warps' worth of positions; each warp
//     owns 16 M rows and all warps share every K/V stage loaded into shared memory.
//   - flash_attention_keys (decode, a few positions): one warp's worth of rows; each warp
//     takes a quarter of every stage's keys and the warps merge at the end. Long contexts
//     are also split over the grid (blockIdx.z), as partial sums for attention_combine (attention.cu).
// K and V stages of 64 keys are gathered through the block table with cp.async into two
// buffers of dynamic shared memory (the next stage loads while this one computes; rows
// past the stage's end are zero-filled), read back with ldmatrix, and the online softmax runs in
// base 2 (the query is pre-scaled by log2(e) / sqrt(head_dim)), once per stage for a
// prefill warp (64 keys), once per 16 keys for a decode warp. Each kernel comes in two
// register budgets, head_dim up to 64 (_hd64) and up to 128 (_hd128); head_dim must be a
// multiple of 16, with at most 16 query heads per KV head.
#define FA_WARPS 4
#define FA_STAGE 64
#define FA_LN2 0.69314718055994530942f

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
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32." FA_AB ".f32 "
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

template <int HD, bool BY_KEYS>
__device__ __forceinline__ void flash_attention(
    const float* __restrict__ q,          // [n, heads * hd]
    const half_t* __restrict__ k_cache,   // [slots, kv_heads * hd]
    const half_t* __restrict__ v_cache,
    const int* __restrict__ tables,       // [seqs, table_stride]
    const int* __restrict__ row_seq,
    const int* __restrict__ row_pos,
    const int* __restrict__ tiles,        // [tiles, 2]: first row, rows
    half_t* __restrict__ out,             // [n, heads * hd] (one split)
    float* __restrict__ part_acc,         // [n, heads, splits, hd] (several splits)
    float* __restrict__ part_ml,          // [n, heads, splits, 2]
    int heads, int kv_heads, int hd, int block_size, int table_stride,
    int chunk, int splits, float scale_log2) {
    constexpr int LD = HD + 8;  // shared row stride in halves: rows 16 bytes apart in the banks
    constexpr int NB = BY_KEYS ? 2 : FA_STAGE / 8;  // n-blocks of 8 keys per warp and stage
    // Two stages (double buffering), each K then V: half_t [buf][k|v][key][LD], dynamic.
    extern __shared__ __align__(16) unsigned char fa_smem[];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = tiles[2 * blockIdx.x], cnt = tiles[2 * blockIdx.x + 1];
    const int g = blockIdx.y, split = blockIdx.z;
    const int group = heads / kv_heads, pw = 16 / group;
    const int kvd = kv_heads * hd;
    const int first = BY_KEYS ? 0 : warp * pw;  // this warp's first position in the tile
    const int len = row_pos[row0 + cnt - 1] + 1;
    const int kbeg = split * chunk;
    const int kend = min(len, kbeg + chunk);

    // This thread's two M rows (lane / 4 and lane / 4 + 8): their batch row, position and
    // query head; -1 for rows past the tile.
    int rrow[2], rpos[2], rhead[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int m = (lane >> 2) + 8 * i;
        int pi = first + m / group;
        bool valid = m < pw * group && pi < cnt;
        rrow[i] = valid ? row0 + pi : -1;
        rpos[i] = valid ? row_pos[row0 + pi] : -1;
        rhead[i] = g * group + m % group;
    }

    if (kbeg >= kend) {
        // An empty split (only with several): mark it so the merge skips it.
        if (threadIdx.x < 16) {
            int m = threadIdx.x, pi = m / group;
            if (m < pw * group && pi < cnt) {
                size_t pi2 = ((size_t)(row0 + pi) * heads + g * group + m % group) * splits + split;
                part_ml[pi2 * 2] = -INFINITY;
                part_ml[pi2 * 2 + 1] = 0.0f;
            }
        }
        return;
    }
    // The last position among this warp's rows (keys past it are masked for all of them).
    const int wlast = first < cnt ? row_pos[row0 + min(first + pw, cnt) - 1] : -1;
    // The first position among them (keys up to it are visible to every row of the warp).
    const int wfirst = first < cnt ? row_pos[row0 + first] : -1;

    // The query as A fragments, pre-scaled: qa[kc] covers dims kc*16 .. kc*16+15.
    unsigned qa[HD / 16][4];
#pragma unroll
    for (int kc = 0; kc < HD / 16; ++kc) {
#pragma unroll
        for (int j = 0; j < 4; ++j) qa[kc][j] = 0u;
        if (kc * 16 < hd) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    int d = kc * 16 + j * 8 + 2 * (lane & 3);
                    float2 v = make_float2(0.0f, 0.0f);
                    if (rrow[i] >= 0) {
                        v = *reinterpret_cast<const float2*>(
                            q + (size_t)rrow[i] * heads * hd + rhead[i] * hd + d);
                    }
                    qa[kc][i + 2 * j] = pack2(v.x * scale_log2, v.y * scale_log2);
                }
            }
        }
    }

    float o[HD / 8][4];
#pragma unroll
    for (int dn = 0; dn < HD / 8; ++dn) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[dn][e] = 0.0f;
    }
    float mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};

    const int* table = tables + (size_t)row_seq[row0] * table_stride;
    // Stage loader: thread t copies 16-byte piece t % PIECES of the KEYS_PER consecutive keys
    // from (t / PIECES) * KEYS_PER, walking the block table (one lookup per KV block it
    // enters, not per key); keys past the split are zeros.
    constexpr int PIECES = HD / 8, KEYS_PER = FA_STAGE * PIECES / 128;
    // log2(block_size) when it is a power of two (no division), else -1.
    const int bs_shift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;
    // Shared-space byte addresses: this thread's loader slot in stage 0's K rows, and its
    // ldmatrix rows of K and V in stage 0 (the stage and the tile offsets are added as
    // constants).
    const unsigned smem0 = smem_addr(fa_smem);
    const unsigned ld_base = smem0 + (unsigned)(threadIdx.x % PIECES) * 16;
    const int koff = BY_KEYS ? warp * 16 : 0;  // this warp's keys of a stage: all, or a quarter
    const unsigned k_rows =
        smem0 + (unsigned)(((koff + (lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8) * 2);
    const unsigned v_rows = smem0 + (unsigned)(((FA_STAGE + koff + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                                (lane >> 4) * 8) * 2);
    auto load_stage = [&](int from, int buf) {
        const int nk = min(FA_STAGE, kend - from);
        const int piece = threadIdx.x % PIECES, jfirst = (threadIdx.x / PIECES) * KEYS_PER;
        const bool in_row = piece * 8 < hd;
        const size_t col = (size_t)g * hd + piece * 8;
        int p = from + jfirst;
        int blk = bs_shift >= 0 ? p >> bs_shift : p / block_size;
        int within = p - blk * block_size;
        // Element offset of key p's piece in the cache (valid while p < kend).
        size_t off = p < kend ? ((size_t)table[blk] * block_size + within) * kvd + col : 0;
        const unsigned dst = ld_base + (unsigned)((buf * 2 * FA_STAGE + jfirst) * LD * 2);
#pragma unroll
        for (int i = 0; i < KEYS_PER; ++i) {
            const bool valid = jfirst + i < nk && in_row;
            const size_t at = valid ? off : 0;
            const int bytes = valid ? 16 : 0;
            cp_async16(dst + i * LD * 2, k_cache + at, bytes);
            cp_async16(dst + (FA_STAGE + i) * LD * 2, v_cache + at, bytes);
            ++p;
            if (++within == block_size) {
                within = 0;
                ++blk;
                off = p < kend ? (size_t)table[blk] * block_size * kvd + col : 0;
            } else {
                off += kvd;
            }
        }
    };
    load_stage(kbeg, 0);
    asm volatile("cp.async.commit_group;\n" ::);
    int buf = 0;
    for (int k0 = kbeg; k0 < kend; k0 += FA_STAGE, buf ^= 1) {
        // Prefetch the next stage into the other buffer, then wait for this one.
        if (k0 + FA_STAGE < kend) load_stage(k0 + FA_STAGE, buf ^ 1);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        __syncthreads();
        const int nk = min(FA_STAGE, kend - k0);

        const unsigned stage = (unsigned)(buf * 2 * FA_STAGE * LD * 2);
        if (koff < nk && k0 + koff <= wlast) {
            float s[NB][4];
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nb][e] = 0.0f;
            }
#pragma unroll
            for (int kc = 0; kc < HD / 16; ++kc) {
                if (kc * 16 < hd) {
#pragma unroll
                    for (int j = 0; j < NB / 2; ++j) {
                        unsigned b[4];
                        ldsm_x4(b, k_rows + stage + (j * 16 * LD + kc * 16) * 2);
                        mma16816(s[2 * j], qa[kc], b[0], b[1]);
                        mma16816(s[2 * j + 1], qa[kc], b[2], b[3]);
                    }
                }
            }
            // Mask (causal, and past the split) where some key of the warp's slice needs
            // it, then the online softmax per M row.
            if (k0 + koff + NB * 8 > min(kend, wfirst + 1)) {
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        int key = k0 + koff + nb * 8 + 2 * (lane & 3) + (e & 1);
                        if (key >= kend || key > rpos[e >> 1]) s[nb][e] = -INFINITY;
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float mx = -INFINITY;
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    mx = fmaxf(mx, fmaxf(s[nb][2 * i], s[nb][2 * i + 1]));
                }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float mn = fmaxf(mrun[i], mx);
                float base = mn == -INFINITY ? 0.0f : mn;
                float corr = ex2(mrun[i] - base);
                mrun[i] = mn;
                float sum = 0.0f;
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float p = ex2(s[nb][2 * i + e] - base);
                        s[nb][2 * i + e] = p;
                        sum += p;
                    }
                }
                lrun[i] = lrun[i] * corr + sum;
                // Rescale the accumulators unless no row of the warp raised its maximum.
                if (!__all_sync(0xffffffffu, corr == 1.0f)) {
#pragma unroll
                    for (int dn = 0; dn < HD / 8; ++dn) {
                        o[dn][2 * i] *= corr;
                        o[dn][2 * i + 1] *= corr;
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < NB / 2; ++j) {
                unsigned pa[4] = {pack2(s[2 * j][0], s[2 * j][1]), pack2(s[2 * j][2], s[2 * j][3]),
                                  pack2(s[2 * j + 1][0], s[2 * j + 1][1]),
                                  pack2(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
                for (int d16 = 0; d16 < HD / 16; ++d16) {
                    if (d16 * 16 < hd) {
                        unsigned b[4];
                        ldsm_x4_trans(b, v_rows + stage + (j * 16 * LD + d16 * 16) * 2);
                        mma16816(o[2 * d16], pa, b[0], b[1]);
                        mma16816(o[2 * d16 + 1], pa, b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; ++i) {
        lrun[i] += __shfl_xor_sync(0xffffffffu, lrun[i], 1);
        lrun[i] += __shfl_xor_sync(0xffffffffu, lrun[i], 2);
    }

    if (!BY_KEYS) {
        // One split: each warp writes its own rows, normalised.
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (rrow[i] < 0) continue;
            float inv = 1.0f / lrun[i];
            half_t* dst = out + (size_t)rrow[i] * heads * hd + rhead[i] * hd + 2 * (lane & 3);
#pragma unroll
            for (int dn = 0; dn < HD / 8; ++dn) {
                if (dn * 8 < hd) {
                    unsigned v = pack2(o[dn][2 * i] * inv, o[dn][2 * i + 1] * inv);
                    *reinterpret_cast<unsigned*>(dst + dn * 8) = v;
                }
            }
        }
        return;
    }

    // Merge the warps' partial results through shared memory (the K/V stages are free now).
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    float* s_o = reinterpret_cast<float*>(fa_smem);          // [warps][16][HD]
    float* s_ml = s_o + FA_WARPS * 16 * HD;                // [warps][16][2]
#pragma unroll
    for (int dn = 0; dn < HD / 8; ++dn) {
        if (dn * 8 < hd) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int m = (lane >> 2) + 8 * (e >> 1);
                s_o[(warp * 16 + m) * HD + dn * 8 + 2 * (lane & 3) + (e & 1)] = o[dn][e];
            }
        }
    }
    if ((lane & 3) == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            int m = (lane >> 2) + 8 * i;
            s_ml[(warp * 16 + m) * 2] = mrun[i];
            s_ml[(warp * 16 + m) * 2 + 1] = lrun[i];
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < 16 * hd; t += blockDim.x) {
        int m = t / hd, d = t - m * hd;
        int pi = m / group;
        if (m >= pw * group || pi >= cnt) continue;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < FA_WARPS; ++w) mx = fmaxf(mx, s_ml[(w * 16 + m) * 2]);
        float base = mx == -INFINITY ? 0.0f : mx;
        float sum = 0.0f, a = 0.0f;
#pragma unroll
        for (int w = 0; w < FA_WARPS; ++w) {
            float c = ex2(s_ml[(w * 16 + m) * 2] - base);
            sum += s_ml[(w * 16 + m) * 2 + 1] * c;
            a += s_o[(w * 16 + m) * HD + d] * c;
        }
        int row = row0 + pi, qh = g * group + m % group;
        if (splits == 1) {
            out[(size_t)row * heads * hd + qh * hd + d] = f32_to_half(a / sum);
        } else {
            size_t pi2 = ((size_t)row * heads + qh) * splits + split;
            part_acc[pi2 * hd + d] = a;
            if (d == 0) {
                part_ml[pi2 * 2] = mx * FA_LN2;  // natural log units, as attention_combine reads
                part_ml[pi2 * 2 + 1] = sum;
            }
        }
    }
}

#define FA_ARGS                                                                              \
    const float* __restrict__ q, const half_t* __restrict__ k_cache,                         \
        const half_t* __restrict__ v_cache, const int* __restrict__ tables,                  \
        const int* __restrict__ row_seq, const int* __restrict__ row_pos,                    \
        const int* __restrict__ tiles, half_t* __restrict__ out, float* __restrict__ part_acc, \
        float* __restrict__ part_ml, int heads, int kv_heads, int hd, int block_size,        \
        int table_stride, int chunk, int splits, float scale_log2
#define FA_PASS                                                                           \
    q, k_cache, v_cache, tables, row_seq, row_pos, tiles, out, part_acc, part_ml, heads,  \
        kv_heads, hd, block_size, table_stride, chunk, splits, scale_log2

// Blocks per multiprocessor the register budget aims for: 4 at head_dim 64, 3 at 128.
extern "C" __global__ void __launch_bounds__(128, 4) KERNEL(flash_attention_rows_hd64)(FA_ARGS) {
    flash_attention<64, false>(FA_PASS);
}
extern "C" __global__ void __launch_bounds__(128, 4) KERNEL(flash_attention_keys_hd64)(FA_ARGS) {
    flash_attention<64, true>(FA_PASS);
}
extern "C" __global__ void __launch_bounds__(128, 3) KERNEL(flash_attention_rows_hd128)(FA_ARGS) {
    flash_attention<128, false>(FA_PASS);
}
extern "C" __global__ void __launch_bounds__(128, 3) KERNEL(flash_attention_keys_hd128)(FA_ARGS) {
    flash_attention<128, true>(FA_PASS);
}
