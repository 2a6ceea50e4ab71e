// Microbenchmark for a decode layer run inside one thread-block cluster (docs/perf.md,
// thirty-fifth pass): what a stage boundary costs when it is a cluster barrier instead of
// a kernel boundary, and how fast a few multiprocessors alone stream weights from memory.
//   A. A chain of dependent stages in one cluster of C blocks (C = 2 .. 16; 16 is a
//      non-portable size): each block reads the C values the last stage wrote, sums them
//      and writes its own, then the cluster barrier (arrive.release, wait.acquire). The
//      values go through global memory (L2) or through distributed shared memory (each
//      block stores its value into every block's shared memory).
//   B. G blocks of 512 threads (one a multiprocessor) streaming B bytes with 16-byte
//      loads past L1, 8 in flight a thread: from memory (a fresh window of a 2 GiB buffer
//      each run) and from L2 (the same window again).
//   C. The same by bulk copies into shared memory (cp.async.bulk, 192 KiB in flight a
//      block), the loader a layer-in-a-cluster kernel would use.
//   D. 30 decode layers of SmolLM2-135M's GEMV shapes run inside one cluster that way
//      (layers_in_cluster, a first prototype): µs a layer, against the engine's chain of
//      kernels, and again with parts left out to see where the time goes (timing only,
//      wrong values).
// Times come from %globaltimer inside the kernels (first block start to last block end),
// so launch gaps do not count. Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a -o /tmp/cluster-layer scripts/cluster-layer.cu && /tmp/cluster-layer
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ unsigned rank_in_cluster() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// times[0]: min start, times[1]: max end (ns), over the blocks.
__device__ __forceinline__ void record(unsigned long long* times, unsigned long long t0) {
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicMin(times, t0);
    atomicMax(times + 1, now());
  }
}

// A: `stages` dependent stages in one cluster; DSMEM: the values through distributed shared
// memory, else through global memory (vals: 2 x 16 floats).
template <bool DSMEM>
__global__ void cluster_chain(float* vals, int stages, unsigned long long* times) {
  __shared__ float inbox[2][16];
  const unsigned c = gridDim.x, r = rank_in_cluster();
  if (threadIdx.x < 32) inbox[0][threadIdx.x & 15] = inbox[1][threadIdx.x & 15] = 0.0f;
  cluster_sync();
  const unsigned long long t0 = now();
  for (int s = 0; s < stages; ++s) {
    const int in = s & 1, out = in ^ 1;
    float v = 0.0f;
    if (threadIdx.x < 32) {
      float x = 0.0f;
      if (threadIdx.x < c) x = DSMEM ? inbox[in][threadIdx.x] : __ldcg(vals + in * 16 + threadIdx.x);
      for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(~0u, x, o);
      v = x * 0.5f + 1.0f;
    }
    if (DSMEM) {
      // Lane j < c stores this block's value (every lane of warp 0 holds it) into block j's
      // inbox.
      if (threadIdx.x < c) {
        unsigned local = (unsigned)__cvta_generic_to_shared(&inbox[out][r]), remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(threadIdx.x));
        asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(v) : "memory");
      }
    } else if (threadIdx.x == 0) {
      __stcg(vals + out * 16 + r, v);
    }
    cluster_sync();
  }
  record(times, t0);
}

// B: every block streams its contiguous share of `bytes` from src.
__global__ void __launch_bounds__(512) stream(const uint4* __restrict__ src, size_t bytes, float* sink,
                                              unsigned long long* times) {
  const unsigned long long t0 = now();
  const size_t chunks = bytes / 16, per = (chunks + gridDim.x - 1) / gridDim.x;
  const size_t c0 = blockIdx.x * per, c1 = c0 + per < chunks ? c0 + per : chunks;
  unsigned acc = 0;
  for (size_t c = c0 + threadIdx.x; c < c1; c += 8 * blockDim.x) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const size_t i = c + (size_t)u * blockDim.x;
      if (i < c1) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                     : "l"(src + i));
      } else {
        v[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) sink[0] = 1.0f;  // keeps the loads
  record(times, t0);
}

