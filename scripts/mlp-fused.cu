// A decode MLP in one kernel against the engine's two GEMVs (docs/perf.md, thirty-eighth
// pass), at SmolLM2-135M's shapes (hidden 576, intermediate 1,536), one token row, bf16.
// Each block takes C intermediate neurons: it norms the residual row, sums its C gate and
// C up rows, takes SwiGLU, multiplies its C columns of down and adds that part into the
// fp32 residual with vector reductions (red.global.add.v4.f32: the order of the blocks'
// additions varies from run to run). Its 3 * C rows (gate, up, and down's columns stored as
// rows) lie contiguous, so two bulk copies requested before the predecessor wait bring them
// into shared memory. The norm reads a copy of the residual that the o projection wrote
// beside it, since the blocks add into the residual while others may still read it.
// The chain: L layers of [o projection, MLP], captured as one CUDA graph with programmatic
// dependent launches, each layer its own weights (about 6 MB a layer, past the L2 at 30
// layers). The o projection is this file's (a warp a row), the same in every variant.
// Timed per layer: o alone, o + the engine's MLP (gemv.cu's gemv_pipe_norm with SwiGLU,
// split 2, then gemv_pipe adding into the residual, split 4: the 135M's plans), and o +
// the fused MLP at several C, with clusters that sum their blocks' parts
// before the reductions, and with parts left out (mode). One layer of every full variant
// is checked against the host (double sums, the same 16-bit roundings); exit 1 on a miss.
// Build and run on the GPU machine (from the repository root):
//   nvcc -O3 -arch=sm_90a -o /tmp/mlp-fused scripts/mlp-fused.cu && /tmp/mlp-fused
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>
#include "../kernels/common.cuh"
#include "../kernels/gemv.cu"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

constexpr int K = 576, F = 1536, THREADS = 256;

// a + the dot product of two 16-byte chunks of 8 16-bit values.
__device__ __forceinline__ float dot8(uint4 w, uint4 x, float a) {
  const unsigned ww[4] = {w.x, w.y, w.z, w.w}, xw[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float xa, xb, wa, wb;
    unpack2(xw[q], xa, xb);
    unpack2(ww[q], wa, wb);
    a = fmaf(wb, xb, fmaf(wa, xa, a));
  }
  return a;
}

__device__ __forceinline__ void bar_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  }
}

