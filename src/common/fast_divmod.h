// Division by a runtime-constant positive divisor (page_size) with one mul.hi, an add and a
// shift instead of the ~20-instruction integer division. Valid for dividends in [0, 2^31).
// Method: Granlund & Montgomery, "Division by invariant integers using multiplication" (1994):
// with l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1, q = (mulhi(n, m) + n) >> l.
// The add cannot overflow because mulhi(n, m) < n < 2^31.
#pragma once

#include <cstdint>

#include "selkv/format_traits.h"  // SELKV_HD

namespace selkv {

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;

  FastDivmod() = default;
  // d in [1, 2^31] (page sizes are positive int32).
  explicit FastDivmod(uint32_t d) : divisor(d) {
    uint32_t l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    shift = l;
    multiplier = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << l) - d)) / d + 1);
  }

  // n in [0, 2^31).
  SELKV_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, multiplier);
#else
    const uint32_t hi = uint32_t((uint64_t(n) * multiplier) >> 32);
#endif
    return (hi + n) >> shift;
  }
  SELKV_HD void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

}  // namespace selkv
