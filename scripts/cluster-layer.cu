// Microbenchmark for a decode layer run inside one thread-block cluster (docs/perf.md,
// thirty-fifth and thirty-sixth passes): what a stage boundary costs when it is a cluster
// barrier instead of a kernel boundary, how fast a few multiprocessors alone stream
// weights from memory, and where the time of a layer inside one cluster goes.
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
//   E. C's 16 blocks launched as clusters of 1 .. 16 blocks: a cluster runs inside one GPC,
//      so a cluster of 16 streams through one GPC's port.
//   F. What the prototypes' small operations cost in such a cluster (clock cycles a round):
//      a barrier, stores into every block's shared memory, shared-memory float atomics, a
//      part of version 4's tensor-core sums, a group of version 3's FMA sums.
//   D. 30 decode layers of SmolLM2-135M's GEMV shapes run inside one cluster that way:
//      five prototypes (layers_in_cluster .. layers_in_cluster5), µs a layer against the
//      engine's chain of kernels, and again with parts left out (modes, timing only, wrong
//      values). Versions 3-5 also report thread 0's clock at each of the layer's 12 spans
//      (norm, qkv, barrier, attention, ...), per block; versions 4 and 5 check their first
//      layer's qkv against the host first.
// Times come from %globaltimer inside the kernels (first block start to last block end),
// so launch gaps do not count. Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a -o /tmp/cluster-layer scripts/cluster-layer.cu && /tmp/cluster-layer
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
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

// Thread's arrival on mbarrier `bar` (shared address) expecting `bytes` more.
__device__ __forceinline__ void expect_bytes(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}

// A bulk copy of `bytes` from global src into shared dst, its bytes completed on `bar`.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
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
        expect_bytes(bar, len);
        bulk_load(dst, src + off, len, bar);
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
    expect_bytes(full, len);
    bulk_load(dst, base + (size_t)r.row * rb, len, full);
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

// Versions 1 and 2: stage s of layer l for this block, its rows, rows a chunk and 16-byte
// pieces a row, and the lane's inputs (d_x_regs).
template <int VPL>
__device__ __forceinline__ void d_stage_inputs(const char* const* layers, int l, int s, const float* in, int lane,
                                               int& rows, int& per, int& vecs, float (&xr)[VPL][8]) {
  const char* base;
  int rb;
  d_stage(layers, l, s, blockIdx.x, gridDim.x, base, rows, rb);
  per = BULK_CHUNK / rb;
  vecs = rb / 16;
  d_x_regs<VPL>(in, vecs, lane, xr);
}

// This warp is done with ring slot `slot`: its lane 0 arrives on the slot's empty barrier.
__device__ __forceinline__ void d_release_slot(unsigned long long* empty, int slot, int lane) {
  __syncwarp();
  if (lane == 0) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"((unsigned)__cvta_generic_to_shared(&empty[slot]))
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
  const int b = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int rows, per, vecs;
  float xr[VPL][8];
  d_stage_inputs<VPL>(layers, l, s, in, lane, rows, per, vecs, xr);
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
    d_release_slot(r.empty, slot, lane);
    ++consumed;
  }
}

// Named barrier 1 of the consumer threads (CONSUMERS of them; the producer warp is apart).
template <int CONSUMERS>
__device__ __forceinline__ void d_consumers_sync() {
  asm volatile("bar.sync 1, %0;" :: "n"(CONSUMERS) : "memory");
}

// A barrier of the block's D_THREADS consumer threads: the whole block, or (PRODUCER: a
// producer warp beside them, layers_in_cluster2) named barrier 1 of the consumers alone.
template <bool PRODUCER>
__device__ __forceinline__ void d_sync() {
  if (PRODUCER) {
    d_consumers_sync<D_THREADS>();
  } else {
    __syncthreads();
  }
}

// The sum of v over the CONSUMERS consumer threads, in every one of them (a consumer
// barrier inside; the caller meets its consumers again before the next call).
template <int CONSUMERS>
__device__ float d_block_sum(float v) {
  __shared__ float part[CONSUMERS / 32];
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  d_consumers_sync<CONSUMERS>();
  float t = 0.0f;
#pragma unroll
  for (int w = 0; w < CONSUMERS / 32; ++w) t += part[w];
  return t;
}

// This block's share of the layer's keys and values (kv) read and summed over the
// CONSUMERS consumer threads (attention's stand-in).
template <int CONSUMERS>
__device__ float d_kv_standin_sum(const char* kv_bytes) {
  const int b = blockIdx.x, C = gridDim.x;
  const uint4* kv = reinterpret_cast<const uint4*>(kv_bytes) + b * (D_KV_BYTES / 16 / C);
  unsigned acc = 0;
  for (int i = threadIdx.x; i < D_KV_BYTES / 16 / C; i += CONSUMERS) {
    const uint4 w = __ldcs(kv + i);
    acc ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  return d_block_sum<CONSUMERS>((float)(acc & 0xff) * 1e-9f);
}

// in = x's RMSNorm (unit weights), every block for itself.
template <bool PRODUCER = false>
__device__ void d_norm(const float* x, float* in) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < D_H; i += D_THREADS) {
    const float v = __ldcg(x + i);
    in[i] = v;
    ss += v * v;
  }
  const float t = d_block_sum<D_THREADS>(ss);
  const float scale = rsqrtf(t / D_H + 1e-5f);
  for (int i = threadIdx.x; i < D_H; i += D_THREADS) in[i] *= scale;
  d_sync<PRODUCER>();
}

template <bool PRODUCER = false>
__device__ void d_load(const float* src, float* in, int n) {
  for (int i = threadIdx.x; i < n; i += D_THREADS) in[i] = __ldcg(src + i);
  d_sync<PRODUCER>();
}

// Every layer's four weight matrices into ws (shared), and n floats of x0 into x.
__device__ void d_layers_setup(const DLayer* gdl, int nl, const char** ws, const float* x0, float* x, int n = D_H) {
  for (int i = threadIdx.x; i < nl * 4; i += blockDim.x) {
    const DLayer& L = gdl[i / 4];
    ws[i] = i % 4 == 0 ? L.qkv : i % 4 == 1 ? L.o : i % 4 == 2 ? L.gu : L.down;
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = x0[i];
}

// A block's setup: every layer's four weight matrices into ws (shared), and the block's
// slice of the residual x into xown (o and down add into it and write it through).
__device__ void d_block_setup(const DLayer* gdl, int nl, const float* x, const char** ws, float* xown) {
  const int b = blockIdx.x, C = gridDim.x;
  d_layers_setup(gdl, nl, ws, x + b * (D_H / C), xown, D_H / C);
}

// The ring's barriers (thread 0): a full one a slot, completed by its copy's bytes, and an
// empty one, completed when the `warps` consumer warps have all released the slot.
__device__ void d_ring_init(unsigned long long* full, unsigned long long* empty, int warps = D_THREADS / 32,
                            int slots = BULK_STAGES) {
  for (int i = 0; i < slots; ++i) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"((unsigned)__cvta_generic_to_shared(&full[i])) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"((unsigned)__cvta_generic_to_shared(&empty[i])),
                 "r"(warps) : "memory");
  }
}

// Versions 2-4, on every thread: thread 0 sets up the ring's barriers (`slots` of them)
// and the two stage barriers that every block of the cluster arrives on once a stage, and fences them to the
// cluster; then the cluster meets, so that every block's barriers are set up before any
// block arrives on them.
__device__ void d_cluster_bars_init(unsigned long long* full, unsigned long long* empty, int warps,
                                    unsigned long long* stage_bars, int slots = BULK_STAGES) {
  if (threadIdx.x == 0) {
    d_ring_init(full, empty, warps, slots);
    for (int i = 0; i < 2; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"((unsigned)__cvta_generic_to_shared(&stage_bars[i])),
                   "r"(gridDim.x) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  cluster_sync();
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
  const int b = blockIdx.x, C = gridDim.x;
  const float t = d_kv_standin_sum<D_THREADS>(kv_bytes);
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
// pass; first run in the thirty-sixth): what the first one's breakdown pointed at.
//   - A producer warp of its own (warp 8) issues every bulk copy, slot by slot, as soon as
//     the consumers release it; the consumer warps never issue or wait for each other's
//     release.
//   - The stages meet on an mbarrier in each block that every block's consumers arrive on
//     remotely (release, cluster scope) and that the block's consumers wait on (acquire),
//     so the producer warp never joins a barrier and runs ahead across stages.
//   - Each warp sums two rows at a time (two chains of FMAs in flight).
#define D2_THREADS (D_THREADS + 32)

// Stage boundary k (`k` counts them) on the CONSUMERS consumer threads: arrive on every
// block's barrier k % 2 (consumer thread t on block t's), then wait for this block's to
// complete. Two barriers in turn: a block that has passed boundary k may arrive for k + 1
// before another block's barrier has seen every arrival for k, but not for k + 2.
// `lean` (version 3): thread 0 alone waits, and the consumers meet after it. `one_fence`
// (version 3): thread 0 fences once (cluster scope) and makes every arrival itself, relaxed.
template <int CONSUMERS>
__device__ __forceinline__ void d_stage_sync(unsigned long long* bars, unsigned& k, bool lean = false,
                                             bool one_fence = false) {
  d_consumers_sync<CONSUMERS>();
  const unsigned local = (unsigned)__cvta_generic_to_shared(&bars[k & 1]);
  const unsigned phase = (k >> 1) & 1;
  if (one_fence) {
    if (threadIdx.x == 0) {
      asm volatile("fence.acq_rel.cluster;" ::: "memory");
      for (unsigned j = 0; j < gridDim.x; ++j) {
        unsigned remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(j));
        asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
      }
    }
  } else if (threadIdx.x < gridDim.x) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(threadIdx.x));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
  }
  unsigned done = lean && threadIdx.x != 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(local), "r"(phase) : "memory");
  }
  if (lean) d_consumers_sync<CONSUMERS>();
  ++k;
}

