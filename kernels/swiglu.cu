// SwiGLU on the fused gate|up product (16-bit), whose columns interleave gate and up (the
// weights' rows are uploaded so): out[r, i] = silu(gu[r, 2i]) * gu[r, 2i + 1], in 16-bit for
// the down projection. grid: (ceil(f / 8 / blockDim.x), n) when f is a multiple of 8 (each
// thread takes 8 consecutive outputs from two 16-byte loads), else (ceil(f / blockDim.x), n).
// The GEMV kernel applies the same SwiGLU in its epilogue (gemv.cu) where it runs gate|up.

// silu(gate) * up of a 32-bit word holding (gate, up) in its low and high halves.
__device__ __forceinline__ float silu_word(unsigned int v) {
    return silu_times(half_to_f32((half_t)(v & 0xffffu)), half_to_f32((half_t)(v >> 16)));
}

__device__ __forceinline__ unsigned int silu_pack(unsigned int a, unsigned int b) {
    return (unsigned int)f32_to_half(silu_word(a)) | ((unsigned int)f32_to_half(silu_word(b)) << 16);
}

extern "C" __global__ void KERNEL(silu_mul)(const half_t* __restrict__ gu,
                                         half_t* __restrict__ out, int f) {
    grid_dep_enter();
    int r = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if ((f & 7) == 0) {
        if (8 * i >= f) return;
        const uint4* in = reinterpret_cast<const uint4*>(gu + (size_t)r * 2 * f) + 2 * i;
        const uint4 a = in[0], b = in[1];
        uint4 o;
        o.x = silu_pack(a.x, a.y);
        o.y = silu_pack(a.z, a.w);
        o.z = silu_pack(b.x, b.y);
        o.w = silu_pack(b.z, b.w);
        reinterpret_cast<uint4*>(out + (size_t)r * f)[i] = o;
        return;
    }
    if (i >= f) return;
    float g = half_to_f32(gu[(size_t)r * 2 * f + 2 * i]);
    float u = half_to_f32(gu[(size_t)r * 2 * f + 2 * i + 1]);
    out[(size_t)r * f + i] = f32_to_half(silu_times(g, u));
}
