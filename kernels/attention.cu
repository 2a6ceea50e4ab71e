// Paged causal attention with grouped KV heads, for prefill and decode rows alike: query
// row r of sequence row_seq[r] at position row_pos[r] attends to positions 0..=row_pos[r]
// (only the last `window` of them where window > 0: a sliding-window layer), scores
// scaled by `scale` and, where softcap > 0, soft-capped (cap * tanh(score / cap), Gemma 2),
// read from the 16-bit cache through the sequence's block table. One block of 4 warps per
// (row, KV head, split): the split covers positions [split * chunk, (split + 1) * chunk);
// each warp takes every 4th position with an online softmax for all the group's query
// heads (each lane holds ceil(hd / 32) consecutive dimensions; lanes past hd idle), then
// the warps merge. With one split the
// block writes the normalised 16-bit output; with several it writes unnormalised partial
// sums and (max, sum) pairs that attention_combine merges over the batch's tiles (split-K
// for long contexts). The body is built for DPL = ceil(head_dim / 32) up to 4
// (paged_attention, head_dim <= 128) and up to 8 (paged_attention_hd256: Gemma's 256), so
// that the narrower heads keep their registers.
#define ATT_WARPS 4
#define ATT_MAX_GROUP 8

template <int DPL>
__device__ __forceinline__ void paged_attention_body(
    const float* __restrict__ q,          // [n, heads * hd]
    const half_t* __restrict__ k_cache,   // [slots, kv_heads * hd]
    const half_t* __restrict__ v_cache,
    const int* __restrict__ tables,       // [seqs, table_stride]
    const int* __restrict__ row_seq,
    const int* __restrict__ row_pos,
    half_t* __restrict__ out,             // [n, heads * hd] (one split)
    float* __restrict__ part_acc,         // [n, heads, splits, hd] (several splits)
    float* __restrict__ part_ml,          // [n, heads, splits, 2]
    int heads, int kv_heads, int hd, int block_size, int table_stride,
    int chunk, int splits, float scale, int window, float softcap) {
    grid_dep_enter();
    __shared__ float s_acc[ATT_WARPS][ATT_MAX_GROUP][DPL * 32];
    __shared__ float s_m[ATT_WARPS][ATT_MAX_GROUP];
    __shared__ float s_l[ATT_WARPS][ATT_MAX_GROUP];

    const int r = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = heads / kv_heads;
    const int dpl = (hd + 31) / 32;
    const int kvd = kv_heads * hd;
    const int len = row_pos[r] + 1;
    const int lo = window > 0 ? max(len - window, 0) : 0;
    const int start = max(split * chunk, lo);
    const int end = min(split * chunk + chunk, len);

    if (start >= end) {
        // An empty split: say so, so the merge can skip it whatever the buffer held.
        if (threadIdx.x < group) {
            size_t pi = ((size_t)r * heads + g * group + threadIdx.x) * splits + split;
            part_ml[pi * 2] = -INFINITY;
            part_ml[pi * 2 + 1] = 0.0f;
        }
        return;
    }

    float qr[ATT_MAX_GROUP][DPL];
    float acc[ATT_MAX_GROUP][DPL];
    float m[ATT_MAX_GROUP], l[ATT_MAX_GROUP];
#pragma unroll
    for (int h = 0; h < ATT_MAX_GROUP; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; ++d) {
            acc[h][d] = 0.0f;
            qr[h][d] = 0.0f;
            if (h < group && d < dpl && lane * dpl + d < hd) {
                qr[h][d] = q[(size_t)r * heads * hd + (g * group + h) * hd + lane * dpl + d] * scale;
            }
        }
    }

    const int* table = tables + (size_t)row_seq[r] * table_stride;
    for (int p = start + warp; p < end; p += ATT_WARPS) {
        size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
        const half_t* kp = k_cache + slot * kvd + g * hd + lane * dpl;
        const half_t* vp = v_cache + slot * kvd + g * hd + lane * dpl;
        float kv[DPL], vv[DPL];
#pragma unroll
        for (int d = 0; d < DPL; ++d) {
            bool in = d < dpl && lane * dpl + d < hd;
            kv[d] = in ? half_to_f32(kp[d]) : 0.0f;
            vv[d] = in ? half_to_f32(vp[d]) : 0.0f;
        }
#pragma unroll
        for (int h = 0; h < ATT_MAX_GROUP; ++h) {
            if (h < group) {
                float s = 0.0f;
#pragma unroll
                for (int d = 0; d < DPL; ++d) s += qr[h][d] * kv[d];
                s = warp_sum(s);
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                float mn = fmaxf(m[h], s);
                float corr = __expf(m[h] - mn);
                float e = __expf(s - mn);
                l[h] = l[h] * corr + e;
#pragma unroll
                for (int d = 0; d < DPL; ++d) acc[h][d] = acc[h][d] * corr + e * vv[d];
                m[h] = mn;
            }
        }
    }