__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// wpk: block b's 3 * C rows of K (gate rows, up rows, down's columns), contiguous. xf: the
// residual's copy (normed here); y: the residual (added into). Dynamic shared memory: the
// rows, the normed row (K halves), the norm's weights (K floats), then 3 * C floats.
template <int C, int CL>
__global__ void __launch_bounds__(THREADS, 1)
    mlp_fused(const half_t* __restrict__ wpk, const float* __restrict__ xf,
              const float* __restrict__ gw, float eps, float* __restrict__ y, int mode,
              float* __restrict__ scratch) {
  // mode (what is left out, to see what each part costs): 1 the reductions; 2 reductions
  // into a row of scratch of the block's own (no contention); 3 the weights' copies (the
  // sums run on whatever shared memory holds).
  static_assert(C % 4 == 0, "part must stay 16-byte aligned");
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bars[2];
  half_t* ws = reinterpret_cast<half_t*>(smem);
  half_t* xs = ws + 3 * C * K;
  float* gs = reinterpret_cast<float*>(xs + K);
  float* dots = gs + K;
  float* hs = dots + 2 * C;
  float* part = hs + C;  // CL > 1: K floats, the cluster's parts of this block's outputs
  const unsigned bar0 = smem_addr(&bars[0]), bar1 = smem_addr(&bars[1]);
  const half_t* wb = wpk + (size_t)blockIdx.x * 3 * C * K;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar0) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar1) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    if (mode != 3) {
      bulk_copy(smem_addr(ws), wb, 2 * C * K * 2, bar0);
      bulk_copy(smem_addr(ws + 2 * C * K), wb + 2 * C * K, C * K * 2, bar1);
    }
  }
  gemv_norm_weights(gw, K, gs);
  // With clusters: every block of the cluster has started before any writes into another's
  // shared memory (arrive here, wait before the first remote store).
  if (CL > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  grid_dep_enter();
  gemv_norm(xf, gs, eps, 1, K, xs);  // ends in a block barrier: the mbarriers' init is seen
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (mode != 3) bar_wait(bar0, 0);
  const uint4* x4 = reinterpret_cast<const uint4*>(xs);
  for (int r = warp; r < 2 * C; r += THREADS / 32) {
    const uint4* w4 = reinterpret_cast<const uint4*>(ws + r * K);
    float a = 0.0f;
    for (int c = lane; c < K / 8; c += 32) a = dot8(w4[c], x4[c], a);
    a = warp_sum(a);
    if (lane == 0) dots[r] = a;
  }
  __syncthreads();
  if (threadIdx.x < C) {
    const float g = half_to_f32(f32_to_half(dots[threadIdx.x]));
    const float u = half_to_f32(f32_to_half(dots[C + threadIdx.x]));
    hs[threadIdx.x] = half_to_f32(f32_to_half(silu_times(g, u)));
  }
  __syncthreads();
  if (mode != 3) bar_wait(bar1, 0);
  const half_t* dw = ws + 2 * C * K;
  if (CL > 1) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  for (int q = threadIdx.x; q < K / 4; q += THREADS) {
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const uint2 wv = *reinterpret_cast<const uint2*>(dw + j * K + 4 * q);
      const float h = hs[j];
      float w0, w1, w2, w3;
      unpack2(wv.x, w0, w1);
      unpack2(wv.y, w2, w3);
      a[0] = fmaf(w0, h, a[0]);
      a[1] = fmaf(w1, h, a[1]);
      a[2] = fmaf(w2, h, a[2]);
      a[3] = fmaf(w3, h, a[3]);
    }
    if (mode == 1) {
      if (a[0] == 12345.0f) y[0] = a[1];  // keeps the sums
    } else if (CL == 1) {
      float* dst = mode == 2 ? scratch + (size_t)blockIdx.x * K + 4 * q : y + 4 * q;
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                   :: "l"(dst), "f"(a[0]), "f"(a[1]), "f"(a[2]), "f"(a[3]) : "memory");
    } else {
      // Block r of the cluster owns outputs [r * K / CL, (r + 1) * K / CL): each block puts
      // its part of them at row (its rank) of the owner's `part`.
      constexpr int OWN = K / CL;
      unsigned rank;
      asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
      const int owner = 4 * q / OWN, at = 4 * q % OWN;
      unsigned remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                   : "=r"(remote) : "r"(smem_addr(part + rank * OWN + at)), "r"(owner));
      asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};"
                   :: "r"(remote), "f"(a[0]), "f"(a[1]), "f"(a[2]), "f"(a[3]) : "memory");
    }
  }
  if (CL > 1) {
    constexpr int OWN = K / CL;
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    if (threadIdx.x < OWN / 4) {
      float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int r = 0; r < CL; ++r) {
        const float4 v = *reinterpret_cast<const float4*>(part + r * OWN + 4 * threadIdx.x);
        t.x += v.x;
        t.y += v.y;
        t.z += v.z;
        t.w += v.w;
      }
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                   :: "l"(y + rank * OWN + 4 * threadIdx.x), "f"(t.x), "f"(t.y), "f"(t.z), "f"(t.w)
                   : "memory");
    }
  }
}

// The o projection of every variant: y[o] += w[o] · a for the K rows (a warp a row, the
// row's weights requested ahead of the predecessor wait, where the compiler leaves them:
// common.cuh's load_early); with `copy`, the sum also at y[K + o] (the fused MLP norms
// that copy).
__global__ void __launch_bounds__(THREADS)
    o_proj(const half_t* __restrict__ a, const half_t* __restrict__ w, float* __restrict__ y, int copy) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * (THREADS / 32) + warp;
  constexpr int CHUNKS = K / 8, PER = (CHUNKS + 31) / 32;
  uint4 wv[PER];
  const uint4* w4 = reinterpret_cast<const uint4*>(w + (size_t)row * K);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    if (lane + 32 * i < CHUNKS) wv[i] = load_stream(w4 + lane + 32 * i);
  }
  grid_dep_enter();
  const uint4* a4 = reinterpret_cast<const uint4*>(a);
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    if (lane + 32 * i < CHUNKS) acc = dot8(wv[i], a4[lane + 32 * i], acc);
  }
  acc = warp_sum(acc);
  if (lane == 0 && row < K) {
    const float v = y[row] + acc;
    y[row] = v;
    if (copy) y[K + row] = v;
  }
}

