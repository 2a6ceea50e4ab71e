// Row gather: out row i = row rows[i] of src, rows of `words` 32-bit words (fp32 rows of
// the residual stream, or 16-bit rows as pairs). Where some rows of a batch get no logits,
// the last layer's attention output and residual rows of those that do go on through it.
// grid: one block per output row; block: any width. Rows of a multiple of 4 words move as
// 16-byte vectors (the buffers are 256-byte aligned, so every such row is too).
extern "C" __global__ void KERNEL(gather_rows)(const unsigned int* __restrict__ src,
                                            const int* __restrict__ rows,
                                            unsigned int* __restrict__ out, int words) {
    grid_dep_enter();
    const unsigned int* s = src + (size_t)rows[blockIdx.x] * words;
    unsigned int* o = out + (size_t)blockIdx.x * words;
    if ((words & 3) == 0) {
        const uint4* s4 = reinterpret_cast<const uint4*>(s);
        uint4* o4 = reinterpret_cast<uint4*>(o);
        for (int i = threadIdx.x; i < words / 4; i += blockDim.x) o4[i] = s4[i];
        return;
    }
    for (int i = threadIdx.x; i < words; i += blockDim.x) o[i] = s[i];
}
