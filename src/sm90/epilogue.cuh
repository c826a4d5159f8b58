// The row epilogue shared by the SM90 attention consumers (C5 decode, C7 prefill): a row's softmax
// statistics -> its output scale and lse, and the store of a warpgroup's m64n256 O accumulator
// rows (accumulator layout: common.cuh).
//
//   row_results       (max, sum) of a thread's two rows -> 1 / sum and lse; an empty row: 0, -inf
//   sink_scale        the attn_sink factor 1 / (1 + exp(sink - lse))
//   store_o_rows256   256 columns of rows r0 and r0 + 8, scaled, packed and transposed over the quad
#pragma once

#include <cmath>
#include <cstdint>

#include "sm90/wg_softmax.cuh"

namespace selkv::sm90 {

// The two rows r0 and r0 + 8 a thread holds of the accumulator.
struct RowResult2 {
  bool any0, any1;  // the row had a valid token (a NaN sum counts: the row then stays NaN, DESIGN §2)
  float lse0, lse1;  // natural-log lse: max * sm_scale + log(sum), -inf for an empty row
  float f0, f1;      // out scale: 1 / sum, 0 for an empty row
};
// m: row max in logit units (before sm_scale), l: the row's sum of exp. l == 0 only for a row with
// no valid token; a NaN that reached the softmax makes l NaN, which must not read as empty.
// kLseFirst sets only the evaluation order (same values), which moves ptxas's schedule of the
// whole kernel: each kernel keeps its own (decode: lse first, prefill: 1 / sum first).
// kFastMath: log and 1 / sum by the MUFU approximations (~2^-22 relative; no inline polynomial, no
// division slow path): ~90 fewer instructions where the epilogue's code is fetched cold (decode).
template <bool kLseFirst, bool kFastMath = false>
__device__ __forceinline__ RowResult2 row_results(float m0, float l0, float m1, float l1, float sm_scale) {
  auto log_ = [](float x) { return kFastMath ? __logf(x) : logf(x); };
  auto rcp_ = [](float x) { return kFastMath ? __fdividef(1.f, x) : 1.f / x; };
  RowResult2 r;
  r.any0 = l0 != 0.f;
  r.any1 = l1 != 0.f;
  if constexpr (kLseFirst) {
    r.lse0 = r.any0 ? m0 * sm_scale + log_(l0) : -INFINITY;
    r.lse1 = r.any1 ? m1 * sm_scale + log_(l1) : -INFINITY;
  }
  r.f0 = r.any0 ? rcp_(l0) : 0.f;
  r.f1 = r.any1 ? rcp_(l1) : 0.f;
  if constexpr (!kLseFirst) {
    r.lse0 = r.any0 ? m0 * sm_scale + log_(l0) : -INFINITY;
    r.lse1 = r.any1 ? m1 * sm_scale + log_(l1) : -INFINITY;
  }
  return r;
}

// The sink is one more softmax term with no value: it scales out only.
__device__ __forceinline__ float sink_scale(float sink, float lse) { return 1.f / (1.f + expf(sink - lse)); }

// Lane q of a quad holds word q (columns 2q, 2q + 1) of every 8-column chunk of rows r0 and r0 + 8;
// a 4 x 4 transpose over the quad gives lane q all four words of chunk 4c + q, so one 16-byte store
// per lane writes 64 contiguous bytes of each of 8 rows per warp instruction (whole sectors).
// o0 / o1: this lane's first column (8 q) of rows r0 / r0 + 8. pack(a, b, f) -> the 32-bit word of
// a * f, b * f; store(dst, v) writes 16 bytes.
template <class FragO, class Pack, class Store>
__device__ __forceinline__ void store_o_rows256(const FragO& o, float f0, float f1, int q4, uint16_t* o0, uint16_t* o1,
                                                Pack pack, Store store) {
#pragma unroll
  for (int c = 0; c < 8; ++c) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float f = r ? f1 : f0;
      uint32_t w[4];  // w[k] = word q4 of chunk 4c + k
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = 4 * (4 * c + k) + 2 * r;
        w[k] = pack(o(i), o(i + 1), f);
      }
      quad_transpose4(w, q4);
      store((r ? o1 : o0) + 32 * c, make_uint4(w[0], w[1], w[2], w[3]));
    }
  }
}

}  // namespace selkv::sm90