// C: the same with bulk copies (cp.async.bulk, the copy engine of each multiprocessor):
// one thread a block keeps BULK_STAGES copies of BULK_CHUNK bytes in flight into shared
// memory, each counted on its stage's mbarrier; the bytes are not read.
#define BULK_STAGES 6
#define BULK_CHUNK (32 << 10)
__global__ void stream_bulk(const char* __restrict__ src, size_t bytes, unsigned long long* times) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long bars[BULK_STAGES];
  const unsigned long long t0 = now();
  const size_t per = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
  const size_t b0 = blockIdx.x * per, b1 = b0 + per < bytes ? b0 + per : bytes;
  if (threadIdx.x == 0) {
    for (int i = 0; i < BULK_STAGES; ++i) {
      unsigned a = (unsigned)__cvta_generic_to_shared(&bars[i]);
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(a) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const int n = b1 > b0 ? (int)((b1 - b0 + BULK_CHUNK - 1) / BULK_CHUNK) : 0;
    for (int i = 0; i < n + BULK_STAGES; ++i) {
      const int st = i % BULK_STAGES;
      const unsigned bar = (unsigned)__cvta_generic_to_shared(&bars[st]);
      if (i >= BULK_STAGES) {  // the copy issued BULK_STAGES ago into this stage
        const unsigned parity = (unsigned)((i / BULK_STAGES - 1) & 1);
        unsigned done = 0;
        while (!done) {
          asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                       : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        }
      }
      if (i < n) {
        const size_t off = b0 + (size_t)i * BULK_CHUNK;
        const unsigned len = (unsigned)(b1 - off < BULK_CHUNK ? b1 - off : BULK_CHUNK);
        const unsigned dst = (unsigned)__cvta_generic_to_shared(ring + st * BULK_CHUNK);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(len) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(dst), "l"(src + off), "r"(len), "r"(bar) : "memory");
      }
    }
  }
  record(times, t0);
}

// D: SmolLM2-135M's decode layers (576 wide, 960 qkv rows, 1,536 intermediate) inside one
// cluster of C blocks, every weight streamed once from memory by bulk copies into a ring of
// shared memory that runs ahead across stages and layers, the stages separated by cluster
// barriers, the vectors between them through L2. Each block owns a contiguous slice of
// each matrix's rows. Stages a layer: norm + qkv | attention | o + residual | norm +
// gate_up + SwiGLU | down + residual, a barrier after each. The attention stage is a stand-in
// (each block reads its share of 256 positions' keys and values and scales q by their sum):
// the timing of the GEMV chain, not of a real attention. bf16 weights, fp32 vectors.
#define D_H 576
#define D_QKV 960
#define D_F 1536
#define D_KV_BYTES (256 * 192 * 2 * 2)
#define D_THREADS 256
#define D_LAYERS_MAX 32
struct DLayer {
  const char* qkv;  // [960][576] bf16
  const char* o;    // [576][576]
  const char* gu;   // [3072][576], gate i and up i at rows 2i, 2i + 1
  const char* down; // [576][1536]
  const char* kv;   // D_KV_BYTES
};
struct DVecs {
  float* x;    // [576], the residual
  float* qkv;  // [960]
  float* attn; // [576]
  float* gu;   // [3072], gate i and up i at 2i, 2i + 1
};

__device__ __forceinline__ float bf16f(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

__device__ __forceinline__ void d_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  }
}

// The ring: chunk k of the block's sequence (layer by layer, stage by stage, whole rows of
// at most BULK_CHUNK bytes) goes to slot k % BULK_STAGES. Thread 0 issues; every warp
// releases a slot once it has used it.
struct DRing {
  char* ring;
  unsigned long long* full;
  unsigned long long* empty;
  // The issuer's cursor.
  int layer, stage, row, issued;
};

// Stage s of layer l for block b of C: the block's first row's address, its rows, row bytes
// (`w`: the layers' stage weights, in shared memory).
__device__ __forceinline__ void d_stage(const char* const* w, int l, int s, int b, int C, const char*& base,
                                        int& rows, int& row_bytes) {
  rows = (s == 0 ? D_QKV : s == 2 ? 2 * D_F : D_H) / C;
  row_bytes = (s == 3 ? D_F : D_H) * 2;
  base = w[l * 4 + s] + (size_t)b * rows * row_bytes;
}

