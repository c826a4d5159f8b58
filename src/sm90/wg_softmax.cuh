// Warpgroup primitives for SM90 attention consumers that hold a wgmma m64nNk16 f32 accumulator
// of S = Q K^T and run the online softmax on it (used by the C7 prefill v3 and the C5 decode's
// softmax warpgroup: one copy of the masking / row-max / exp2 arithmetic).
//
//   Accumulator fragment (common.cuh): value i of thread (warp w, lane l) of the warpgroup is
//   row 16 w + l / 4 + 8 * ((i >> 1) & 1), column 8 * (i >> 2) + 2 * (l % 4) + (i & 1).
//   The A-operand register fragment of an RS wgmma m64nNk16 (bf16) uses the same order: its
//   k-block kb holds accumulator values [8 kb, 8 kb + 8) of an m64n(16 kb + 16) accumulator, so
//   packing value pairs (2j, 2j + 1) into bf16x2 word j gives the A fragment directly.
//
//   row_valid_mask64   validity of 64 consecutive top-k entries (DESIGN §2 rule) as a 64-bit mask.
//   wg_mask_rowmax     masks invalid columns to -inf and returns the two row maxima of a thread.
//   wg_online_softmax64  exp2 of S against the new row max, row sums, the old-O rescale factor.
//   OnlineSoftmax2     a thread's two rows' running max and sums, stepped by the two above.
//   pack_bf16_pairs    accumulator values -> bf16x2 words (the RS A fragment), optional row scale.
//   quad_sum           the sum over a quad (one accumulator row's 4 threads).
//   quad_transpose4    4 x 4 word transpose over a quad (accumulator words -> 16-byte row chunks).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "sm90/common.cuh"

namespace selkv::sm90 {

// Entries k0 + lane and k0 + 32 + lane of idx_row: valid iff k < len and 0 <= idx < n. Entries at
// or past len are not loaded. Bit j of the result = entry k0 + j. Warp-collective.
__device__ __forceinline__ uint64_t row_valid_mask64(const int32_t* idx_row, int32_t k0, int32_t len,
                                                     int64_t n, int lane) {
  const int32_t ka = k0 + lane, kb = k0 + 32 + lane;
  int32_t ia = -1, ib = -1;
  if (ka < len) ia = __ldg(idx_row + ka);
  if (kb < len) ib = __ldg(idx_row + kb);
  const bool va = ia >= 0 && int64_t(ia) < n;
  const bool vb = ib >= 0 && int64_t(ib) < n;
  const uint32_t lo = __ballot_sync(0xffffffffu, va), hi = __ballot_sync(0xffffffffu, vb);
  return (uint64_t(hi) << 32) | lo;
}

// s: 32 accumulator values of an m64n64 S fragment. Invalid columns become -inf; returns the
// row maxima (rows r0 and r0 + 8) over the 4 lanes of the quad.
template <class FragS>
__device__ __forceinline__ void wg_mask_rowmax64(FragS& s, uint64_t valid, int lane, float& mx0, float& mx1) {
  const uint64_t v = valid >> (2 * (lane & 3));
  mx0 = -INFINITY;
  mx1 = -INFINITY;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int bit = 8 * (i >> 2) + (i & 1);
    if (!((v >> bit) & 1u)) s(i) = -INFINITY;
    if ((i >> 1) & 1) mx1 = fmaxf(mx1, s(i)); else mx0 = fmaxf(mx0, s(i));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
}

// Sum over the 4 lanes of a quad (the 4 threads holding one accumulator row): row sums at the end.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// p[i] = exp2(s[i] * sl2 - base_row); returns the per-thread row sums (not quad-reduced).
template <class FragS>
__device__ __forceinline__ void wg_exp2_rows64(FragS& s, float sl2, float base0, float base1, float& ps0,
                                               float& ps1) {
  ps0 = 0.f;
  ps1 = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const bool hi = (i >> 1) & 1;
    const float pv = exp2_ftz(fmaf(s(i), sl2, hi ? -base1 : -base0));
    s(i) = pv;
    if (hi) ps1 += pv; else ps0 += pv;
  }
}

// One online-softmax step for the thread's rows r0 and r0 + 8 of an m64n64 S fragment: m is the
// running max before this block, mn after it (>= m; -inf while nothing is valid, where the base
// 0 keeps exp2 finite). P = exp2(s * sl2 - mn * sl2) in place, l = l * sc + rowsum(P) (not
// quad-reduced); returns sc = exp2((m - mn) * sl2), the factor for the old O.
template <class FragS>
__device__ __forceinline__ float2 wg_online_softmax64(FragS& s, float sl2, float m0, float m1, float mn0, float mn1,
                                                      float& l0, float& l1) {
  const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
  const float2 sc = make_float2(exp2_ftz((m0 - mu0) * sl2), exp2_ftz((m1 - mu1) * sl2));
  float ps0, ps1;
  wg_exp2_rows64(s, sl2, mu0 * sl2, mu1 * sl2, ps0, ps1);
  l0 = l0 * sc.x + ps0;
  l1 = l1 * sc.y + ps1;
  return sc;
}

