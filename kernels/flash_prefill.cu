// Tensor-core paged causal attention for prefill tiles (mma.sync m16n8k16, fp32
// accumulation). A tile is (first row, count): consecutive rows of one sequence at
// consecutive positions. Its "M rows" are (position, query head of the KV head's group)
// pairs in atoms of 16: an atom holds 16 / group positions. Each of the block's FP_WARPS
// warps owns FP_ATOMS atoms, so a block covers 128 M rows (32 positions for Llama's group
// of 4) and every K/V stage in shared memory serves them all. (Measured on the H200, 8B
// 2,048-token prefill: 8 warps of 1 atom 3.5% faster than 4 warps of 2, which share each
// K/V fragment between two atoms but leave 2 warps per scheduler to hide latency.)
//
// The queries come in 16-bit, pre-scaled by log2(e) times the scores' scale (RoPE writes them so)
// so the online softmax runs in base 2; the block copies its own into shared memory with
// cp.async, in the same group as the first stage of keys. K and V stages of 64 keys are
// gathered through the block table with cp.async into two buffers (the next
// stage loads while this one computes; keys past the context are zero-filled). Fragments
// are read back with ldmatrix one step ahead of the mma that uses them, and each warp runs
// the online softmax once per stage of 64 keys (H100, 8B 2,048-token prefill: 5.8 ms
// against 6.1 with a softmax per 32 keys, though the scores then spill 40 bytes; with one
// block per multiprocessor and no spill, 7.1 ms; with the two 32-key steps software-
// pipelined inside the warp, 6.4 ms). A warp whose rows all end before a step skips it;
// masking runs only on steps that cross a row's position. Two register budgets: head_dim
// up to 64 (_hd64) and up to 128 (_hd128); head_dim a multiple of 16, at most 16 query
// heads per KV head. On Hopper, head_dim 64 and 128 run flash_prefill_sm90.cu (wgmma)
// instead.
#define FP_WARPS 8
#define FP_ATOMS 1
#define FP_STAGE 64
#define FP_SUB 64  // keys per softmax step (one per stage)

template <int HD>
__device__ __forceinline__ void flash_prefill(PREFILL_ARGS) {
    constexpr int FP_ROWS = FP_WARPS * FP_ATOMS * 16;
    constexpr int LD = HD + 8;  // shared row stride in halves: rows 16 bytes apart in the banks
    constexpr int NB = FP_SUB / 8;  // n-blocks of 8 keys per softmax step
    // Q [FP_ROWS][LD], then two stages of K then V [buf][k|v][key][LD], all 16-bit.
    extern __shared__ __align__(16) unsigned char fp_smem[];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // Blocks run the tiles in order, a tile's KV heads side by side: the tiles come
    // longest-context first, so the GPU's last wave is its shortest.
    const int tile = blockIdx.x / kv_heads, g = blockIdx.x % kv_heads;
    const int row0 = tiles[2 * tile], cnt = tiles[2 * tile + 1];
    const int group = heads / kv_heads, pw = 16 / group;
    const int kvd = kv_heads * hd;
    const int kend = row_pos[row0 + cnt - 1] + 1;

    // The queries into shared memory (gather_q_tile's M rows), committed with the first
    // stage below.
    const unsigned smem0 = smem_addr(fp_smem);
    gather_q_tile<HD, FP_ROWS, LD>(smem0, q, row0, cnt, heads, g, group, pw, hd, blockDim.x);

    // This thread's M rows: atom a of the warp, rows lane / 4 and lane / 4 + 8; their batch
    // row, position and query head (-1 past the tile).
    int rrow[FP_ATOMS][2], rpos[FP_ATOMS][2], rhead[FP_ATOMS][2];
#pragma unroll
    for (int a = 0; a < FP_ATOMS; ++a) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int m = (lane >> 2) + 8 * i;
            const int pi = (warp * FP_ATOMS + a) * pw + m / group;
            const bool valid = m < pw * group && pi < cnt;
            rrow[a][i] = valid ? row0 + pi : -1;
            rpos[a][i] = valid ? row_pos[row0 + pi] : -1;
            rhead[a][i] = g * group + m % group;
        }
    }
    // The warp's first and last positions: keys past the last are masked for all its rows,
    // keys up to the first are visible to all of them.
    const int wfirst_i = warp * FP_ATOMS * pw;
    const int wlast_i = min((warp + 1) * FP_ATOMS * pw, cnt) - 1;
    const int wfirst = wfirst_i < cnt ? row_pos[row0 + wfirst_i] : -1;
    const int wlast = wfirst_i < cnt ? row_pos[row0 + wlast_i] : -1;

    float o[FP_ATOMS][HD / 8][4];
