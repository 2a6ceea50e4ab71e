// Paged causal attention for prefill tiles on Hopper's warpgroup tensor cores (wgmma, sm_90a;
// fp32 accumulation). The same tiles and M rows as flash_prefill.cu: a block covers 128 M
// rows ((position, query head) pairs of one KV head's group, 32 positions for Llama's group
// of 4), now as two warpgroups of 64 rows, each warp owning the same 16 rows as there.
//
// Operands sit in shared memory in the 128-byte swizzled layout wgmma reads through matrix
// descriptors: a row's 16-byte pieces of each 64-column half are XOR-ed with the row's index
// mod 8 (the queries [half][128 rows][64], each stage's K and V [half][64 keys][64]). The block
// gathers the queries and double-buffered stages of 64 keys through the block table with
// cp.async, as flash_prefill.cu does, then per stage each warpgroup runs S = Q K^T as
// head_dim / 16 wgmma (both operands from shared memory, K-major), masks and updates its
// online softmax in registers (base 2: the queries come pre-scaled), and runs O += P V as 4
// wgmma whose A operand is P from registers and whose B operand is the V stage read
// transposed. A warpgroup whose rows all end before a stage skips it. head_dim exactly 64
// or 128 (the host runs flash_prefill.cu otherwise), at most 16 query heads per KV head.
#define WG_THREADS 256  // two warpgroups
#define WG_ROWS 128     // M rows of a block
#define WG_STAGE 64     // keys of a stage

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The "+f" operands of eight accumulators from d[i], for the wgmma wrappers below.
#define WG_D8(i)                                                                        \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d (+)= A B for one warpgroup, 64 x 64 fp32: A (64 x 16) and B (16 x 64) from shared memory
// through descriptors, both K-major; `acc` 0 ignores d's old values.
__device__ __forceinline__ void wgmma_ss_n64(float* d, unsigned long long a, unsigned long long b, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." FA_AB " "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
        ", %32, %33, p, 1, 1, 0, 0;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
        : "l"(a), "l"(b), "r"(acc));
}

// d += A B for one warpgroup, 64 x 64 fp32: A (64 x 16) from registers (each warp's 16 rows as
// an mma.m16n8k16 A fragment), B (16 x 64) from shared memory stored N-major (transposed).
__device__ __forceinline__ void wgmma_rs_n64_tb(float* d, const unsigned* a, unsigned long long b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." FA_AB " "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
        ", {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// d += A B for one warpgroup, 64 x 128 fp32: A (64 x 16) from registers (each warp's 16 rows as
// an mma.m16n8k16 A fragment), B (16 x 128) from shared memory stored N-major (transposed).
__device__ __forceinline__ void wgmma_rs_n128_tb(float* d, const unsigned* a, unsigned long long b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." FA_AB " "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
        ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous
// wgmma that owns it (an empty asm that "changes" the register, ordered with the others).
__device__ __forceinline__ void wgmma_hold(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// Makes this thread's completed shared-memory writes (cp.async) visible to wgmma's reads.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Descriptor of a 128-byte-swizzled operand at shared address `addr`: `lbo` bytes between
// 64-column halves (read only for a transposed operand), 1,024 between groups of 8 rows.
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr, unsigned lbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

template <int HD>
__device__ __forceinline__ void flash_prefill_sm90(PREFILL_ARGS) {
    // hd is HD here (the host checks it): the code reads HD.
    constexpr int NB = WG_STAGE / 8;                    // n-blocks of 8 keys in S
    constexpr int KV_BYTES = WG_STAGE * HD * 2;         // K or V of one stage
    extern __shared__ __align__(16) unsigned char wg_smem[];
    // The swizzle repeats every 1,024 bytes: align the regions to it (the host adds the slack).
    const unsigned qs = (smem_addr(wg_smem) + 1023u) & ~1023u;
    const unsigned kv0 = qs + WG_ROWS * HD * 2;  // stage b: K at kv0 + 2 b KV_BYTES, V after it

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
    const int tile = blockIdx.x / kv_heads, g = blockIdx.x % kv_heads;
    const int row0 = tiles[2 * tile], cnt = tiles[2 * tile + 1];
    const int group = heads / kv_heads, pw = 16 / group;
    const int kvd = kv_heads * HD;
    const int kend = row_pos[row0 + cnt - 1] + 1;

    // The queries (swizzled), committed with the first stage below.
    gather_q_tile<HD, WG_ROWS, 0>(qs, q, row0, cnt, heads, g, group, pw, HD, WG_THREADS);

    // This thread's two M rows (lane / 4 and lane / 4 + 8 of the warp's 16): batch row,
    // position and query head (-1 past the tile).
    int rrow[2], rpos[2], rhead[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int m = (lane >> 2) + 8 * i;
        const int pi = warp * pw + m / group;
        const bool valid = m < pw * group && pi < cnt;
        rrow[i] = valid ? row0 + pi : -1;
        rpos[i] = valid ? row_pos[row0 + pi] : -1;
        rhead[i] = g * group + m % group;
    }
    // The warpgroup's first and last positions (the same for its four warps, so that the
    // warpgroup-wide wgmma are skipped together).
    const int gfirst_i = wg * 4 * pw;
    const int glast_i = min((wg + 1) * 4 * pw, cnt) - 1;
    const int gfirst = gfirst_i < cnt ? row_pos[row0 + gfirst_i] : -1;
    const int glast = gfirst_i < cnt ? row_pos[row0 + glast_i] : -1;

    float o[HD / 8][4];
    float* of = &o[0][0];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) of[i] = 0.0f;
    float mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};

    const int* table = tables + (size_t)row_seq[row0] * table_stride;
    const int bs_shift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;
    // Keys [from, ...) into stage buffer `buf`, swizzled.
    auto load_stage = [&](int from, int buf) {
        load_kv_stage<HD, WG_STAGE, WG_THREADS, 0>(kv0 + (unsigned)(buf * 2 * KV_BYTES), k_cache, v_cache, table,
                                                  from, kend, g, HD, kvd, block_size, bs_shift);
    };
    load_stage(0, 0);
    asm volatile("cp.async.commit_group;\n" ::);
    // Descriptors of the warpgroup's queries (rows 64 wg.. of each half) and of stage 0's K
    // and V, once: an operand `bytes` on (a multiple of 16) is its descriptor plus bytes / 16.
    const unsigned long long dq0 = sw128_desc(qs + (unsigned)(wg * 64 * 128), 16);
    const unsigned long long dk0 = sw128_desc(kv0, 16);
    const unsigned long long dv0 = sw128_desc(kv0 + KV_BYTES, WG_STAGE * 128);
    int buf = 0;
    for (int k0 = 0; k0 < kend; k0 += WG_STAGE, buf ^= 1) {
        if (k0 + WG_STAGE < kend) load_stage(k0 + WG_STAGE, buf ^ 1);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        fence_async_shared();
        __syncthreads();
        if (k0 <= glast) {
            const unsigned long long stage_off = (unsigned long long)((buf * 2 * KV_BYTES) >> 4);
            // S = Q K^T: 16 dims a step; within a 128-byte row a step is 32 bytes on.
            float s[NB][4];
            float* sf = &s[0][0];
#pragma unroll
            for (int i = 0; i < NB * 4; ++i) wgmma_hold(sf[i]);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk) {
                const unsigned qo = (kk >> 2) * WG_ROWS * 128 + (kk & 3) * 32;
                const unsigned ko = (kk >> 2) * WG_STAGE * 128 + (kk & 3) * 32;
                wgmma_ss_n64(sf, dq0 + (qo >> 4), dk0 + stage_off + (ko >> 4), kk > 0);
            }
            wgmma_commit();
            wgmma_wait_all();
#pragma unroll
            for (int i = 0; i < NB * 4; ++i) wgmma_hold(sf[i]);
            // Mask (causal, and past the context) where some key of the stage needs it.
            if (k0 + WG_STAGE > min(kend, gfirst + 1)) {
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = k0 + nb * 8 + 2 * (lane & 3) + (e & 1);
                        if (key >= kend || key > rpos[e >> 1]) s[nb][e] = -INFINITY;
                    }
                }
            }
            // Online softmax per M row.
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float corr = softmax_row_step<NB>(s, i, mrun[i], lrun[i]);
#pragma unroll
                for (int dn = 0; dn < HD / 8; ++dn) {
                    o[dn][2 * i] *= corr;
                    o[dn][2 * i + 1] *= corr;
                }
            }
            // O += P V: 16 keys a step, P as the A fragments (the mma.m16n8k16 layout the S
            // accumulators already have), V's rows 16 keys (2,048 bytes) a step on.
            unsigned pa[WG_STAGE / 16][4];
