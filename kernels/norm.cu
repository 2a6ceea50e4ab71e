// RMSNorm into 16-bit GEMM inputs. add_rms_norm fuses the residual add:
// x += delta (when delta is not null), then out = x / rms(x) * w. rms_norm_rows norms
// the selected rows rows[i] of x into out row i (the rows that get logits).
// grid: one block per output row; block: a multiple of 32 threads.
extern "C" __global__ void KERNEL(add_rms_norm)(float* __restrict__ x,
                                             const float* __restrict__ delta,
                                             const float* __restrict__ w,
                                             half_t* __restrict__ out, int h, float eps) {
    __shared__ float scratch[32];
    int r = blockIdx.x;
    float* xr = x + (size_t)r * h;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        float v = xr[i];
        if (delta != nullptr) {
            v += delta[(size_t)r * h + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    float scale = rsqrtf(block_sum(ss, scratch) / (float)h + eps);
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        out[(size_t)r * h + i] = f32_to_half(xr[i] * scale * w[i]);
    }
}

extern "C" __global__ void KERNEL(rms_norm_rows)(const float* __restrict__ x,
                                              const int* __restrict__ rows,
                                              const float* __restrict__ w,
                                              half_t* __restrict__ out, int h, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (size_t)rows[blockIdx.x] * h;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) ss += xr[i] * xr[i];
    float scale = rsqrtf(block_sum(ss, scratch) / (float)h + eps);
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        out[(size_t)blockIdx.x * h + i] = f32_to_half(xr[i] * scale * w[i]);
    }
}