// Thread 0 issues chunks until `upto` (exclusive) or the last layer's last.
__device__ void d_issue(DRing& r, const char* const* layers, int nl, int upto) {
  const int b = blockIdx.x, C = gridDim.x;
  while (r.issued < upto && r.layer < nl) {
    const char* base;
    int rows, rb;
    d_stage(layers, r.layer, r.stage, b, C, base, rows, rb);
    const int per = BULK_CHUNK / rb, n = min(per, rows - r.row);
    const int slot = r.issued % BULK_STAGES;
    const unsigned full = (unsigned)__cvta_generic_to_shared(&r.full[slot]);
    const unsigned empty = (unsigned)__cvta_generic_to_shared(&r.empty[slot]);
    // The slot's last user, chunk issued - BULK_STAGES, is done (a fresh barrier passes).
    d_wait(empty, (unsigned)(((r.issued / BULK_STAGES) & 1) ^ 1));
    const unsigned len = (unsigned)(n * rb);
    const unsigned dst = (unsigned)__cvta_generic_to_shared(r.ring + slot * BULK_CHUNK);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(full), "r"(len) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(base + (size_t)r.row * rb), "r"(len), "r"(full) : "memory");
    ++r.issued;
    r.row += n;
    if (r.row == rows) {
      r.row = 0;
      if (++r.stage == 4) {
        r.stage = 0;
        ++r.layer;
      }
    }
  }
}

// The inputs of lane's 16-byte pieces of a row (lane, lane + 32, ...; vecs a row) from
// `in` (shared, fp32) into registers, for a whole GEMV stage.
template <int VPL>
__device__ __forceinline__ void d_x_regs(const float* in, int vecs, int lane, float (&xr)[VPL][8]) {
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    if (lane + 32 * k >= vecs) break;
    const float4* x4 = reinterpret_cast<const float4*>(in + (lane + 32 * k) * 8);
    const float4 a = x4[0], c = x4[1];
    xr[k][0] = a.x; xr[k][1] = a.y; xr[k][2] = a.z; xr[k][3] = a.w;
    xr[k][4] = c.x; xr[k][5] = c.y; xr[k][6] = c.z; xr[k][7] = c.w;
  }
}

// This warp is done with ring slot `slot`: its lane 0 arrives on the slot's empty barrier.
__device__ __forceinline__ void d_release(DRing& r, int slot, int lane) {
  __syncwarp();
  if (lane == 0) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"((unsigned)__cvta_generic_to_shared(&r.empty[slot]))
                 : "memory");
  }
}

// One GEMV stage: every row of the block's slice dotted with `in` (shared, fp32, `cols`
// wide), each result handed to `put(row, value)` by lane 0 of the warp that summed it.
// Lane j takes the row's 16-byte pieces j, j + 32, ... (at most VPL of them), whose
// inputs it holds in registers for the whole stage. `consumed` counts the block's chunks
// used so far.
template <int VPL, class Put>
__device__ void d_gemv(DRing& r, const char* const* layers, int nl, int l, int s, const float* in, int& consumed,
                       bool skip, Put put) {
  const int b = blockIdx.x, C = gridDim.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const char* base;
  int rows, rb;
  d_stage(layers, l, s, b, C, base, rows, rb);
  const int per = BULK_CHUNK / rb, vecs = rb / 16;
  float xr[VPL][8];
  d_x_regs<VPL>(in, vecs, lane, xr);
  for (int row0 = 0; row0 < rows; row0 += per) {
    if (threadIdx.x == 0) d_issue(r, layers, nl, consumed + BULK_STAGES);
    const int slot = consumed % BULK_STAGES, n = min(per, rows - row0);
    d_wait((unsigned)__cvta_generic_to_shared(&r.full[slot]), (unsigned)((consumed / BULK_STAGES) & 1));
    const uint4* chunk = reinterpret_cast<const uint4*>(r.ring + slot * BULK_CHUNK);
    for (int i = skip ? n : warp; i < n; i += D_THREADS / 32) {
      float acc = 0.0f;
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        if (lane + 32 * k >= vecs) break;
        const uint4 w = chunk[i * vecs + lane + 32 * k];
        const unsigned ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          acc = fmaf(bf16f((unsigned short)(ws[q] & 0xffff)), xr[k][2 * q], acc);
          acc = fmaf(bf16f((unsigned short)(ws[q] >> 16)), xr[k][2 * q + 1], acc);
        }
      }
      for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(~0u, acc, o);
      if (lane == 0) put(b * rows + row0 + i, acc);
    }
    d_release(r, slot, lane);
    ++consumed;
  }
}

