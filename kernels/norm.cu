// RMSNorm into 16-bit GEMM inputs: rms_norm norms every row of the fp32 residual stream x
// (the linear layers add their outputs into x themselves, Out::F32Add), or of the rows the
// last layer ran on alone; rms_norm_rows norms the selected rows rows[i] of x into out row i
// (the rows that get logits, where the last layer ran on every row).
// grid: one block per output row; block: a multiple of 32 threads. Rows of a multiple of 4
// up to blockDim.x * 4 * NORM_VEC take the fast path: float4 loads all issued at once,
// the row kept in registers between the sum and the scaling (one read of x, not two). The
// weights are immutable: the fast path loads them before the predecessor wait, so that
// after it the kernel waits on x alone (just written, in L2), not on a read of w queued
// behind the next kernel's early weight loads (gemv.cu requests its first batch before its
// own wait, megabytes of them while this kernel runs).
// With `early`, rms_norm lets the next kernel launch before its own wait: that GEMV's blocks
// then become resident, and request their first weights, while the kernel before this norm
// (down's last wave) still finishes (forward.rs sets it for the norm before qkv only).
// Safe because the next kernel reads only immutable data
// (weights) before its own wait, which returns once this norm has completed, and this norm
// completes only after its wait. Data an earlier kernel wrote may still be in flight when
// that kernel starts.
#define NORM_VEC 8

extern "C" __global__ void KERNEL(rms_norm)(const float* __restrict__ x,
                                         const float* __restrict__ w,
                                         half_t* __restrict__ out, int h, float eps,
                                         int early) {
    __shared__ float scratch[32];
    if (early) grid_dep_launch();
    const int r = blockIdx.x;
    const float* xr = x + (size_t)r * h;
    if ((h & 3) == 0 && h <= (int)blockDim.x * 4 * NORM_VEC) {
        const int h4 = h >> 2;
        const float4* w4 = reinterpret_cast<const float4*>(w);
        float4 wv[NORM_VEC];
#pragma unroll
        for (int k = 0; k < NORM_VEC; ++k) {
            int i = threadIdx.x + k * blockDim.x;
            wv[k] = i < h4 ? load_early(w4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        grid_dep_enter();
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4 v[NORM_VEC];
#pragma unroll
        for (int k = 0; k < NORM_VEC; ++k) {
            int i = threadIdx.x + k * blockDim.x;
            v[k] = i < h4 ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_VEC; ++k) {
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        }
        float scale = rsqrtf(block_sum(ss, scratch) / (float)h + eps);
#pragma unroll
        for (int k = 0; k < NORM_VEC; ++k) {
            int i = threadIdx.x + k * blockDim.x;
            if (i < h4) {
                store_half4(out + (size_t)r * h + 4 * i, v[k].x * scale * wv[k].x,
                            v[k].y * scale * wv[k].y, v[k].z * scale * wv[k].z,
                            v[k].w * scale * wv[k].w);
            }
        }
        return;
    }
    grid_dep_enter();
    float ss = 0.0f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) ss += xr[i] * xr[i];
    float scale = rsqrtf(block_sum(ss, scratch) / (float)h + eps);
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        out[(size_t)r * h + i] = f32_to_half(xr[i] * scale * w[i]);
    }
}

extern "C" __global__ void KERNEL(rms_norm_rows)(const float* __restrict__ x,
                                              const int* __restrict__ rows,
                                              const float* __restrict__ w,
                                              half_t* __restrict__ out, int h, float eps) {
    grid_dep_enter();
    __shared__ float scratch[32];
    const float* xr = x + (size_t)rows[blockIdx.x] * h;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) ss += xr[i] * xr[i];
    float scale = rsqrtf(block_sum(ss, scratch) / (float)h + eps);
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        out[(size_t)blockIdx.x * h + i] = f32_to_half(xr[i] * scale * w[i]);
    }
}
