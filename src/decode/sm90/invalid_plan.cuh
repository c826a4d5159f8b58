// The defined result of a dynamic-top-k decode whose plan header does not match the call (a
// stale, overwritten or unwritten metadata buffer, md_header_ok): every row's out and lse are NaN.
// The lengths the call was planned for are unknown then, so no row can be computed; NaN makes
// the misuse visible instead of leaving stale outputs. Not a hot path.
#pragma once

#include <cstdint>

#include "decode/decode_params.h"

namespace selkv::decode::sm90 {

// CTA (head group blockIdx.x, part blockIdx.y) fills rows blockIdx.y, + gridDim.y, ... for its 64
// heads with 16-byte stores.
__device__ __forceinline__ void write_nan_rows(const DecodeKernelParams& p) {
  constexpr int kChunks = kHeadsPerCta * (fmt::kVDim / 8);  // 16-byte chunks of one row's 64 heads
  const uint4 nan8 = make_uint4(0x7fc07fc0u, 0x7fc07fc0u, 0x7fc07fc0u, 0x7fc07fc0u);  // bf16 NaN x 8
  const int head_base = int(blockIdx.x) * kHeadsPerCta;
  for (int32_t row = int32_t(blockIdx.y); row < p.num_rows; row += int32_t(gridDim.y)) {
    const auto [b, s] = row_coord(row, p.batch);
    uint16_t* orow = p.out + b * p.out_batch_stride + s * p.out_seq_stride;
    for (int i = int(threadIdx.x); i < kChunks; i += int(blockDim.x)) {
      const int h = head_base + i / (fmt::kVDim / 8), c = i % (fmt::kVDim / 8);
      *reinterpret_cast<uint4*>(orow + int64_t(h) * p.out_head_stride + 8 * c) = nan8;
    }
    if (int(threadIdx.x) < kHeadsPerCta)
      p.lse[b * p.lse_batch_stride + s * p.lse_seq_stride + head_base + int(threadIdx.x)] = __int_as_float(0x7fc00000);
  }
}

}  // namespace selkv::decode::sm90
