// C1 write_kv_cache kernel: bf16 latent (+ RoPE) -> FP8 records (DESIGN §1), one warp per token
// at a time, persistent warps with the next token's loads in flight.
//
// Work split (per warp = one token; 16-byte accesses fully coalesced across the warp):
//   latent 1024 B: lane l loads elements [16l, 16l+16) (two adjacent LDG.128), so lanes 8k..8k+7
//                  hold tile k and the 128-element tile amax is an 8-lane xor-shuffle max.
//   RoPE 128 B:    lanes 0-7 copy 16 B each.
//   record:        16 E4M3 bytes per lane (one 512-byte contiguous STG.128), lanes 0-3 store the
//                  four fp32 scales (one 16-byte sector), the RoPE as 8 x 16 B.
// model1_fp8 (448 codes, tiles of 64, UE8M0 scales in the page tail): the same split on lanes
// 0-27 (a tile is 4 lanes: a 4-lane shuffle max); lanes 28-31 load nothing; lanes 0-6 store the
// scale bytes and lane 7 the zero pad byte at scale_offset(in_page, page_size).
// All loads (slot, latent, RoPE) of a token are issued before the first use, and one token
// ahead of its conversion. Padded tokens (slot < 0) and slots >= num_slots are skipped after the
// loads: padding is rare, and not waiting on the slot before loading takes one memory latency off
// every token.
#pragma once

#include <cstdint>

#include "common/fast_divmod.h"
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

inline constexpr int kWriteWarps = 8;         // warps per CTA
inline constexpr int kWriteTokensPerWarp = 4;  // launcher target: tokens each warp walks through

// One token's inputs, loaded before the previous token is converted.
struct WriteTok {
  uint4 a, b, r;
  int64_t slot;
};

template <class Fmt>
__device__ __forceinline__ void write_load(const WriteKvKernelParams& p, int64_t t, int lane,
                                           WriteTok& x) {
  constexpr int kLatLanes = Fmt::kNopeDim / 16;  // 32, or 28 for model1_fp8
  x.slot = __ldg(p.slot_mapping + t);
  const uint8_t* row = p.latent + t * p.latent_row_bytes + 32 * lane;
  x.a = make_uint4(0, 0, 0, 0);
  x.b = make_uint4(0, 0, 0, 0);
  if (kLatLanes == 32 || lane < kLatLanes) {
    x.a = dev::ld_nc_na_u4(row);
    x.b = dev::ld_nc_na_u4(row + 16);
  }
  x.r = make_uint4(0, 0, 0, 0);
  if (Fmt::kHasRope && lane < 8) x.r = dev::ld_nc_na_u4(p.rope + t * p.rope_row_bytes + 16 * lane);
}

template <class Fmt, ScaleMode kMode>
__device__ __forceinline__ void write_token(const WriteKvKernelParams& p, int lane, const WriteTok& x) {
  constexpr int kLatLanes = Fmt::kNopeDim / 16;     // lanes holding codes: 32 or 28
  constexpr int kTileLanes = Fmt::kTileElems / 16;  // lanes per tile: 8 or 4
  const int64_t slot = x.slot;
  if (slot < 0 || slot >= p.num_slots) return;  // padding / out of range: never written (uniform)
  float v[16];
  {
    float lo[8], hi[8];
    dev::unpack_bf16x8(x.a, lo);
    dev::unpack_bf16x8(x.b, hi);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = lo[i];
      v[8 + i] = hi[i];
    }
  }
  // fmaxf ignores NaN like the oracle's `if (a > amax)`; |bf16| is exact in fp32.
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(v[i]));
#pragma unroll
  for (int d = kTileLanes / 2; d >= 1; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));  // 1 tile
  const float s = codec::tile_scale(m, kMode);
  if constexpr (kMode == ScaleMode::kPow2) {
    // s is a power of two (or inf), so 1/s is exact and x * (1/s) rounds exactly like x / s
    // (same real value, one IEEE rounding), subnormal results included.
    const float inv = __fdiv_rn(1.f, s);
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = __fmul_rn(v[i], inv);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = __fdiv_rn(v[i], s);  // IEEE division, as the oracle
  }
  float v0[8], v1[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v0[i] = v[i];
    v1[i] = v[8 + i];
  }
  const uint2 q0 = dev::encode_e4m3x8(v0);
  const uint2 q1 = dev::encode_e4m3x8(v1);
  // lanes < kNumTiles: scale of tile `lane`
  const float sk = __shfl_sync(0xffffffffu, s, kTileLanes * (lane % Fmt::kNumTiles));

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
  uint8_t* page = p.cache + block * p.block_stride_bytes;
  uint8_t* rec = page + Fmt::record_offset(in_page);
  if (kLatLanes == 32 || lane < kLatLanes) {
    dev::st_u4(rec + Fmt::kNopeOffset + 16 * lane, make_uint4(q0.x, q0.y, q1.x, q1.y));
  }
  if constexpr (Fmt::kScalesInRecord) {
    if (lane < Fmt::kNumTiles) *reinterpret_cast<float*>(rec + Fmt::kScaleOffset + 4 * lane) = sk;
  } else {
    // UE8M0: s is a power of two (or inf -> 0xFF), as codec::float_to_ue8m0 requires.
    if (lane < Fmt::kScaleStride) {
      page[Fmt::scale_offset(in_page, p.page_size) + lane] = lane < Fmt::kNumTiles ? codec::float_to_ue8m0(sk) : 0;
    }
  }
  if (Fmt::kHasRope && lane < 8) dev::st_u4(rec + Fmt::kRopeOffset + 16 * lane, x.r);
}

// Persistent warps: global warp g = warp * gridDim.x + blockIdx.x takes tokens g, g + W, ...
// (W = all warps; CTA-minor numbering spreads a short token range over every SM) and loads the
// next token before converting the current one, so each warp keeps two tokens in flight.
template <class Fmt, ScaleMode kMode>
__global__ void __launch_bounds__(kWriteWarps * 32)
    write_kv_cache_kernel(const WriteKvKernelParams p) {
  static_assert(dev::kWarpSplitFits<Fmt>, "record layout of the warp split");
  const int lane = threadIdx.x & 31;
  const int64_t nw = int64_t(gridDim.x) * kWriteWarps;
  int64_t t = int64_t(threadIdx.x >> 5) * gridDim.x + blockIdx.x;
  if (t >= p.num_tokens) return;  // warp-uniform
  WriteTok cur;
  write_load<Fmt>(p, t, lane, cur);
  for (;;) {
    const int64_t tn = t + nw;
    WriteTok nxt;
    const bool more = tn < p.num_tokens;
    if (more) write_load<Fmt>(p, tn, lane, nxt);
    write_token<Fmt, kMode>(p, lane, cur);
    if (!more) break;
    cur = nxt;
    t = tn;
  }
}

}  // namespace selkv::cache