// A stage's end: the stage barrier of the cluster, or (`alone`: timing only) the block's
// consumers alone.
template <int CONSUMERS>
__device__ __forceinline__ void d_boundary(bool alone, unsigned long long* bars, unsigned& k, bool lean = false,
                                           bool one_fence = false) {
  if (alone) {
    d_consumers_sync<CONSUMERS>();
  } else {
    d_stage_sync<CONSUMERS>(bars, k, lean, one_fence);
  }
}

// One GEMV stage on the consumer warps, as d_gemv but issuing nothing, two rows a warp at a
// time.
template <int VPL, class Put>
__device__ void d2_gemv(DRing& r, const char* const* layers, int l, int s, const float* in, int& consumed,
                        bool skip, Put put) {
  const int lane = threadIdx.x & 31;
  int rows, per, vecs;
  float xr[VPL][8];
  d_stage_inputs<VPL>(layers, l, s, in, lane, rows, per, vecs, xr);
  const int b = blockIdx.x, warp = threadIdx.x >> 5;
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
    d_release_slot(r.empty, slot, lane);
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
  d_cluster_bars_init(full, empty, D_THREADS / 32, stage_bars);
  const char* const* layers = ws;
  DRing r{ring, full, empty, 0, 0, 0, 0};
  const unsigned long long t0 = now();
  if (threadIdx.x >= D_THREADS) {  // the producer warp
    if (threadIdx.x == D_THREADS) d_issue(r, layers, nl, 1 << 30);
    __syncwarp();
  } else {
    unsigned boundary = 0;
    int consumed = 0;
    auto sync = [&]() { d_boundary<D_THREADS>(mode & 2, stage_bars, boundary); };
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

// D, third version (layers_in_cluster3, thirty-sixth pass): what the second one's
// breakdown pointed at (its consumers' round trips through L2, and half its warps idle).
//   - 16 consumer warps beside the producer warp.
//   - Every vector between stages lives in each block's shared memory: a block stores each
//     result it computes into every block's copy (distributed shared memory, lane j into
//     block j), before the stage barrier. The residual x too: the block owning a row of o
//     or down adds into its copy and stores the sum everywhere. No stage reads L2 for its
//     inputs; the norms run on the local copy.
//   - gate_up's gate i and up i (rows 2i, 2i + 1) are summed by one warp, which applies
//     the SwiGLU and stores the product.
//   - A warp sums R rows at a time (R = 2 or 4; down: 2) over all 32 lanes without idle
//     lanes: 576 columns as 288 four-byte words, 9 a lane; 1,536 as 192 sixteen-byte
//     pieces, 6 a lane.
//   - The groups of R rows of a stage go to warps round robin across the ring's chunks, so
//     every warp has work in every stage.
//   - The mode is a template argument, so the parts a mode leaves out are not compiled.
#define D3_CONSUMERS 512
#define D3_WARPS (D3_CONSUMERS / 32)
#define D3_THREADS (D3_CONSUMERS + 32)

struct D3Vecs {
  float x[D_H];     // the residual
  float xn[D_H];    // the normed input of qkv and gate_up (this block's own)
  float qkv[D_QKV];
  float attn[D_H];
  float act[D_F];   // SwiGLU(gate, up)
};

__device__ __forceinline__ void d3_sync() { d_consumers_sync<D3_CONSUMERS>(); }

// Stores v at `local` (an address in this block's shared memory) into the same place in
// block `lane`'s, for lanes below the cluster's size: every lane holds v.
__device__ __forceinline__ void d3_broadcast(float* local, float v, int lane, bool local_only = false) {
  if (local_only) {  // timing only: this block's copy alone
    if (lane == 0) *local = v;
  } else if (lane < (int)gridDim.x) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((unsigned)__cvta_generic_to_shared(local)), "r"(lane));
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(v) : "memory");
  }
}

// Thread 0's clock at each of a layer's 12 points, summed per span, into `sum` (shared),
// and at the end into the kernel's `detail` (versions 3 and 4).
struct DSpans {
  long long* sum;
  long long last;
  __device__ explicit DSpans(long long* s) : sum(s) {
    if (threadIdx.x < 12) sum[threadIdx.x] = 0;
    d_consumers_sync<D3_CONSUMERS>();
    last = clock64();
  }
  __device__ void mark(int i) {
    if (threadIdx.x == 0) {
      const long long t = clock64();
      sum[i] += t - last;
      last = t;
    }
  }
  __device__ void write(unsigned long long* detail) const {
    if (threadIdx.x == 0) {
      for (int i = 0; i < 12; ++i) detail[blockIdx.x * 12 + i] = sum[i];
    }
  }
};

// xn = RMSNorm(x) (unit weights), from this block's copy.
__device__ void d3_norm(const float* x, float* xn) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < D_H; i += D3_CONSUMERS) ss += x[i] * x[i];
  const float t = d_block_sum<D3_CONSUMERS>(ss);
  const float scale = rsqrtf(t / D_H + 1e-5f);
  for (int i = threadIdx.x; i < D_H; i += D3_CONSUMERS) xn[i] = x[i] * scale;
  d3_sync();
}

// A lane's piece k of a row: WPP 32-bit words at word (lane + 32 k) * WPP; its inputs in
// registers (xr[k], 2 * WPP floats).
template <int WPP>
__device__ __forceinline__ void d3_piece(const unsigned* row, int idx, unsigned (&w)[WPP]) {
  if (WPP == 4) {
    const uint4 v = reinterpret_cast<const uint4*>(row)[idx];
    w[0] = v.x; w[1] = v.y; w[2 % WPP] = v.z; w[3 % WPP] = v.w;
  } else {
    w[0] = row[idx];
  }
}

// One GEMV stage on the 16 consumer warps: the block's rows in pairs, pair p to warp
// p % 16, over the ring's chunks in order (every warp waits for and releases every chunk).
// `put(row, a0, a1)` gets each pair (rows row, row + 1), every lane holding both sums.
template <int WPP, int PPL, int R, bool NORM, class Put>
__device__ void d3_gemv(DRing& r, const char* const* layers, int l, int s, const float* in, int& consumed, bool skip,
                        bool lean, bool nocopy, Put put) {
  const int b = blockIdx.x, C = gridDim.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const char* base;
  int rows, rb;
  d_stage(layers, l, s, b, C, base, rows, rb);
  const int per = BULK_CHUNK / rb, words = rb / 4;
  float xr[PPL][2 * WPP];
#pragma unroll
  for (int k = 0; k < PPL; ++k) {
    if (WPP == 4) {
      const float4* x4 = reinterpret_cast<const float4*>(in + (lane + 32 * k) * 8);
      const float4 p = x4[0], q = x4[1];
      xr[k][0] = p.x; xr[k][1] = p.y; xr[k][2 % (2 * WPP)] = p.z; xr[k][3 % (2 * WPP)] = p.w;
      xr[k][4 % (2 * WPP)] = q.x; xr[k][5 % (2 * WPP)] = q.y; xr[k][6 % (2 * WPP)] = q.z; xr[k][7 % (2 * WPP)] = q.w;
    } else {
      const float2 p = reinterpret_cast<const float2*>(in)[lane + 32 * k];
      xr[k][0] = p.x; xr[k][1] = p.y;
    }
  }
  if (NORM) {
    // `in` is x: every warp takes the RMSNorm's scale itself (unit weights) from the
    // inputs its lanes hold, which cover the row.
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < PPL; ++k) {
#pragma unroll
      for (int e = 0; e < 2 * WPP; ++e) ss += xr[k][e] * xr[k][e];
    }
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
    const float scale = rsqrtf(ss / (64 * WPP * PPL) + 1e-5f);
#pragma unroll
    for (int k = 0; k < PPL; ++k) {
#pragma unroll
      for (int e = 0; e < 2 * WPP; ++e) xr[k][e] *= scale;
    }
  }
  int group = 0;  // the stage's groups of R rows seen so far
  for (int row0 = 0; row0 < rows; row0 += per) {
    const int slot = consumed % BULK_STAGES, n = min(per, rows - row0);
    // lean: lane 0 alone waits for the copy.
    if (!nocopy && (!lean || lane == 0)) d_wait((unsigned)__cvta_generic_to_shared(&r.full[slot]), (unsigned)((consumed / BULK_STAGES) & 1));
    if (lean) __syncwarp();
    const unsigned* chunk = reinterpret_cast<const unsigned*>(r.ring + slot * BULK_CHUNK);
    // The chunk's first group this warp takes.
    const int first = (warp - group % D3_WARPS + D3_WARPS) % D3_WARPS;
    for (int i = skip ? n : R * first; i < n; i += R * D3_WARPS) {
      float acc[R];
#pragma unroll
      for (int j = 0; j < R; ++j) acc[j] = 0.0f;
#pragma unroll
      for (int k = 0; k < PPL; ++k) {
        unsigned w[R][WPP];
#pragma unroll
        for (int j = 0; j < R; ++j) d3_piece<WPP>(chunk + (i + j) * words, lane + 32 * k, w[j]);
#pragma unroll
        for (int q = 0; q < WPP; ++q) {
#pragma unroll
          for (int j = 0; j < R; ++j) acc[j] = fmaf(__uint_as_float(w[j][q] << 16), xr[k][2 * q], acc[j]);
#pragma unroll
          for (int j = 0; j < R; ++j) acc[j] = fmaf(__uint_as_float(w[j][q] & 0xffff0000u), xr[k][2 * q + 1], acc[j]);
        }
      }
      for (int o = 16; o; o >>= 1) {
#pragma unroll
        for (int j = 0; j < R; ++j) acc[j] += __shfl_xor_sync(~0u, acc[j], o);
      }
      put(b * rows + row0 + i, acc);
    }
    group += n / R;
    if (!nocopy) d_release_slot(r.empty, slot, lane);
    ++consumed;
  }
}

