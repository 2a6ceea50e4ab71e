// Linear layers for a few token rows (decode at small batch), where reading the weights is
// the whole cost: y[t, o] = sum_i x[t, i] * w[o, i] for t < n (n <= GEMV_MAX_ROWS), x and w
// 16-bit row-major, fp32 accumulation; y_mode 0: y fp32, 1: y 16-bit, 2: y fp32 added to
// (y += the product, the residual stream's add).
// Work items are (pair of output rows, k slice): `split` (1, 2, 4 or 8) warps of one block
// share a pair, so that even a short matrix gives every SM enough 16-byte loads in flight.
// Each lane streams its slice's chunks of both rows, GEMV_UNROLL per row in flight, past L1
// (the weights are read once; x stays cached there for every warp), and converts each x
// chunk once for the two rows: the kernel is bound by instructions per weight byte as much
// as by bytes. The slices meet in shared memory.
// With `swiglu` (out even: gate_up's rows interleaved, gate i and up i at rows 2i and
// 2i + 1), a pair is one gate and its up, and the kernel writes silu(gate) * up, each first
// rounded to 16 bits as silu_mul (swiglu.cu) would read them: y is then [n, out / 2].
// With `xf` (not null), x is the RMSNorm of the fp32 rows xf by the fp32 weights gw: each
// block norms them itself into shared memory (n * k 16-bit values of dynamic shared
// memory, then gw's k floats) after the predecessor wait, as rms_norm (norm.cu) would have
// written them, same sums in the same order for its 256 threads, so a decode layer needs no
// norm kernel before qkv and gate_up. gw is immutable: it is copied into shared memory
// before the wait, with the weights' first batch, so that after the wait the norm waits on
// xf alone (which the last kernel just wrote, into L2), not on a read of gw queued behind
// every block's weights.
// Needs k a multiple of 8 and 16-byte aligned rows (xf and gw too). grid: ceil(ceil(out /
// 2) * split / GEMV_WARPS); block: 32 * GEMV_WARPS.
#define GEMV_WARPS 8
#define GEMV_UNROLL 4
#define GEMV_MAX_ROWS 4

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// Two 16-bit values of a 32-bit word as floats.
__device__ __forceinline__ void unpack2(unsigned u, float& lo, float& hi) {
    lo = half_to_f32((half_t)(u & 0xffffu));
    hi = half_to_f32((half_t)(u >> 16));
}

// acc[r][t] += chunk c of row t of x · the weight chunk w[r] of pair row r (the second
// only when `two`), a 32-bit word at a time (few live registers).
__device__ __forceinline__ void gemv_chunk2(const uint4* w, const uint4* __restrict__ x,
                                            int chunks, int c, int n, bool two,
                                            float (*acc)[GEMV_MAX_ROWS]) {
    const unsigned w0[4] = {w[0].x, w[0].y, w[0].z, w[0].w};
    const unsigned w1[4] = {w[1].x, w[1].y, w[1].z, w[1].w};
#pragma unroll
    for (int t = 0; t < GEMV_MAX_ROWS; ++t) {
        if (t < n) {
            const uint4 xv = x[(size_t)t * chunks + c];
            const unsigned xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float xa, xb, a, b;
                unpack2(xw[q], xa, xb);
                unpack2(w0[q], a, b);
                acc[0][t] = fmaf(b, xb, fmaf(a, xa, acc[0][t]));
                if (two) {
                    unpack2(w1[q], a, b);
                    acc[1][t] = fmaf(b, xb, fmaf(a, xa, acc[1][t]));
                }
            }
        }
    }
}

// y[at] = v, in fp32 or, with half_out, 16-bit.
__device__ __forceinline__ void gemv_store(void* y, size_t at, float v, bool half_out) {
    if (half_out) {
        reinterpret_cast<half_t*>(y)[at] = f32_to_half(v);
    } else {
        reinterpret_cast<float*>(y)[at] = v;
    }
}

// gw's k floats into shared memory gs, asynchronously (a commit group of the calling
// thread's copies; gemv_norm waits for them).
__device__ __forceinline__ void gemv_norm_weights(const float* __restrict__ gw, int k, float* gs) {
    for (int i = threadIdx.x; i < (k >> 2); i += blockDim.x) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(gs + 4 * i)),
                     "l"(gw + 4 * i));
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