#pragma unroll
    for (int a = 0; a < FP_ATOMS; ++a) {
#pragma unroll
        for (int dn = 0; dn < HD / 8; ++dn) {
#pragma unroll
            for (int e = 0; e < 4; ++e) o[a][dn][e] = 0.0f;
        }
    }
    float mrun[FP_ATOMS][2], lrun[FP_ATOMS][2];
#pragma unroll
    for (int a = 0; a < FP_ATOMS; ++a) {
        mrun[a][0] = mrun[a][1] = -INFINITY;
        lrun[a][0] = lrun[a][1] = 0.0f;
    }

    const int* table = tables + (size_t)row_seq[row0] * table_stride;
    const int bs_shift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;
    const unsigned kv0 = smem0 + FP_ROWS * LD * 2;  // stage 0's K rows
    // This lane's ldmatrix rows: the Q atoms (A operands), K (B, keys x dims) and V (B
    // transposed); the stage and the tile offsets are added as constants.
    const unsigned q_rows = smem0 + (unsigned)(((warp * FP_ATOMS * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                                (lane >> 4) * 8) * 2);
    const unsigned k_rows = kv0 + (unsigned)((((lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8) * 2);
    const unsigned v_rows = kv0 + (unsigned)(((FP_STAGE + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                              (lane >> 4) * 8) * 2);
    // Keys [from, ...) into stage buffer `buf`.
    auto load_stage = [&](int from, int buf) {
        load_kv_stage<HD, FP_STAGE, FP_WARPS * 32, LD>(kv0 + (unsigned)(buf * 2 * FP_STAGE * LD * 2), k_cache,
                                                     v_cache, table, from, kend, g, hd, kvd, block_size,
                                                     bs_shift);
    };
    load_stage(0, 0);
    asm volatile("cp.async.commit_group;\n" ::);
    int buf = 0;
    for (int k0 = 0; k0 < kend; k0 += FP_STAGE, buf ^= 1) {
        // Prefetch the next stage into the other buffer, then wait for this one (the first
        // wait also covers the queries' stores).
        if (k0 + FP_STAGE < kend) load_stage(k0 + FP_STAGE, buf ^ 1);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        __syncthreads();

        // Softmax steps of FP_SUB keys (FP_STAGE / FP_SUB per stage).
#pragma unroll 1
        for (int h = 0; h < FP_STAGE / FP_SUB; ++h) {
            const int kh = k0 + h * FP_SUB;
            const unsigned stage = (unsigned)((buf * 2 * FP_STAGE + h * FP_SUB) * LD * 2);
            if (kh <= wlast) {
                float s[FP_ATOMS][NB][4];
#pragma unroll
                for (int a = 0; a < FP_ATOMS; ++a) {
#pragma unroll
                    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) s[a][nb][e] = 0.0f;
                    }
                }
                // S = Q K^T over (kc, j) steps: 16 dims by 16 keys, the next step's fragments
                // loaded before this step's mma so that the loads' latency overlaps them. All
                // HD dims take part: past hd, the queries and keys in shared memory are zeros.
                constexpr int SJ = NB / 2, ST = (HD / 16) * SJ;
                unsigned qa[2][FP_ATOMS][4], kb[2][4];
#pragma unroll
                for (int a = 0; a < FP_ATOMS; ++a) ldsm_x4(qa[0][a], q_rows + a * 16 * LD * 2);
                ldsm_x4(kb[0], k_rows + stage);
#pragma unroll
                for (int t = 0; t < ST; ++t) {
                    const int kc = t / SJ, j = t % SJ;
                    const int nt = t + 1, nkc = nt / SJ, nj = nt % SJ;
                    if (nt < ST) {
                        if (nj == 0) {
#pragma unroll
                            for (int a = 0; a < FP_ATOMS; ++a) {
                                ldsm_x4(qa[nkc & 1][a], q_rows + (a * 16 * LD + nkc * 16) * 2);
                            }
                        }
                        ldsm_x4(kb[nt & 1], k_rows + stage + (nj * 16 * LD + nkc * 16) * 2);
                    }
#pragma unroll
                    for (int a = 0; a < FP_ATOMS; ++a) {
                        mma16816(s[a][2 * j], qa[kc & 1][a], kb[t & 1][0], kb[t & 1][1]);
                        mma16816(s[a][2 * j + 1], qa[kc & 1][a], kb[t & 1][2], kb[t & 1][3]);
                    }
                }
                // Mask (causal, and past the context) where some key of the stage needs it,
                // then the online softmax per M row.
                if (kh + FP_SUB > min(kend, wfirst + 1)) {
#pragma unroll
                    for (int a = 0; a < FP_ATOMS; ++a) {
#pragma unroll
                        for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const int key = kh + nb * 8 + 2 * (lane & 3) + (e & 1);
                                if (key >= kend || key > rpos[a][e >> 1]) s[a][nb][e] = -INFINITY;
                            }
                        }
                    }
                }
                // Online softmax per M row.
#pragma unroll
                for (int a = 0; a < FP_ATOMS; ++a) {
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const float corr = softmax_row_step<NB>(s[a], i, mrun[a][i], lrun[a][i]);
                        // Rescale the accumulators unless no row of the warp raised its
                        // maximum.
                        if (__any_sync(0xffffffffu, corr != 1.0f)) {
#pragma unroll
                            for (int dn = 0; dn < HD / 8; ++dn) {
                                o[a][dn][2 * i] *= corr;
                                o[a][dn][2 * i + 1] *= corr;
                            }
                        }
                    }
                }
                // O += P V over (j, d16) steps: 16 keys by 16 dims, pipelined as above (past hd
                // the values are zeros, and those dims are not written out).
                constexpr int VD = HD / 16, VT = SJ * VD;
                unsigned vb[2][4], pa[FP_ATOMS][4];
                ldsm_x4_trans(vb[0], v_rows + stage);
#pragma unroll
                for (int t = 0; t < VT; ++t) {
                    const int j = t / VD, d16 = t % VD;
                    if (d16 == 0) {
#pragma unroll
                        for (int a = 0; a < FP_ATOMS; ++a) {
                            pa[a][0] = pack2(s[a][2 * j][0], s[a][2 * j][1]);
                            pa[a][1] = pack2(s[a][2 * j][2], s[a][2 * j][3]);
                            pa[a][2] = pack2(s[a][2 * j + 1][0], s[a][2 * j + 1][1]);
                            pa[a][3] = pack2(s[a][2 * j + 1][2], s[a][2 * j + 1][3]);
                        }
                    }
                    const int nt = t + 1;
                    if (nt < VT) {
                        ldsm_x4_trans(vb[nt & 1], v_rows + stage + ((nt / VD) * 16 * LD + (nt % VD) * 16) * 2);
                    }
#pragma unroll
                    for (int a = 0; a < FP_ATOMS; ++a) {
                        mma16816(o[a][2 * d16], pa[a], vb[t & 1][0], vb[t & 1][1]);
                        mma16816(o[a][2 * d16 + 1], pa[a], vb[t & 1][2], vb[t & 1][3]);
                    }
                }
            }
        }
        __syncthreads();
    }

    // Each thread writes its rows, normalised.
#pragma unroll
    for (int a = 0; a < FP_ATOMS; ++a) {
#pragma unroll
        for (int i = 0; i < 2; ++i) store_out_row<HD>(o[a], i, lrun[a][i], out, rrow[a][i], rhead[a][i], heads, hd);
    }
}

// Two blocks of 8 warps per multiprocessor: up to 128 registers a thread (about 128 at
// head_dim 128 and 111 at 64, without spilling).
extern "C" __global__ void __launch_bounds__(FP_WARPS * 32, 2) KERNEL(flash_prefill_hd64)(PREFILL_ARGS) {
    grid_dep_enter();
    flash_prefill<64>(PREFILL_PASS);
}
extern "C" __global__ void __launch_bounds__(FP_WARPS * 32, 2) KERNEL(flash_prefill_hd128)(PREFILL_ARGS) {
    grid_dep_enter();
    flash_prefill<128>(PREFILL_PASS);
}