// A barrier of the block's D_THREADS consumer threads: the whole block, or (PRODUCER: a
// producer warp beside them, layers_in_cluster2) named barrier 1 of the consumers alone.
template <bool PRODUCER>
__device__ __forceinline__ void d_sync() {
  if (PRODUCER) {
    asm volatile("bar.sync 1, %0;" :: "n"(D_THREADS) : "memory");
  } else {
    __syncthreads();
  }
}

// in = x's RMSNorm (unit weights), every block for itself.
template <bool PRODUCER = false>
__device__ void d_norm(const float* x, float* in) {
  __shared__ float part[D_THREADS / 32];
  float ss = 0.0f;
  for (int i = threadIdx.x; i < D_H; i += D_THREADS) {
    const float v = __ldcg(x + i);
    in[i] = v;
    ss += v * v;
  }
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  d_sync<PRODUCER>();
  float t = 0.0f;
  for (int w = 0; w < D_THREADS / 32; ++w) t += part[w];
  const float scale = rsqrtf(t / D_H + 1e-5f);
  for (int i = threadIdx.x; i < D_H; i += D_THREADS) in[i] *= scale;
  d_sync<PRODUCER>();
}

template <bool PRODUCER = false>
__device__ void d_load(const float* src, float* in, int n) {
  for (int i = threadIdx.x; i < n; i += D_THREADS) in[i] = __ldcg(src + i);
  d_sync<PRODUCER>();
}

// A block's setup: every layer's four weight matrices into ws (shared), and the block's
// slice of the residual x into xown (o and down add into it and write it through).
__device__ void d_block_setup(const DLayer* gdl, int nl, const float* x, const char** ws, float* xown) {
  const int b = blockIdx.x, C = gridDim.x;
  for (int i = threadIdx.x; i < nl * 4; i += blockDim.x) {
    const DLayer& L = gdl[i / 4];
    ws[i] = i % 4 == 0 ? L.qkv : i % 4 == 1 ? L.o : i % 4 == 2 ? L.gu : L.down;
  }
  for (int i = threadIdx.x; i < D_H / C; i += blockDim.x) xown[i] = x[b * (D_H / C) + i];
}

// The ring's barriers (thread 0): a full one a slot, completed by its copy's bytes, and an
// empty one, completed when the consumer warps have all released the slot.
__device__ void d_ring_init(unsigned long long* full, unsigned long long* empty) {
  for (int i = 0; i < BULK_STAGES; ++i) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"((unsigned)__cvta_generic_to_shared(&full[i])) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"((unsigned)__cvta_generic_to_shared(&empty[i])),
                 "r"(D_THREADS / 32) : "memory");
  }
}

// o's and down's result for `row` of x, which this block owns: added to its slice and
// written through.
__device__ __forceinline__ void d_add_x(float* xown, float* x, int row, float a) {
  const float y = xown[row - blockIdx.x * (D_H / gridDim.x)] += a;
  __stcg(x + row, y);
}

