// What the default model's decode GEMVs would cost on its GGUF blocks instead of f16 rows:
// SmolLM2-135M's 30 layers of qkv, o, gate_up and down (Q4_1 in its GGUF: 20 bytes a 32
// weights) and its tied lm_head (Q8_0: 34 bytes a 32 weights), against the same GEMVs on
// f16 weights (what the engine uploads today), as one chain of 121 programmatic dependent
// launches in a CUDA graph, the way a decode step runs them. One kernel for the three
// formats: a warp takes a pair of rows and its lanes take 16-byte units of them (8 f16
// weights, 16 Q8_0 or 32 Q4_1), every unit loaded before the predecessor wait. The quantized
// weights are dequantized as the engine's upload does (f16 of d * q (+ m)), so the products
// are the f16 path's up to the order of the sums; a host check compares each format.
//
//     nvcc -O3 -arch=sm_90a -o /tmp/quant-gemv scripts/quant-gemv.cu && /tmp/quant-gemv
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <utility>
#include <initializer_list>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

enum Fmt { F16 = 0, Q8 = 1, Q4 = 2 };
// Weights a 16-byte unit holds.
__host__ __device__ constexpr int unit_weights(int f) { return f == F16 ? 8 : f == Q8 ? 16 : 32; }
// Bytes of a row's weights (its scales apart).
__host__ __device__ constexpr size_t row_bytes(int f, int k) { return f == F16 ? 2ull * k : f == Q8 ? (size_t)k : k / 2ull; }
#define MAXU 12  // units a lane holds at most: 2 rows of 1536 f16 weights over 32 lanes

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// The f16 value the engine's upload makes of a quantized weight, as f32.
__device__ __forceinline__ float deq(float d, float m, int q) {
  return __half2float(__float2half_rn(__fadd_rn(__fmul_rn(d, (float)q), m)));
}

// y[o] = sum_i x[i] * w[o, i] for one row x (f16, k); w in format F: F16 rows of k; Q8 rows
// of k int8 with an f16 scale a 32 (scales [rows, k / 32]); Q4 rows of k / 2 bytes, each
// 16-byte unit one GGML block (byte j: weight j low nibble, j + 16 high), with (d, m) a
// block (scales [rows, k / 32] of half2).
template <int F, bool EXACT>
__global__ void __launch_bounds__(256) gemv_fmt(const uint8_t* __restrict__ w,
                                                const void* __restrict__ scales,
                                                const __half* __restrict__ x, float* __restrict__ y,
                                                int k, int rows) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  const int o = 2 * warp;
  const int per_row = k / unit_weights(F);  // units a row
  const size_t bytes = row_bytes(F, k);
  uint4 wv[MAXU];
  float sc[MAXU][2];