// rms_norm's rows of xf by the weights gs (shared, gemv_norm_weights's) into xs ([n, k]
// 16-bit, shared), for the whole block.
__device__ __forceinline__ void gemv_norm(const float* __restrict__ xf, const float* gs, float eps,
                                          int n, int k, half_t* xs) {
    __shared__ float scratch[32];
    const int k4 = k >> 2;
    // This thread's copies of gs; block_sum's barrier makes everyone's visible.
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    const float4* g4 = reinterpret_cast<const float4*>(gs);
    for (int t = 0; t < n; ++t) {
        const float4* x4 = reinterpret_cast<const float4*>(xf + (size_t)t * k);
        float ss = 0.0f;
        for (int i = threadIdx.x; i < k4; i += blockDim.x) {
            const float4 v = x4[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        const float scale = rsqrtf(block_sum(ss, scratch) / (float)k + eps);
        for (int i = threadIdx.x; i < k4; i += blockDim.x) {
            const float4 v = x4[i], g = g4[i];
            store_half4(xs + (size_t)t * k + 4 * i, v.x * scale * g.x, v.y * scale * g.y,
                        v.z * scale * g.z, v.w * scale * g.w);
        }
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    KERNEL(gemv)(const half_t* __restrict__ x, const half_t* __restrict__ w,
                 void* __restrict__ y, int n, int k, int out, int y_mode, int split,
                 int swiglu, const float* __restrict__ xf, const float* __restrict__ gw,
                 float eps) {
    extern __shared__ __align__(16) half_t gemv_xs[];
    __shared__ float part[GEMV_WARPS][2][GEMV_MAX_ROWS];
    // y_mode 2: the values of y this warp adds to, fetched while the weights stream.
    __shared__ float resid[GEMV_WARPS][2][GEMV_MAX_ROWS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int item = blockIdx.x * GEMV_WARPS + warp;
    const int o = 2 * (item / split), slice = item % split;
    const bool live = o < out, two = o + 1 < out;
    const int chunks = k >> 3;
    const int per = (chunks + split - 1) / split;
    const int c0 = slice * per, c1 = min(chunks, c0 + per);
    const uint4* xc = reinterpret_cast<const uint4*>(xf != nullptr ? gemv_xs : x);
    float acc[2][GEMV_MAX_ROWS];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_ROWS; ++t) acc[0][t] = acc[1][t] = 0.0f;
    const uint4* wr0 = reinterpret_cast<const uint4*>(w + (size_t)o * k);
    const uint4* wr1 = wr0 + chunks;
    // Every batch, the last one too, issues all its loads before using any. The weights are
    // immutable, so the first batch is requested before waiting on the previous kernel:
    // under a programmatic dependent launch those bytes stream in while it finishes.
    uint4 wv[GEMV_UNROLL][2];
    const int first = c0 + lane;
    if (live) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            if (first + 32 * u < c1) {
                wv[u][0] = load_stream(wr0 + first + 32 * u);
                if (two) wv[u][1] = load_stream(wr1 + first + 32 * u);
            }
        }
    }
    float* gemv_gs = reinterpret_cast<float*>(gemv_xs + (size_t)n * k);
    if (xf != nullptr) gemv_norm_weights(gw, k, gemv_gs);
    grid_dep_enter();
    if (xf != nullptr) gemv_norm(xf, gemv_gs, eps, n, k, gemv_xs);
    // The warp that stores its pair copies the y values it adds to into shared memory
    // now, asynchronously (a lane each), so that their latency is not the kernel's tail.
    const bool adds = y_mode == 2 && live && slice == 0;
    if (adds && lane < 2 * GEMV_MAX_ROWS) {
        const int r = lane / GEMV_MAX_ROWS, t = lane % GEMV_MAX_ROWS;
        if (t < n && (r == 0 || two)) {
            const float* src = reinterpret_cast<const float*>(y) + (size_t)t * out + o + r;
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(&resid[warp][r][t])),
                         "l"(src));
        }
        asm volatile("cp.async.commit_group;\n" ::);
    }
    if (live) {
        for (int c = first; c < c1; c += 32 * GEMV_UNROLL) {
            if (c != first) {
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; ++u) {
                    if (c + 32 * u < c1) {
                        wv[u][0] = load_stream(wr0 + c + 32 * u);
                        if (two) wv[u][1] = load_stream(wr1 + c + 32 * u);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                if (c + 32 * u < c1) gemv_chunk2(wv[u], xc, chunks, c + 32 * u, n, two, acc);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < GEMV_MAX_ROWS; ++t) {
        if (t < n) {
            acc[0][t] = warp_sum(acc[0][t]);
            acc[1][t] = warp_sum(acc[1][t]);
        }
    }
    if (split > 1) {  // the same for the whole block
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < GEMV_MAX_ROWS; ++t) {
                part[warp][0][t] = acc[0][t];
                part[warp][1][t] = acc[1][t];
            }
        }
        __syncthreads();
        if (slice != 0) return;
        for (int s = 1; s < split; ++s) {
#pragma unroll
            for (int t = 0; t < GEMV_MAX_ROWS; ++t) {
                acc[0][t] += part[warp + s][0][t];
                acc[1][t] += part[warp + s][1][t];
            }
        }
    }
    if (swiglu) {
        if (lane == 0 && live) {
#pragma unroll
            for (int t = 0; t < GEMV_MAX_ROWS; ++t) {
                if (t < n) {
                    const float g = half_to_f32(f32_to_half(acc[0][t]));
                    const float u = half_to_f32(f32_to_half(acc[1][t]));
                    gemv_store(y, (size_t)t * (out / 2) + o / 2, silu_times(g, u), y_mode == 1);
                }
            }
        }
        return;
    }
    if (adds) {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncwarp();
    }
    if (lane == 0 && live) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (r == 1 && !two) break;
#pragma unroll
            for (int t = 0; t < GEMV_MAX_ROWS; ++t) {
                if (t < n) {
                    const float v = adds ? resid[warp][r][t] + acc[r][t] : acc[r][t];
                    gemv_store(y, (size_t)t * out + o + r, v, y_mode == 1);
                }
            }
        }
    }
}

