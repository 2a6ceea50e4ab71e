// Embedding gather: row ids[r] of a 16-bit table [vocab, h] into the fp32 residual stream.
// An id below 0 is a token the host did not know when it launched the step: the choice
// of logits row -id - 1 of the previous step, read from that step's choices `fed` (a
// row that allowed no token, -1 there, embeds token 0: its sequence has stopped).
// grid: n rows; block: any width.
extern "C" __global__ void KERNEL(embed)(const half_t* __restrict__ table,
                                      const int* __restrict__ ids,
                                      const int* __restrict__ fed,
                                      float* __restrict__ x, int h) {
    grid_dep_enter();
    int r = blockIdx.x;
    int id = ids[r];
    if (id < 0) id = max(fed[-id - 1], 0);
    const half_t* src = table + (size_t)id * h;
    float* dst = x + (size_t)r * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = half_to_f32(src[i]);
}
