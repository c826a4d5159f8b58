// Internal (device-side) parameters of the C5 sparse MLA decode, and the metadata layout shared
// by the scheduler, the decode kernel and the combine kernel. Arch-neutral.
#pragma once

#include <cstdint>

#include "selkv/formats.h"

#if defined(__CUDACC__)
#define SELKV_DEC_HD __host__ __device__ __forceinline__
#else
#define SELKV_DEC_HD inline
#endif

namespace selkv::decode {

inline constexpr int kBlockTokens = 64;      // selected tokens per KV block (TOPK_BLOCK_SIZE)
inline constexpr int kHeadsPerCta = 64;      // query heads per CTA (one wgmma M tile)
// Scheduler: do not split finer than this many 64-token blocks per part. Each part costs a Q
// load, a partial write and a combine read. Measured at 2a59009+ (H200, quick grid): H = 64 B = 1
// 1 / 2 / 4 blocks: 36.2 / 28.7 / 30.5 us; H = 128 B = 2 S_q = 2 (2-CTA clusters): 2 / 4 blocks:
// 37.4 / 30.0 us. Large batches are capped by the SM count and do not see it.
SELKV_DEC_HD constexpr int min_blocks_per_part(int num_heads) { return num_heads == 128 ? 4 : 2; }

// Metadata buffer (int32, device):
//   [0] T = total blocks   [1] NP = effective number of parts   [2] rows   [3] magic
//   [4..7] reserved        [8 .. 8+rows] P = prefix sums of blocks per row (P[0] = 0)
inline constexpr int kMdHeaderInts = 8;
inline constexpr int32_t kMdMagic = 0x5e1c0de5;

// Part p of NP owns global blocks [part_begin(p), part_begin(p+1)).
SELKV_DEC_HD int32_t part_begin(int32_t p, int32_t total, int32_t np) {
  return int32_t((int64_t(p) * total) / np);
}
// The part that owns global block g (0 <= g < total).
SELKV_DEC_HD int32_t part_of(int32_t g, int32_t total, int32_t np) {
  return int32_t((int64_t(g + 1) * np + total - 1) / total) - 1;
}

struct DecodeKernelParams {
  const uint16_t* q;  // bf16
  int64_t q_batch_stride, q_seq_stride, q_head_stride;
  int32_t batch, seq_q, num_heads, topk;
  int32_t num_rows;  // batch * seq_q

  const uint8_t* cache;
  int64_t num_slots;
  int32_t page_size;
  int64_t block_stride_bytes;

  const int32_t* indices;
  int64_t indices_batch_stride, indices_seq_stride;
  const int32_t* topk_length;  // only read by the dynamic specialization
  const float* attn_sink;      // [H] or null

  float sm_scale;
  float sm_scale_log2;  // sm_scale * log2(e)

  uint16_t* out;  // bf16
  int64_t out_batch_stride, out_seq_stride, out_head_stride;
  float* lse;
  int64_t lse_batch_stride, lse_seq_stride;

  const int32_t* metadata;  // see layout above
  int32_t num_sm_parts;     // gridDim.x; parts >= NP exit at once
  float* accum_out;         // [2 * num_sm_parts, H, 512] fp32 (normalized partial out)
  float* accum_lse;         // [2 * num_sm_parts, H]
};

}  // namespace selkv::decode