#pragma unroll
            for (int j = 0; j < WG_STAGE / 16; ++j) {
                pa[j][0] = pack2(s[2 * j][0], s[2 * j][1]);
                pa[j][1] = pack2(s[2 * j][2], s[2 * j][3]);
                pa[j][2] = pack2(s[2 * j + 1][0], s[2 * j + 1][1]);
                pa[j][3] = pack2(s[2 * j + 1][2], s[2 * j + 1][3]);
            }
#pragma unroll
            for (int i = 0; i < HD / 2; ++i) wgmma_hold(of[i]);
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < WG_STAGE / 16; ++j) {
                const unsigned long long dv = dv0 + stage_off + (unsigned long long)((j * 16 * 128) >> 4);
                if constexpr (HD == 128) {
                    wgmma_rs_n128_tb(of, pa[j], dv);
                } else {
                    wgmma_rs_n64_tb(of, pa[j], dv);
                }
            }
            wgmma_commit();
            wgmma_wait_all();
#pragma unroll
            for (int i = 0; i < HD / 2; ++i) wgmma_hold(of[i]);
        }
        __syncthreads();
    }

    // Each thread writes its rows, normalised.
#pragma unroll
    for (int i = 0; i < 2; ++i) store_out_row<HD>(o, i, lrun[i], out, rrow[i], rhead[i], heads, HD);
}
#else
// Built only for sm_90a (the host launches it only there); elsewhere the entry points exist
// and trap.
template <int HD>
__device__ __forceinline__ void flash_prefill_sm90(PREFILL_ARGS) {
    __trap();
}
#endif

// PREFILL_ARGS, hd equal to the build's head_dim. Two blocks per multiprocessor: up to 128
// registers a thread.
extern "C" __global__ void __launch_bounds__(WG_THREADS, 2) KERNEL(flash_prefill_sm90_hd64)(PREFILL_ARGS) {
    grid_dep_enter();
    flash_prefill_sm90<64>(PREFILL_PASS);
}
extern "C" __global__ void __launch_bounds__(WG_THREADS, 2) KERNEL(flash_prefill_sm90_hd128)(PREFILL_ARGS) {
    grid_dep_enter();
    flash_prefill_sm90<128>(PREFILL_PASS);
}