#pragma unroll
    for (int h = 0; h < ATT_MAX_GROUP; ++h) {
        if (h < group) {
#pragma unroll
            for (int d = 0; d < DPL; ++d) {
                if (d < dpl && lane * dpl + d < hd) s_acc[warp][h][lane * dpl + d] = acc[h][d];
            }
            if (lane == 0) {
                s_m[warp][h] = m[h];
                s_l[warp][h] = l[h];
            }
        }
    }
    __syncthreads();

    // Merge the warps: thread t handles (head t / hd, dim t % hd).
    for (int t = threadIdx.x; t < group * hd; t += blockDim.x) {
        int h = t / hd, d = t % hd;
        float mx = -INFINITY;
        for (int w = 0; w < ATT_WARPS; ++w) mx = fmaxf(mx, s_m[w][h]);
        float sum = 0.0f, a = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w) {
            if (s_m[w][h] == -INFINITY) continue;  // a warp that saw no position
            float c = __expf(s_m[w][h] - mx);
            sum += s_l[w][h] * c;
            a += s_acc[w][h][d] * c;
        }
        int qh = g * group + h;
        if (splits == 1) {
            out[(size_t)r * heads * hd + qh * hd + d] = f32_to_half(a / sum);
        } else {
            size_t pi = ((size_t)r * heads + qh) * splits + split;
            part_acc[pi * hd + d] = a;
            if (d == 0) {
                part_ml[pi * 2] = mx;
                part_ml[pi * 2 + 1] = sum;
            }
        }
    }
}

#define ATT_ARGS                                                                              \
    const float* __restrict__ q, const half_t* __restrict__ k_cache,                          \
        const half_t* __restrict__ v_cache, const int* __restrict__ tables,                   \
        const int* __restrict__ row_seq, const int* __restrict__ row_pos,                     \
        half_t* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,  \
        int heads, int kv_heads, int hd, int block_size, int table_stride, int chunk,         \
        int splits, float scale, int window, float softcap
#define ATT_PASS                                                                              \
    q, k_cache, v_cache, tables, row_seq, row_pos, out, part_acc, part_ml, heads, kv_heads,   \
        hd, block_size, table_stride, chunk, splits, scale, window, softcap

extern "C" __global__ void KERNEL(paged_attention)(ATT_ARGS) { paged_attention_body<4>(ATT_PASS); }
extern "C" __global__ void KERNEL(paged_attention_hd256)(ATT_ARGS) {
    paged_attention_body<8>(ATT_PASS);
}

// Merges the splits of paged_attention or flash_decode (partial sums relative to
// natural-log maxima) for each tile's rows (tiles: [first row, rows] pairs).
// grid: (tiles, heads).
extern "C" __global__ void KERNEL(attention_combine)(const int* __restrict__ tiles,
                                              const float* __restrict__ part_acc,
                                              const float* __restrict__ part_ml,
                                              half_t* __restrict__ out,
                                              int heads, int hd, int splits) {
    grid_dep_enter();
    const int row0 = tiles[2 * blockIdx.x], cnt = tiles[2 * blockIdx.x + 1];
    const int qh = blockIdx.y;
    for (int i = 0; i < cnt; ++i) {
        const int r = row0 + i;
        const size_t base = ((size_t)r * heads + qh) * splits;
        float mx = -INFINITY;
        for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_ml[(base + s) * 2]);
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float sum = 0.0f, a = 0.0f;
            for (int s = 0; s < splits; ++s) {
                float ms = part_ml[(base + s) * 2];
                if (ms == -INFINITY) continue;
                float c = __expf(ms - mx);
                sum += part_ml[(base + s) * 2 + 1] * c;
                a += part_acc[(base + s) * hd + d] * c;
            }
            out[(size_t)r * heads * hd + qh * hd + d] = f32_to_half(a / sum);
        }
    }
}