// Attention's stand-in as d_attention_standin, its results stored into every block's attn.
__device__ void d3_attention_standin(const char* kv_bytes, D3Vecs& v, bool local_only) {
  const int b = blockIdx.x, C = gridDim.x;
  const float t = d_kv_standin_sum<D3_CONSUMERS>(kv_bytes);
  // The block's share of attn, one value a warp at a time, every lane holding it.
  const int per = D_H / C, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = warp; i < per; i += D3_WARPS) d3_broadcast(&v.attn[b * per + i], v.qkv[b * per + i] * (1.0f + t), lane, local_only);
}

// MODE as `mode` above, fixed at compile time; R: rows a warp sums at a time in the stages
// of 576 columns.
template <int MODE, int R>
__global__ void __launch_bounds__(D3_THREADS, 1) layers_in_cluster3(const DLayer* gdl, int nl, const float* x0,
                                                                    unsigned long long* times, unsigned long long* detail) {
  constexpr int mode = MODE;
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long full[BULK_STAGES], empty[BULK_STAGES], stage_bars[2];
  __shared__ __align__(16) D3Vecs v;
  __shared__ const char* ws[D_LAYERS_MAX * 4];
  const int lane = threadIdx.x & 31;
  d_layers_setup(gdl, nl, ws, x0, v.x);
  d_cluster_bars_init(full, empty, D3_WARPS, stage_bars);
  const char* const* layers = ws;
  DRing r{ring, full, empty, 0, 0, 0, 0};
  const unsigned long long t0 = now();
  if (threadIdx.x >= D3_CONSUMERS) {  // the producer warp
    if (threadIdx.x == D3_CONSUMERS && !(mode & 16)) d_issue(r, layers, nl, 1 << 30);
    __syncwarp();
  } else {
    unsigned boundary = 0;
    int consumed = 0;
    auto sync = [&]() { d_boundary<D3_CONSUMERS>(mode & 2, stage_bars, boundary, mode & 8, mode & 32); };
    __shared__ long long spans[12];
    DSpans sp(spans);
    auto mark = [&](int i) { sp.mark(i); };
    for (int l = 0; l < nl; ++l) {
      constexpr bool wnorm = mode & 128;  // the norms in each warp
      constexpr int reps = mode & 256 ? 2 : 1;  // each GEMV stage twice in a row
      if (!wnorm) d3_norm(v.x, v.xn);
      mark(0);
      for (int rep = 0; rep < reps; ++rep)
      d3_gemv<1, 9, R, wnorm>(r, layers, l, 0, wnorm ? v.x : v.xn, consumed, mode & 1, mode & 8, mode & 16, [&](int row, const float (&a)[R]) {
#pragma unroll
        for (int j = 0; j < R; ++j) d3_broadcast(&v.qkv[row + j], a[j], lane, mode & 64);
      });
      mark(1);
      sync();
      mark(2);
      if (!(mode & 4)) d3_attention_standin(gdl[l].kv, v, mode & 64);
      mark(3);
      sync();
      mark(4);
      for (int rep = 0; rep < reps; ++rep)
      d3_gemv<1, 9, R, false>(r, layers, l, 1, v.attn, consumed, mode & 1, mode & 8, mode & 16, [&](int row, const float (&a)[R]) {
        float y[R];
#pragma unroll
        for (int j = 0; j < R; ++j) y[j] = v.x[row + j] + a[j];
        __syncwarp();
#pragma unroll
        for (int j = 0; j < R; ++j) d3_broadcast(&v.x[row + j], y[j], lane, mode & 64);
      });
      mark(5);
      sync();
      mark(6);
      if (!wnorm) d3_norm(v.x, v.xn);
      mark(7);
      for (int rep = 0; rep < reps; ++rep)
      d3_gemv<1, 9, R, wnorm>(r, layers, l, 2, wnorm ? v.x : v.xn, consumed, mode & 1, mode & 8, mode & 16, [&](int row, const float (&a)[R]) {
#pragma unroll
        for (int j = 0; j < R; j += 2) d3_broadcast(&v.act[(row + j) / 2], __fdividef(a[j], 1.0f + __expf(-a[j])) * a[j + 1], lane, mode & 64);
      });
      mark(8);
      sync();
      mark(9);
      for (int rep = 0; rep < reps; ++rep)
      d3_gemv<4, 6, 2, false>(r, layers, l, 3, v.act, consumed, mode & 1, mode & 8, mode & 16, [&](int row, const float (&a)[2]) {
        const float y0 = v.x[row] + a[0] * 1e-3f, y1 = v.x[row + 1] + a[1] * 1e-3f;
        __syncwarp();
        d3_broadcast(&v.x[row], y0, lane, mode & 64);
        d3_broadcast(&v.x[row + 1], y1, lane, mode & 64);
      });
      mark(10);
      sync();
      mark(11);
    }
    sp.write(detail);
  }
  record(times, t0);
  __syncwarp();
  cluster_sync();
}

// Versions 4 and 5's arguments: the layers, the residual's first value, the kernel's
// times, where block 0 leaves its copy of the first layer's qkv (or null), and the spans.
struct D45Args {
  const DLayer* gdl;
  int nl;
  const float* x0;
  unsigned long long* times;
  float* check;
  unsigned long long* detail;
};

// D, fourth version (layers_in_cluster4, thirty-sixth pass): version 3 with its dot products
// on tensor cores, what version 3's breakdown pointed at (its sums latency-bound at about
// 1,000 cycles a group of rows, one group in flight a warp).
//   - Every stage's rows go to the blocks in tiles of 16 rows, and the ring's chunks are
//     tiles (two of 576 columns, or one of 1,536). So that ldmatrix reads 8 rows at a time
//     without bank conflicts, either (padded) the producer warp copies a chunk row by row,
//     one bulk copy a lane, into rows padded by 16 bytes, or (SWZ, swizzled) the weights
//     are stored with each row's 16-byte pieces permuted within their 128-byte group by the
//     row's index mod 8 (d4_piece), and a chunk is one bulk copy.
//   - A tile's columns are split into KS parts (9 of 64 columns for 576, 16 of 96 for
//     1,536); the parts of a stage's tiles go to the 16 warps round robin. A part is
//     4 or 6 mma.m16n8k16 (the weights as A, the input vector as column 0 of B, so one
//     multiply-add in eight counts), summed into the tile's rows by shared-memory atomics.
//   - The input vector goes into shared memory as bf16 pairs before the stage (normed there
//     for qkv and gate_up); the stage's sums leave after a barrier of the consumers, one
//     row a warp into every block's copy, as in version 3.
#define D4_SLOTS 4
#define D4_SLOT (16 * (2 * D_F + 16))  // one tile of 1,536 columns, or two of 576
#define D4_ACC 192                     // the most rows of a stage a block takes

struct D4Shared {
  unsigned xb[D_F / 2];  // the stage's input as bf16 pairs
  float acc[D4_ACC];     // the stage's sums
};

// Stage s: its tiles, columns, the block's first and end tile, and padded row bytes.
struct D4Stage {
  int cols, t0, t1, stride;
  const char* w;
};

