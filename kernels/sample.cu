// Sampling on the device: one block per row of fp32 logits (a few for a greedy row, below)
// chooses that row's token from its plan (the CPU twin is RowPlan::choose in src/sampling/plan.rs; both must give the
// same token for the same logits, plan and seed):
//   1. the logit bias, then edits: repetition penalty, then presence/frequency by generated
//      count, then bans; then the row's token mask (structured output), when it has one;
//   2. clean (NaN -> -inf, +inf -> FLT_MAX, -0 -> +0), the maximum and its first index;
//   3. the row's total weight (for log-probabilities), and the alternatives: the most
//      likely tokens (a radix select of the top-k boundary, then a sort of those few) with
//      their log-softmax, written to the host;
//   4. a score row: the target token; greedy: the maximum's index; otherwise weights
//      w = exp_fast((x - max) * inv_t), min-p (w >= min_p), the top-k prefix in rank order
//      (logit descending, id ascending) by a radix select on counts, the top-p prefix
//      inside both by a radix select on fixed-point mass, and a draw: the first kept id,
//      in id order, whose running weight exceeds u * kept weight,
//      u = step_uniform(seed, step).
// Float arithmetic that must match the host is written with _rn intrinsics so that no
// multiply-add is contracted. Sums are deterministic (fixed reduction trees, integer
// atomics only), so a seed gives the same token on every run.
//
// params: SAMPLE_PLAN_WORDS words per row: 0 flags (1 greedy, 2 the row's total, for
// log-probabilities, 4 score the target), 1 inv_t, 2 top_k (0 all), 3 top_p, 4-5 seed
// lo/hi, 6-7 step lo/hi, 8 repetition, 9 presence, 10 frequency, 11 first edit, 12 end of
// edits, 13 mask (0: none; else 1 + the word offset in `edits` of the row's mask), 14 mask
// bits, 16 first bias, 17 end of biases, 18 min_p, 19 alternatives (<= SAMPLE_TOP_MAX),
// 20 target; the rest spare.
// edits: (token, info) pairs; info = generated count | 1<<30 repeat | 1<<31 ban; biases are
// (token, bias bits) pairs of the same array; then the rows' masks: bit i % 32 of word
// i / 32 allows id i; ids at or past mask bits are banned.
// tokens[row] = -1 when no token is allowed (log_probs[row] = -inf).
// host: rows tokens, rows log-probability bits, then per row SAMPLE_TOP_MAX (token,
// log-probability bits) pairs of which a row writes only the alternatives it asks for
// (token 0xffffffff past the last), so only what is asked crosses to the host.
// Greedy rows that want no total split their vocabulary over the grid's x blocks
// (slices of ceil(vocab / gridDim.x) ids): each block edits and scans its slice and folds
// its maximum's key and first id into the row's 64-bit word of `best` by atomicMax (an
// integer maximum: the same whatever the order); the last block to count itself done
// writes the token and clears the row's two words (maximum, count) for the next launch.
// Every other row runs on its x = 0 block alone. The host splits only few rows (about 256
// blocks in all): at batch 1 the lm_head leaves one row of up to 128K logits, which one
// block would read through one multiprocessor.
// grid: (slices, rows); block: SAMPLE_THREADS threads; best: 2 words a row, zero.

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define EDIT_REPEAT (1u << 30)
#define EDIT_BAN (1u << 31)
#define EDIT_COUNT (EDIT_REPEAT - 1u)
#define MASS_SCALE 1099511627776.0  // 2^40: a weight of 1 in fixed point
#define SAMPLE_PLAN_WORDS 24             // sampling::PLAN_WORDS
#define SAMPLE_TOP_MAX 20                // sampling::MAX_TOP_LOG_PROBS

__device__ __forceinline__ float sample_clean(float x) {
    x = x > -INFINITY ? x : -INFINITY;  // NaN fails the comparison
    x = x < 3.40282347e38f ? x : 3.40282347e38f;
    return __fadd_rn(x, 0.0f);
}

