// SwiGLU on the fused gate|up product: out[r, i] = silu(gu[r, i]) * gu[r, f + i], in bf16
// for the down projection. grid: (ceil(f / blockDim.x), n).
extern "C" __global__ void silu_mul_bf16(const float* __restrict__ gu,
                                         bf16_t* __restrict__ out, int f) {
    int r = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= f) return;
    float g = gu[(size_t)r * 2 * f + i];
    float u = gu[(size_t)r * 2 * f + f + i];
    out[(size_t)r * f + i] = f32_to_bf16(g / (1.0f + expf(-g)) * u);
}
