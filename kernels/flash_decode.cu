// Tensor-core paged causal attention for decode tiles (mma.sync m16n8k16, fp32
// accumulation). A tile is (first row, count): consecutive rows of one sequence at
// consecutive positions, one warp's worth: its "M rows" are (position, query head of the KV
// head's group) pairs, 16 to a warp, so a tile holds up to 16 / group positions (a decode
// step, or a short draft to verify). Prefill tiles run flash_prefill.cu.
//
// Each of the block's 4 warps takes a quarter of every stage's keys, and the warps merge
// at the end. Long contexts are also split over the grid (blockIdx.z), as partial sums for
// attention_combine (attention.cu). K and V stages of 64 keys are gathered through the
// block table with cp.async into two buffers of dynamic shared memory (the next stage
// loads while this one computes; rows past the stage's end are zero-filled; the keys of the
// first two stages that earlier steps wrote load before the wait for the previous kernel),
// read back with ldmatrix, and the online softmax runs in base 2 (the 16-bit query comes
// pre-scaled by log2(e) times the scores' scale: RoPE writes it so), once per 16 keys. The kernel
// comes in two register budgets, head_dim up to 64 (_hd64) and up to 128 (_hd128); head_dim
// must be a multiple of 16, with at most 16 query heads per KV head.
// The _cl entry points (sm_90) merge the splits themselves: the splits of one (tile, KV head)
// are one thread-block cluster (cluster dims 1 x 1 x splits, at most 8). Rank 0 merges: the
// other ranks push their partial sums into its shared memory with st.async, which counts the
// bytes on rank 0's mbarrier, and exit; rank 0 waits for them and writes `out`. No
// workspace, no attention_combine, and one one-way trip between blocks.
#define FA_WARPS 4
#define FA_STAGE 64
#define FA_LN2 0.69314718055994530942f

// Cluster helpers (sm_90, no-ops below): this block's rank in its cluster and the cluster's
// size; an address in rank r's shared memory at our own shared address; a float stored there
// with st.async, which counts its 4 bytes on rank r's mbarrier at `bar` (an address from
// cluster_addr too).
__device__ __forceinline__ void cluster_place(unsigned& rank, unsigned& size) {
    rank = 0;
    size = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n"
                 "mov.u32 %1, %%cluster_nctarank;"
                 : "=r"(rank), "=r"(size));
#endif
}
__device__ __forceinline__ unsigned cluster_addr(unsigned local, unsigned r) {
    unsigned a = local;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(local), "r"(r));
#endif
    return a;
}
__device__ __forceinline__ void cluster_push(unsigned addr, float v, unsigned bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr),
                 "r"(__float_as_uint(v)), "r"(bar)
                 : "memory");
#endif
}

// The mbarrier on which rank 0 counts the bytes the other ranks push (one per block).
__device__ __forceinline__ unsigned push_bar() {
    __shared__ __align__(8) unsigned long long bar;
    return smem_addr(&bar);
}

// Every rank calls it, before anything is pushed: rank 0's first thread initialises its
// mbarrier to expect `bytes` (every other rank's slot) and makes that visible to the
// cluster; every thread of every rank arrives on the cluster barrier that a rank waits on
// before it pushes (cluster_ready).
__device__ __forceinline__ void cluster_open(unsigned rank, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (rank == 0 && threadIdx.x == 0) {
        const unsigned bar = push_bar();
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
        asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(bar),
                     "r"(bytes)
                     : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();  // the barrier is .aligned: each warp converged before it
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
// Rank 0's mbarrier is initialised and every block of the cluster is running (all arrived
// in cluster_open, long before): pushing to rank 0 is safe after this.
__device__ __forceinline__ void cluster_ready() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __syncwarp();
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}

// Rank 0's merge of its cluster's splits. Each rank r left, for its valid M rows m, the
// unnormalised sums acc[m][d] (hd floats a row) and ml[m] = (max in base 2, sum of weights):
// rank 0 in its own cl_acc (HD floats a row) and cl_ml, rank r > 0 in slot r - 1 of `slots`
// (rows * (hd + 2) floats each: acc [rows][hd], then ml [rows][2]). A rank with no keys for a
// row left a maximum of -inf and is skipped. Waits for the pushed bytes, then the block's
// threads share the rows' elements.
template <int HD>
__device__ __forceinline__ void cluster_merge(const float* cl_acc, const float* cl_ml, const float* slots,
                                              unsigned size, int rows, int group, int row0, int g,
                                              int heads, int hd, half_t* __restrict__ out) {
    constexpr int MAX_CLUSTER = 8;  // attention.rs's MAX_CLUSTER: the launch holds to it
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned bar = push_bar();
    unsigned done = 0;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar)
            : "memory");
    } while (!done);
