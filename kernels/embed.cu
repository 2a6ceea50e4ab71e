// Embedding gather: row ids[r] of a 16-bit table [vocab, h] into the fp32 residual stream.
// An id below 0 is a token the host did not know when it launched the step: the choice
// of logits row -id - 1 of the previous step, read from that step's choices `fed` (a
// row that allowed no token, -1 there, embeds token 0: its sequence has stopped).
// The ids were uploaded before the step's first kernel, so they are read ahead of the
// predecessor wait. Rows of a multiple of 8 up to blockDim.x * 8 * EMBED_VEC values take
// the vector path: 16-byte loads, all issued before any is used (a row is one round trip
// to memory, not one a loop iteration).
// Where `pos_table` is given (learned positions, GPT-2) row pos[r] of it is added, and every
// value is multiplied by `scale` (Gemma's sqrt(hidden)); such rows take the scalar path.
// grid: n rows; block: any width.
#define EMBED_VEC 4

extern "C" __global__ void KERNEL(embed)(const half_t* __restrict__ table,
                                      const int* __restrict__ ids,
                                      const int* __restrict__ fed,
                                      float* __restrict__ x, int h,
                                      const float* __restrict__ pos_table,
                                      const int* __restrict__ pos, float scale) {
    const int r = blockIdx.x;
    int id = load_early(ids + r);
    grid_dep_enter();
    if (id < 0) id = max(fed[-id - 1], 0);
    const half_t* src = table + (size_t)id * h;
    float* dst = x + (size_t)r * h;
    if (pos_table != nullptr || scale != 1.0f) {
        const float* pe = pos_table != nullptr ? pos_table + (size_t)pos[r] * h : nullptr;
        for (int i = threadIdx.x; i < h; i += blockDim.x) {
            dst[i] = half_to_f32(src[i]) * scale + (pe != nullptr ? pe[i] : 0.0f);
        }
        return;
    }
    if ((h & 7) != 0 || h > (int)blockDim.x * 8 * EMBED_VEC) {
        for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = half_to_f32(src[i]);
        return;
    }
    const int h8 = h >> 3;
    uint4 v[EMBED_VEC];
#pragma unroll
    for (int k = 0; k < EMBED_VEC; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < h8) v[k] = reinterpret_cast<const uint4*>(src)[i];
    }
#pragma unroll
    for (int k = 0; k < EMBED_VEC; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < h8) {
            const unsigned w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
            float f[8];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                f[2 * q] = half_to_f32((half_t)(w[q] & 0xffffu));
                f[2 * q + 1] = half_to_f32((half_t)(w[q] >> 16));
            }
            float4* d = reinterpret_cast<float4*>(dst + 8 * i);
            d[0] = make_float4(f[0], f[1], f[2], f[3]);
            d[1] = make_float4(f[4], f[5], f[6], f[7]);
        }
    }
}