// The online-softmax state of a thread's rows r0 and r0 + 8: running maxima m in logit units
// (-inf while nothing is valid) and running per-thread sums l (quad-reduced by finish()).
struct OnlineSoftmax2 {
  // This member order gives both consumers the SASS of the four separate locals the struct
  // replaced (the order in which the compiler promotes the members sets its register numbering).
  float l1 = 0.f;
  float l0 = 0.f;
  float m0 = -INFINITY;
  float m1 = -INFINITY;

  // Masks the block's invalid columns of s to -inf; the block's row maxima (quad-reduced).
  template <class FragS>
  __device__ __forceinline__ float2 rowmax(FragS& s, uint64_t valid, int lane) const {
    float mx0, mx1;
    wg_mask_rowmax64(s, valid, lane, mx0, mx1);
    return make_float2(mx0, mx1);
  }
  // P = exp2(s * sl2 - mn * sl2) in place and the sums for the new maxima mn (>= m), which become
  // the running maxima; returns the factors for the old O.
  template <class FragS>
  __device__ __forceinline__ float2 advance(FragS& s, float sl2, float mn0, float mn1) {
    const float2 sc = wg_online_softmax64(s, sl2, m0, m1, mn0, mn1, l0, l1);
    m0 = mn0;
    m1 = mn1;
    return sc;
  }
  // Row end: the sums over the row's quad.
  __device__ __forceinline__ void finish() {
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
  }
};

// words[j] = bf16x2(s[2j] * f_row, s[2j + 1] * f_row).
template <class FragS, class FragW>
__device__ __forceinline__ void pack_bf16_pairs64(const FragS& s, FragW& w) {
#pragma unroll
  for (int j = 0; j < 16; ++j) w(j) = bf16x2_bits(s(2 * j), s(2 * j + 1));
}
template <class FragS, class FragW>
__device__ __forceinline__ void pack_bf16_pairs64_scaled(const FragS& s, float f0, float f1, FragW& w) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float f = (j & 1) ? f1 : f0;  // value pair 2j, 2j+1 is row r0 + 8 * (j & 1)
    w(j) = bf16x2_bits(s(2 * j) * f, s(2 * j + 1) * f);
  }
}

// 4 x 4 transpose of 32-bit words over the 4 lanes of a quad (q = lane & 3): on entry lane q holds
// w[k] = M[q][k], on exit w[k] = M[k][q]. Two xor-shuffle stages (lane bit 0, then bit 1), each
// lane sending the word it is about to replace: 4 SHFL per call.
__device__ __forceinline__ void quad_transpose4(uint32_t (&w)[4], int q) {
  const bool b0 = (q & 1) != 0, b1 = (q & 2) != 0;
#pragma unroll
  for (int k1 = 0; k1 < 2; ++k1) {
    uint32_t& x = w[2 * k1];
    uint32_t& y = w[2 * k1 + 1];
    const uint32_t r = __shfl_xor_sync(0xffffffffu, b0 ? x : y, 1);
    if (b0) x = r; else y = r;
  }
#pragma unroll
  for (int k0 = 0; k0 < 2; ++k0) {
    uint32_t& x = w[k0];
    uint32_t& y = w[k0 + 2];
    const uint32_t r = __shfl_xor_sync(0xffffffffu, b1 ? x : y, 2);
    if (b1) x = r; else y = r;
  }
}

// Store bf16x2 words (pairs of an m64n64 fragment) into a 64 x 64 SW128 tile (row-major 128 B
// rows, chunk j of row r at j ^ (r & 7)). Conflict-free: per instruction lanes (rr, q) hit bank
// 4 * ((chunk ^ rr) & 7) + q.
template <class FragW>
__device__ __forceinline__ void store_p_tile64(uint32_t* tile_words, const FragW& w, int r0, int lane) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int row = (j & 1) ? r0 + 8 : r0;
    const int chunk = j >> 1;  // 8-column group of value pair 2j
    tile_words[row * 32 + (((chunk ^ (row & 7)) & 7) << 2) + (lane & 3)] = w(j);
  }
}

// L2 cache-policy helpers (createpolicy; the policy operand of .L2::cache_hint accesses).
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint64_t l2_policy_evict_normal() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
// 16-byte cp.async.cg with an L2 cache policy; zero-filled without a global read when !valid.
__device__ __forceinline__ void cp_async_16_hint(uint32_t smem_addr, const void* gptr, bool valid, uint64_t pol) {
  const uint32_t src_bytes = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_addr), "l"(gptr),
               "r"(src_bytes), "l"(pol)
               : "memory");
}
// Both: the 256-byte L2 prefetch and an L2 cache policy (kv gathers kept with evict-last).
__device__ __forceinline__ void cp_async_16_pf256_hint(uint32_t smem_addr, const void* gptr, bool valid, uint64_t pol) {
  const uint32_t src_bytes = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(smem_addr),
               "l"(gptr), "r"(src_bytes), "l"(pol)
               : "memory");
}
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
// 16-byte global store with an L2 cache policy.
__device__ __forceinline__ void st_global_16_hint(void* gptr, uint4 v, uint64_t pol) {
  asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(gptr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w), "l"(pol)
               : "memory");
}

}  // namespace selkv::sm90
