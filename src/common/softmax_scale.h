// The exp2-domain softmax scale both attention kernels (decode, prefill) take from the host.
#pragma once

namespace selkv::detail {

inline constexpr double kLog2e = 1.4426950408889634;

// sm_scale * log2(e), rounded once to fp32 from the double product.
inline float sm_scale_log2(float sm_scale) { return float(double(sm_scale) * kLog2e); }

}  // namespace selkv::detail
