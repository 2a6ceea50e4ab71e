// Preemption by swapping: copies whole KV blocks between the device cache and the host
// cache, page-locked host memory the device reads and writes directly (over PCIe).
// Device cache: [2 * layers][slots][kv_dim] (layer l's K at 2l, V at 2l + 1); host cache:
// [host_block][2 * layers][block_size * kv_dim]; both 16-bit, copied as 16-byte words
// (`chunk`, a block's elements in one layer's K or V, is a multiple of 8).
// pairs: [n][2] (device block, host block). grid: n * 2 * layers; block: any width.
extern "C" __global__ void KERNEL(kv_swap)(half_t* __restrict__ dev,
                                        half_t* __restrict__ host,
                                        const int* __restrict__ pairs, int planes,
                                        long long plane, int chunk, int to_host) {
    grid_dep_enter();
    int pair = blockIdx.x / planes;
    int p = blockIdx.x % planes;
    uint4* d = reinterpret_cast<uint4*>(dev + (size_t)p * plane + (size_t)pairs[2 * pair] * chunk);
    uint4* h = reinterpret_cast<uint4*>(host + ((size_t)pairs[2 * pair + 1] * planes + p) * chunk);
    int words = chunk / 8;
    if (to_host) {
        for (int i = threadIdx.x; i < words; i += blockDim.x) h[i] = d[i];
    } else {
        for (int i = threadIdx.x; i < words; i += blockDim.x) d[i] = h[i];
    }
}
