// SwiGLU on the fused gate|up product: out[r, i] = silu(gu[r, i]) * gu[r, f + i], in 16-bit
// for the down projection. grid: (ceil(f / blockDim.x), n).
extern "C" __global__ void KERNEL(silu_mul)(const float* __restrict__ gu,
                                         half_t* __restrict__ out, int f) {
    int r = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= f) return;
    float g = gu[(size_t)r * 2 * f + i];
    float u = gu[(size_t)r * 2 * f + f + i];
    out[(size_t)r * f + i] = f32_to_half(g / (1.0f + expf(-g)) * u);
}
