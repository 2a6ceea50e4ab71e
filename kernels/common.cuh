// Shared helpers of the inflight kernels: the 16-bit float type of the module (bf16 or
// f16, stored as raw 16-bit words so NVRTC needs no CUDA headers), its conversions, and
// warp and block reductions.
// Each module is compiled twice: with INFLIGHT_F16 its 16-bit type is IEEE half (entry
// points end in _f16), without it bfloat16 (_bf16). Both are stored as raw 16-bit words.
typedef unsigned short half_t;

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

#ifdef INFLIGHT_F16
#define KERNEL(name) name##_f16
__device__ __forceinline__ float half_to_f32(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ half_t f32_to_half(float f) {
    half_t r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
#else
#define KERNEL(name) name##_bf16
__device__ __forceinline__ float half_to_f32(half_t h) {
    return __uint_as_float(((unsigned int)h) << 16);
}
// Round to nearest even, as the host's `half` crate does.
__device__ __forceinline__ half_t f32_to_half(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (half_t)((u >> 16) | 0x40u);  // NaN stays NaN (quiet)
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (half_t)(u >> 16);
}
#endif

// Four floats as four 16-bit values, one 8-byte store (dst 8-byte aligned).
__device__ __forceinline__ void store_half4(half_t* dst, float a, float b, float c, float d) {
    uint2 v;
    v.x = (unsigned)f32_to_half(a) | ((unsigned)f32_to_half(b) << 16);
    v.y = (unsigned)f32_to_half(c) | ((unsigned)f32_to_half(d) << 16);
    *reinterpret_cast<uint2*>(dst) = v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v, float* scratch /* 32 floats */) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    float t = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(t);
}
