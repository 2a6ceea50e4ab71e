// RoPE (HF rotate-half layout) fused with the paged KV-cache write. Input: the fused QKV
// product [n, (heads + 2 * kv_heads) * hd] in fp32 (plus an optional bias). Output: rotated
// q in fp32 [n, heads * hd]; rotated k and plain v written in 16-bit into the layer's cache
// [slots, kv_heads * hd] at slots[r]. Angles in double precision, as the CPU twin.
// grid: n rows; block: any width.
extern "C" __global__ void KERNEL(rope_kv_write)(const float* __restrict__ qkv,
                                              const float* __restrict__ bias,
                                              const int* __restrict__ pos,
                                              const int* __restrict__ slots,
                                              const float* __restrict__ inv_freq,
                                              float* __restrict__ q_out,
                                              half_t* __restrict__ k_cache,
                                              half_t* __restrict__ v_cache,
                                              int heads, int kv_heads, int hd) {
    int r = blockIdx.x;
    int half = hd / 2;
    int qd = heads * hd, kvd = kv_heads * hd;
    const float* row = qkv + (size_t)r * (qd + 2 * kvd);
    size_t slot = (size_t)slots[r];
    double p = (double)pos[r];
    // Rotated pairs of q and k heads together: (heads + kv_heads) * half pairs.
    int pairs = (heads + kv_heads) * half;
    for (int t = threadIdx.x; t < pairs; t += blockDim.x) {
        int head = t / half, i = t % half;
        int a = head * hd + i, b = a + half;  // q heads first, then k heads
        float xa = row[a], xb = row[b];
        if (bias != nullptr) {
            xa += bias[a];
            xb += bias[b];
        }
        double s, c;
        sincos(p * (double)inv_freq[i], &s, &c);
        float sn = (float)s, cs = (float)c;
        float ya = xa * cs - xb * sn;
        float yb = xb * cs + xa * sn;
        if (head < heads) {
            q_out[(size_t)r * qd + a] = ya;
            q_out[(size_t)r * qd + b] = yb;
        } else {
            k_cache[slot * kvd + (a - qd)] = f32_to_half(ya);
            k_cache[slot * kvd + (b - qd)] = f32_to_half(yb);
        }
    }
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        float v = row[qd + kvd + i];
        if (bias != nullptr) v += bias[qd + kvd + i];
        v_cache[slot * kvd + i] = f32_to_half(v);
    }
}