// One token row, its weights pipelined: y[o] = sum_i x[i] * w[o, i] (y_mode and swiglu as
// gemv's). The grid is what fits on the GPU at once, and each block takes groups of
// GEMV_WARPS work items in turn (group g, g + gridDim.x, ...) with the next group's
// weights in flight while this one is summed and stored: gemv's blocks each load, sum and
// leave, so its waves meet a round trip to memory each with nothing in flight. Two groups
// are requested before the predecessor wait. A warp keeps its k slice (GEMV_WARPS is a
// multiple of split) and reads its x chunks through L1 each group. Each lane holds at most
// PIPE_UNROLL chunks of a row (chunks / split <= 32 * PIPE_UNROLL). Same sums in the same
// order as gemv's at the same split; gemv_pipe_norm norms x first, as gemv does with xf.
// grid: at most ceil(ceil(out / 2) * split / GEMV_WARPS); block: 32 * GEMV_WARPS.
#define PIPE_UNROLL 2

// The weights of this warp's pair of rows in group g (rows o, o + 1 of w; none past out).
__device__ __forceinline__ void pipe_load(const half_t* __restrict__ w, int g, int split, int warp,
                                          int k, int out, int c, int c1,
                                          uint4 (&wv)[PIPE_UNROLL][2]) {
    const int o = 2 * (g * (GEMV_WARPS / split) + warp / split);
    const uint4* wr0 = reinterpret_cast<const uint4*>(w + (size_t)o * k);
    const uint4* wr1 = wr0 + (k >> 3);
#pragma unroll
    for (int u = 0; u < PIPE_UNROLL; ++u) {
        if (o < out && c + 32 * u < c1) {
            wv[u][0] = load_stream(wr0 + c + 32 * u);
            if (o + 1 < out) wv[u][1] = load_stream(wr1 + c + 32 * u);
        }
    }
}

// This lane's sums of its pair's rows in group g against x's chunks (xc) at its own.
__device__ __forceinline__ void pipe_sum(int g, int split, int warp, int out, int c, int c1,
                                         const uint4 (&wv)[PIPE_UNROLL][2],
                                         const uint4* __restrict__ xc, float (&acc)[2]) {
    const int o = 2 * (g * (GEMV_WARPS / split) + warp / split);
    acc[0] = acc[1] = 0.0f;
    if (o >= out) return;
    const bool two = o + 1 < out;
#pragma unroll
    for (int u = 0; u < PIPE_UNROLL; ++u) {
        if (c + 32 * u < c1) {
            const uint4 xv = xc[c + 32 * u];
            const unsigned xw[4] = {xv.x, xv.y, xv.z, xv.w};
            const unsigned w0[4] = {wv[u][0].x, wv[u][0].y, wv[u][0].z, wv[u][0].w};
            const unsigned w1[4] = {wv[u][1].x, wv[u][1].y, wv[u][1].z, wv[u][1].w};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float xa, xb, a, b;
                unpack2(xw[q], xa, xb);
                unpack2(w0[q], a, b);
                acc[0] = fmaf(b, xb, fmaf(a, xa, acc[0]));
                if (two) {
                    unpack2(w1[q], a, b);
                    acc[1] = fmaf(b, xb, fmaf(a, xa, acc[1]));
                }
            }
        }
    }
}

