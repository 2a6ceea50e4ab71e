// SwiGLU on the fused gate|up product (16-bit): out[r, i] = silu(gu[r, i]) * gu[r, f + i],
// in 16-bit for the down projection. grid: (ceil(f / 8 / blockDim.x), n) when f is a
// multiple of 8 (each thread takes 8 consecutive outputs with 16-byte loads), else
// (ceil(f / blockDim.x), n).
__device__ __forceinline__ float silu_times(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

__device__ __forceinline__ float lo_half(unsigned int v) { return half_to_f32((half_t)(v & 0xffffu)); }
__device__ __forceinline__ float hi_half(unsigned int v) { return half_to_f32((half_t)(v >> 16)); }

__device__ __forceinline__ unsigned int silu_pair(unsigned int g, unsigned int u) {
    return (unsigned int)f32_to_half(silu_times(lo_half(g), lo_half(u))) |
           ((unsigned int)f32_to_half(silu_times(hi_half(g), hi_half(u))) << 16);
}

extern "C" __global__ void KERNEL(silu_mul)(const half_t* __restrict__ gu,
                                         half_t* __restrict__ out, int f) {
    grid_dep_enter();
    int r = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if ((f & 7) == 0) {
        if (8 * i >= f) return;
        uint4 g = reinterpret_cast<const uint4*>(gu + (size_t)r * 2 * f)[i];
        uint4 u = reinterpret_cast<const uint4*>(gu + (size_t)r * 2 * f + f)[i];
        uint4 o;
        o.x = silu_pair(g.x, u.x);
        o.y = silu_pair(g.y, u.y);
        o.z = silu_pair(g.z, u.z);
        o.w = silu_pair(g.w, u.w);
        reinterpret_cast<uint4*>(out + (size_t)r * f)[i] = o;
        return;
    }
    if (i >= f) return;
    float g = half_to_f32(gu[(size_t)r * 2 * f + i]);
    float u = half_to_f32(gu[(size_t)r * 2 * f + f + i]);
    out[(size_t)r * f + i] = f32_to_half(silu_times(g, u));
}