#pragma unroll
  for (int i = 0; i < MAXU; ++i) {
    const int u = lane + 32 * i;
    if (u < 2 * per_row && o + u / per_row < rows) {
      const int r = o + u / per_row, c = u % per_row;
      wv[i] = load_stream(reinterpret_cast<const uint4*>(w + (size_t)r * bytes) + c);
      if (F == Q8) {
        sc[i][0] = __half2float(reinterpret_cast<const __half*>(scales)[(size_t)r * (k / 32) + c / 2]);
      } else if (F == Q4) {
        const __half2 dm = reinterpret_cast<const __half2*>(scales)[(size_t)r * (k / 32) + c];
        sc[i][0] = __low2float(dm);
        sc[i][1] = __high2float(dm);
      }
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  float acc[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < MAXU; ++i) {
    const int u = lane + 32 * i;
    if (u < 2 * per_row && o + u / per_row < rows) {
      const int which = u / per_row, c = u % per_row;
      const __half* xs = x + c * unit_weights(F);
      float s = 0.f;
      if (F == F16) {
        const __half* h = reinterpret_cast<const __half*>(&wv[i]);
        const uint4 xv = *reinterpret_cast<const uint4*>(xs);
        const __half* xh = reinterpret_cast<const __half*>(&xv);
#pragma unroll
        for (int j = 0; j < 8; ++j) s = fmaf(__half2float(h[j]), __half2float(xh[j]), s);
      } else if (F == Q8) {
        // EXACT: each weight as the upload rounds it; else the file's d * q in f32, d out of
        // the sum.
        const int8_t* q = reinterpret_cast<const int8_t*>(&wv[i]);
#pragma unroll
        for (int j = 0; j < 16; j += 8) {
          const uint4 xv = *reinterpret_cast<const uint4*>(xs + j);
          const __half* xh = reinterpret_cast<const __half*>(&xv);
#pragma unroll
          for (int t = 0; t < 8; ++t) {
            const float wq = EXACT ? deq(sc[i][0], 0.f, q[j + t]) : (float)q[j + t];
            s = fmaf(wq, __half2float(xh[t]), s);
          }
        }
        if (!EXACT) s *= sc[i][0];
      } else {
        // EXACT: as for Q8; else d * sum(q x) + m * sum(x).
        const uint8_t* q = reinterpret_cast<const uint8_t*>(&wv[i]);
        float sx = 0.f;
#pragma unroll
        for (int half_ = 0; half_ < 2; ++half_) {
#pragma unroll
          for (int j = 0; j < 16; j += 8) {
            const uint4 xv = *reinterpret_cast<const uint4*>(xs + 16 * half_ + j);
            const __half* xh = reinterpret_cast<const __half*>(&xv);
#pragma unroll
            for (int t = 0; t < 8; ++t) {
              const int nib = half_ == 0 ? (q[j + t] & 15) : (q[j + t] >> 4);
              const float xf = __half2float(xh[t]);
              s = fmaf(EXACT ? deq(sc[i][0], sc[i][1], nib) : (float)nib, xf, s);
              if (!EXACT) sx += xf;
            }
          }
        }
        if (!EXACT) s = fmaf(sc[i][0], s, sc[i][1] * sx);
      }
      acc[which] += s;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  if (lane == 0) {
    if (o < rows) y[o] = acc[0];
    if (o + 1 < rows) y[o + 1] = acc[1];
  }
}

struct Mat { uint8_t* w; void* s; int rows, k, fmt; bool exact = true; };

static size_t scale_bytes(int fmt, int k) { return fmt == F16 ? 0 : fmt == Q8 ? 2ull * (k / 32) : 4ull * (k / 32); }

// Random weights: quants of any value, f16 weights and scales small and finite.
static void fill(Mat& m, unsigned seed, std::vector<uint8_t>* hw = nullptr, std::vector<uint8_t>* hs = nullptr) {
  const size_t wb = row_bytes(m.fmt, m.k) * m.rows, sb = scale_bytes(m.fmt, m.k) * m.rows;
  std::vector<uint8_t> w(wb), s(sb);
  unsigned st = seed * 2654435761u + 1;
  auto rnd = [&]() { st ^= st << 13; st ^= st >> 17; st ^= st << 5; return st; };
  auto small_half = [&]() { __half h = __float2half(((int)(rnd() % 2001) - 1000) * 1e-5f); uint16_t b; memcpy(&b, &h, 2); return b; };
  if (m.fmt == F16) {
    for (size_t i = 0; i < wb; i += 2) { uint16_t b = small_half(); memcpy(&w[i], &b, 2); }
  } else {
    for (auto& b : w) b = (uint8_t)rnd();
    for (size_t i = 0; i < sb; i += 2) { uint16_t b = small_half(); memcpy(&s[i], &b, 2); }
  }
  CK(cudaMalloc(&m.w, wb));
  CK(cudaMemcpy(m.w, w.data(), wb, cudaMemcpyHostToDevice));
  m.s = nullptr;
  if (sb) { CK(cudaMalloc(&m.s, sb)); CK(cudaMemcpy(m.s, s.data(), sb, cudaMemcpyHostToDevice)); }
  if (hw) *hw = std::move(w);
  if (hs) *hs = std::move(s);
}

static void launch(const Mat& m, const __half* x, float* y, cudaStream_t st) {
  const int warps = (m.rows + 1) / 2, blocks = (warps + 7) / 8;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks); cfg.blockDim = dim3(256); cfg.stream = st;
  cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = a; cfg.numAttrs = 1;
  const uint8_t* w = m.w; const void* s = m.s; int k = m.k, rows = m.rows;
  if (m.fmt == F16) CK(cudaLaunchKernelEx(&cfg, gemv_fmt<F16, true>, w, s, x, y, k, rows));
  else if (m.fmt == Q8 && m.exact) CK(cudaLaunchKernelEx(&cfg, gemv_fmt<Q8, true>, w, s, x, y, k, rows));
  else if (m.fmt == Q8) CK(cudaLaunchKernelEx(&cfg, gemv_fmt<Q8, false>, w, s, x, y, k, rows));
  else if (m.exact) CK(cudaLaunchKernelEx(&cfg, gemv_fmt<Q4, true>, w, s, x, y, k, rows));
  else CK(cudaLaunchKernelEx(&cfg, gemv_fmt<Q4, false>, w, s, x, y, k, rows));
}

static float half_f(uint16_t b) { __half h; memcpy(&h, &b, 2); return __half2float(h); }
static float deq_host(float d, float m, int q, bool exact) {
  const float v = d * (float)q + m;
  if (!exact) return v;
  __half h = __float2half_rn(v); uint16_t b; memcpy(&b, &h, 2); return half_f(b);
}

// One matrix of each format against the host, on x.
static int check(const __half* dx, const std::vector<float>& hx, float* dy, cudaStream_t st) {
  int bad = 0;
  for (int fmt = 0; fmt < 5; ++fmt) {
    const bool exact = fmt < 3;
    const int f = fmt < 3 ? fmt : fmt - 2;
    for (int k : {576, 1536}) {
      Mat m{nullptr, nullptr, 77, k, f, exact};
      std::vector<uint8_t> w, s;
      fill(m, 99 + fmt, &w, &s);
      launch(m, dx, dy, st);
      CK(cudaStreamSynchronize(st));
      std::vector<float> y(m.rows);
      CK(cudaMemcpy(y.data(), dy, 4 * m.rows, cudaMemcpyDeviceToHost));
      double worst = 0;
      for (int r = 0; r < m.rows; ++r) {
        double ref = 0, mag = 0;
        for (int i = 0; i < k; ++i) {
          float wv;
          if (f == F16) { uint16_t b; memcpy(&b, &w[(size_t)r * 2 * k + 2 * i], 2); wv = half_f(b); }
          else if (f == Q8) {
            uint16_t b; memcpy(&b, &s[((size_t)r * (k / 32) + i / 32) * 2], 2);
            wv = deq_host(half_f(b), 0.f, (int8_t)w[(size_t)r * k + i], exact);
          } else {
            uint16_t bd, bm; const size_t at = ((size_t)r * (k / 32) + i / 32) * 4;
            memcpy(&bd, &s[at], 2); memcpy(&bm, &s[at + 2], 2);
            const int blk = i / 32, j = i % 32;
            const uint8_t byte = w[(size_t)r * (k / 2) + blk * 16 + (j % 16)];
            wv = deq_host(half_f(bd), half_f(bm), j < 16 ? (byte & 15) : (byte >> 4), exact);
          }
          ref += (double)wv * hx[i];
          mag += fabs((double)wv * hx[i]);
        }
        worst = fmax(worst, fabs(ref - y[r]) / (mag + 1e-30));
      }
      const char* names[] = {"f16", "Q8_0", "Q4_1", "Q8_0 factored", "Q4_1 factored"};
      printf("check %-13s k %4d: largest error %.2e of the sum of magnitudes%s\n", names[fmt], k, worst,
             worst < 1e-5 ? "" : "  FAIL");
      bad += worst >= 1e-5;
      CK(cudaFree(m.w)); if (m.s) CK(cudaFree(m.s));
    }
  }
  return bad;
}

int main() {
  const int L = 30, H = 576, QKV = 960, FF = 1536, V = 49152;
  cudaStream_t st; CK(cudaStreamCreate(&st));
  __half* dx; float* dy;
  CK(cudaMalloc(&dx, 2 * 4096)); CK(cudaMalloc(&dy, 4 * (size_t)V));
  std::vector<float> hx(2048);
  std::vector<__half> hxh(2048);
  for (int i = 0; i < 2048; ++i) { hx[i] = __half2float(__float2half(sinf(i * 0.37f))); hxh[i] = __float2half(hx[i]); }
  CK(cudaMemcpy(dx, hxh.data(), 2 * 2048, cudaMemcpyHostToDevice));
  const int bad = check(dx, hx, dy, st);
  // The step's GEMVs in each build: "f16" as the engine uploads them, "GGUF" the layers in
  // Q4_1 and the lm_head in Q8_0, as the default model's file holds them.
  // "GGUF f32": the file's values in f32, each block's scale out of its sums (not the f16
  // path's products: those round each weight to f16).
  const char* build[] = {"f16", "GGUF", "GGUF f32"};
  for (int rep = 0; rep < 2; ++rep)
  for (int b = 0; b < 3; ++b) {
    const int lf = b == 0 ? F16 : Q4, hf = b == 0 ? F16 : Q8;
    const bool exact = b < 2;
    std::vector<Mat> mats;
    size_t bytes = 0;
    for (int l = 0; l < L; ++l) {
      for (auto [rows, k] : std::initializer_list<std::pair<int, int>>{{QKV, H}, {H, H}, {2 * FF, H}, {H, FF}}) {
        Mat m{nullptr, nullptr, rows, k, lf, exact};
        fill(m, 1000 * l + rows + k);
        mats.push_back(m);
        bytes += (row_bytes(lf, k) + scale_bytes(lf, k)) * rows;
      }
    }
    Mat head{nullptr, nullptr, V, H, hf, exact};
    fill(head, 7);
    mats.push_back(head);
    bytes += (row_bytes(hf, H) + scale_bytes(hf, H)) * V;
    // Graphs: the whole step; each kind of GEMV alone, 30 in a row (the lm_head 4 times).
    auto timed = [&](const std::vector<const Mat*>& chain) {
      cudaGraph_t g; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      for (auto* m : chain) launch(*m, dx, dy, st);
      CK(cudaStreamEndCapture(st, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
      for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(e0, st));
      const int n = 200;
      for (int i = 0; i < n; ++i) CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
      CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
      CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
      return ms * 1000.0 / n;
    };
    std::vector<const Mat*> step;
    for (auto& m : mats) step.push_back(&m);
    const double all = timed(step);
    printf("%-8s step of 121 GEMVs: %7.1f us (%.1f MB, %.0f GB/s)", build[b], all, bytes / 1e6, bytes / all / 1e3);
    const char* kinds[] = {"qkv", "o", "gate_up", "down"};
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<const Mat*> c;
      for (int l = 0; l < L; ++l) c.push_back(&mats[4 * l + kind]);
      printf("  %s %.2f", kinds[kind], timed(c) / L);
    }
    std::vector<const Mat*> h4(4, &mats.back());
    printf("  lm_head %.2f us each\n", timed(h4) / 4);
    for (auto& m : mats) { CK(cudaFree(m.w)); if (m.s) CK(cudaFree(m.s)); }
  }
  return bad ? 1 : 0;
}
