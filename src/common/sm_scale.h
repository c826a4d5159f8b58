// The sm_scale rule of DESIGN §2, one definition for every op that takes a scale (decode, prefill,
// the composed routes and the CPU oracle): finite, > 0, and sm_scale * log2(e) finite in fp32.
// The kernels run exp2 on scores times sm_scale * log2(e); a scale of 0 (or one that overflows
// there) turns an all-masked max of -inf into NaN, so such scales are rejected, not computed.
#pragma once

#include <cmath>

#include "common/check.h"

namespace selkv::detail {

inline constexpr double kLog2e = 1.4426950408889634;

// sm_scale * log2(e) rounded to fp32: the value the kernels use.
inline float sm_scale_log2(float sm_scale) { return float(double(sm_scale) * kLog2e); }

inline bool valid_sm_scale(float sm_scale) {
  return std::isfinite(sm_scale) && sm_scale > 0.f && std::isfinite(sm_scale_log2(sm_scale));
}

// kInvalidArgument naming `name` (default "sm_scale") when the rule does not hold.
inline Status check_sm_scale(const char* op, float sm_scale, const char* name = "sm_scale") {
  if (valid_sm_scale(sm_scale)) return Status::Ok();
  return arg_error(op, name, "must be finite and > 0 with sm_scale * log2(e) finite in fp32, got ",
                   sm_scale);
}

}  // namespace selkv::detail
