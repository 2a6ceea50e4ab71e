// RoPE (HF rotate-half layout) fused with the paged KV-cache write. Input: the fused QKV
// product [n, (heads + 2 * kv_heads) * hd] in 16-bit (plus an optional fp32 bias). Output: rotated
// q in fp32 [n, heads * hd]; rotated k and plain v written in 16-bit into the layer's cache
// [slots, kv_heads * hd] at slots[r]. The angle is formed and reduced to [-pi, pi] in
// double precision, then its sine and cosine are taken in single precision (within about
// 1e-7 of the CPU twin's double-precision values, at a fraction of the cost).
// grid: (n rows, ceil((heads + kv_heads) * hd / 2 / ROPE_THREADS)); block: ROPE_THREADS
// threads, one rotated pair each, q heads' pairs first, then k heads' (a k pair also
// copies the same pair of v).
#define ROPE_THREADS 256
extern "C" __global__ void KERNEL(rope_kv_write)(const half_t* __restrict__ qkv,
                                              const float* __restrict__ bias,
                                              const int* __restrict__ pos,
                                              const int* __restrict__ slots,
                                              const float* __restrict__ inv_freq,
                                              float* __restrict__ q_out,
                                              half_t* __restrict__ k_cache,
                                              half_t* __restrict__ v_cache,
                                              int heads, int kv_heads, int hd) {
    grid_dep_enter();
    int half = hd / 2;
    int t = blockIdx.y * ROPE_THREADS + threadIdx.x;
    if (t >= (heads + kv_heads) * half) return;
    int r = blockIdx.x, head = t / half, i = t - head * half;  // q heads first, then k heads
    int qd = heads * hd, kvd = kv_heads * hd;
    const half_t* row = qkv + (size_t)r * (qd + 2 * kvd);
    size_t slot = (size_t)slots[r];
    const double angle = (double)pos[r] * (double)inv_freq[i];
    const double two_pi = 6.283185307179586476925;
    float sn, cs;
    sincosf((float)(angle - rint(angle * (1.0 / two_pi)) * two_pi), &sn, &cs);
    int a = head * hd + i, b = a + half;
    float xa = half_to_f32(row[a]), xb = half_to_f32(row[b]);
    if (bias != nullptr) {
        xa += bias[a];
        xb += bias[b];
    }
    float ya = xa * cs - xb * sn;
    float yb = xb * cs + xa * sn;
    if (head < heads) {
        q_out[(size_t)r * qd + a] = ya;
        q_out[(size_t)r * qd + b] = yb;
        return;
    }
    k_cache[slot * kvd + (a - qd)] = f32_to_half(ya);
    k_cache[slot * kvd + (b - qd)] = f32_to_half(yb);
    // The k head's block also copies its v head.
    int va = qd + kvd + (head - heads) * hd + i;
    float v0 = half_to_f32(row[va]), v1 = half_to_f32(row[va + half]);
    if (bias != nullptr) {
        v0 += bias[va];
        v1 += bias[va + half];
    }
    v_cache[slot * kvd + (va - qd - kvd)] = f32_to_half(v0);
    v_cache[slot * kvd + (va + half - qd - kvd)] = f32_to_half(v1);
}
