// Stage-boundary microbenchmark (docs/perf.md, nineteenth pass): a chain of dependent stages
// timed as a CUDA graph of kernels (plain and programmatic dependent launches) and as one
// persistent kernel with a grid barrier between stages. Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o /tmp/stage-boundary scripts/stage-boundary.cu && /tmp/stage-boundary
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)
constexpr int V = 1024, T = 256;
__device__ float block_sum(float v) {
  __shared__ float s[32];
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = (threadIdx.x & 31) < (T / 32) ? s[threadIdx.x & 31] : 0.f;
  for (int o = 16; o; o >>= 1) t += __shfl_xor_sync(~0u, t, o);
  return t;
}
__device__ void stage(const float* in, float* out) {
  float v = 0;
  for (int i = threadIdx.x; i < V; i += T) v += in[i];
  float s = block_sum(v);
  const int per = (V + gridDim.x - 1) / gridDim.x;  // this block's slice of the vector
  int i = blockIdx.x * per + threadIdx.x;
  if (threadIdx.x < per && i < V) out[i] = s * 1e-3f + 1.0f;
}
__global__ void k_stage(const float* in, float* out) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  stage(in, out);
}
__device__ void barrier(unsigned* c, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    unsigned v;
    do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory"); } while (v < target);
  }
  __syncthreads();
}
__global__ void k_persist(float* a, float* b, int stages, unsigned* c, unsigned base) {
  for (int s = 0; s < stages; ++s) {
    stage(s & 1 ? b : a, s & 1 ? a : b);
    barrier(c, base + gridDim.x * (s + 1));
  }
}
int main() {
  int blocks_list[] = {60, 132, 264};
  float *a, *b; unsigned* c;
  CK(cudaMalloc(&a, V * 4)); CK(cudaMalloc(&b, V * 4)); CK(cudaMalloc(&c, 4));
  CK(cudaMemset(a, 0, V * 4)); CK(cudaMemset(c, 0, 4));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int K = 200, REP = 50;
  for (int blocks : blocks_list) {
    for (int pdl = 0; pdl < 2; ++pdl) {
      cudaGraph_t g; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int s = 0; s < K; ++s) {
        cudaLaunchConfig_t cfg = {}; cfg.gridDim = blocks; cfg.blockDim = T; cfg.stream = st;
        cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at; cfg.numAttrs = pdl;
        CK(cudaLaunchKernelEx(&cfg, k_stage, (const float*)(s & 1 ? b : a), (s & 1 ? a : b)));
      }
      CK(cudaStreamEndCapture(st, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      for (int w = 0; w < 5; ++w) CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(e0, st));
      for (int r = 0; r < REP; ++r) CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
      float ms; cudaEventElapsedTime(&ms, e0, e1);
      printf("graph of %d kernels, %3d blocks, pdl=%d: %.3f us/stage\n", K, blocks, pdl, ms * 1000 / REP / K);
    }
    unsigned base = 0;
    for (int w = 0; w < 5; ++w) { k_persist<<<blocks, T, 0, st>>>(a, b, K, c, base); base += blocks * K; }
    CK(cudaEventRecord(e0, st));
    for (int r = 0; r < REP; ++r) { k_persist<<<blocks, T, 0, st>>>(a, b, K, c, base); base += blocks * K; }
    CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    printf("persistent, %3d blocks, barrier:       %.3f us/stage\n", blocks, ms * 1000 / REP / K);
  }
  return 0;
}
