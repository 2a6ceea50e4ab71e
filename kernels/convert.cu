// The weight loader's in-place conversion of a matrix uploaded in the other 16-bit type into
// the module's own: bf16 words into f16 in the f16 build, f16 words into bf16 in the bf16
// build, rounded to nearest even as the host's `half` crate rounds. A finite value that
// becomes infinite (beyond f16's 65504) sets *overflow, and the loader takes bf16 instead.
// grid: any (a grid-stride loop over the n words); block: any width.
extern "C" __global__ void KERNEL(convert_from_other)(half_t* __restrict__ w,
                                                     unsigned long long n,
                                                     unsigned int* __restrict__ overflow) {
    grid_dep_enter();
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    bool over = false;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const unsigned short v = w[i];
#ifdef INFLIGHT_F16
        const float f = __uint_as_float(((unsigned int)v) << 16);
#else
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
#endif
        const half_t h = f32_to_half(f);
        const bool finite = (__float_as_uint(f) & 0x7f800000u) != 0x7f800000u;
#ifdef INFLIGHT_F16
        over |= finite && (h & 0x7fffu) == 0x7c00u;
#else
        over |= finite && (h & 0x7fffu) == 0x7f80u;
#endif
        w[i] = h;
    }
    if (over) *overflow = 1u;
}
