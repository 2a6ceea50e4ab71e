// Stage-boundary microbenchmark (docs/perf.md, nineteenth and thirty-first passes): a chain of
// 180 dependent stages, timed as a CUDA graph of kernels (plain launches, programmatic
// dependent launches, and those with the trigger before the wait) and as one persistent
// kernel with a grid barrier between stages (a counter every block adds to and polls, or
// the last block to arrive flipping a flag on its own line). Each stage: every block reads
// the last stage's vector (one float per block), reduces it and writes its own value. The
// nineteenth pass's figures came from an earlier version (a 1,024-float vector a stage);
// the thirty-first pass's ran the two barriers as two copies of the persistent kernel,
// now one template (the same code).
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o /tmp/stage-boundary scripts/stage-boundary.cu && /tmp/stage-boundary
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ float stage_work(const float* in, int n) {
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += __ldcg(in + i);
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
  __shared__ float red[32];
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  float t = 0.f;
  if (threadIdx.x < 32) {
    t = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    for (int o = 16; o; o >>= 1) t += __shfl_xor_sync(~0u, t, o);
  }
  __syncthreads();
  return t;
}

__global__ void stage_pdl(const float* in, float* out, int n, int early) {
  if (early) asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float t = stage_work(in, n);
  if (threadIdx.x == 0) out[blockIdx.x] = t * 0.5f + 1.f;
}

__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(count) : "memory");
    unsigned v;
    do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory"); } while (v < target);
  }
  __syncthreads();
}

// Last arriver flips a flag that the others poll (different lines for count and flag).
__device__ __forceinline__ void grid_barrier2(unsigned* count, unsigned* flag, unsigned gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
    if (old == gridDim.x * gen - 1) {
      asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(flag), "r"(gen) : "memory");
    } else {
      unsigned v;
      do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory"); } while (v < gen);
    }
  }
  __syncthreads();
}

// One kernel for all stages, a grid barrier between them: the counter barrier, or with
// FLAG the last-arriver flag barrier.
template <bool FLAG>
__global__ void persistent(float* a, float* b, int n, int stages, unsigned* count) {
  for (int s = 0; s < stages; ++s) {
    const float* in = (s & 1) ? b : a;
    float* out = (s & 1) ? a : b;
    float t = stage_work(in, n);
    if (threadIdx.x == 0) out[blockIdx.x] = t * 0.5f + 1.f;
    if (FLAG) {
      grid_barrier2(count, count + 32, s + 1);
    } else {
      grid_barrier(count, gridDim.x * (s + 1));
    }
  }
}

int main() {
  const int STAGES = 180;
  int grids[] = {1, 8, 60, 132, 264};
  float *a, *b; unsigned* cnt;
  CK(cudaMalloc(&a, 4096 * 4)); CK(cudaMalloc(&b, 4096 * 4)); CK(cudaMalloc(&cnt, 4096));
  CK(cudaMemset(a, 0, 4096 * 4)); CK(cudaMemset(b, 0, 4096 * 4));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int g : grids) {
    for (int mode = 0; mode < 5; ++mode) {
      // mode 0: chain no PDL; 1: PDL wait only; 2: PDL early trigger; 3: persistent
      cudaGraph_t graph; cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      if (mode < 3) {
        for (int s = 0; s < STAGES; ++s) {
          cudaLaunchConfig_t cfg = {};
          cfg.gridDim = dim3(g); cfg.blockDim = dim3(256); cfg.stream = st;
          cudaLaunchAttribute at[1];
          at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          at[0].val.programmaticStreamSerializationAllowed = mode >= 1;
          cfg.attrs = at; cfg.numAttrs = 1;
          const float* in = (s & 1) ? b : a; float* out = (s & 1) ? a : b;
          int early = mode == 2;
          CK(cudaLaunchKernelEx(&cfg, stage_pdl, in, out, g, early));
        }
      } else {
        CK(cudaMemsetAsync(cnt, 0, 4096, st));
        if (mode == 3) {
          persistent<false><<<g, 256, 0, st>>>(a, b, g, STAGES, cnt);
        } else {
          persistent<true><<<g, 256, 0, st>>>(a, b, g, STAGES, cnt);
        }
      }
      CK(cudaStreamEndCapture(st, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(exec, st));
      CK(cudaStreamSynchronize(st));
      const int IT = 200;
      CK(cudaEventRecord(e0, st));
      for (int i = 0; i < IT; ++i) CK(cudaGraphLaunch(exec, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaStreamSynchronize(st));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
      const char* names[] = {"chain", "chain+pdl", "chain+pdl+early", "persistent", "persistent-flag"};
      printf("grid %4d %-16s %.3f us/stage (%.1f us/graph)\n", g, names[mode], ms * 1000.f / IT / STAGES, ms * 1000.f / IT);
      CK(cudaGraphExecDestroy(exec)); CK(cudaGraphDestroy(graph));
    }
  }
  return 0;
}
