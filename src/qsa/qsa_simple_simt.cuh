// C8 exact simple kernel, SIMT form (selkv/qsa.h): the body of one CTA per (row, kv head), fp32
// FMAs, nothing newer than SM70 (warp shuffles and ballots, plain global loads). It serves the
// fix-up pass after the page-4 kernel and, on GPUs without bf16 tensor cores, bf16 calls
// (qsa_simple.cuh picks the form; qsa_simple_mma.cuh is the tensor-core one).
//
// The CTA serves the `G` query heads of its kv head, so every selected K / V token is loaded once
// for all of them. Its warps take 32-column chunks of the row's selection in turn (chunk c goes
// to warp c % kWarps): a lane resolves one column (the validity rule of qsa_select.cuh, before any
// K / V read), a ballot gives the chunk's valid tokens, then the warp walks them with the head
// dimension spread over its lanes (D / 32 elements each): pass 1 the scores (a warp reduction per
// token and head), pass 2 the V accumulation after one online-softmax rescale per chunk. The warps'
// states are merged in warp order through shared memory, so the result depends only on the
// selection's column positions (expanded and compact forms of one selection give the same bits).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "qsa/qsa_device_util.cuh"
#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_select.cuh"

namespace selkv::qsa {

// W 32-bit words (2W elements) of one lane's share of a D-row.
template <int W>
struct Words {
  uint32_t w[W];
};

// The 2W elements of a lane's words, in fp32.
template <typename T, int W>
__device__ __forceinline__ void unpack_words(const Words<W>& x, float (&f)[2 * W]) {
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const float2 v = Elem<T>::unpack(x.w[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

template <int W>
__device__ __forceinline__ Words<W> load_words(const void* p) {
  Words<W> r;
  if constexpr (W == 4) {
    const uint4 u = __ldg(static_cast<const uint4*>(p));
    r.w[0] = u.x; r.w[1] = u.y; r.w[2] = u.z; r.w[3] = u.w;
  } else {
    static_assert(W == 2, "D / 32 elements per lane: 8 (D 256) or 4 (D 128)");
    const uint2 u = __ldg(static_cast<const uint2*>(p));
    r.w[0] = u.x; r.w[1] = u.y;
  }
  return r;
}

// Tokens whose K (pass 1) or V (pass 2) loads are issued together.
inline constexpr int kSimpleUnroll = 4;

// The warp sums of P (a power of two <= 32) values at once: at each butterfly step a lane keeps
// half of its values and adds its partner's share of them, so P - 1 + (5 - log2 P) shuffles
// instead of 5 P. Returns the sum of value (lane >> (5 - log2 P)); values never mix.
template <int P>
__device__ __forceinline__ float warp_sums_scatter(float (&v)[P], int lane) {
  static_assert(P >= 1 && P <= 32 && (P & (P - 1)) == 0, "P: a power of two up to 32");
  constexpr int kLog = P >= 32 ? 5 : P >= 16 ? 4 : P >= 8 ? 3 : P >= 4 ? 2 : P >= 2 ? 1 : 0;
#pragma unroll
  for (int k = 0; k < kLog; ++k) {  // step P >> (k + 1) over lane offset 16 >> k
    const int step = P >> (k + 1), o = 16 >> k;
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < P / 2; ++i) {
      if (i < step) {
        const float send = upper ? v[i] : v[i + step];
        const float keep = upper ? v[i + step] : v[i];
        v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, o);
      }
    }
  }
  float x = v[0];
#pragma unroll
  for (int k = kLog; k < 5; ++k) x += __shfl_xor_sync(0xFFFFFFFFu, x, 16 >> k);
  return x;
}

template <typename T, int D, int G, int kWarps>
__device__ __forceinline__ void simt_attend(const QsaSimpleParams& p) {
  constexpr int kThreads = kWarps * 32;
  constexpr int E = D / 32;  // elements per lane
  constexpr int W = E / 2;   // 32-bit words per lane
  const float kNegInf = -__int_as_float(0x7F800000);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t cta = blockIdx.x;
  const int32_t r = int32_t(cta / p.num_kv_heads);
  const int32_t kvh = int32_t(cta - int64_t(r) * p.num_kv_heads);
  if (p.only_nonfinite && !fixup_flagged<T, G>(p, r, kvh)) return;
  const RowSel rs = row_sel(p.sel, r);

  // q of the G heads, this lane's E elements, in fp32.
  float q[G][E];
  const T* qrow = static_cast<const T*>(p.io.q) + int64_t(r) * p.io.q_row_stride + int64_t(lane) * E;
#pragma unroll
  for (int h = 0; h < G; ++h) {
    const Words<W> x = load_words<W>(qrow + int64_t(kvh * G + h) * p.io.q_head_stride);
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float2 f = Elem<T>::unpack(x.w[i]);
      q[h][2 * i] = f.x;
      q[h][2 * i + 1] = f.y;
    }
  }
  float o[G][E];
  float m[G];       // running max (base-2 scores), warp-uniform
  float l_part[G];  // running sum, this lane's share (summed over the warp at the end)
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = kNegInf;
    l_part[h] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) o[h][e] = 0.f;
  }
  uint32_t nan_heads = 0;  // bit h: a NaN score reached head h (DESIGN §2: the head's out and lse are NaN)

  // Score pairs (token, head) of one round, padded to a power of two for warp_sums_scatter.
  constexpr int kPairs = pow2_ceil(kSimpleUnroll * G) < 32 ? pow2_ceil(kSimpleUnroll * G) : 32;
  static_assert(kSimpleUnroll * G <= 32, "one round's score pairs fit the warp");
  __shared__ float sm_s[kWarps][kPairs];
  const char* kbase = static_cast<const char*>(p.io.k) + (int64_t(kvh) * p.io.k_head_stride + int64_t(lane) * E) * 2;
  const char* vbase = static_cast<const char*>(p.io.v) + (int64_t(kvh) * p.io.v_head_stride + int64_t(lane) * E) * 2;

  for (int32_t chunk = warp; chunk * 32 < rs.cols; chunk += kWarps) {
    const int32_t c = chunk * 32 + lane;
    int32_t page = 0, slot = 0;
    const bool valid = c < rs.cols && resolve_token(p.sel, rs, column_token(p.sel, rs, c), &page, &slot);
    const uint32_t mask = __ballot_sync(0xFFFFFFFFu, valid);
    if (mask == 0) continue;
    const int64_t koff = valid ? (int64_t(page) * p.io.k_page_stride + int64_t(slot) * p.io.k_slot_stride) * 2 : 0;
    const int64_t voff = valid ? (int64_t(page) * p.io.v_page_stride + int64_t(slot) * p.io.v_slot_stride) * 2 : 0;

    // Pass 1: scores of the chunk's valid tokens; lane j keeps token j's.
    float s_mine[G];
#pragma unroll
    for (int h = 0; h < G; ++h) s_mine[h] = kNegInf;
    for (uint32_t rem = mask; rem != 0;) {
      int j[kSimpleUnroll];
      Words<W> kx[kSimpleUnroll];
#pragma unroll
      for (int u = 0; u < kSimpleUnroll; ++u) {
        j[u] = rem != 0 ? __ffs(rem) - 1 : -1;
        rem &= rem - 1;  // rem == 0 stays 0
        const int64_t off = __shfl_sync(0xFFFFFFFFu, koff, j[u] < 0 ? 0 : j[u]);
        if (j[u] >= 0) kx[u] = load_words<W>(kbase + off);
      }
      // This lane's partial dot products of the (token, head) pairs, summed over the warp together
      // (warp_sums_scatter), then handed to each token's lane through shared memory.
      float d[kPairs];
#pragma unroll
      for (int i = 0; i < kPairs; ++i) d[i] = 0.f;
#pragma unroll
      for (int u = 0; u < kSimpleUnroll; ++u) {
        if (j[u] < 0) continue;  // (not break: a fully unrolled loop keeps d in registers)
        float kf[E];
        unpack_words<T, W>(kx[u], kf);
#pragma unroll
        for (int h = 0; h < G; ++h)
#pragma unroll
          for (int e = 0; e < E; ++e) d[u * G + h] = fmaf(q[h][e], kf[e], d[u * G + h]);
      }
      const float sum = warp_sums_scatter<kPairs>(d, lane);
      __syncwarp();  // the previous round's reads of sm_s are done
      if ((lane & (32 / kPairs - 1)) == 0) sm_s[warp][lane / (32 / kPairs)] = sum * p.io.scale_log2;
      __syncwarp();
#pragma unroll
      for (int u = 0; u < kSimpleUnroll; ++u)
        if (lane == j[u])
#pragma unroll
          for (int h = 0; h < G; ++h) s_mine[h] = sm_s[warp][u * G + h];
    }

    // One online-softmax step for the chunk.
    float p_mine[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      if (__any_sync(0xFFFFFFFFu, s_mine[h] != s_mine[h])) nan_heads |= 1u << h;
      const float m_new = fmaxf(m[h], warp_max(s_mine[h]));
      const float alpha = m[h] == m_new ? 1.f : exp2f(m[h] - m_new);
      p_mine[h] = m_new == kNegInf ? 0.f : exp2f(s_mine[h] - m_new);  // invalid lanes: exp2(-inf) = 0
      l_part[h] = l_part[h] * alpha + p_mine[h];
#pragma unroll
      for (int e = 0; e < E; ++e) o[h][e] *= alpha;
      m[h] = m_new;
    }

    // Pass 2: o += p * V over the same tokens.
    for (uint32_t rem = mask; rem != 0;) {
      int j[kSimpleUnroll];
      Words<W> vx[kSimpleUnroll];
#pragma unroll
      for (int u = 0; u < kSimpleUnroll; ++u) {
        j[u] = rem != 0 ? __ffs(rem) - 1 : -1;
        rem &= rem - 1;
        const int64_t off = __shfl_sync(0xFFFFFFFFu, voff, j[u] < 0 ? 0 : j[u]);
        if (j[u] >= 0) vx[u] = load_words<W>(vbase + off);
      }
#pragma unroll
      for (int u = 0; u < kSimpleUnroll; ++u) {
        if (j[u] < 0) break;
        float vf[E];
        unpack_words<T, W>(vx[u], vf);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float pj = __shfl_sync(0xFFFFFFFFu, p_mine[h], j[u]);
#pragma unroll
          for (int e = 0; e < E; ++e) o[h][e] = fmaf(pj, vf[e], o[h][e]);
        }
      }
    }
  }

  // ---- merge the warps' states, in warp order ----
  __shared__ float sm_m[kWarps][G];
  __shared__ float sm_l[kWarps][G];
  __shared__ uint32_t sm_nan[kWarps];
  __shared__ float sm_o[G][D];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    const float l = warp_sum(l_part[h]);
    if (lane == 0) {
      sm_m[warp][h] = m[h];
      sm_l[warp][h] = l;
    }
  }
  if (lane == 0) sm_nan[warp] = nan_heads;
  __syncthreads();
  float scale_mine[G];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    float mx = kNegInf;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][h]);
    scale_mine[h] = m[h] == kNegInf ? 0.f : exp2f(m[h] - mx);
  }
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int h = 0; h < G; ++h)
#pragma unroll
        for (int e = 0; e < E; ++e) {
          // A warp without a valid token holds o = 0 (or NaN after NaN scores, which the flag covers).
          const float x = scale_mine[h] == 0.f ? 0.f : o[h][e] * scale_mine[h];
          float& dst = sm_o[h][lane * E + e];
          dst = w == 0 ? x : dst + x;
        }
    }
    __syncthreads();
  }

  // ---- epilogue: out = O / L (0 for an empty row, NaN after a NaN score), lse = ln(sum exp) ----
  uint32_t nan_all = 0;
  for (int w = 0; w < kWarps; ++w) nan_all |= sm_nan[w];
  const int64_t head0 = int64_t(kvh) * G;
  for (int i = int(threadIdx.x); i < G * D / 2; i += kThreads) {
    const int h = i / (D / 2), d = (i % (D / 2)) * 2;
    float mx = kNegInf, L = 0.f;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][h]);
    for (int w = 0; w < kWarps; ++w)
      if (sm_m[w][h] != kNegInf) L += sm_l[w][h] * exp2f(sm_m[w][h] - mx);
    float a, b;
    if ((nan_all >> h) & 1u) {
      a = b = __int_as_float(0x7FC00000);
    } else if (mx == kNegInf) {
      a = b = 0.f;
    } else {
      const float inv = 1.f / L;
      a = sm_o[h][d] * inv;
      b = sm_o[h][d + 1] * inv;
    }
    T* dst = static_cast<T*>(p.io.out) + int64_t(r) * p.io.out_row_stride + (head0 + h) * p.io.out_head_stride + d;
    *reinterpret_cast<uint32_t*>(dst) = Elem<T>::pack(a, b);
    if (p.io.lse != nullptr && d == 0) {
      float lse;
      if ((nan_all >> h) & 1u) lse = __int_as_float(0x7FC00000);
      else if (mx == kNegInf) lse = kNegInf;
      else lse = mx * 0.69314718055994530942f + logf(L);
      p.io.lse[int64_t(r) * p.io.lse_row_stride + (head0 + h) * p.io.lse_head_stride] = lse;
    }
  }
}

}  // namespace selkv::qsa
