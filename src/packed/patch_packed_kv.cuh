// C6 patch kernel (include/selkv/packed.h): records[i] -> entry positions[i] of a packed buffer,
// validity bit set with atomicOr (other entries of the word may be patched by other warps). A
// buffer whose shape words are not this call's shape (packed for another shape, or never packed)
// gets no record; instead its K word is poisoned, so that every later decode of it gives NaN rows
// (fails closed) rather than attention over records this patch should have replaced. Poisoning is
// idempotent and only ever follows a mismatch, so concurrent readers all see a mismatch either way.
// One warp per record, 41 16-byte chunks: lane l copies chunk l, lanes 0-8 also chunk 32 + l.
// Grid-stride over records (a patch is normally a handful of records: one per query row).
#pragma once

#include <cstdint>

#include "formats/device_codec.cuh"
#include "packed/packed_layout.h"

namespace selkv::packed {

inline constexpr int kPatchThreads = 128;
inline constexpr int kPatchWarps = kPatchThreads / 32;

struct PatchKernelParams {
  uint8_t* out = nullptr;
  uint32_t* validity = nullptr;
  uint64_t* shape = nullptr;  // the buffer's shape words (packed_layout.h)
  PackedShape want = {};      // this call's
  int64_t entries = 0;  // B * S_q * K
  const int64_t* positions = nullptr;
  const uint8_t* records = nullptr;
  int64_t record_stride_bytes = 0;
  int64_t num_records = 0;
};

__global__ void __launch_bounds__(kPatchThreads) patch_packed_kv_kernel(const PatchKernelParams p) {
  constexpr int kChunks = kRecordBytes / 16;  // 41
  const int lane = int(threadIdx.x) & 31;
  if (p.shape[0] != p.want.lo || p.shape[1] != p.want.hi) {  // every thread reads the same words: uniform
    if (blockIdx.x == 0 && threadIdx.x == 0)
      reinterpret_cast<uint32_t*>(p.shape)[kShapeTopkWord] = kPoisonedTopk;
    return;
  }
  const int64_t nwarps = int64_t(gridDim.x) * kPatchWarps;
  for (int64_t i = int64_t(blockIdx.x) * kPatchWarps + (int(threadIdx.x) >> 5); i < p.num_records; i += nwarps) {
    const int64_t e = __ldg(p.positions + i);
    if (e < 0 || e >= p.entries) continue;  // padding: never written (warp-uniform)
    const uint8_t* src = p.records + i * p.record_stride_bytes;
    uint8_t* dst = p.out + packed_record_offset(e);
    const uint4 a = dev::ld_nc_na_u4(src + 16 * lane);
    uint4 b = make_uint4(0u, 0u, 0u, 0u);
    if (lane < kChunks - 32) b = dev::ld_nc_na_u4(src + 16 * (32 + lane));
    dev::st_u4(dst + 16 * lane, a);
    if (lane < kChunks - 32) dev::st_u4(dst + 16 * (32 + lane), b);
    if (lane == 0) atomicOr(p.validity + e / 32, 1u << (e % 32));
  }
}

}  // namespace selkv::packed
