// Linear layers for a few token rows (decode at small batch), where reading the weights is
// the whole cost: y[t, o] = sum_i x[t, i] * w[o, i] for t < n (n <= GEMV_MAX_ROWS), x and w
// 16-bit row-major, fp32 accumulation, y fp32 (half_out == 0) or 16-bit.
// Work items are (output row, k slice): `split` (1, 2, 4 or 8) warps of one block share a
// row, so that even a short matrix gives every SM enough 16-byte loads in flight. Each lane
// streams its slice's chunks with GEMV_UNROLL loads in flight, past L1 (the weights are read
// once; x stays cached there for every warp); the slices meet in shared memory.
// Needs k a multiple of 8 and 16-byte aligned rows. grid: ceil(out * split / GEMV_WARPS);
// block: 32 * GEMV_WARPS.
#define GEMV_WARPS 8
#define GEMV_UNROLL 8
#define GEMV_MAX_ROWS 4

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ void unpack8(uint4 v, float* f) {
    const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        f[2 * j] = half_to_f32((half_t)(u[j] & 0xffffu));
        f[2 * j + 1] = half_to_f32((half_t)(u[j] >> 16));
    }
}

// acc[t] += chunk c of row t of x · the weight chunk wv.
__device__ __forceinline__ void gemv_chunk(uint4 wv, const uint4* __restrict__ x, int chunks,
                                           int c, int n, float* acc) {
    float wf[8];
    unpack8(wv, wf);
#pragma unroll
    for (int t = 0; t < GEMV_MAX_ROWS; ++t) {
        if (t < n) {
            float xf[8];
            unpack8(x[(size_t)t * chunks + c], xf);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[t] = fmaf(wf[j], xf[j], acc[t]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    KERNEL(gemv)(const half_t* __restrict__ x, const half_t* __restrict__ w,
                 void* __restrict__ y, int n, int k, int out, int half_out, int split) {
    __shared__ float part[GEMV_WARPS][GEMV_MAX_ROWS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int item = blockIdx.x * GEMV_WARPS + warp;
    const int o = item / split, slice = item % split;
    const int chunks = k >> 3;
    const int per = (chunks + split - 1) / split;
    const int c0 = slice * per, c1 = min(chunks, c0 + per);
    const uint4* xc = reinterpret_cast<const uint4*>(x);
    float acc[GEMV_MAX_ROWS];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_ROWS; ++t) acc[t] = 0.0f;
    const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)o * k);
    // Every batch, the last one too, issues all its loads before using any. The weights are
    // immutable, so the first batch is requested before waiting on the previous kernel:
    // under a programmatic dependent launch those bytes stream in while it finishes.
    uint4 wv[GEMV_UNROLL];
    const int first = c0 + lane;
    if (o < out) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            if (first + 32 * u < c1) wv[u] = load_stream(wr + first + 32 * u);
        }
    }
    grid_dep_enter();
    if (o < out) {
        for (int c = first; c < c1; c += 32 * GEMV_UNROLL) {
            if (c != first) {
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; ++u) {
                    if (c + 32 * u < c1) wv[u] = load_stream(wr + c + 32 * u);
                }
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                if (c + 32 * u < c1) gemv_chunk(wv[u], xc, chunks, c + 32 * u, n, acc);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < GEMV_MAX_ROWS; ++t) {
        if (t < n) acc[t] = warp_sum(acc[t]);
    }
    if (split > 1) {  // the same for the whole block
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < GEMV_MAX_ROWS; ++t) part[warp][t] = acc[t];
        }
        __syncthreads();
        if (slice != 0) return;
        for (int s = 1; s < split; ++s) {
#pragma unroll
            for (int t = 0; t < GEMV_MAX_ROWS; ++t) acc[t] += part[warp + s][t];
        }
    }
    if (lane == 0 && o < out) {
#pragma unroll
        for (int t = 0; t < GEMV_MAX_ROWS; ++t) {
            if (t < n) {
                if (half_out) {
                    reinterpret_cast<half_t*>(y)[(size_t)t * out + o] = f32_to_half(acc[t]);
                } else {
                    reinterpret_cast<float*>(y)[(size_t)t * out + o] = acc[t];
                }
            }
        }
    }
}