// Group g's sums (each lane's, acc) reduced over the warp and the pair's split warps
// (through part, which alternates between groups so that one barrier a group suffices),
// and stored as gemv stores them. Every thread of the block calls it.
__device__ __forceinline__ void pipe_store(int g, int split, int warp, int lane, int out,
                                           int y_mode, int swiglu, float (&acc)[2],
                                           float (*part)[2], void* __restrict__ y) {
    const int o = 2 * (g * (GEMV_WARPS / split) + warp / split);
    acc[0] = warp_sum(acc[0]);
    acc[1] = warp_sum(acc[1]);
    if (split > 1) {
        if (lane == 0) {
            part[warp][0] = acc[0];
            part[warp][1] = acc[1];
        }
        __syncthreads();
        if (warp % split != 0) return;
        for (int s = 1; s < split; ++s) {
            acc[0] += part[warp + s][0];
            acc[1] += part[warp + s][1];
        }
    }
    if (lane != 0 || o >= out) return;
    if (swiglu) {
        const float gt = half_to_f32(f32_to_half(acc[0]));
        const float up = half_to_f32(f32_to_half(acc[1]));
        gemv_store(y, o / 2, silu_times(gt, up), y_mode == 1);
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (r == 1 && o + 1 >= out) break;
        const float v = y_mode == 2 ? reinterpret_cast<const float*>(y)[o + r] + acc[r] : acc[r];
        gemv_store(y, o + r, v, y_mode == 1);
    }
}

// gemv_pipe's body; NORM: gemv_pipe_norm's, x the norm of xf by gw in shared memory.
template <bool NORM>
__device__ __forceinline__ void gemv_pipe_body(const half_t* __restrict__ x,
                                               const half_t* __restrict__ w, void* __restrict__ y,
                                               int k, int out, int y_mode, int split, int swiglu,
                                               const float* __restrict__ xf,
                                               const float* __restrict__ gw, float eps) {
    extern __shared__ __align__(16) half_t pipe_xs[];
    __shared__ float part[2][GEMV_WARPS][2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int chunks = k >> 3;
    const int per = (chunks + split - 1) / split;
    const int c0 = (warp % split) * per, c1 = min(chunks, c0 + per);
    const int c = c0 + lane;
    const int groups = ((out + 1) / 2 * split + GEMV_WARPS - 1) / GEMV_WARPS;
    const int stride = gridDim.x;
    uint4 wa[PIPE_UNROLL][2], wb[PIPE_UNROLL][2];
    int g = blockIdx.x;
    pipe_load(w, g, split, warp, k, out, c, c1, wa);
    if (g + stride < groups) pipe_load(w, g + stride, split, warp, k, out, c, c1, wb);
    float* gs = reinterpret_cast<float*>(pipe_xs + k);
    if (NORM) gemv_norm_weights(gw, k, gs);
    grid_dep_enter();
    if (NORM) gemv_norm(xf, gs, eps, 1, k, pipe_xs);
    const uint4* xc = reinterpret_cast<const uint4*>(NORM ? pipe_xs : x);
    float acc[2];
    // Two groups a turn, one from each buffer; each buffer is refilled as soon as summed.
    for (; g < groups; g += 2 * stride) {
        pipe_sum(g, split, warp, out, c, c1, wa, xc, acc);
        if (g + 2 * stride < groups) pipe_load(w, g + 2 * stride, split, warp, k, out, c, c1, wa);
        pipe_store(g, split, warp, lane, out, y_mode, swiglu, acc, part[0], y);
        if (g + stride >= groups) break;
        pipe_sum(g + stride, split, warp, out, c, c1, wb, xc, acc);
        if (g + 3 * stride < groups) pipe_load(w, g + 3 * stride, split, warp, k, out, c, c1, wb);
        pipe_store(g + stride, split, warp, lane, out, y_mode, swiglu, acc, part[1], y);
    }
}

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 4)
    KERNEL(gemv_pipe)(const half_t* __restrict__ x, const half_t* __restrict__ w,
                      void* __restrict__ y, int k, int out, int y_mode, int split, int swiglu) {
    gemv_pipe_body<false>(x, w, y, k, out, y_mode, split, swiglu, nullptr, nullptr, 0.0f);
}

// gemv_pipe on the RMSNorm of the fp32 row xf by the fp32 weights gw (x unread): each block
// norms it into shared memory after the predecessor wait, as gemv does with xf (k 16-bit
// values, then gw's k floats, of dynamic shared memory; gw copied in before the wait), so
// the products are those of rms_norm's row, bit for bit. Once a block: where each block
// takes one group, the norm's latency is paid once, not once a wave.
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 4)
    KERNEL(gemv_pipe_norm)(const half_t* __restrict__ x, const half_t* __restrict__ w,
                           void* __restrict__ y, int k, int out, int y_mode, int split,
                           int swiglu, const float* __restrict__ xf,
                           const float* __restrict__ gw, float eps) {
    gemv_pipe_body<true>(x, w, y, k, out, y_mode, split, swiglu, xf, gw, eps);
}