// ---- host ----

static unsigned rng = 12345;
static float frand() {  // uniform in [-1, 1)
  rng = rng * 1664525u + 1013904223u;
  return ((rng >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}
static unsigned short to_bf16(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
static float from_bf16(unsigned short h) {
  unsigned u = (unsigned)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float round_bf16(float f) { return from_bf16(to_bf16(f)); }

struct Layer {
  std::vector<unsigned short> o, gu, down;  // o [K][K], gate_up interleaved [2F][K], down [K][F]
  std::vector<float> gw;                    // [K]
  half_t *d_o, *d_gu, *d_down;
  float* d_gw;
  half_t* d_pk[3];                          // packed for C = CS[i]
};

// The neurons a block takes in the fused variants (each layer's weights packed for each).
static const int CS[3] = {12, 16, 24};

static std::vector<unsigned short> pack(const Layer& l, int c) {
  std::vector<unsigned short> p((size_t)3 * F * K);
  for (int b = 0; b < F / c; ++b) {
    unsigned short* dst = p.data() + (size_t)b * 3 * c * K;
    for (int j = 0; j < c; ++j) {
      const int n = b * c + j;
      memcpy(dst + (size_t)j * K, l.gu.data() + (size_t)(2 * n) * K, K * 2);
      memcpy(dst + (size_t)(c + j) * K, l.gu.data() + (size_t)(2 * n + 1) * K, K * 2);
      for (int o = 0; o < K; ++o) dst[(size_t)(2 * c + j) * K + o] = l.down[(size_t)o * F + n];
    }
  }
  return p;
}

// The host's chain: resid (K) through L layers of o (attn fixed) and the MLP, with the
// kernels' roundings (normed row and SwiGLU's inputs and output to bf16), double sums.
static void host_chain(const std::vector<Layer>& ls, const std::vector<unsigned short>& attn,
                       std::vector<float>& resid, float eps) {
  std::vector<float> xs(K), h(F);
  for (const Layer& l : ls) {
    for (int o = 0; o < K; ++o) {
      double s = 0;
      for (int i = 0; i < K; ++i) s += (double)from_bf16(l.o[(size_t)o * K + i]) * from_bf16(attn[i]);
      resid[o] = (float)(resid[o] + s);
    }
    double ss = 0;
    for (int i = 0; i < K; ++i) ss += (double)resid[i] * resid[i];
    const float scale = (float)(1.0 / sqrt(ss / K + eps));
    for (int i = 0; i < K; ++i) xs[i] = round_bf16(resid[i] * scale * l.gw[i]);
    for (int n = 0; n < F; ++n) {
      double g = 0, u = 0;
      for (int i = 0; i < K; ++i) {
        g += (double)from_bf16(l.gu[(size_t)(2 * n) * K + i]) * xs[i];
        u += (double)from_bf16(l.gu[(size_t)(2 * n + 1) * K + i]) * xs[i];
      }
      const float gf = round_bf16((float)g), uf = round_bf16((float)u);
      h[n] = round_bf16(gf / (1.0f + expf(-gf)) * uf);
    }
    for (int o = 0; o < K; ++o) {
      double s = 0;
      for (int n = 0; n < F; ++n) s += (double)from_bf16(l.down[(size_t)o * F + n]) * h[n];
      resid[o] = (float)(resid[o] + s);
    }
  }
}

template <typename... P, typename... A>
static void launch(void (*f)(P...), int grid, int smem, int cluster, cudaStream_t s, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  at[1].id = cudaLaunchAttributeClusterDimension;
  at[1].val.clusterDim.x = cluster;
  at[1].val.clusterDim.y = 1;
  at[1].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = cluster > 1 ? 2 : 1;
  CK(cudaLaunchKernelEx(&cfg, f, args...));
}

static int groups(int out, int split) { return ((out + 1) / 2 * split + GEMV_WARPS - 1) / GEMV_WARPS; }

typedef void (*Fused)(const half_t*, const float*, const float*, float, float*, int, float*);
struct Variant {
  const char* name;
  int c, cl;  // c 0: o alone; -1: the engine's MLP
  Fused f;
  int mode;
};

static int fused_smem(int c, int cl) { return (3 * c * K + K) * 2 + K * 4 + 3 * c * 4 + (cl > 1 ? K * 4 : 0); }

int main(int argc, char** argv) {
  const int L = argc > 1 ? atoi(argv[1]) : 30;
  if (L < 1) {
    printf("layers: at least 1, got %d\n", L);
    return 1;
  }
  const int reps = 200;
  const float eps = 1e-5f;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int resident = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, gemv_pipe_bf16, THREADS, 0));
  const int pipe_grid = sms * resident;
  const int norm_smem = K * 2 + K * 4;

  std::vector<Layer> ls(L);
  std::vector<unsigned short> attn(K);
  for (auto& a : attn) a = to_bf16(frand());
  for (Layer& l : ls) {
    l.o.resize((size_t)K * K);
    l.gu.resize((size_t)2 * F * K);
    l.down.resize((size_t)K * F);
    l.gw.resize(K);
    for (auto& v : l.o) v = to_bf16(0.02f * frand());
    for (auto& v : l.gu) v = to_bf16(0.08f * frand());
    for (auto& v : l.down) v = to_bf16(0.05f * frand());
    for (auto& v : l.gw) v = 1.0f + 0.2f * frand();
    CK(cudaMalloc(&l.d_o, l.o.size() * 2));
    CK(cudaMalloc(&l.d_gu, l.gu.size() * 2));
    CK(cudaMalloc(&l.d_down, l.down.size() * 2));
    CK(cudaMalloc(&l.d_gw, K * 4));
    CK(cudaMemcpy(l.d_o, l.o.data(), l.o.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(l.d_gu, l.gu.data(), l.gu.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(l.d_down, l.down.data(), l.down.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(l.d_gw, l.gw.data(), K * 4, cudaMemcpyHostToDevice));
    for (int c = 0; c < 3; ++c) {
      std::vector<unsigned short> p = pack(l, CS[c]);
      CK(cudaMalloc(&l.d_pk[c], p.size() * 2));
      CK(cudaMemcpy(l.d_pk[c], p.data(), p.size() * 2, cudaMemcpyHostToDevice));
    }
  }
  half_t *d_attn, *d_h;
  float* d_resid;
  CK(cudaMalloc(&d_attn, K * 2));
  CK(cudaMalloc(&d_h, F * 2));
  CK(cudaMalloc(&d_resid, 2 * K * 4));
  float* d_scratch;
  CK(cudaMalloc(&d_scratch, (size_t)F * K * 4));
  CK(cudaMemcpy(d_attn, attn.data(), K * 2, cudaMemcpyHostToDevice));
  std::vector<float> resid0(K);
  for (auto& v : resid0) v = frand();

  const Variant vs[] = {
      {"o alone", 0, 1, nullptr},
      {"o + engine MLP (gate_up, down)", -1, 1, nullptr},
      {"o + fused, C 12", 12, 1, mlp_fused<12, 1>},
      {"o + fused, C 16", 16, 1, mlp_fused<16, 1>},
      {"o + fused, C 24", 24, 1, mlp_fused<24, 1>},
      {"o + fused, C 16, no reductions", 16, 1, mlp_fused<16, 1>, 1},
      {"o + fused, C 16, reductions apart", 16, 1, mlp_fused<16, 1>, 2},
      {"o + fused, C 16, no weights", 16, 1, mlp_fused<16, 1>, 3},
      {"o + fused, C 12, clusters of 8", 12, 8, mlp_fused<12, 8>},
      {"o + fused, C 16, clusters of 4", 16, 4, mlp_fused<16, 4>},
  };

  const int nv = sizeof(vs) / sizeof(vs[0]);
  for (const Variant& v : vs) {
    if (v.f != nullptr) {
      CK(cudaFuncSetAttribute(v.f, cudaFuncAttributeMaxDynamicSharedMemorySize, fused_smem(v.c, v.cl)));
    }
  }

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto record = [&](const Variant& v, int layers) {
    for (int li = 0; li < layers; ++li) {
      const Layer& l = ls[li];
      launch(o_proj, K / (THREADS / 32), 0, 1, s, (const half_t*)d_attn, (const half_t*)l.d_o, d_resid,
             v.c > 0 ? 1 : 0);
      if (v.c == -1) {
        launch(gemv_pipe_norm_bf16, std::min(groups(2 * F, 2), pipe_grid), norm_smem, 1, s,
               (const half_t*)nullptr, (const half_t*)l.d_gu, (void*)d_h, K, 2 * F, 1, 2, 1,
               (const float*)d_resid, (const float*)l.d_gw, eps);
        launch(gemv_pipe_bf16, std::min(groups(K, 4), pipe_grid), 0, 1, s, (const half_t*)d_h,
               (const half_t*)l.d_down, (void*)d_resid, F, K, 2, 4, 0);
      } else if (v.c > 0) {
        int pk = 0;
        while (CS[pk] != v.c) ++pk;
        launch(v.f, F / v.c, fused_smem(v.c, v.cl), v.cl, s, (const half_t*)l.d_pk[pk],
               (const float*)(d_resid + K), (const float*)l.d_gw, eps, d_resid, v.mode, d_scratch);
      }
    }
  };
  auto graph_of = [&](const Variant& v, int layers) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    record(v, layers);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    return ge;
  };

  // The check: one layer from resid0 against the host's.
  std::vector<Layer> first(ls.begin(), ls.begin() + 1);
  std::vector<float> ref = resid0;
  host_chain(first, attn, ref, eps);
  double refmax = 0;
  for (float v : ref) refmax = std::max(refmax, (double)fabs(v));
  printf("%d layers, %d SMs, pipelined grid %d; one layer's residual max %.3f\n", L, sms, pipe_grid, refmax);

  int failed = 0;
  double base = 0;
  for (int round = 0; round < 2; ++round) {
    for (int vi = 0; vi < nv; ++vi) {
      const Variant& v = vs[vi];
      double err = 0;
      if (v.c != 0) {
        cudaGraphExec_t one = graph_of(v, 1);
        CK(cudaMemcpy(d_resid, resid0.data(), K * 4, cudaMemcpyHostToDevice));
        CK(cudaGraphLaunch(one, s));
        CK(cudaStreamSynchronize(s));
        std::vector<float> got(K);
        CK(cudaMemcpy(got.data(), d_resid, K * 4, cudaMemcpyDeviceToHost));
        for (int i = 0; i < K; ++i) {
          const double d = fabs((double)got[i] - ref[i]);
          err = d == d ? std::max(err, d) : INFINITY;  // a NaN fails the check
        }
        CK(cudaGraphExecDestroy(one));
      }
      const bool ok = v.mode != 0 || err <= 1e-5 * refmax;
      if (!ok) failed++;
      cudaGraphExec_t ge = graph_of(v, L);
      for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(ge, s));
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      CK(cudaEventRecord(e0, s));
      for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, s));
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = ms * 1000.0 / reps / L;
      if (v.c == 0) base = us;
      printf("round %d  %-34s %6.3f us a layer (MLP %6.3f)  max err %.2e %s\n", round, v.name, us,
             v.c == 0 ? 0.0 : us - base, err, ok ? "ok" : "MISS");
      CK(cudaEventDestroy(e0));
      CK(cudaEventDestroy(e1));
      CK(cudaGraphExecDestroy(ge));
    }
  }
  CK(cudaGetLastError());
  if (failed) {
    printf("FAILED: %d variants off the host\n", failed);
  } else {
    printf("all variants match the host\n");
  }
  return failed ? 1 : 0;
}