#endif
    const int slot = rows * (hd + 2);
    for (int e = threadIdx.x; e < rows * hd; e += blockDim.x) {
        const int m = e / hd, d = e - m * hd;
        float mx[MAX_CLUSTER], l[MAX_CLUSTER], a[MAX_CLUSTER];
        float top = -INFINITY;
#pragma unroll
        for (int r = 0; r < MAX_CLUSTER; ++r) {
            mx[r] = -INFINITY;
            l[r] = a[r] = 0.0f;
            if (r < (int)size) {
                const float* from = slots + (r > 0 ? r - 1 : 0) * slot;
                mx[r] = r == 0 ? cl_ml[m * 2] : from[rows * hd + m * 2];
                l[r] = r == 0 ? cl_ml[m * 2 + 1] : from[rows * hd + m * 2 + 1];
                a[r] = r == 0 ? cl_acc[m * HD + d] : from[e];
                top = fmaxf(top, mx[r]);
            }
        }
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int r = 0; r < MAX_CLUSTER; ++r) {
            // A rank without keys for this row: its sums were never formed.
            if (mx[r] != -INFINITY) {
                const float c = ex2(mx[r] - top);
                num += a[r] * c;
                den += l[r] * c;
            }
        }
        const int row = row0 + m / group, qh = g * group + m % group;
        out[(size_t)row * heads * hd + qh * hd + d] = f32_to_half(num / den);
    }
}