// Attention's stand-in on the consumer threads: this block's share of the layer's keys and
// values (kv) read and summed, and its share of q scaled by that into attn.
template <bool PRODUCER>
__device__ void d_attention_standin(const char* kv_bytes, const DVecs& v) {
  __shared__ float red[D_THREADS / 32];
  const int b = blockIdx.x, C = gridDim.x;
  const uint4* kv = reinterpret_cast<const uint4*>(kv_bytes) + b * (D_KV_BYTES / 16 / C);
  unsigned acc = 0;
  for (int i = threadIdx.x; i < D_KV_BYTES / 16 / C; i += D_THREADS) {
    const uint4 w = __ldcs(kv + i);
    acc ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  float f = (float)(acc & 0xff) * 1e-9f;
  for (int o = 16; o; o >>= 1) f += __shfl_xor_sync(~0u, f, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = f;
  d_sync<PRODUCER>();
  float t = 0.0f;
  for (int w = 0; w < D_THREADS / 32; ++w) t += red[w];
  const int per = D_H / C;
  for (int i = threadIdx.x; i < per; i += D_THREADS) __stcg(v.attn + b * per + i, __ldcg(v.qkv + b * per + i) * (1.0f + t));
  d_sync<PRODUCER>();
}

// in = SwiGLU of gate_up's interleaved results (gate i and up i at 2i, 2i + 1).
template <bool PRODUCER>
__device__ void d_swiglu_load(const float* gu, float* in) {
  for (int i = threadIdx.x; i < D_F; i += D_THREADS) {
    const float g = __ldcg(gu + 2 * i), u = __ldcg(gu + 2 * i + 1);
    in[i] = g / (1.0f + __expf(-g)) * u;
  }
  d_sync<PRODUCER>();
}

__global__ void __launch_bounds__(D_THREADS) layers_in_cluster(const DLayer* gdl, int nl, DVecs v, int mode,
                                                               unsigned long long* times) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long full[BULK_STAGES], empty[BULK_STAGES];
  __shared__ __align__(16) float in[D_F];  // read as float4
  // Every layer's four weight matrices, then this block's slice of x (d_block_setup).
  __shared__ const char* ws[D_LAYERS_MAX * 4];
  __shared__ float xown[D_H / 8];
  d_block_setup(gdl, nl, v.x, ws, xown);
  __syncthreads();
  const char* const* layers = ws;
  DRing r{ring, full, empty, 0, 0, 0, 0};
  if (threadIdx.x == 0) {
    d_ring_init(full, empty);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) d_issue(r, layers, nl, BULK_STAGES);
  cluster_sync();
  const unsigned long long t0 = now();
  int consumed = 0;
  for (int l = 0; l < nl; ++l) {
    d_norm(v.x, in);
    d_gemv<3>(r, layers, nl, l, 0, in, consumed, mode & 1, [&](int row, float a) { __stcg(v.qkv + row, a); });
    if (threadIdx.x == 0) d_issue(r, layers, nl, consumed + BULK_STAGES);
    if (!(mode & 2)) cluster_sync();
    if (!(mode & 4)) d_attention_standin<false>(gdl[l].kv, v);
    if (threadIdx.x == 0) d_issue(r, layers, nl, consumed + BULK_STAGES);
    if (!(mode & 2)) cluster_sync();
    d_load(v.attn, in, D_H);
    d_gemv<3>(r, layers, nl, l, 1, in, consumed, mode & 1, [&](int row, float a) { d_add_x(xown, v.x, row, a); });
    if (threadIdx.x == 0) d_issue(r, layers, nl, consumed + BULK_STAGES);
    if (!(mode & 2)) cluster_sync();
    d_norm(v.x, in);
    // gate_up: a gate row and its up row are summed by different warps, so the SwiGLU is
    // taken by the down stage's load.
    d_gemv<3>(r, layers, nl, l, 2, in, consumed, mode & 1, [&](int row, float a) { __stcg(v.gu + row, a); });
    if (threadIdx.x == 0) d_issue(r, layers, nl, consumed + BULK_STAGES);
    if (!(mode & 2)) cluster_sync();
    d_swiglu_load<false>(v.gu, in);
    d_gemv<6>(r, layers, nl, l, 3, in, consumed, mode & 1, [&](int row, float a) { d_add_x(xown, v.x, row, a * 1e-3f); });
    if (threadIdx.x == 0) d_issue(r, layers, nl, consumed + BULK_STAGES);
    if (!(mode & 2)) cluster_sync();
  }
  record(times, t0);
}

// D, second version (layers_in_cluster2; written after the last call of the thirty-fifth
// pass, compiled but not yet run): what the first one's breakdown pointed at.
//   - A producer warp of its own (warp 8) issues every bulk copy, slot by slot, as soon as
//     the consumers release it; the consumer warps never issue or wait for each other's
//     release.
//   - The stages meet on an mbarrier in each block that every block's consumers arrive on
//     remotely (release, cluster scope) and that the block's consumers wait on (acquire),
//     so the producer warp never joins a barrier and runs ahead across stages.
//   - Each warp sums two rows at a time (two chains of FMAs in flight).
#define D2_THREADS (D_THREADS + 32)

// Stage boundary k (`k` counts them): arrive on every block's barrier k % 2 (consumer
// thread t on block t's), then wait for this block's to complete. Two barriers in turn: a
// block that has passed boundary k may arrive for k + 1 before another block's barrier
// has seen every arrival for k, but not for k + 2.
__device__ __forceinline__ void d2_stage_sync(unsigned long long* bars, unsigned& k) {
  d_sync<true>();
  const unsigned local = (unsigned)__cvta_generic_to_shared(&bars[k & 1]);
  const unsigned phase = (k >> 1) & 1;
  if (threadIdx.x < gridDim.x) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(threadIdx.x));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
  }
  unsigned done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(local), "r"(phase) : "memory");
  }
  ++k;
}

