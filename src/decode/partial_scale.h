// fp16 split partials (DecodePartials::kFp16, decode_params.h), host and device. Each (slot, head,
// d_v half) holds the row's O unnormalized, in fp16, and one float inverse scale the combine
// multiplies it by: 1 / sum where O's |max| rounds into [2^-13, 65504] in fp16 (the usual case:
// no multiply in the decode epilogue), else O times the power of two `scale` below and
// inv = `inv` / sum (data far from unit scale; the power of two rounds nothing). 0 for an empty
// row, NaN for a NaN row (sm90/consumer.cuh stage_f16_partial).
#pragma once

#include <cstdint>
#include <cstring>

#include "decode/decode_params.h"

namespace selkv::decode {

// Workspace layout with fp16 partials: the 2 * parts fp16 slots (partial_slot_elems apart) fill the
// first half of accum_out's accum_out_floats; the inverse scales [2 * parts, H, 2 (d_v half)] start
// right after them.
SELKV_DEC_HD int64_t f16_inv_scales_offset(int32_t num_sm_parts, int32_t num_heads) {  // in floats
  return int64_t(num_sm_parts) * partial_slot_elems(num_heads, true);  // 2 * parts slots of halves
}

struct PartialScale {
  float scale, inv;
};

SELKV_DEC_HD float pow2_float(int k) {  // 2^k for k in [-126, 127]
  const uint32_t bits = uint32_t(127 + k) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// For the max m >= 0 of the values to store: m * scale lands in [2^13, 2^14) (far below fp16's
// 65504, far above its subnormals), clamped to normal powers of two; 1 for 0, inf and nan (those
// propagate unscaled).
SELKV_DEC_HD PartialScale f16_partial_scale(float m) {
  uint32_t bits;
  std::memcpy(&bits, &m, sizeof bits);
  const int e = int((bits >> 23) & 0xffu);  // biased exponent
  if (e == 0xff || m == 0.f) return PartialScale{1.f, 1.f};
  int k = 13 - (e - 127);
  k = k > 126 ? 126 : (k < -126 ? -126 : k);
  return PartialScale{pow2_float(k), pow2_float(-k)};
}

}  // namespace selkv::decode