template <bool SWZ>
__device__ __forceinline__ D4Stage d4_stage(const char* const* layers, int l, int s) {
  const int tiles = (s == 0 ? D_QKV : s == 2 ? 2 * D_F : D_H) / 16, b = blockIdx.x, C = gridDim.x;
  D4Stage st;
  st.cols = s == 3 ? D_F : D_H;
  st.t0 = b * tiles / C;
  st.t1 = (b + 1) * tiles / C;
  st.stride = st.cols * 2 + (SWZ ? 0 : 16);
  st.w = layers[l * 4 + s];
  return st;
}

// Tiles a chunk of stage s holds.
__device__ __forceinline__ int d4_chunk_tiles(const D4Stage& st) { return st.cols == D_H ? 2 : 1; }

// The producer warp: every chunk of every layer, in the consumers' order. SWZ: the weights'
// rows are stored with their 16-byte pieces swizzled (below), unpadded, so that a chunk is
// one bulk copy; else one copy a row into rows padded by 16 bytes. `kv` (version 5): each
// layer's block share of keys and values as one more chunk after qkv's (attention's
// stand-in reads it from the ring).
template <bool SWZ>
__device__ void d4_produce(char* ring, unsigned long long* full, unsigned long long* empty, const char* const* layers,
                           const DLayer* gdl, int nl, bool kv) {
  const int lane = threadIdx.x & 31, share = D_KV_BYTES / gridDim.x;
  int issued = 0;
  // The next slot, once free, expecting `bytes` (lane 0); its full barrier and address.
  auto next_slot = [&](int bytes, unsigned& f) {
    const int slot = issued++ % D4_SLOTS;
    f = (unsigned)__cvta_generic_to_shared(&full[slot]);
    if (lane == 0) {
      d_wait((unsigned)__cvta_generic_to_shared(&empty[slot]), (unsigned)((((issued - 1) / D4_SLOTS) & 1) ^ 1));
      expect_bytes(f, bytes);
    }
    return (unsigned)__cvta_generic_to_shared(ring + slot * D4_SLOT);
  };
  for (int l = 0; l < nl; ++l) {
    for (int s = 0; s < 4; ++s) {
      const D4Stage st = d4_stage<SWZ>(layers, l, s);
      for (int t = st.t0; t < st.t1; t += d4_chunk_tiles(st)) {
        const int rows = 16 * min(d4_chunk_tiles(st), st.t1 - t);
        const char* src = st.w + (size_t)t * 16 * st.cols * 2;
        unsigned f;
        const unsigned dst = next_slot(rows * st.cols * 2, f);
        if (SWZ && lane == 0) bulk_load(dst, src, rows * st.cols * 2, f);
        __syncwarp();
        if (!SWZ && lane < rows) bulk_load(dst + lane * st.stride, src + (size_t)lane * st.cols * 2, st.cols * 2, f);
      }
      if (s == 0 && kv) {
        unsigned f;
        const unsigned dst = next_slot(share, f);
        if (lane == 0) bulk_load(dst, gdl[l].kv + (size_t)blockIdx.x * share, share, f);
        __syncwarp();
      }
    }
  }
}

// SWZ: where 16-byte piece c of a row r of a tile is stored in its row (the pieces of each
// 128-byte group permuted by r % 8, so that the 8 rows an ldmatrix reads together fall on
// distinct banks).
__device__ __forceinline__ int d4_piece(int c, int r) { return (c & ~7) | ((c & 7) ^ (r & 7)); }

// A part's fragments (STEPS of them): the weights of tile row rr (of the chunk at `base`,
// rows `stride` bytes apart, swizzled where SWZ) over columns [p * STEPS * 16, ...) by
// ldmatrix as mma's A, and the input vector's bf16 pairs `xb` as column 0 of B (lanes 0-3).
template <int STEPS, bool SWZ>
__device__ __forceinline__ void d4_part(unsigned base, int stride, int rr, int p, const unsigned* xb, int lane,
                                        unsigned (&a)[STEPS][4], unsigned (&bx)[STEPS][2]) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int k = 0; k < STEPS; ++k) {
    const int k0 = (p * STEPS + k) * 16, c = k0 / 8 + (lane >> 4);
    const unsigned addr = base + rr * stride + (SWZ ? d4_piece(c, rr) : c) * 16;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a[k][0]), "=r"(a[k][1]), "=r"(a[k][2]), "=r"(a[k][3]) : "r"(addr));
    bx[k][0] = g == 0 ? xb[k0 / 2 + t] : 0u;
    bx[k][1] = g == 0 ? xb[k0 / 2 + 4 + t] : 0u;
  }
}

// c += A B (mma.m16n8k16, bf16 in, fp32 sums).
__device__ __forceinline__ void d4_mma(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The first of a chunk's parts [lo, hi) this warp takes (parts go to warps round robin
// from the stage's first); hi where `skip`.
__device__ __forceinline__ int d4_first_part(int lo, int hi, int warp, bool skip) {
  return skip ? hi : lo + ((warp - lo % D3_WARPS) + D3_WARPS) % D3_WARPS;
}

// A stage's input vector (`cols` floats, this block's copy) into xb as bf16 pairs, normed
// first (RMSNorm, unit weights) where `norm`; on the consumer threads.
__device__ void d4_input(const float* in, int cols, bool norm, unsigned* xb) {
  float scale = 1.0f;
  if (norm) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += D3_CONSUMERS) ss += in[i] * in[i];
    scale = rsqrtf(d_block_sum<D3_CONSUMERS>(ss) / cols + 1e-5f);
  }
  for (int i = threadIdx.x; i < cols / 2; i += D3_CONSUMERS) {
    unsigned p;  // element 2i in the low half, rounded to nearest
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(in[2 * i + 1] * scale), "f"(in[2 * i] * scale));
    xb[i] = p;
  }
}

// One GEMV stage on the consumer warps (see above). `in`: the input vector (fp32, this
// block's copy), normed first where `norm`. `put(i, acc)` runs on every lane of a warp for
// the block's row i of the stage (acc: the stage's sums).
template <bool SWZ, int KS, int STEPS, class Put>
__device__ void d4_gemv(char* ring, unsigned long long* full, unsigned long long* empty, const char* const* layers, int l,
                        int s, const float* in, bool norm, D4Shared& sh, int& consumed, bool skip, bool nocopy,
                        Put put) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const D4Stage st = d4_stage<SWZ>(layers, l, s);
  const int rows = 16 * (st.t1 - st.t0);
  d4_input(in, st.cols, norm, sh.xb);
  for (int i = threadIdx.x; i < rows; i += D3_CONSUMERS) sh.acc[i] = 0.0f;
  d3_sync();
  const int g = lane >> 2, t = lane & 3;
  for (int tile = 0; tile < st.t1 - st.t0; tile += d4_chunk_tiles(st)) {
    const int n = min(d4_chunk_tiles(st), st.t1 - st.t0 - tile), slot = consumed % D4_SLOTS;
    if (!nocopy) d_wait((unsigned)__cvta_generic_to_shared(&full[slot]), (unsigned)((consumed / D4_SLOTS) & 1));
    const unsigned base = (unsigned)__cvta_generic_to_shared(ring + slot * D4_SLOT);
    const int lo = tile * KS, hi = (tile + n) * KS;
    for (int item = d4_first_part(lo, hi, warp, skip); item < hi; item += D3_WARPS) {
      const int tl = item / KS - tile;
      float c[4] = {};
      // Every fragment of the part first, then the chain of mma.
      unsigned a[STEPS][4], bx[STEPS][2];
      d4_part<STEPS, SWZ>(base, st.stride, tl * 16 + (lane & 15), item % KS, sh.xb, lane, a, bx);
#pragma unroll
      for (int k = 0; k < STEPS; ++k) d4_mma(c, a[k], bx[k]);
      // Column 0 of the tile's sums: rows g and g + 8, in the lanes with t == 0.
      if (t == 0) {
        atomicAdd(&sh.acc[(tile + tl) * 16 + g], c[0]);
        atomicAdd(&sh.acc[(tile + tl) * 16 + g + 8], c[2]);
      }
    }
    if (!nocopy) d_release_slot(empty, slot, lane);
    ++consumed;
  }
  d3_sync();
  for (int i = warp; i < rows; i += D3_WARPS) put(st.t0 * 16, i, sh.acc);
}

