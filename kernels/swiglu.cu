// SwiGLU on the fused gate|up product: out[r, i] = silu(gu[r, i]) * gu[r, f + i], in 16-bit
// for the down projection. grid: (ceil(f / 4 / blockDim.x), n) when f is a multiple of 4
// (each thread takes 4 consecutive outputs with float4 loads), else (ceil(f / blockDim.x), n).
__device__ __forceinline__ float silu_times(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

extern "C" __global__ void KERNEL(silu_mul)(const float* __restrict__ gu,
                                         half_t* __restrict__ out, int f) {
    int r = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if ((f & 3) == 0) {
        if (4 * i >= f) return;
        float4 g = reinterpret_cast<const float4*>(gu + (size_t)r * 2 * f)[i];
        float4 u = reinterpret_cast<const float4*>(gu + (size_t)r * 2 * f + f)[i];
        store_half4(out + (size_t)r * f + 4 * i, silu_times(g.x, u.x), silu_times(g.y, u.y),
                    silu_times(g.z, u.z), silu_times(g.w, u.w));
        return;
    }
    if (i >= f) return;
    float g = gu[(size_t)r * 2 * f + i];
    float u = gu[(size_t)r * 2 * f + f + i];
    out[(size_t)r * f + i] = f32_to_half(silu_times(g, u));
}
