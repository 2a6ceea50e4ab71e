// The kernels only some model families need (model::family), each the twin of a CPU
// kernel in kernels/cpu.rs:
//   layer_norm       GPT-2's LayerNorm of fp32 rows (rows[i] of x where rows is given,
//                    else row i) into 16-bit GEMM inputs; grid: n rows.
//   head_rms_norm    Qwen3's and Gemma 3's per-head RMSNorm of q and k, in place in the
//                    16-bit fused QKV rows, before RoPE; grid: (n, heads + kv_heads), one
//                    warp a head.
//   residual_add     x += t + b, or x += rmsnorm(t + b) * w (Gemma's norms on the attention
//                    and MLP outputs), t the layer's fp32 output; grid: n rows.
//   gelu_mul         GeGLU: out[r, i] = gelu(gu[r, 2i]) * gu[r, 2i + 1] (gate and up
//                    columns interleaved, as silu_mul reads them); grid: (ceil(f / 256), n).
//   gelu_bias        GPT-2's MLP: out = gelu(up + b) elementwise; grid: (ceil(f / 256), n).
//   softcap          x = cap * tanh(x / cap) over fp32 rows (Gemma 2's logits);
//                    grid: (ceil(w / 256), n).
// GELU is the tanh approximation (gelu_pytorch_tanh, GPT-2's gelu_new). Blocks of 256.

__device__ __forceinline__ float gelu_tanh(float x) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

extern "C" __global__ void KERNEL(layer_norm)(const float* __restrict__ x,
                                           const int* __restrict__ rows,
                                           const float* __restrict__ w,
                                           const float* __restrict__ b,
                                           half_t* __restrict__ out, int h, float eps) {
    grid_dep_enter();
    __shared__ float scratch[32];
    const int r = rows != nullptr ? rows[blockIdx.x] : blockIdx.x;
    const float* xr = x + (size_t)r * h;
    float s = 0.0f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s, scratch) / (float)h;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        const float d = xr[i] - mean;
        ss += d * d;
    }
    const float scale = rsqrtf(block_sum(ss, scratch) / (float)h + eps);
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        out[(size_t)blockIdx.x * h + i] = f32_to_half((xr[i] - mean) * scale * w[i] + b[i]);
    }
}

extern "C" __global__ void KERNEL(head_rms_norm)(half_t* __restrict__ qkv,
                                              const float* __restrict__ q_w,
                                              const float* __restrict__ k_w,
                                              int heads, int kv_heads, int hd, float eps) {
    grid_dep_enter();
    if (threadIdx.x >= 32) return;
    const int r = blockIdx.x, head = blockIdx.y;
    const int width = (heads + 2 * kv_heads) * hd;
    half_t* v = qkv + (size_t)r * width + (size_t)head * hd;
    const float* w = head < heads ? q_w : k_w;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += 32) {
        const float f = half_to_f32(v[i]);
        ss += f * f;
    }
    const float scale = rsqrtf(warp_sum(ss) / (float)hd + eps);
    for (int i = threadIdx.x; i < hd; i += 32) {
        v[i] = f32_to_half(half_to_f32(v[i]) * scale * w[i]);
    }
}

extern "C" __global__ void KERNEL(residual_add)(float* __restrict__ x,
                                             const float* __restrict__ t,
                                             const float* __restrict__ b,
                                             const float* __restrict__ w, int h, float eps) {
    grid_dep_enter();
    __shared__ float scratch[32];
    const size_t at = (size_t)blockIdx.x * h;
    float scale = 1.0f;
    if (w != nullptr) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < h; i += blockDim.x) {
            const float v = t[at + i] + (b != nullptr ? b[i] : 0.0f);
            ss += v * v;
        }
        scale = rsqrtf(block_sum(ss, scratch) / (float)h + eps);
    }
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        const float v = t[at + i] + (b != nullptr ? b[i] : 0.0f);
        x[at + i] += w != nullptr ? v * scale * w[i] : v;
    }
}

extern "C" __global__ void KERNEL(gelu_mul)(const half_t* __restrict__ gu,
                                         half_t* __restrict__ out, int f) {
    grid_dep_enter();
    const int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= f) return;
    const float g = half_to_f32(gu[(size_t)r * 2 * f + 2 * i]);
    const float u = half_to_f32(gu[(size_t)r * 2 * f + 2 * i + 1]);
    out[(size_t)r * f + i] = f32_to_half(gelu_tanh(g) * u);
}

extern "C" __global__ void KERNEL(gelu_bias)(const half_t* __restrict__ up,
                                          const float* __restrict__ b,
                                          half_t* __restrict__ out, int f) {
    grid_dep_enter();
    const int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= f) return;
    const float v = half_to_f32(up[(size_t)r * f + i]) + (b != nullptr ? b[i] : 0.0f);
    out[(size_t)r * f + i] = f32_to_half(gelu_tanh(v));
}

extern "C" __global__ void KERNEL(softcap)(float* __restrict__ x, int w, float cap) {
    grid_dep_enter();
    const int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= w) return;
    float* v = x + (size_t)r * w + i;
    *v = cap * tanhf(*v / cap);
}
