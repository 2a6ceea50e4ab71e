// RoPE (HF rotate-half layout) fused with the paged KV-cache write. Input: the fused QKV
// product [n, (heads + 2 * kv_heads) * hd] in 16-bit (plus an optional fp32 bias). Output:
// rotated q [n, heads * hd] in one of two forms, and rotated k and plain v in 16-bit into
// the layer's cache [slots, kv_heads * hd] at slots[r].
//   - q_scale > 0: 16-bit q times q_scale, the tensor-core attention kernels' A operand
//     (pre-scaled by log2(e) times the scores' scale, 1 / sqrt(hd) unless the model says
//     otherwise), rounded once as those kernels used to round it;
//   - q_scale == 0: fp32 q, unscaled (the warp-per-key kernel's input).
// One thread takes V consecutive pairs of one head (elements i .. i + V - 1 and their
// partners i + hd / 2 ..), with V-wide loads and stores; a k head's thread also copies the
// same elements of v. V is 8 (rope_kv_write) where hd / 2 is a multiple of 8 and the rows
// are many, else 1 (rope_kv_write_v1: decode's few rows want a sine a thread). The angle of
// each pair is formed and reduced to [-pi, pi] in double precision, then its sine and
// cosine are taken in single precision (within about 1e-7 of the CPU twin's
// double-precision values, at a fraction of the cost).
// Where long_rows is given (LongRoPE), row r with long_rows[r] != 0 takes the frequencies at
// inv_freq + hd / 2 (the long factors'), the others those at inv_freq.
// grid: ceil(n * (heads + kv_heads) * hd / 2 / V / ROPE_THREADS) blocks of ROPE_THREADS,
// thread t taking row t / per_row, item t % per_row (q heads' items first, then k heads').
#define ROPE_THREADS 256

template <int V>
struct __align__(2 * V) rope_hvec {
    half_t h[V];
};

template <int V>
__device__ __forceinline__ void rope_kv(const half_t* __restrict__ qkv,
                                        const float* __restrict__ bias,
                                        const int* __restrict__ pos,
                                        const int* __restrict__ slots,
                                        const float* __restrict__ inv_freq,
                                        const int* __restrict__ long_rows,
                                        void* __restrict__ q_out,
                                        half_t* __restrict__ k_cache,
                                        half_t* __restrict__ v_cache,
                                        int n, int heads, int kv_heads, int hd, float q_scale) {
    typedef rope_hvec<V> hv;
    const int half = hd / 2, per_head = half / V, per_row = (heads + kv_heads) * per_head;
    const long long t = (long long)blockIdx.x * ROPE_THREADS + threadIdx.x;
    if (t >= (long long)n * per_row) {
        grid_dep_enter();
        return;
    }
    const int r = (int)(t / per_row), item = (int)(t - (long long)r * per_row);
    const int head = item / per_head, i0 = (item - head * per_head) * V;
    const int qd = heads * hd, kvd = kv_heads * hd;
    // The angles come before the predecessor wait: positions, slots and the frequencies
    // are the step's upload and the model's, ready before its first kernel began, so only
    // the QKV rows are read after it.
    const double p = (double)pos[r];
    const float* freq = inv_freq + (long_rows != nullptr && long_rows[r] != 0 ? half : 0);
    const double two_pi = 6.283185307179586476925;
    float sn[V], cs[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const double angle = p * (double)freq[i0 + j];
        sincosf((float)(angle - rint(angle * (1.0 / two_pi)) * two_pi), &sn[j], &cs[j]);
    }
    const size_t slot = head < heads ? 0 : (size_t)load_early(slots + r);
    grid_dep_enter();
    const half_t* row = qkv + (size_t)r * (qd + 2 * kvd);
    const int a = head * hd + i0, b = a + half;
    const hv xa = *reinterpret_cast<const hv*>(row + a);
    const hv xb = *reinterpret_cast<const hv*>(row + b);
    float ya[V], yb[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
        float fa = half_to_f32(xa.h[j]), fb = half_to_f32(xb.h[j]);
        if (bias != nullptr) {
            fa += bias[a + j];
            fb += bias[b + j];
        }
        ya[j] = fa * cs[j] - fb * sn[j];
        yb[j] = fb * cs[j] + fa * sn[j];
    }
    if (head < heads) {
        const size_t at = (size_t)r * qd + a;
        if (q_scale > 0.0f) {
            half_t* q = reinterpret_cast<half_t*>(q_out);
            hv oa, ob;
#pragma unroll
            for (int j = 0; j < V; ++j) {
                oa.h[j] = f32_to_half(ya[j] * q_scale);
                ob.h[j] = f32_to_half(yb[j] * q_scale);
            }
            *reinterpret_cast<hv*>(q + at) = oa;
            *reinterpret_cast<hv*>(q + at + half) = ob;
        } else {
            float* q = reinterpret_cast<float*>(q_out);
if constexpr (V % 4 == 0) {
#pragma unroll
                for (int j = 0; j < V; j += 4) {
                    *reinterpret_cast<float4*>(q + at + j) = make_float4(ya[j], ya[j + 1], ya[j + 2], ya[j + 3]);
                    *reinterpret_cast<float4*>(q + at + half + j) =
                        make_float4(yb[j], yb[j + 1], yb[j + 2], yb[j + 3]);
                }
            } else {
#pragma unroll
                for (int j = 0; j < V; ++j) {
                    q[at + j] = ya[j];
                    q[at + half + j] = yb[j];
                }
            }
        }
        return;
    }
    half_t* kdst = k_cache + slot * kvd + (a - qd);
    hv ka, kb;
#pragma unroll
    for (int j = 0; j < V; ++j) {
        ka.h[j] = f32_to_half(ya[j]);
        kb.h[j] = f32_to_half(yb[j]);
    }
    *reinterpret_cast<hv*>(kdst) = ka;
    *reinterpret_cast<hv*>(kdst + half) = kb;
    // The same elements of the k head's v head, copied (plus the bias where there is one).
    const int va = a + kvd;
    hv v0 = *reinterpret_cast<const hv*>(row + va);
    hv v1 = *reinterpret_cast<const hv*>(row + va + half);
    if (bias != nullptr) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
            v0.h[j] = f32_to_half(half_to_f32(v0.h[j]) + bias[va + j]);
            v1.h[j] = f32_to_half(half_to_f32(v1.h[j]) + bias[va + half + j]);
        }
    }
    half_t* vdst = v_cache + slot * kvd + (a - qd);
    *reinterpret_cast<hv*>(vdst) = v0;
    *reinterpret_cast<hv*>(vdst + half) = v1;
}

#define ROPE_ARGS                                                                          \
    const half_t* __restrict__ qkv, const float* __restrict__ bias, const int* __restrict__ pos, \
        const int* __restrict__ slots, const float* __restrict__ inv_freq,                 \
        const int* __restrict__ long_rows, void* __restrict__ q_out,                       \
        half_t* __restrict__ k_cache, half_t* __restrict__ v_cache, int n, int heads,      \
        int kv_heads, int hd, float q_scale
#define ROPE_PASS \
    qkv, bias, pos, slots, inv_freq, long_rows, q_out, k_cache, v_cache, n, heads, kv_heads, hd, q_scale

extern "C" __global__ void KERNEL(rope_kv_write)(ROPE_ARGS) { rope_kv<8>(ROPE_PASS); }
extern "C" __global__ void KERNEL(rope_kv_write_v1)(ROPE_ARGS) { rope_kv<1>(ROPE_PASS); }