template <int HD, bool CL>
__device__ __forceinline__ void flash_decode(
    const half_t* __restrict__ q,         // [n, heads * hd], pre-scaled
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
    int chunk, int splits) {
    constexpr int LD = HD + 8;  // shared row stride in halves: rows 16 bytes apart in the banks
    constexpr int NB = 2;  // n-blocks of 8 keys per warp and stage
    // Two stages (double buffering), each K then V: half_t [buf][k|v][key][LD], dynamic.
    extern __shared__ __align__(16) unsigned char fa_smem[];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // A tile's KV heads side by side, the tiles longest-context first (as in prefill).
    const int tile = blockIdx.x / kv_heads, g = blockIdx.x % kv_heads, split = blockIdx.z;
    const int row0 = tiles[2 * tile], cnt = tiles[2 * tile + 1];
    const int group = heads / kv_heads, pw = 16 / group;
    const int kvd = kv_heads * hd;
    const int len = row_pos[row0 + cnt - 1] + 1;
    const int kbeg = split * chunk;
    const int kend = min(len, kbeg + chunk);

    // This thread's two M rows (lane / 4 and lane / 4 + 8): their batch row, position and
    // query head; -1 for rows past the tile.
    int rrow[2], rpos[2], rhead[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int m = (lane >> 2) + 8 * i;
        int pi = m / group;
        bool valid = m < pw * group && pi < cnt;
        rrow[i] = valid ? row0 + pi : -1;
        rpos[i] = valid ? row_pos[row0 + pi] : -1;
        rhead[i] = g * group + m % group;
    }

    // The last position among the tile's rows (keys past it are masked for all of them).
    const int wlast = row_pos[row0 + min(pw, cnt) - 1];
    // The first position among them (keys up to it are visible to every row). Keys before it
    // were written by earlier steps; this step's RoPE writes the rest. (A tile of the last
    // layer's rows with logits may start after keys this step wrote: forward.rs launches a
    // kernel between the two that waits for the RoPE.)
    const int wfirst = row_pos[row0];
    // The valid M rows: (position, query head) pairs, positions first.
    const int rows = min(pw, cnt) * group;
    // In a cluster: this block's rank, and (ranks past 0) where its slot and rank 0's
    // mbarrier are in rank 0's shared memory. The slots follow the two stages of K and V.
    unsigned rank = 0, size = 1, slot = 0, bar = 0;
    float* slots = reinterpret_cast<float*>(fa_smem + 2 * 2 * FA_STAGE * LD * 2);
    if (CL) {
        cluster_place(rank, size);
        cluster_open(rank, (size - 1) * (unsigned)(rows * (hd + 2)) * 4u);
        if (rank != 0) {
            slot = cluster_addr(smem_addr(slots + (rank - 1) * rows * (hd + 2)), 0);
            bar = cluster_addr(push_bar(), 0);
        }
    }

    const int* table = tables + (size_t)row_seq[row0] * table_stride;
    const int bs_shift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;
    // Shared-space byte addresses: this lane's ldmatrix rows of K and V in stage 0 (the
    // stage and the tile offsets are added as constants).
    const unsigned smem0 = smem_addr(fa_smem);
    const int koff = warp * 16;  // this warp's quarter of a stage's keys
    const unsigned k_rows =
        smem0 + (unsigned)(((koff + (lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8) * 2);
    const unsigned v_rows = smem0 + (unsigned)(((FA_STAGE + koff + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                                (lane >> 4) * 8) * 2);
    // Keys [from, ...) into stage buffer `buf` (keys past the split are zeros), those in
    // [lo, hi) only.
    auto load_stage = [&](int from, int buf, int lo, int hi) {
        load_kv_stage<HD, FA_STAGE, FA_WARPS * 32, LD>(smem0 + (unsigned)(buf * 2 * FA_STAGE * LD * 2), k_cache,
                                                     v_cache, table, from, kend, g, hd, kvd, block_size,
                                                     bs_shift, lo, hi);
    };
    const int all = 0x7fffffff;
    // The first two stages' keys written by earlier steps stream in before the wait for the
    // previous kernel (the tables and positions are the step's, uploaded before it); their
    // keys from wfirst on come after it. Four commit groups, which the loop's first wait
    // sees done.
    const bool live = kbeg < kend, second = kbeg + FA_STAGE < kend;
    if (live) load_stage(kbeg, 0, -all, wfirst);
    asm volatile("cp.async.commit_group;\n" ::);
    if (live && second) load_stage(kbeg + FA_STAGE, 1, -all, wfirst);
    asm volatile("cp.async.commit_group;\n" ::);
    grid_dep_enter();
    float* s_o = reinterpret_cast<float*>(fa_smem);          // [warps][16][HD]
    float* s_ml = s_o + FA_WARPS * 16 * HD;                // [warps][16][2]
    float* cl_acc = s_ml + FA_WARPS * 16 * 2;              // [16][HD] (clusters)
    float* cl_ml = cl_acc + 16 * HD;                       // [16][2]
    if (CL && !live) {
        // An empty split of a cluster (never rank 0, whose split starts at position 0): no
        // keys, so maxima of -inf and zero sums.
        cluster_ready();
        for (int e = threadIdx.x; e < rows * (hd + 2); e += blockDim.x) {
            const int j = e - rows * hd;  // past the sums: (max, weight sum) pairs
            cluster_push(slot + (unsigned)e * 4u, j >= 0 && (j & 1) == 0 ? -INFINITY : 0.0f, bar);
        }
        return;
    }
    if (!live) {
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
    if (wfirst < kbeg + FA_STAGE) load_stage(kbeg, 0, wfirst, all);
    asm volatile("cp.async.commit_group;\n" ::);
    if (second && wfirst < kbeg + 2 * FA_STAGE) load_stage(kbeg + FA_STAGE, 1, wfirst, all);
    asm volatile("cp.async.commit_group;\n" ::);

    // The query as A fragments: qa[kc] covers dims kc*16 .. kc*16+15.
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
                    if (rrow[i] >= 0) {
                        qa[kc][i + 2 * j] = *reinterpret_cast<const unsigned*>(
                            q + (size_t)rrow[i] * heads * hd + rhead[i] * hd + d);
                    }
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

    int buf = 0;
    for (int k0 = kbeg; k0 < kend; k0 += FA_STAGE, buf ^= 1) {
        // Prefetch the next stage into the other buffer (the second is on its way already),
        // then wait for this one.
        if (k0 != kbeg && k0 + FA_STAGE < kend) load_stage(k0 + FA_STAGE, buf ^ 1, -all, all);
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

    // Merge the warps' partial results through shared memory (the K/V stages are free now).
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#pragma unroll
    for (int dn = 0; dn < HD / 8; ++dn) {
        if (dn * 8 < hd) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int m = (lane >> 2) + 8 * (e >> 1);
                if (m < rows) s_o[(warp * 16 + m) * HD + dn * 8 + 2 * (lane & 3) + (e & 1)] = o[dn][e];
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
    if (CL) cluster_ready();
    // One valid M row at a time (its weights per warp found once), its dimensions across
    // the block: no division in the loop, no pass over the rows past the tile.
    for (int m = 0; m < rows; ++m) {
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < FA_WARPS; ++w) mx = fmaxf(mx, s_ml[(w * 16 + m) * 2]);
        const float base = mx == -INFINITY ? 0.0f : mx;
        float c[FA_WARPS], sum = 0.0f;
#pragma unroll
        for (int w = 0; w < FA_WARPS; ++w) {
            c[w] = ex2(s_ml[(w * 16 + m) * 2] - base);
            sum += s_ml[(w * 16 + m) * 2 + 1] * c[w];
        }
        const int row = row0 + m / group, qh = g * group + m % group;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float a = 0.0f;
#pragma unroll
            for (int w = 0; w < FA_WARPS; ++w) a += s_o[(w * 16 + m) * HD + d] * c[w];
            if (CL && rank != 0) {
                cluster_push(slot + (unsigned)(m * hd + d) * 4u, a, bar);
                if (d == 0) {
                    cluster_push(slot + (unsigned)(rows * hd + m * 2) * 4u, mx, bar);  // base 2
                    cluster_push(slot + (unsigned)(rows * hd + m * 2 + 1) * 4u, sum, bar);
                }
            } else if (CL) {
                cl_acc[m * HD + d] = a;
                if (d == 0) {
                    cl_ml[m * 2] = mx;  // base 2
                    cl_ml[m * 2 + 1] = sum;
                }
            } else if (splits == 1) {
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
    if (CL && rank == 0) {
        __syncthreads();
        cluster_merge<HD>(cl_acc, cl_ml, slots, size, rows, group, row0, g, heads, hd, out);
    }
}

#define FA_ARGS                                                                              \
    const half_t* __restrict__ q, const half_t* __restrict__ k_cache,                        \
        const half_t* __restrict__ v_cache, const int* __restrict__ tables,                  \
        const int* __restrict__ row_seq, const int* __restrict__ row_pos,                    \
        const int* __restrict__ tiles, half_t* __restrict__ out, float* __restrict__ part_acc, \
        float* __restrict__ part_ml, int heads, int kv_heads, int hd, int block_size,        \
        int table_stride, int chunk, int splits
#define FA_PASS                                                                           \
    q, k_cache, v_cache, tables, row_seq, row_pos, tiles, out, part_acc, part_ml, heads,  \
        kv_heads, hd, block_size, table_stride, chunk, splits

// Blocks per multiprocessor the register budget aims for: 4 at head_dim 64, 3 at 128.
extern "C" __global__ void __launch_bounds__(128, 4) KERNEL(flash_decode_hd64)(FA_ARGS) {
    flash_decode<64, false>(FA_PASS);
}
extern "C" __global__ void __launch_bounds__(128, 3) KERNEL(flash_decode_hd128)(FA_ARGS) {
    flash_decode<128, false>(FA_PASS);
}
// The same, the splits merged within their cluster (launched with cluster dims 1 x 1 x splits
// and, after the stages, dynamic shared memory for splits - 1 slots of the tiles' rows:
// attention.rs's cluster_slots).
extern "C" __global__ void __launch_bounds__(128, 4) KERNEL(flash_decode_cl_hd64)(FA_ARGS) {
    flash_decode<64, true>(FA_PASS);
}
extern "C" __global__ void __launch_bounds__(128, 3) KERNEL(flash_decode_cl_hd128)(FA_ARGS) {
    flash_decode<128, true>(FA_PASS);
}