// One GEMV stage on the consumer warps, as d_gemv but issuing nothing, two rows a warp at a
// time.
template <int VPL, class Put>
__device__ void d2_gemv(DRing& r, const char* const* layers, int l, int s, const float* in, int& consumed,
                        bool skip, Put put) {
  const int b = blockIdx.x, C = gridDim.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const char* base;
  int rows, rb;
  d_stage(layers, l, s, b, C, base, rows, rb);
  const int per = BULK_CHUNK / rb, vecs = rb / 16;
  float xr[VPL][8];
  d_x_regs<VPL>(in, vecs, lane, xr);
  for (int row0 = 0; row0 < rows; row0 += per) {
    const int slot = consumed % BULK_STAGES, n = min(per, rows - row0);
    d_wait((unsigned)__cvta_generic_to_shared(&r.full[slot]), (unsigned)((consumed / BULK_STAGES) & 1));
    const uint4* chunk = reinterpret_cast<const uint4*>(r.ring + slot * BULK_CHUNK);
    for (int i = skip ? n : 2 * warp; i < n; i += 2 * (D_THREADS / 32)) {
      const bool two = i + 1 < n;
      float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        if (lane + 32 * k >= vecs) break;
        const uint4 w0 = chunk[i * vecs + lane + 32 * k];
        const uint4 w1 = two ? chunk[(i + 1) * vecs + lane + 32 * k] : make_uint4(0, 0, 0, 0);
        const unsigned a[4] = {w0.x, w0.y, w0.z, w0.w}, c[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          acc0 = fmaf(bf16f((unsigned short)(a[q] & 0xffff)), xr[k][2 * q], acc0);
          acc1 = fmaf(bf16f((unsigned short)(c[q] & 0xffff)), xr[k][2 * q], acc1);
          acc0 = fmaf(bf16f((unsigned short)(a[q] >> 16)), xr[k][2 * q + 1], acc0);
          acc1 = fmaf(bf16f((unsigned short)(c[q] >> 16)), xr[k][2 * q + 1], acc1);
        }
      }
      for (int o = 16; o; o >>= 1) {
        acc0 += __shfl_xor_sync(~0u, acc0, o);
        acc1 += __shfl_xor_sync(~0u, acc1, o);
      }
      if (lane == 0) {
        put(b * rows + row0 + i, acc0);
        if (two) put(b * rows + row0 + i + 1, acc1);
      }
    }
    d_release(r, slot, lane);
    ++consumed;
  }
}