// The host's math::exp_fast, operation for operation.
__device__ __forceinline__ float sample_exp(float x) {
    const float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f, ROUND = 12582912.0f;
    float xc = x > -87.0f ? x : -87.0f;
    xc = xc < 88.0f ? xc : 88.0f;
    float shifted = __fadd_rn(__fmul_rn(xc, 1.44269504088896341f), ROUND);
    float n = __fsub_rn(shifted, ROUND);
    int n_int = __float_as_int(shifted) - __float_as_int(ROUND);
    float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, LN2_HI)), __fmul_rn(n, LN2_LO));
    float p = __fadd_rn(1.0f / 720.0f, __fmul_rn(r, 1.0f / 5040.0f));
    p = __fadd_rn(1.0f / 120.0f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f / 24.0f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f / 6.0f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f / 2.0f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f, __fmul_rn(r, p));
    float scale = __int_as_float((n_int + 127) << 23);
    return x < -87.0f ? 0.0f : __fmul_rn(p, scale);
}

// Order-preserving key of a cleaned logit: larger logit, larger key.
__device__ __forceinline__ unsigned sample_key(float v) {
    unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ unsigned long long sample_mix(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ double block_sum_f64(double v, double* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = lane < SAMPLE_WARPS ? scratch[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

__device__ __forceinline__ int block_min_int(int v, int* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int t = lane < SAMPLE_WARPS ? scratch[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t = min(t, __shfl_xor_sync(0xffffffffu, t, o));
    return t;
}

__device__ __forceinline__ int block_max_int(int v, int* scratch) {
    return -block_min_int(-v, scratch);
}

// Exclusive prefix sum over threads in thread order (deterministic for doubles too).
template <typename T>
__device__ __forceinline__ T block_scan_excl(T v, T* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        T up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
    }
    __syncthreads();
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        T t = lane < SAMPLE_WARPS ? scratch[lane] : (T)0;
        T ti = t;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            T up = __shfl_up_sync(0xffffffffu, ti, o);
            if (lane >= o) ti += up;
        }
        if (lane < SAMPLE_WARPS) scratch[lane] = ti - t;  // exclusive warp offsets
    }
    __syncthreads();
    return scratch[warp] + incl - v;
}

struct SampleRow {
    const float* x;
    int n;
    float mx, inv_t;
    unsigned tk;  // top-k boundary key: kept when key > tk, or key == tk and id <= ck
    int ck;
    unsigned tp;  // top-p boundary, the same way inside the top-k prefix
    int cp;
    bool use_p;
    float min_w;  // min-p: a weight below it is cut (0: none is)

    __device__ __forceinline__ float weight(float v) const {
        return sample_exp(__fmul_rn(__fsub_rn(v, mx), inv_t));
    }
    __device__ __forceinline__ bool in_k(unsigned key, int i) const {
        return key > tk || (key == tk && i <= ck);
    }
    // In the top-k prefix and not cut by min-p (`w` is the token's weight): what top-p
    // chooses among.
    __device__ __forceinline__ bool in_km(unsigned key, int i, float w) const {
        return in_k(key, i) && w >= min_w;
    }
    __device__ __forceinline__ bool kept(unsigned key, int i, float w) const {
        return in_km(key, i, w) && (!use_p || key > tp || (key == tp && i <= cp));
    }
};

// The top-k boundary of a row of n cleaned logits, k < n: the key of the k-th token in
// rank order (logit descending, id ascending), and the last id among the ties of that key
// that is kept. A token is among the k when key > *tk, or key == *tk and id <= *ck. Every
// thread of the block calls it; [lo, hi) is the thread's contiguous run of ids.
__device__ void sample_topk_bound(const float* x, int n, unsigned k, int lo, int hi,
                                  unsigned* hist_n, unsigned* sel_u, unsigned* iscratch_u,
                                  int* iscratch, unsigned* tk, int* ck) {
    const int tid = threadIdx.x, nt = blockDim.x;
    unsigned prefix = 0, pmask = 0, need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += nt) hist_n[b] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += nt) {
            unsigned key = sample_key(sample_clean(x[i]));
            if ((key & pmask) == prefix) atomicAdd(&hist_n[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned above = 0;
            int b = 255;
            for (; b > 0; --b) {
                if (above + hist_n[b] >= need) break;
                above += hist_n[b];
            }
            sel_u[0] = (unsigned)b, sel_u[1] = need - above;
        }
        __syncthreads();
        prefix |= sel_u[0] << shift, pmask |= 255u << shift, need = sel_u[1];
        __syncthreads();
    }
    // The need-th tie in id order.
    unsigned c = 0;
    for (int i = lo; i < hi; ++i) c += sample_key(sample_clean(x[i])) == prefix;
    unsigned before = block_scan_excl<unsigned>(c, iscratch_u);
    int cut = 0x7fffffff;
    if (before < need && need <= before + c) {
        unsigned run = before;
        for (int i = lo; i < hi; ++i) {
            if (sample_key(sample_clean(x[i])) == prefix && ++run == need) {
                cut = i;
                break;
            }
        }
    }
    *tk = prefix;
    *ck = block_min_int(cut, iscratch);
}

// The row's `k` (1..=SAMPLE_TOP_MAX) most likely tokens of its n cleaned logits, from the
// most likely (ties to the lower id), those of logit -inf left out, each with its
// log-softmax at 1 / inv_t ((x - mx) * inv_t - ln(total), as the host computes it), into
// `out`: (token, log-probability bits) pairs, token 0xffffffff past the last. Every
// thread of the block calls it.
__device__ void sample_top(const float* x, int n, unsigned k, int lo, int hi, float mx,
                           float inv_t, double total, unsigned* out, unsigned* hist_n,
                           unsigned* sel_u, unsigned* iscratch_u, int* iscratch) {
    __shared__ unsigned top_key[SAMPLE_TOP_MAX];
    __shared__ int top_id[SAMPLE_TOP_MAX];
    __shared__ unsigned top_n;
    unsigned tk = 0;
    int ck = n;
    if (k < (unsigned)n) sample_topk_bound(x, n, k, lo, hi, hist_n, sel_u, iscratch_u, iscratch, &tk, &ck);
    if (threadIdx.x == 0) top_n = 0;
    __syncthreads();
    // At most k tokens pass (k < n: exactly the top k, less those of -inf; else n <= k).
    for (int i = lo; i < hi; ++i) {
        const float v = sample_clean(x[i]);
        const unsigned key = sample_key(v);
        if (v > -INFINITY && (key > tk || (key == tk && i <= ck))) {
            const unsigned at = atomicAdd(&top_n, 1u);
            if (at < SAMPLE_TOP_MAX) top_key[at] = key, top_id[at] = i;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // The atomics placed them in any order: sort by rank (a few elements).
        const unsigned cnt = min(min(top_n, k), (unsigned)SAMPLE_TOP_MAX);
        for (unsigned a = 1; a < cnt; ++a) {
            const unsigned ka = top_key[a];
            const int ia = top_id[a];
            int b = (int)a - 1;
            while (b >= 0 && (top_key[b] < ka || (top_key[b] == ka && top_id[b] > ia))) {
                top_key[b + 1] = top_key[b], top_id[b + 1] = top_id[b];
                --b;
            }
            top_key[b + 1] = ka, top_id[b + 1] = ia;
        }
        const double ln_total = log(total);
        for (unsigned j = 0; j < k; ++j) {
            unsigned id = 0xffffffffu;
            float lp = -INFINITY;
            if (j < cnt) {
                id = (unsigned)top_id[j];
                lp = (float)((double)__fmul_rn(__fsub_rn(sample_clean(x[id]), mx), inv_t) - ln_total);
            }
            out[2 * j] = id;
            out[2 * j + 1] = __float_as_uint(lp);
        }
    }
    __syncthreads();
}

// A row's choice into tokens / log_probs (on the device, where the next step reads its
// pending tokens) and into host[row] / host[rows + row]: page-locked host memory mapped for
// the device, which the host reads once the launch is done, with no copy after the kernel.
__device__ __forceinline__ void put_choice(int* tokens, float* log_probs, unsigned* host, int row,
                                           int token, float log_prob) {
    tokens[row] = token;
    log_probs[row] = log_prob;
    host[row] = (unsigned)token;
    host[gridDim.y + row] = __float_as_uint(log_prob);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    KERNEL(sample_rows)(float* __restrict__ logits, const unsigned* __restrict__ params,
                        const unsigned* __restrict__ edits, int vocab, int* __restrict__ tokens,
                        float* __restrict__ log_probs, unsigned long long* __restrict__ best_words,
                        unsigned* __restrict__ host) {
    grid_dep_enter();
    __shared__ unsigned hist_n[256];
    __shared__ unsigned long long hist_m[256];
    __shared__ double dscratch[32];
    __shared__ unsigned long long uscratch[32];
    __shared__ unsigned iscratch_u[32];
    __shared__ int iscratch[32];
    __shared__ unsigned sel_u[2];
    __shared__ unsigned long long sel_m;

    const int row = blockIdx.y, tid = threadIdx.x, nt = blockDim.x, n = vocab;
    const unsigned* pr = params + (size_t)row * SAMPLE_PLAN_WORDS;
    float* x = logits + (size_t)row * n;
    const bool greedy = pr[0] & 1u, want_lp = pr[0] & 2u, score = pr[0] & 4u;
    const float inv_t = __uint_as_float(pr[1]);
    const unsigned top_k = pr[2];
    const float top_p = __uint_as_float(pr[3]);
    const unsigned long long seed = pr[4] | ((unsigned long long)pr[5] << 32);
    const unsigned long long step = pr[6] | ((unsigned long long)pr[7] << 32);
    const float rep = __uint_as_float(pr[8]), pres = __uint_as_float(pr[9]),
                freq = __uint_as_float(pr[10]);
    const float min_p = __uint_as_float(pr[18]);
    const unsigned want_top = min(pr[19], (unsigned)SAMPLE_TOP_MAX), target = pr[20];

    // The slice of ids this block scans: the whole row unless the row is split.
    const bool split = greedy && !want_lp && gridDim.x > 1;
    if (!split && blockIdx.x != 0) return;
    const int per = split ? (n + (int)gridDim.x - 1) / (int)gridDim.x : n;
    const int from = split ? min(n, (int)blockIdx.x * per) : 0, to = min(n, from + per);

    // 1. The logit bias, then the edits (at most one of each per token, so no two threads
    // touch one logit in either loop).
    for (unsigned e = pr[16] + tid; e < pr[17]; e += nt) {
        const unsigned tok = edits[2 * e];
        if (tok >= (unsigned)from && tok < (unsigned)to) x[tok] = __fadd_rn(x[tok], __uint_as_float(edits[2 * e + 1]));
    }
    __syncthreads();
    for (unsigned e = pr[11] + tid; e < pr[12]; e += nt) {
        unsigned tok = edits[2 * e], info = edits[2 * e + 1];
        if (tok < (unsigned)from || tok >= (unsigned)to) continue;
        float v = x[tok];
        if (info & EDIT_REPEAT) v = v > 0.0f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
        unsigned count = info & EDIT_COUNT;
        if (count) v = __fsub_rn(v, __fadd_rn(pres, __fmul_rn(freq, (float)count)));
        if (info & EDIT_BAN) v = -INFINITY;
        x[tok] = v;
    }
    __syncthreads();
    if (pr[13] != 0u) {
        const unsigned* mw = edits + (pr[13] - 1u);
        const int bits = (int)pr[14];
        for (int i = from + tid; i < to; i += nt) {
            if (i >= bits || ((mw[i >> 5] >> (i & 31)) & 1u) == 0u) x[i] = -INFINITY;
        }
        __syncthreads();
    }

    // 2. The maximum and its first index.
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = from + tid; i < to; i += nt) {
        float v = sample_clean(x[i]);
        if (v > best) best = v, bi = i;
    }
    {
        int lane = tid & 31, warp = tid >> 5;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) best = ov, bi = oi;
        }
        __shared__ float bv[32];
        if (lane == 0) bv[warp] = best, iscratch[warp] = bi;
        __syncthreads();
        best = lane < SAMPLE_WARPS ? bv[lane] : -INFINITY;
        bi = lane < SAMPLE_WARPS ? iscratch[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) best = ov, bi = oi;
        }
    }
    if (split) {
        if (tid == 0) {
            unsigned long long* w = best_words + 2 * (size_t)row;
            // Larger logit, larger key; among equal ones the first id. No key for -inf.
            const unsigned long long key =
                best == -INFINITY ? 0ull
                                  : ((unsigned long long)sample_key(best) << 32) | (0xffffffffu - (unsigned)bi);
            atomicMax(w, key);
            __threadfence();
            if (atomicAdd(w + 1, 1ull) == gridDim.x - 1) {
                __threadfence();
                const unsigned long long top = atomicExch(w, 0ull);
                atomicExch(w + 1, 0ull);
                put_choice(tokens, log_probs, host, row,
                           top == 0ull ? -1 : (int)(0xffffffffu - (unsigned)(top & 0xffffffffu)),
                           top == 0ull ? -INFINITY : 0.0f);
            }
        }
        return;
    }
    if (best == -INFINITY) {
        if (tid == 0) put_choice(tokens, log_probs, host, row, -1, -INFINITY);
        return;
    }
    SampleRow s;
    s.x = x, s.n = n, s.mx = best, s.inv_t = inv_t;
    s.tk = 0, s.ck = n, s.tp = 0, s.cp = n, s.use_p = false;
    s.min_w = min_p > 0.0f ? fminf(min_p, 1.0f) : 0.0f;  // NaN fails the comparison: off

    // Each thread's contiguous run of ids, for the scans that go in id order.
    const int seg = (n + nt - 1) / nt, lo = min(n, tid * seg), hi = min(n, lo + seg);

    // 3. The whole row's weight, for log-probabilities, and the alternatives.
    double total = 0.0;
    if (want_lp) {
        for (int i = tid; i < n; i += nt) total += (double)s.weight(sample_clean(x[i]));
        total = block_sum_f64(total, dscratch);
    }
    if (want_lp && want_top > 0) {
        sample_top(x, n, want_top, lo, hi, best, inv_t, total,
                   host + 2 * gridDim.y + (size_t)row * 2 * SAMPLE_TOP_MAX, hist_n, sel_u, iscratch_u,
                   iscratch);
    }
    if (score) {
        if (tid == 0) {
            if (target < (unsigned)n) {
                const float z = __fmul_rn(__fsub_rn(sample_clean(x[target]), best), inv_t);
                put_choice(tokens, log_probs, host, row, (int)target, (float)((double)z - log(total)));
            } else {
                put_choice(tokens, log_probs, host, row, -1, -INFINITY);
            }
        }
        return;
    }
    if (greedy) {
        if (tid == 0) put_choice(tokens, log_probs, host, row, bi, want_lp ? (float)(-log(total)) : 0.0f);
        return;
    }

    // 4a. Top-k: the key of the k-th token in rank order, then which of its ties (by id).
    if (top_k != 0 && top_k < (unsigned)n) {
        sample_topk_bound(x, n, top_k, lo, hi, hist_n, sel_u, iscratch_u, iscratch, &s.tk, &s.ck);
    }

    // 4b. Top-p inside the top-k prefix (less what min-p cuts), on fixed-point mass.
    if (top_p < 1.0f) {
        double mk = 0.0;
        for (int i = tid; i < n; i += nt) {
            float v = sample_clean(x[i]);
            float w = s.weight(v);
            if (s.in_km(sample_key(v), i, w)) mk += (double)w;
        }
        mk = block_sum_f64(mk, dscratch);
        const double target = mk * (double)top_p;
        const unsigned long long tgt = target <= 0.0 ? 0ull : __double2ull_rn(target * MASS_SCALE);
        unsigned prefix = 0, pmask = 0;
        unsigned long long above = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += nt) hist_n[b] = 0, hist_m[b] = 0;
            __syncthreads();
            for (int i = tid; i < n; i += nt) {
                float v = sample_clean(x[i]);
                unsigned k = sample_key(v);
                if ((k & pmask) != prefix) continue;
                float w = s.weight(v);
                if (s.in_km(k, i, w)) {
                    unsigned d = (k >> shift) & 255u;
                    atomicAdd(&hist_n[d], 1u);
                    atomicAdd(&hist_m[d], __double2ull_rn((double)w * MASS_SCALE));
                }
            }
            __syncthreads();
            if (tid == 0) {
                // The first bin from the top, holding tokens, where the mass reaches the
                // target; the lowest such bin when rounding leaves it short.
                unsigned long long acc = above;
                int pick = -1, lowest = 0;
                for (int b = 255; b >= 0; --b) {
                    if (hist_n[b] == 0) continue;
                    lowest = b;
                    if (acc + hist_m[b] >= tgt) {
                        pick = b;
                        break;
                    }
                    acc += hist_m[b];
                }
                if (pick < 0) pick = lowest, acc -= hist_m[lowest];
                sel_u[0] = (unsigned)pick, sel_m = acc;
            }
            __syncthreads();
            prefix |= sel_u[0] << shift, pmask |= 255u << shift, above = sel_m;
            __syncthreads();
        }
        // The first tie, in id order, at which the mass reaches the target; the last tie
        // when it never does.
        unsigned long long m = 0;
        for (int i = lo; i < hi; ++i) {
            float v = sample_clean(x[i]);
            unsigned k = sample_key(v);
            float w = s.weight(v);
            if (k == prefix && s.in_km(k, i, w)) m += __double2ull_rn((double)w * MASS_SCALE);
        }
        unsigned long long run = above + block_scan_excl<unsigned long long>(m, uscratch);
        int cut = 0x7fffffff, last = -1;
        for (int i = lo; i < hi; ++i) {
            float v = sample_clean(x[i]);
            unsigned k = sample_key(v);
            float w = s.weight(v);
            if (k == prefix && s.in_km(k, i, w)) {
                last = i;
                run += __double2ull_rn((double)w * MASS_SCALE);
                if (cut == 0x7fffffff && run >= tgt) cut = i;
            }
        }
        cut = block_min_int(cut, iscratch);
        last = block_max_int(last, iscratch);
        s.tp = prefix, s.cp = cut == 0x7fffffff ? last : cut, s.use_p = true;
    }

    // 4c. The draw over the kept tokens in id order.
    double mass = 0.0;
    for (int i = lo; i < hi; ++i) {
        float v = sample_clean(x[i]);
        float w = s.weight(v);
        if (s.kept(sample_key(v), i, w)) mass += (double)w;
    }
    double before = block_scan_excl<double>(mass, dscratch);
    __shared__ double kept_sum;
    if (tid == nt - 1) kept_sum = before + mass;  // the last thread's inclusive sum
    __syncthreads();
    const double kept_total = kept_sum;
    const double u =
        (double)(sample_mix(sample_mix(seed ^ sample_mix(step))) >> 11) * (1.0 / 9007199254740992.0);
    const double r = u * kept_total;
    int pick = 0x7fffffff, last = -1;
    double run = before;
    for (int i = lo; i < hi; ++i) {
        float v = sample_clean(x[i]);
        float w = s.weight(v);
        if (!s.kept(sample_key(v), i, w)) continue;
        if (w > 0.0f) last = i;
        run += (double)w;
        if (r < run) {
            pick = i;
            break;
        }
    }
    pick = block_min_int(pick, iscratch);
    last = block_max_int(last, iscratch);
    if (pick == 0x7fffffff) pick = last < 0 ? bi : last;
    if (tid == 0) {
        const float w = s.weight(sample_clean(x[pick]));
        put_choice(tokens, log_probs, host, row, pick,
                   want_lp ? (float)(log((double)w) - log(total)) : 0.0f);
    }
}