// MODE: 1 no dot products, 2 no barriers between blocks, 4 no attention stand-in, 16 no copies. `check`:
// where block 0 leaves its copy of the first layer's qkv (or null).
template <int MODE, bool SWZ>
__global__ void __launch_bounds__(D3_THREADS, 1) layers_in_cluster4(D45Args args) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long full[D4_SLOTS], empty[D4_SLOTS], stage_bars[2];
  __shared__ __align__(16) D3Vecs v;
  __shared__ __align__(16) D4Shared sh;
  __shared__ const char* ws[D_LAYERS_MAX * 4];
  constexpr int mode = MODE;
  const int lane = threadIdx.x & 31;
  d_layers_setup(args.gdl, args.nl, ws, args.x0, v.x);
  d_cluster_bars_init(full, empty, D3_WARPS, stage_bars, D4_SLOTS);
  const char* const* layers = ws;
  const unsigned long long t0 = now();
  if (threadIdx.x >= D3_CONSUMERS) {  // the producer warp
    if (!(mode & 16)) d4_produce<SWZ>(ring, full, empty, layers, args.gdl, args.nl, false);
  } else {
    unsigned boundary = 0;
    int consumed = 0;
    auto sync = [&]() { d_boundary<D3_CONSUMERS>(mode & 2, stage_bars, boundary); };
    constexpr bool skip = mode & 1, nocopy = mode & 16;
    __shared__ long long spans[12];
    DSpans sp(spans);
    for (int l = 0; l < args.nl; ++l) {
      sp.mark(0);
      d4_gemv<SWZ, 9, 4>(ring, full, empty, layers, l, 0, v.x, true, sh, consumed, skip, nocopy,
                         [&](int row0, int i, const float* acc) { d3_broadcast(&v.qkv[row0 + i], acc[i], lane); });
      sp.mark(1);
      sync();
      sp.mark(2);
      if (args.check && l == 0 && blockIdx.x == 0) {
        for (int i = threadIdx.x; i < D_QKV; i += D3_CONSUMERS) args.check[i] = v.qkv[i];
      }
      if (!(mode & 4)) d3_attention_standin(args.gdl[l].kv, v, false);
      sp.mark(3);
      sync();
      sp.mark(4);
      d4_gemv<SWZ, 9, 4>(ring, full, empty, layers, l, 1, v.attn, false, sh, consumed, skip, nocopy, [&](int row0, int i, const float* acc) {
        const float y = v.x[row0 + i] + acc[i];
        __syncwarp();
        d3_broadcast(&v.x[row0 + i], y, lane);
      });
      sp.mark(5);
      sync();
      sp.mark(6);
      sp.mark(7);
      // gate_up: row i of the block's share is gate (even) or up (odd) of one SwiGLU.
      d4_gemv<SWZ, 9, 4>(ring, full, empty, layers, l, 2, v.x, true, sh, consumed, skip, nocopy, [&](int row0, int i, const float* acc) {
        if (i % 2 == 0) {
          d3_broadcast(&v.act[(row0 + i) / 2], __fdividef(acc[i], 1.0f + __expf(-acc[i])) * acc[i + 1], lane);
        }
      });
      sp.mark(8);
      sync();
      sp.mark(9);
      d4_gemv<SWZ, 16, 6>(ring, full, empty, layers, l, 3, v.act, false, sh, consumed, skip, nocopy,
                          [&](int row0, int i, const float* acc) {
        const float y = v.x[row0 + i] + acc[i] * 1e-3f;
        __syncwarp();
        d3_broadcast(&v.x[row0 + i], y, lane);
      });
      sp.mark(10);
      sync();
      sp.mark(11);
    }
    sp.write(args.detail);
  }
  record(args.times, t0);
  __syncwarp();
  cluster_sync();
}

// D, fifth version (layers_in_cluster5, thirty-sixth pass): version 4, swizzled, with what
// section F measured in it: its shared-memory float atomics spin (compare-and-swap) and its
// stores into the other blocks' shared memory, 4 bytes at a time, cost about 100 cycles a
// value a warp; and each stage barrier's arrival fences the whole GPU.
//   - A part's sums go to a slot of their own (part x row) in shared memory; the stage's
//     rows are summed over their parts after a barrier of the consumers.
//   - The block writes its rows of the stage's output into its own copy of the vector, and
//     one thread pushes them to each other block by one bulk copy (shared memory to shared
//     memory across the cluster), which completes bytes on that block's stage barrier.
//   - The stage barrier is that mbarrier: each block expects the bytes the other blocks
//     push for the stage, and waits for them. No fence, no arrival per block.
#define D5_PARTS_MAX (9 * D4_ACC)

struct D5Shared {
  unsigned xb[D_F / 2];         // the stage's input as bf16 pairs
  float part[D5_PARTS_MAX];     // [part][row] sums
};

// Pushes this block's floats [from, from + n) of `vec` (its own copy) into every other
// block's copy, completing their stage barrier `bar` (the same offset in each block);
// called by the consumer threads after the values are written.
__device__ __forceinline__ void d5_push(const float* vec, int from, int n, unsigned long long* bar) {
  // Every writer's stores are made visible to the bulk copies (the async proxy) first.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  d3_sync();
  if (threadIdx.x < gridDim.x && threadIdx.x != rank_in_cluster()) {
    const unsigned src = (unsigned)__cvta_generic_to_shared(vec + from);
    unsigned dst, rbar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(src), "r"(threadIdx.x));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rbar)
                 : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(threadIdx.x));
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "r"(src), "r"(n * 4), "r"(rbar) : "memory");
  }
}

// Stage boundary k: expect `bytes` from the other blocks on barrier k % 2, and wait for
// them (thread 0 arrives; every consumer waits).
__device__ __forceinline__ void d5_wait(unsigned long long* bars, unsigned& k, int bytes) {
  const unsigned bar = (unsigned)__cvta_generic_to_shared(&bars[k & 1]);
  if (threadIdx.x == 0) {
    expect_bytes(bar, bytes);
  }
  d_wait(bar, (k >> 1) & 1);
  ++k;
}

// One GEMV stage as d4_gemv (swizzled rows), its sums by part. `put(row, value)` runs on
// one thread a row of the block's share, once the parts are summed.
template <int KS, int STEPS, bool PAIR, class Put>
__device__ void d5_gemv(char* ring, unsigned long long* full, unsigned long long* empty, const char* const* layers, int l,
                        int s, const float* in, bool norm, D5Shared& sh, int& consumed, bool skip, Put put) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const D4Stage st = d4_stage<true>(layers, l, s);
  const int rows = 16 * (st.t1 - st.t0);
  d4_input(in, st.cols, norm, sh.xb);
  if (skip) {
    for (int i = threadIdx.x; i < KS * rows; i += D3_CONSUMERS) sh.part[i] = 0.0f;
  }
  d3_sync();
  const int g = lane >> 2, t = lane & 3;
  for (int tile = 0; tile < st.t1 - st.t0; tile += d4_chunk_tiles(st)) {
    const int n = min(d4_chunk_tiles(st), st.t1 - st.t0 - tile), slot = consumed % D4_SLOTS;
    d_wait((unsigned)__cvta_generic_to_shared(&full[slot]), (unsigned)((consumed / D4_SLOTS) & 1));
    const unsigned base = (unsigned)__cvta_generic_to_shared(ring + slot * D4_SLOT);
    const int lo = tile * KS, hi = (tile + n) * KS;
    // PAIR: two of the warp's parts at a time, their mma chains interleaved.
    for (int item = d4_first_part(lo, hi, warp, skip); item < hi; item += (PAIR ? 2 : 1) * D3_WARPS) {
      const bool two = PAIR && item + D3_WARPS < hi;
      unsigned a[2][STEPS][4], bx[2][STEPS][2];
      float c[2][4] = {};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (j == 1 && !two) break;
        const int it = item + j * D3_WARPS;
        d4_part<STEPS, true>(base, st.stride, (it / KS - tile) * 16 + (lane & 15), it % KS, sh.xb, lane, a[j], bx[j]);
      }
#pragma unroll
      for (int k = 0; k < STEPS; ++k) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          if (j == 1 && !two) break;
          d4_mma(c[j], a[j][k], bx[j][k]);
        }
      }
      if (t == 0) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          if (j == 1 && !two) break;
          const int it = item + j * D3_WARPS, row = it / KS * 16 + g, p = it % KS;
          sh.part[p * rows + row] = c[j][0];
          sh.part[p * rows + row + 8] = c[j][2];
        }
      }
    }
    d_release_slot(empty, slot, lane);
    ++consumed;
  }
  d3_sync();
  for (int i = threadIdx.x; i < rows; i += D3_CONSUMERS) {
    float a = 0.0f;
#pragma unroll
    for (int p = 0; p < KS; ++p) a += sh.part[p * rows + i];
    put(st.t0 * 16 + i, a);
  }
}

