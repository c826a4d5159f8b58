// C1 write_kv_cache kernel: bf16 latent (+ RoPE) -> FP8 records (DESIGN §1), one warp per token.
//
// Work split (per warp = one token; 16-byte loads fully coalesced across the warp):
//   latent 1024 B: lane l loads elements [8l, 8l+8) and [256+8l, 256+8l+8) -> two LDG.128 that
//                  each cover 512 contiguous bytes. Lane l thus holds part of tile l/16 and of
//                  tile 2 + l/16; the 128-element tile amax is a 16-lane xor-shuffle max.
//   RoPE 128 B:    lanes 0-7 copy 16 B each.
//   record:        8 E4M3 bytes per lane and half (two 256-byte contiguous STG.64 rows), the
//                  four fp32 scales as one 16-byte store by lane 0, the RoPE as 8 x 16 B.
// All loads (slot, latent, RoPE) are issued before the first use. Padded tokens (slot < 0) and
// slots >= num_slots are skipped after the loads: padding is rare, and not waiting on the slot
// before loading takes one memory latency off every token.
#pragma once

#include <cstdint>

#include "cache/fast_divmod.h"
#include "formats/codec.h"
#include "formats/device_codec.cuh"
#include "selkv/formats.h"

namespace selkv::cache {

struct WriteKvKernelParams {
  const uint8_t* latent = nullptr;   // bf16 rows, byte pointer
  int64_t latent_row_bytes = 0;
  const uint8_t* rope = nullptr;
  int64_t rope_row_bytes = 0;
  const int64_t* slot_mapping = nullptr;
  int64_t num_tokens = 0;
  uint8_t* cache = nullptr;
  int64_t num_slots = 0;
  int64_t block_stride_bytes = 0;
  int32_t page_size = 1;
  FastDivmod page;                   // divides by page_size
};

inline constexpr int kWriteWarps = 8;  // tokens per CTA

template <bool kRope, ScaleMode kMode>
__global__ void __launch_bounds__(kWriteWarps * 32)
    write_kv_cache_kernel(const WriteKvKernelParams p) {
  constexpr int kRecordBytes = kRope ? fmt::kDsMlaRecordBytes : fmt::kNopeRecordBytes;
  const int lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * kWriteWarps + (threadIdx.x >> 5);
  if (t >= p.num_tokens) return;  // warp-uniform

  const int64_t slot = __ldg(p.slot_mapping + t);
  const uint8_t* row = p.latent + t * p.latent_row_bytes;
  const uint4 va = dev::ld_stream_u4(row + 16 * lane);
  const uint4 vb = dev::ld_stream_u4(row + 512 + 16 * lane);
  uint4 vr = make_uint4(0, 0, 0, 0);
  if (kRope && lane < 8) vr = dev::ld_stream_u4(p.rope + t * p.rope_row_bytes + 16 * lane);

  if (slot < 0 || slot >= p.num_slots) return;  // padding / out of range: never written

  float xa[8], xb[8];
  dev::unpack_bf16x8(va, xa);
  dev::unpack_bf16x8(vb, xb);
  // fmaxf ignores NaN like the oracle's `if (a > amax)`; |bf16| is exact in fp32.
  float ma = 0.f, mb = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    ma = fmaxf(ma, fabsf(xa[i]));
    mb = fmaxf(mb, fabsf(xb[i]));
  }
#pragma unroll
  for (int d = 8; d >= 1; d >>= 1) {  // 16-lane groups = one 128-element tile each
    ma = fmaxf(ma, __shfl_xor_sync(0xffffffffu, ma, d));
    mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, d));
  }
  const float sa = codec::tile_scale(ma, kMode);
  const float sb = codec::tile_scale(mb, kMode);
  if constexpr (kMode == ScaleMode::kPow2) {
    // s is a power of two (or inf), so 1/s is exact and x * (1/s) rounds exactly like x / s
    // (same real value, one IEEE rounding), subnormal results included.
    const float ia = __fdiv_rn(1.f, sa), ib = __fdiv_rn(1.f, sb);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      xa[i] = __fmul_rn(xa[i], ia);
      xb[i] = __fmul_rn(xb[i], ib);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // the oracle divides: IEEE division, never an approximation
      xa[i] = __fdiv_rn(xa[i], sa);
      xb[i] = __fdiv_rn(xb[i], sb);
    }
  }
  const uint2 qa = dev::encode_e4m3x8(xa);
  const uint2 qb = dev::encode_e4m3x8(xb);
  const float sa_hi = __shfl_sync(0xffffffffu, sa, 16);  // tile 1 scale
  const float sb_hi = __shfl_sync(0xffffffffu, sb, 16);  // tile 3 scale

  int64_t block, in_page;
  if (slot <= int64_t(0x7fffffff)) {
    uint32_t q, r;
    p.page.divmod(uint32_t(slot), q, r);
    block = q;
    in_page = r;
  } else {
    block = slot / p.page_size;
    in_page = slot - block * p.page_size;
  }
  uint8_t* rec = p.cache + block * p.block_stride_bytes + in_page * kRecordBytes;
  dev::st_u2(rec + fmt::kNopeOffset + 8 * lane, qa);
  dev::st_u2(rec + fmt::kNopeOffset + 256 + 8 * lane, qb);
  if (lane == 0) {
    *reinterpret_cast<float4*>(rec + fmt::kScaleOffset) = make_float4(sa, sa_hi, sb, sb_hi);
  }
  if (kRope && lane < 8) dev::st_u4(rec + fmt::kRopeOffset + 16 * lane, vr);
}

}  // namespace selkv::cache