__global__ void __launch_bounds__(D2_THREADS) layers_in_cluster2(const DLayer* gdl, int nl, DVecs v, int mode,
                                                                 unsigned long long* times) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long full[BULK_STAGES], empty[BULK_STAGES], stage_bars[2];
  __shared__ __align__(16) float in[D_F];  // read as float4
  __shared__ const char* ws[D_LAYERS_MAX * 4];
  __shared__ float xown[D_H / 8];
  d_block_setup(gdl, nl, v.x, ws, xown);
  if (threadIdx.x == 0) {
    d_ring_init(full, empty);
    for (int i = 0; i < 2; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"((unsigned)__cvta_generic_to_shared(&stage_bars[i])),
                   "r"(gridDim.x) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // Every block's barriers are set up before any block arrives on them.
  __syncwarp();
  cluster_sync();
  const char* const* layers = ws;
  DRing r{ring, full, empty, 0, 0, 0, 0};
  const unsigned long long t0 = now();
  if (threadIdx.x >= D_THREADS) {  // the producer warp
    if (threadIdx.x == D_THREADS) d_issue(r, layers, nl, 1 << 30);
    __syncwarp();
  } else {
    const bool skip_sync = mode & 2;
    unsigned boundary = 0;
    int consumed = 0;
    auto sync = [&]() {
      if (skip_sync) {
        d_sync<true>();
      } else {
        d2_stage_sync(stage_bars, boundary);
      }
    };
    for (int l = 0; l < nl; ++l) {
      d_norm<true>(v.x, in);
      d2_gemv<3>(r, layers, l, 0, in, consumed, mode & 1, [&](int row, float a) { __stcg(v.qkv + row, a); });
      sync();
      if (!(mode & 4)) d_attention_standin<true>(gdl[l].kv, v);
      sync();
      d_load<true>(v.attn, in, D_H);
      d2_gemv<3>(r, layers, l, 1, in, consumed, mode & 1, [&](int row, float a) { d_add_x(xown, v.x, row, a); });
      sync();
      d_norm<true>(v.x, in);
      d2_gemv<3>(r, layers, l, 2, in, consumed, mode & 1, [&](int row, float a) { __stcg(v.gu + row, a); });
      sync();
      d_swiglu_load<true>(v.gu, in);
      d2_gemv<6>(r, layers, l, 3, in, consumed, mode & 1, [&](int row, float a) { d_add_x(xown, v.x, row, a * 1e-3f); });
      sync();
    }
  }
  record(times, t0);
  // No block leaves while another may still arrive on its barriers.
  __syncwarp();
  cluster_sync();
}

static unsigned long long* g_times;

static double elapsed_us() {
  unsigned long long t[2];
  CK(cudaMemcpy(t, g_times, sizeof t, cudaMemcpyDeviceToHost));
  return (double)(t[1] - t[0]) / 1e3;
}

static void reset_times() {
  unsigned long long init[2] = {~0ull, 0ull};
  CK(cudaMemcpy(g_times, init, sizeof init, cudaMemcpyHostToDevice));
}

// A launch of one cluster of c blocks of `threads`, `smem` bytes of dynamic shared memory
// each (cfg points at at: not copied).
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[1];
  ClusterLaunch(int c, int threads, int smem) {
    cfg.gridDim = dim3(c);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = c;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
};

// B and C's table: `run(src, bytes, G)` streams `bytes` from src on G blocks; GB/s from a
// fresh window of buf (big bytes; `window` is where the last one started) and from the same
// window again, 5 runs each.
template <class Run>
static void stream_table(const uint4* buf, size_t big, size_t& window, int sms, Run run) {
  printf("| bytes | G | from memory | from L2 |\n|---|---|---|---|\n");
  for (size_t bytes : {(size_t)7 << 20, (size_t)56 << 20}) {
    for (int g : {8, 16, 32, 66, sms}) {
      double cold = 0, hot = 0;
      const int REPS = 5;
      for (int rep = 0; rep < REPS; ++rep) {
        window = (window + bytes + (1 << 20)) % (big - bytes - (1 << 20));
        const char* src = reinterpret_cast<const char*>(buf) + window;
        for (double* rate : {&cold, &hot}) {
          reset_times();
          run(src, bytes, g);
          CK(cudaDeviceSynchronize());
          *rate += bytes / (elapsed_us() * 1e3);
        }
      }
      printf("| %zu MiB | %d | %.0f | %.0f |\n", bytes >> 20, g, cold / REPS, hot / REPS);
    }
  }
}

template <bool DSMEM>
static double chain_us_per_stage(int c, float* vals, int stages) {
  auto k = cluster_chain<DSMEM>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  ClusterLaunch cl(c, 256, 0);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    reset_times();
    CK(cudaLaunchKernelEx(&cl.cfg, k, vals, stages, g_times));
    CK(cudaDeviceSynchronize());
    const double us = elapsed_us() / stages;
    if (rep > 0 && us < best) best = us;
  }
  return best;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaMalloc(&g_times, 16));
  float *vals, *sink;
  CK(cudaMalloc(&vals, 64 * 4));
  CK(cudaMemset(vals, 0, 64 * 4));
  CK(cudaMalloc(&sink, 4));
  const int STAGES = 2000;
  printf("A. dependent stages in one cluster (us a stage, best of 4 runs of %d)\n", STAGES);
  printf("| blocks in the cluster | values through L2 | through distributed shared memory |\n|---|---|---|\n");
  for (int c : {1, 2, 4, 8, 16}) {
    printf("| %d | %.3f | %.3f |\n", c, chain_us_per_stage<false>(c, vals, STAGES),
           chain_us_per_stage<true>(c, vals, STAGES));
  }
  const size_t BIG = 2ull << 30;
  uint4* buf;
  CK(cudaMalloc(&buf, BIG));
  CK(cudaMemset(buf, 1, BIG));
  size_t window = 0;
  printf("\nB. G blocks of 512 threads streaming (GB/s; from memory: a fresh window each run; from L2: the same window again)\n");
  stream_table(buf, BIG, window, sms, [&](const char* src, size_t bytes, int g) {
    stream<<<g, 512>>>(reinterpret_cast<const uint4*>(src), bytes, sink, g_times);
  });
  const int smem = BULK_STAGES * BULK_CHUNK;
  CK(cudaFuncSetAttribute(stream_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  printf("\nC. G blocks streaming by bulk copies, %d of %d KiB in flight a block (GB/s)\n", BULK_STAGES,
         BULK_CHUNK >> 10);
  stream_table(buf, BIG, window, sms, [&](const char* src, size_t bytes, int g) {
    stream_bulk<<<g, 32, smem>>>(src, bytes, g_times);
  });
  // D: 30 layers of the 135M's shapes, each layer's weights and keys apart (about 211 MB,
  // beyond L2).
  const int NL = 30;
  const size_t layer_bytes = (size_t)(D_QKV + D_H + 2 * D_F) * D_H * 2 + (size_t)D_H * D_F * 2 + D_KV_BYTES;
  char* wbuf;
  CK(cudaMalloc(&wbuf, layer_bytes * NL));
  CK(cudaMemset(wbuf, 0x3c, layer_bytes * NL));
  DLayer hl[NL];
  for (int l = 0; l < NL; ++l) {
    char* p = wbuf + layer_bytes * l;
    hl[l].qkv = p; p += (size_t)D_QKV * D_H * 2;
    hl[l].o = p; p += (size_t)D_H * D_H * 2;
    hl[l].gu = p; p += (size_t)2 * D_F * D_H * 2;
    hl[l].down = p; p += (size_t)D_H * D_F * 2;
    hl[l].kv = p;
  }
  DLayer* dl;
  CK(cudaMalloc(&dl, sizeof hl));
  CK(cudaMemcpy(dl, hl, sizeof hl, cudaMemcpyHostToDevice));
  DVecs dv;
  CK(cudaMalloc(&dv.x, D_H * 4)); CK(cudaMalloc(&dv.qkv, D_QKV * 4)); CK(cudaMalloc(&dv.attn, D_H * 4));
  CK(cudaMalloc(&dv.gu, 2 * D_F * 4));
  CK(cudaFuncSetAttribute(layers_in_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(layers_in_cluster, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  printf("\nD. 30 decode layers of SmolLM2-135M's shapes in one cluster (us a layer; weights %.2f MB a layer)\n",
         (layer_bytes - D_KV_BYTES) / 1e6);
  printf("Modes (timing only, wrong values): 1 no dot products, 2 no barriers between blocks, 4 no attention stand-in.\n");
  printf("| version | blocks in the cluster | mode | us a layer, runs |\n|---|---|---|---|\n");
  CK(cudaFuncSetAttribute(layers_in_cluster2, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(layers_in_cluster2, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // {version, blocks, mode}
  const int runs[][3] = {{1, 8, 0}, {1, 16, 0}, {1, 16, 1}, {1, 16, 2}, {1, 16, 4}, {1, 16, 3}, {1, 16, 7},
                         {1, 16, 6}, {2, 16, 0}, {2, 16, 1}, {2, 16, 2}, {2, 16, 7}, {2, 8, 0}};
  for (const auto& vcm : runs) {
    const int version = vcm[0], c = vcm[1], mode = vcm[2];
    printf("| %d | %d | %d |", version, c, mode);
    {
      ClusterLaunch cl(c, version == 1 ? D_THREADS : D2_THREADS, smem);
      int fits = 0;
      CK(cudaOccupancyMaxActiveClusters(&fits, version == 1 ? layers_in_cluster : layers_in_cluster2, &cl.cfg));
      if (fits == 0) {
        printf(" does not fit this GPU |\n");
        continue;
      }
    }
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<float> x(D_H, 1.0f);
      CK(cudaMemcpy(dv.x, x.data(), D_H * 4, cudaMemcpyHostToDevice));
      ClusterLaunch cl(c, version == 1 ? D_THREADS : D2_THREADS, smem);
      reset_times();
      CK(cudaLaunchKernelEx(&cl.cfg, version == 1 ? layers_in_cluster : layers_in_cluster2, (const DLayer*)dl, NL,
                            dv, mode, g_times));
      CK(cudaDeviceSynchronize());
      printf(" %.2f", elapsed_us() / NL);
    }
    printf(" |\n");
  }
  return 0;
}