// MODE: 1 no dot products, 4 no attention stand-in, 8 two parts at a time a warp (down's split into
// 32 parts of 3 steps instead of 16 of 6), 16 the keys and values through the ring.
// `check`: where block 0 leaves its copies of the first layer's qkv, x and act (or null).
template <int MODE>
__global__ void __launch_bounds__(D3_THREADS, 1) layers_in_cluster5(D45Args args) {
  constexpr int mode = MODE;
  constexpr bool skip = mode & 1, kv_ring = mode & 16, pair = mode & 8;
  constexpr int gu_parts = 9;  // gate_up's parts a tile
  // down's sums are scaled so that x stays bounded over 30 layers of patterned weights; in a
  // check (one layer) they are not, so that the check sees them.
  const float down_scale = args.check ? 1.0f : 1e-3f;
  __shared__ const char* ws[D_LAYERS_MAX * 4];
  __shared__ __align__(16) D5Shared sh;
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long full[D4_SLOTS], empty[D4_SLOTS], stage_bars[2];
  __shared__ __align__(16) D3Vecs v;
  d_layers_setup(args.gdl, args.nl, ws, args.x0, v.x);
  if (threadIdx.x == 0) {
    d_ring_init(full, empty, D3_WARPS, D4_SLOTS);
    for (int i = 0; i < 2; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"((unsigned)__cvta_generic_to_shared(&stage_bars[i]))
                   : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // x's first values (generic stores) before any block's bulk copies write into it.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncwarp();
  cluster_sync();
  const char* const* layers = ws;
  const unsigned long long t0 = now();
  if (threadIdx.x >= D3_CONSUMERS) {  // the producer warp
    d4_produce<true>(ring, full, empty, layers, args.gdl, args.nl, kv_ring);
  } else {
    const int b = blockIdx.x, C = gridDim.x;
    unsigned k = 0;
    int consumed = 0;
    __shared__ long long spans[12];
    DSpans sp(spans);
    // The block's first row of stage s and its rows (tiles of 16).
    auto share = [&](int s, int& from, int& n) {
      const int tiles = (s == 0 ? D_QKV : s == 2 ? 2 * D_F : D_H) / 16;
      from = b * tiles / C * 16;
      n = (b + 1) * tiles / C * 16 - from;
    };
    int from, n;
    for (int l = 0; l < args.nl; ++l) {
      sp.mark(0);
      d5_gemv<9, 4, pair>(ring, full, empty, layers, l, 0, v.x, true, sh, consumed, skip,
                    [&](int row, float a) { v.qkv[row] = a; });
      share(0, from, n);
      d5_push(v.qkv, from, n, &stage_bars[k & 1]);
      sp.mark(1);
      d5_wait(stage_bars, k, (D_QKV - n) * 4);
      sp.mark(2);
      if (args.check && l == 0 && blockIdx.x == 0) {
        for (int i = threadIdx.x; i < D_QKV; i += D3_CONSUMERS) args.check[i] = v.qkv[i];
      }
      const int per = D_H / C;
      if (kv_ring) {
        // The block's keys and values from the ring (the producer copied them after qkv).
        const int slot = consumed % D4_SLOTS;
        d_wait((unsigned)__cvta_generic_to_shared(&full[slot]), (unsigned)((consumed / D4_SLOTS) & 1));
        const uint4* kv = reinterpret_cast<const uint4*>(ring + slot * D4_SLOT);
        unsigned acc = 0;
        for (int i = threadIdx.x; i < D_KV_BYTES / 16 / C; i += D3_CONSUMERS) {
          const uint4 w = kv[i];
          acc ^= w.x ^ w.y ^ w.z ^ w.w;
        }
        d_release_slot(empty, slot, threadIdx.x & 31);
        ++consumed;
        const float tt = d_block_sum<D3_CONSUMERS>((float)(acc & 0xff) * 1e-9f);
        for (int i = threadIdx.x; i < per; i += D3_CONSUMERS) v.attn[b * per + i] = v.qkv[b * per + i] * (1.0f + tt);
      } else if (!(mode & 4)) {
        const float tt = d_kv_standin_sum<D3_CONSUMERS>(args.gdl[l].kv);
        for (int i = threadIdx.x; i < per; i += D3_CONSUMERS) v.attn[b * per + i] = v.qkv[b * per + i] * (1.0f + tt);
      }
      d5_push(v.attn, b * per, per, &stage_bars[k & 1]);
      sp.mark(3);
      d5_wait(stage_bars, k, (D_H - per) * 4);
      sp.mark(4);
      d5_gemv<9, 4, pair>(ring, full, empty, layers, l, 1, v.attn, false, sh, consumed, skip,
                    [&](int row, float a) { v.x[row] += a; });
      share(1, from, n);
      d5_push(v.x, from, n, &stage_bars[k & 1]);
      sp.mark(5);
      d5_wait(stage_bars, k, (D_H - n) * 4);
      sp.mark(6);
      sp.mark(7);
      d5_gemv<gu_parts, 36 / gu_parts, pair>(ring, full, empty, layers, l, 2, v.x, true, sh, consumed, skip,
                                             [&](int row, float a) {
        // gate (even rows) and up (odd rows) of one SwiGLU meet in act's slot: gate first.
        if (row % 2 == 0) v.act[row / 2] = a;
      });
      d3_sync();
      share(2, from, n);
      for (int i = threadIdx.x; i < n / 2; i += D3_CONSUMERS) {
        float u = 0.0f;
        for (int p = 0; p < gu_parts; ++p) u += sh.part[p * n + 2 * i + 1];
        const float gt = v.act[from / 2 + i];
        v.act[from / 2 + i] = __fdividef(gt, 1.0f + __expf(-gt)) * u;
      }
      d5_push(v.act, from / 2, n / 2, &stage_bars[k & 1]);
      sp.mark(8);
      d5_wait(stage_bars, k, (D_F - n / 2) * 4);
      sp.mark(9);
      d5_gemv<pair ? 32 : 16, pair ? 3 : 6, pair>(ring, full, empty, layers, l, 3, v.act, false, sh, consumed, skip,
                     [&](int row, float a) { v.x[row] += a * down_scale; });
      share(3, from, n);
      d5_push(v.x, from, n, &stage_bars[k & 1]);
      sp.mark(10);
      d5_wait(stage_bars, k, (D_H - n) * 4);
      sp.mark(11);
      if (args.check && l == 0 && blockIdx.x == 0) {  // the layer's x and act, after qkv's
        for (int i = threadIdx.x; i < D_H; i += D3_CONSUMERS) args.check[D_QKV + i] = v.x[i];
        for (int i = threadIdx.x; i < D_F; i += D3_CONSUMERS) args.check[D_QKV + D_H + i] = v.act[i];
      }
    }
    sp.write(args.detail);
  }
  record(args.times, t0);
  __syncwarp();
  cluster_sync();
}

// F: what the prototypes' small operations cost inside a 16-block cluster of 512 consumer
// threads and a producer warp (as versions 3 and 4 run): thread 0's clock cycles a round,
// every consumer warp doing one round of the operation each time (or warp 0 alone).
//   0 nothing; 1 a barrier of the consumers (bar.sync 1, 512); 2 one value stored into
//   every block's shared memory (16 lanes, one remote store each); 3 shared-memory float
//   atomics, 8 lanes a warp, every warp on the same 16 words; 4 the same on words of its
//   own; 5 one of version 4's parts (4 ldmatrix.x4, 4 mma.m16n8k16, 2 atomics); 6 the
//   same without the atomics (the sums stored); 7 one of version 3's groups (2 rows of 576
//   columns, 18 FMAs a row, shuffles, stored).
#define F_OPS 8
__global__ void __launch_bounds__(D3_THREADS, 1) op_costs(int op, int warps, int rounds, unsigned long long* out) {
  __shared__ __align__(16) unsigned tile[16 * D_H / 2];
  __shared__ __align__(16) float words[D3_CONSUMERS];
  __shared__ float slot[16];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < 16 * D_H / 2; i += blockDim.x) tile[i] = 0x3c003c00u + i;
  for (int i = threadIdx.x; i < D3_CONSUMERS; i += blockDim.x) words[i] = 0.0f;
  cluster_sync();
  if (threadIdx.x < D3_CONSUMERS) {
    const bool active = warp < warps;
    float sink = 0.0f;
    const long long t0 = clock64();
    for (int r = 0; r < rounds; ++r) {
      if (op == 1) {
        d3_sync();
      } else if (!active) {
      } else if (op == 2) {
        d3_broadcast(&slot[r & 15], (float)r, lane);
      } else if (op == 3 || op == 4) {
        if ((lane & 3) == 0) atomicAdd(&words[(op == 4 ? warp * 8 : 0) + (lane >> 2)], 1.0f);
      } else if (op == 5 || op == 6) {
        const int g = lane >> 2, t = lane & 3;
        float c[4] = {};
        unsigned a[4][4], bx[4][2];
        d4_part<4, true>((unsigned)__cvta_generic_to_shared(tile), D_H * 2, lane & 15, r & 7, tile, lane, a, bx);
#pragma unroll
        for (int k = 0; k < 4; ++k) d4_mma(c, a[k], bx[k]);
        if (t == 0) {
          if (op == 5) {
            atomicAdd(&words[g], c[0]);
            atomicAdd(&words[g + 8], c[2]);
          } else {
            words[warp * 16 + g] = c[0];
            words[warp * 16 + g + 8] = c[2];
          }
        }
      } else if (op == 7) {
        float acc0 = 0.0f, acc1 = 0.0f;
        const unsigned* r0 = tile + (r & 7) * 2 * (D_H / 2);
#pragma unroll
        for (int k = 0; k < 9; ++k) {
          const unsigned a = r0[lane + 32 * k], c = r0[D_H / 2 + lane + 32 * k];
          const float x0 = words[(lane + 32 * k) & 511], x1 = words[(lane + 32 * k + 1) & 511];
          acc0 = fmaf(__uint_as_float(a << 16), x0, acc0);
          acc1 = fmaf(__uint_as_float(c << 16), x0, acc1);
          acc0 = fmaf(__uint_as_float(a & 0xffff0000u), x1, acc0);
          acc1 = fmaf(__uint_as_float(c & 0xffff0000u), x1, acc1);
        }
        for (int o = 16; o; o >>= 1) {
          acc0 += __shfl_xor_sync(~0u, acc0, o);
          acc1 += __shfl_xor_sync(~0u, acc1, o);
        }
        if (lane == 0) slot[warp & 15] = acc0 + acc1;
      }
      __syncwarp();
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = (unsigned long long)(clock64() - t0);
    if (sink == 1.0f) out[1] = 1;
  }
  __syncwarp();
  cluster_sync();
}

// f rounded to bf16 (nearest, ties to even): its bits, and a bf16's value.
static unsigned short bf16_bits(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_float(unsigned short h) {
  const unsigned u = (unsigned)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static unsigned long long* g_times;
static unsigned long long* detail;  // version 3's spans: [block][12] clock cycles
static char spans_text[16384];

// Appends the last run's spans (version 3) to spans_text as a table row.
static void spans_row(int c, int mode, int nl) {
  unsigned long long d[16 * 12];
  CK(cudaMemcpy(d, detail, sizeof d, cudaMemcpyDeviceToHost));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  size_t at = strlen(spans_text);
  if (at == 0) {
    at += snprintf(spans_text + at, sizeof spans_text - at,
                   "| blocks | run | norm | qkv | sync | attn | sync | o | sync | norm | gate_up | sync | down | sync |\n"
                   "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  at += snprintf(spans_text + at, sizeof spans_text - at, "| %d | %d |", c, mode);
  for (int i = 0; i < 12; ++i) {
    double mean = 0, worst = 0;
    for (int b = 0; b < c; ++b) {
      const double us = d[b * 12 + i] / (clock_khz * 1e-3) / nl;
      mean += us / c;
      worst = us > worst ? us : worst;
    }
    at += snprintf(spans_text + at, sizeof spans_text - at, " %.2f/%.2f |", mean, worst);
  }
  snprintf(spans_text + at, sizeof spans_text - at, "\n");
}

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
  int sms = 0, rows_off = 0;  // rows_off: the host checks' rows off, all versions (exit 1 if any)
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
  // E: C's streaming by G = 16 blocks launched as clusters of c: a cluster runs inside one
  // GPC (graphics processing cluster), so c = 16 puts every block on one GPC's SMs.
  printf("\nE. 16 blocks streaming by bulk copies as clusters of c (GB/s: from memory, 56 MiB; from L2, 7 MiB)\n| c | from memory | from L2 |\n|---|---|---|\n");
  CK(cudaFuncSetAttribute(stream_bulk, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  for (int c : {1, 2, 4, 8, 16}) {
    double cold = 0, hot = 0;
    const size_t bytes = (size_t)56 << 20, hot_bytes = (size_t)7 << 20;
    for (int rep = 0; rep < 5; ++rep) {
      window = (window + bytes + (1 << 20)) % (BIG - bytes - (1 << 20));
      ClusterLaunch cl(16, 32, smem);
      cl.at[0].val.clusterDim.x = c;
      const char* src = reinterpret_cast<const char*>(buf) + window;
      reset_times();
      CK(cudaLaunchKernelEx(&cl.cfg, stream_bulk, src, bytes, g_times));
      CK(cudaDeviceSynchronize());
      cold += bytes / (elapsed_us() * 1e3);
      // From L2: 7 MiB read once, then timed again.
      CK(cudaLaunchKernelEx(&cl.cfg, stream_bulk, src, hot_bytes, g_times));
      reset_times();
      CK(cudaLaunchKernelEx(&cl.cfg, stream_bulk, src, hot_bytes, g_times));
      CK(cudaDeviceSynchronize());
      hot += hot_bytes / (elapsed_us() * 1e3);
    }
    printf("| %d | %.0f | %.0f |\n", c, cold / 5, hot / 5);
  }
  // F: the small operations' costs (cycles a round, thread 0 of block 0).
  {
    printf("\nF. cycles a round inside a 16-block cluster of 544 threads (thread 0's clock; 16 warps or warp 0 alone)\n"
           "| operation | 16 warps | warp 0 alone |\n|---|---|---|\n");
    const char* names[F_OPS] = {"nothing", "barrier of the consumers", "a value into every block (16 remote stores)",
                                "float atomics on 16 shared words", "float atomics on the warp's own words",
                                "version 4's part (4 ldmatrix, 4 mma, 2 atomics)", "the same, sums stored",
                                "version 3's group (2 rows x 576)"};
    unsigned long long* out;
    CK(cudaMalloc(&out, 16));
    CK(cudaFuncSetAttribute(op_costs, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    const int rounds = 1024;
    for (int op = 0; op < F_OPS; ++op) {
      printf("| %s |", names[op]);
      for (int warps : {D3_WARPS, 1}) {
        ClusterLaunch cl(16, D3_THREADS, 0);
        CK(cudaLaunchKernelEx(&cl.cfg, op_costs, op, warps, rounds, out));
        CK(cudaDeviceSynchronize());
        unsigned long long cyc;
        CK(cudaMemcpy(&cyc, out, 8, cudaMemcpyDeviceToHost));
        printf(" %.0f |", (double)cyc / rounds);
      }
      printf("\n");
    }
  }
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
  printf("Modes (timing only, wrong values): 1 no dot products, 2 no barriers between blocks, 4 no attention stand-in;\n"
         "8 (version 3) one waiter a warp for each copy and one a block for each stage barrier; 16 (version 3) no copies\n"
         "(the consumers sum whatever the ring holds, without waiting); 32 (version 3) the stage barrier's arrivals after one\n"
         "cluster fence, by one thread; 64 (version 3) results stored in the block's own shared memory alone;\n"
         "128 (version 3) every warp takes the norm's scale itself (no block barrier); 256 (version 3, with 16) each GEMV\n"
         "stage twice in a row.\n");
  printf("| version | blocks in the cluster | mode | rows a warp | us a layer, runs |\n|---|---|---|---|---|\n");
  CK(cudaMalloc(&detail, 16 * 12 * 8));
  // Version 3's instances: {mode, rows a warp, kernel}.
  struct V3 { int mode, r; const void* k; };
  const V3 v3s[] = {{0, 2, (const void*)layers_in_cluster3<0, 2>},     {128, 2, (const void*)layers_in_cluster3<128, 2>},
                    {2, 2, (const void*)layers_in_cluster3<2, 2>},     {16, 2, (const void*)layers_in_cluster3<16, 2>},
                    {23, 2, (const void*)layers_in_cluster3<23, 2>},   {129, 4, (const void*)layers_in_cluster3<129, 4>},
                    {146, 4, (const void*)layers_in_cluster3<146, 4>}, {402, 4, (const void*)layers_in_cluster3<402, 4>},
                    {210, 2, (const void*)layers_in_cluster3<210, 2>}, {466, 2, (const void*)layers_in_cluster3<466, 2>}};
  for (const void* k : {(const void*)layers_in_cluster2}) {
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  for (const V3& v : v3s) {
    CK(cudaFuncSetAttribute(v.k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(v.k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  // {version, blocks, mode, rows a warp (version 3)}
  const int runs[][4] = {{1, 16, 0, 2},   {2, 16, 0, 2},   {3, 16, 0, 2},   {3, 16, 128, 2},
                         {3, 16, 2, 2},   {3, 16, 16, 2},  {3, 16, 23, 2},  {3, 16, 129, 4},
                         {3, 16, 146, 4}, {3, 16, 402, 4}, {3, 16, 210, 2}, {3, 16, 466, 2}};
  for (const auto& vcm : runs) {
    const int version = vcm[0], c = vcm[1], mode = vcm[2], rw = vcm[3];
    const int threads = version == 1 ? D_THREADS : version == 2 ? D2_THREADS : D3_THREADS;
    const void* kernel = version == 1 ? (const void*)layers_in_cluster : (const void*)layers_in_cluster2;
    if (version == 3) {
      kernel = nullptr;
      for (const V3& v : v3s) {
        if (v.mode == mode && v.r == rw) kernel = v.k;
      }
      if (!kernel) continue;
    }
    printf("| %d | %d | %d | %d |", version, c, mode, rw);
    {
      ClusterLaunch cl(c, threads, smem);
      int fits = 0;
      CK(cudaOccupancyMaxActiveClusters(&fits, kernel, &cl.cfg));
      if (fits == 0) {
        printf(" does not fit this GPU |\n");
        continue;
      }
    }
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<float> x(D_H, 1.0f);
      CK(cudaMemcpy(dv.x, x.data(), D_H * 4, cudaMemcpyHostToDevice));
      ClusterLaunch cl(c, threads, smem);
      reset_times();
      if (version == 1) {
        CK(cudaLaunchKernelEx(&cl.cfg, layers_in_cluster, (const DLayer*)dl, NL, dv, mode, g_times));
      } else if (version == 2) {
        CK(cudaLaunchKernelEx(&cl.cfg, layers_in_cluster2, (const DLayer*)dl, NL, dv, mode, g_times));
      } else {
        const DLayer* a0 = dl;
        int a1 = NL;
        const float* a2 = dv.x;
        void* args[] = {&a0, &a1, &a2, &g_times, &detail};
        CK(cudaLaunchKernelExC(&cl.cfg, kernel, args));
      }
      CK(cudaDeviceSynchronize());
      printf(" %.2f", elapsed_us() / NL);
    }
    printf(" |\n");
    if (version == 3) spans_row(c, mode * 10 + rw, NL);
  }
  printf("\nSpans of version 3's layer (thread 0 of each block, us a layer; mean over the blocks / the slowest block;\n"
         "run: mode x 10 + rows a warp):\n%s", spans_text);
  // Versions 4 and 5: the first layer's qkv checked against the host once (one layer, the
  // weights and x in a pattern), then timed.
  struct V45 { int version, mode; bool swz; const void* k; };
  const V45 v45s[] = {{4, 0, false, (const void*)layers_in_cluster4<0, false>},
                      {4, 0, true, (const void*)layers_in_cluster4<0, true>},
                      {4, 1, true, (const void*)layers_in_cluster4<1, true>},
                      {4, 2, true, (const void*)layers_in_cluster4<2, true>},
                      {4, 3, true, (const void*)layers_in_cluster4<3, true>},
                      {4, 7, true, (const void*)layers_in_cluster4<7, true>},
                      {4, 16, true, (const void*)layers_in_cluster4<16, true>},
                      {4, 18, true, (const void*)layers_in_cluster4<18, true>},
                      {4, 19, true, (const void*)layers_in_cluster4<19, true>},
                      {5, 0, true, (const void*)layers_in_cluster5<0>},
                      {5, 1, true, (const void*)layers_in_cluster5<1>},
                      {5, 4, true, (const void*)layers_in_cluster5<4>},
                      {5, 5, true, (const void*)layers_in_cluster5<5>},
                      {5, 16, true, (const void*)layers_in_cluster5<16>},
                      {5, 17, true, (const void*)layers_in_cluster5<17>},
                      {5, 24, true, (const void*)layers_in_cluster5<24>}};
  const int smem45 = D4_SLOTS * D4_SLOT;
  for (const V45& v : v45s) {
    CK(cudaFuncSetAttribute(v.k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(v.k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem45));
  }
  // One launch of a version 4 or 5 kernel on nl layers from x (device), its qkv into check.
  auto launch45 = [&](const void* k, int nl, const float* x, float* check) {
    ClusterLaunch cl(16, D3_THREADS, smem45);
    D45Args a{dl, nl, x, g_times, check, detail};
    void* args[] = {&a};
    CK(cudaLaunchKernelExC(&cl.cfg, k, args));
    CK(cudaDeviceSynchronize());
  };
  {
    // Layer 0's four matrices in patterns exact in bf16, plain and swizzled (d4_piece); its
    // keys and values zero, so that the attention stand-in passes q through.
    struct Mat { const char* dev; int rows, cols, a, b, m, off, div; };
    const Mat mats[4] = {{hl[0].qkv, D_QKV, D_H, 7, 3, 17, 8, 16}, {hl[0].o, D_H, D_H, 5, 11, 13, 6, 16},
                         {hl[0].gu, 2 * D_F, D_H, 3, 7, 11, 5, 32}, {hl[0].down, D_H, D_F, 13, 5, 19, 9, 64}};
    std::vector<unsigned short> plain[4], swz[4];
    for (int m = 0; m < 4; ++m) {
      const Mat& M = mats[m];
      plain[m].resize((size_t)M.rows * M.cols);
      swz[m].resize(plain[m].size());
      for (int r = 0; r < M.rows; ++r) {
        for (int k = 0; k < M.cols; ++k) {
          plain[m][(size_t)r * M.cols + k] = bf16_bits(((r * M.a + k * M.b) % M.m - M.off) / (float)M.div);
        }
        for (int c = 0; c < M.cols / 8; ++c) {
          const int p = (c & ~7) | ((c & 7) ^ (r & 7));
          for (int e = 0; e < 8; ++e) swz[m][(size_t)r * M.cols + p * 8 + e] = plain[m][(size_t)r * M.cols + c * 8 + e];
        }
      }
    }
    CK(cudaMemset((void*)hl[0].kv, 0, D_KV_BYTES));
    // The host's layer: the kernels' bf16 roundings of each stage's input, sums in double.
    auto bf = [](float f) { return bf16_float(bf16_bits(f)); };
    auto normed = [&](const std::vector<float>& v) {
      double ss = 0;
      for (float e : v) ss += (double)e * e;
      const float scale = 1.0f / sqrtf((float)(ss / v.size()) + 1e-5f);
      std::vector<float> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = bf(v[i] * scale);
      return out;
    };
    auto gemv = [&](int m, const std::vector<float>& in) {
      std::vector<float> out(mats[m].rows);
      for (int r = 0; r < mats[m].rows; ++r) {
        double acc = 0;
        for (int k = 0; k < mats[m].cols; ++k) acc += (double)bf16_float(plain[m][(size_t)r * mats[m].cols + k]) * in[k];
        out[r] = (float)acc;
      }
      return out;
    };
    std::vector<float> x(D_H);
    for (int k = 0; k < D_H; ++k) x[k] = 1.0f + (k % 5) * 0.25f;
    const std::vector<float> qkv = gemv(0, normed(x));
    std::vector<float> attn(D_H), x1(D_H), act(D_F), act_in(D_F), x2(D_H);
    for (int k = 0; k < D_H; ++k) attn[k] = bf(qkv[k]);
    const std::vector<float> o = gemv(1, attn);
    for (int k = 0; k < D_H; ++k) x1[k] = x[k] + o[k];
    const std::vector<float> gu = gemv(2, normed(x1));
    for (int i = 0; i < D_F; ++i) {
      act[i] = gu[2 * i] / (1.0f + expf(-gu[2 * i])) * gu[2 * i + 1];
      act_in[i] = bf(act[i]);
    }
    const std::vector<float> dn = gemv(3, act_in);
    for (int k = 0; k < D_H; ++k) x2[k] = x1[k] + dn[k];
    float* check;
    const int check_len = D_QKV + D_H + D_F;
    CK(cudaMalloc(&check, check_len * 4));
    printf("\nVersions 4 and 5 against the host, one layer of patterned weights (version 4: qkv; version 5: qkv, the\n"
           "layer's x and act): rows off (beyond 1e-3 x (1 + |value|)) and the largest |difference|\n");
    const V45 checked[] = {v45s[0], v45s[1], v45s[9], v45s[13], v45s[15]};
    for (const V45& v : checked) {
      for (int m = 0; m < 4; ++m) {
        const std::vector<unsigned short>& w = v.swz ? swz[m] : plain[m];
        CK(cudaMemcpy((void*)mats[m].dev, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
      }
      CK(cudaMemcpy(dv.x, x.data(), D_H * 4, cudaMemcpyHostToDevice));
      CK(cudaMemset(check, 0xff, check_len * 4));
      launch45(v.k, 1, dv.x, check);
      std::vector<float> got(check_len);
      CK(cudaMemcpy(got.data(), check, check_len * 4, cudaMemcpyDeviceToHost));
      printf("- version %d, %s rows, mode %d:", v.version, v.swz ? "swizzled" : "padded", v.mode);
      const struct { const char* name; const float* ref; int at, n; } parts[3] = {
          {"qkv", qkv.data(), 0, D_QKV}, {"x", x2.data(), D_QKV, D_H}, {"act", act.data(), D_QKV + D_H, D_F}};
      for (int q = 0; q < (v.version == 4 ? 1 : 3); ++q) {
        double worst = 0;
        int off = 0;
        for (int i = 0; i < parts[q].n; ++i) {
          const double ref = parts[q].ref[i], d = fabs(got[parts[q].at + i] - ref);
          worst = d > worst ? d : worst;
          if (!(d <= 1e-3 * (1.0 + fabs(ref)))) ++off;
        }
        printf(" %s %d of %d off (%.1e)", parts[q].name, off, parts[q].n, worst);
        rows_off += off;
      }
      printf("\n");
    }
  }
  printf("| version | layout | blocks in the cluster | mode | us a layer, runs |\n|---|---|---|---|---|\n");
  spans_text[0] = 0;
  for (const V45& v : v45s) {
    printf("| %d | %s | 16 | %d |", v.version, v.swz ? "swizzled" : "padded", v.mode);
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<float> ones(D_H, 1.0f);
      CK(cudaMemcpy(dv.x, ones.data(), D_H * 4, cudaMemcpyHostToDevice));
      reset_times();
      launch45(v.k, NL, dv.x, nullptr);
      printf(" %.2f", elapsed_us() / NL);
    }
    printf(" |\n");
    if (v.swz) spans_row(16, v.version * 100 + v.mode, NL);
  }
  printf("\nSpans of versions 4 and 5 (swizzled; run: version x 100 + mode; their norms are inside qkv and gate_up;\n"
         "version 5's barriers are the waits for the other blocks' pushes):\n%s", spans_text);
  return rows_off > 0 ? 1 : 0;
}
