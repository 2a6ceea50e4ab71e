// Embedding gather: row ids[r] of a 16-bit table [vocab, h] into the fp32 residual stream.
// grid: n rows; block: any width.
extern "C" __global__ void KERNEL(embed)(const half_t* __restrict__ table,
                                      const int* __restrict__ ids,
                                      float* __restrict__ x, int h) {
    grid_dep_enter();
    int r = blockIdx.x;
    const half_t* src = table + (size_t)ids[r] * h;
    float* dst = x + (size_t)r * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = half_to_f32(src[i]);
}
