// Device-side vector codecs for the FP8 KV records, built on the SM89+/SM90 hardware converters.
// They must give the same bits as the scalar rules in codec.h (the oracle's); tests/cpp/
// test_cache_ops_gpu.cu sweeps all 256 codes and millions of floats to prove it.
//
//   encode: cvt.rn.satfinite.e4m3x2.f32 == codec::float_to_e4m3 (RNE, +-448 saturation,
//           NaN -> 0x7F).
//   decode: e4m3 -> f16 (exact: every E4M3 value is an f16) -> f32 (exact) -> * s (one fp32
//           rounding, as the oracle) -> bf16 RNE. Equal to codec::dequant_e4m3 for every
//           non-NaN result; NaN results come out as the canonical 0x7FFF where the oracle keeps
//           the host CPU's NaN payload (NaN only arises from corrupt records: the writer never
//           emits code 0x7F/0xFF for finite input).
//   decode, power-of-two scales (model1_fp8): e4m3 -> bf16 (exact) times the scale in bf16 (one
//           RNE rounding of the same exact product): the same bits as the rule above.
//
// Define SELKV_E4M3_SOFTWARE to route everything through the integer codec instead (slower; an
// escape hatch should a toolchain/driver ever disagree with codec.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "formats/codec.h"

namespace selkv::dev {

// The cache kernels split one record over a warp's 32 lanes with fixed lane -> tile maps. Two
// layouts fit: 512 codes in 4 tiles of 128 with fp32 scales inside the record (ds_mla_fp8,
// nope_fp8), and 448 codes in 7 tiles of 64 with UE8M0 scales in the page tail (model1_fp8).
template <class Fmt>
inline constexpr bool kSplit512 = Fmt::kNopeDim == 512 && Fmt::kTileElems == 128 &&
                                  Fmt::kScalesInRecord && sizeof(typename Fmt::Scale) == 4;
template <class Fmt>
inline constexpr bool kSplit448 = Fmt::kNopeDim == 448 && Fmt::kTileElems == 64 && !Fmt::kScalesInRecord &&
                                  sizeof(typename Fmt::Scale) == 1 && Fmt::kHasRope && Fmt::kRopeDim == 64;
template <class Fmt>
inline constexpr bool kWarpSplitFits = kSplit512<Fmt> || kSplit448<Fmt>;

// Readers (C3, C4): lane l holds codes [8l, 8l + 8) ("lo", tile 8l / kTileElems) and, for the
// lanes with 256 + 8l < kNopeDim, codes [256 + 8l, 256 + 8l + 8) ("hi"): 32 hi lanes for 512
// codes, 24 for 448. Output bytes 16l and 512 + 16l of the bf16 row either way.
template <class Fmt>
inline constexpr int kHiLanes = (Fmt::kNopeDim - 256) / 8;

// ---- UE8M0 -----------------------------------------------------------------------------------
// Device twin of codec::ue8m0_to_float (integer only, so bit-identical by construction).
__device__ __forceinline__ float ue8m0_to_float(uint32_t b) {
  b &= 0xffu;
  return b == 0xffu ? __uint_as_float(0x7fc00000u) : b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(b << 23);
}

// model1_fp8 readers: this lane's two tile scales (lo: tile lane / 8, hi: tile 4 + lane / 8) from
// the token's 8 UE8M0 bytes at `scales` (8-byte aligned, one broadcast load). Lanes >= kHiLanes
// get the pad byte as hi scale and must not use it.
__device__ __forceinline__ void ue8m0_lane_scales(const uint8_t* scales, int lane, float& slo, float& shi) {
  const uint2 w = __ldg(reinterpret_cast<const uint2*>(scales));
  const int sh = 8 * (lane >> 3);
  slo = ue8m0_to_float(w.x >> sh);
  shi = ue8m0_to_float(w.y >> sh);
}

// ---- bf16 <-> fp32 ---------------------------------------------------------------------------
// Two bf16 packed in a uint32 (element 0 in the low half) -> two exact floats.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// 8 bf16 (one uint4) -> 8 floats.
__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float (&x)[8]) {
  x[0] = bf16_lo(v.x); x[1] = bf16_hi(v.x);
  x[2] = bf16_lo(v.y); x[3] = bf16_hi(v.y);
  x[4] = bf16_lo(v.z); x[5] = bf16_hi(v.z);
  x[6] = bf16_lo(v.w); x[7] = bf16_hi(v.w);
}

// ---- E4M3 encode -----------------------------------------------------------------------------
// Two floats -> two E4M3 bytes (a in the low byte).
__device__ __forceinline__ uint32_t e4m3x2(float a, float b) {
#if defined(SELKV_E4M3_SOFTWARE)
  return uint32_t(codec::float_to_e4m3(a)) | (uint32_t(codec::float_to_e4m3(b)) << 8);
#else
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
#endif
}

__device__ __forceinline__ uint8_t e4m3(float a) { return uint8_t(e4m3x2(a, 0.f) & 0xffu); }

// 8 floats -> 8 E4M3 bytes (element 0 in the lowest byte of .x).
__device__ __forceinline__ uint2 encode_e4m3x8(const float (&x)[8]) {
  uint2 r;
  r.x = e4m3x2(x[0], x[1]) | (e4m3x2(x[2], x[3]) << 16);
  r.y = e4m3x2(x[4], x[5]) | (e4m3x2(x[6], x[7]) << 16);
  return r;
}

// ---- E4M3 decode -----------------------------------------------------------------------------
// Two E4M3 bytes (low 16 bits of `codes`) -> two exact floats.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t codes) {
#if defined(SELKV_E4M3_SOFTWARE)
  return make_float2(codec::e4m3_to_float(uint8_t(codes)), codec::e4m3_to_float(uint8_t(codes >> 8)));
#else
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
#endif
}

__device__ __forceinline__ float e4m3_to_float(uint8_t c) { return e4m3x2_to_float2(c).x; }

// Reader rule bf16(float(e4m3) * s) for two codes -> packed bf16x2 (first code in the low half).
__device__ __forceinline__ uint32_t dequant_e4m3x2(uint32_t codes, float s) {
  const float2 f = e4m3x2_to_float2(codes);
  const float a = __fmul_rn(f.x, s);  // _rn: one rounding, never contracted into an FMA
  const float b = __fmul_rn(f.y, s);
#if defined(SELKV_E4M3_SOFTWARE)
  return uint32_t(codec::float_to_bf16(a)) | (uint32_t(codec::float_to_bf16(b)) << 16);
#else
  const __nv_bfloat162 v = __float22bfloat162_rn(make_float2(a, b));
  return *reinterpret_cast<const uint32_t*>(&v);
#endif
}

// 4 E4M3 codes (byte i = element i) -> 4 exact floats (elements 0, 1 in .x, .y of the first).
// The two cvt.rn.f16x2.e4m3x2 read the halves of `w` as 16-bit registers, which ptxas maps to the
// F2FP source half selector (R.H1) instead of a shift per word (`w >> 16`: one SHF per 4 values).
__device__ __forceinline__ void e4m3x4_to_float2x2(uint32_t w, float2& f01, float2& f23) {
  uint32_t r01, r23;
  asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\n\tcvt.rn.f16x2.e4m3x2 %1, hi;\n\t}"
      : "=r"(r01), "=r"(r23)
      : "r"(w));
  f01 = __half22float2(*reinterpret_cast<const __half2*>(&r01));
  f23 = __half22float2(*reinterpret_cast<const __half2*>(&r23));
}

// 4 E4M3 codes (byte i = element i) with one scale -> 4 bf16 (one uint2).
__device__ __forceinline__ uint2 dequant_e4m3x4(uint32_t w, float s) {
#if defined(SELKV_E4M3_SOFTWARE)
  return make_uint2(dequant_e4m3x2(w, s), dequant_e4m3x2(w >> 16, s));
#else
  float2 f01, f23;
  e4m3x4_to_float2x2(w, f01, f23);
  const __nv_bfloat162 v01 = __floats2bfloat162_rn(__fmul_rn(f01.x, s), __fmul_rn(f01.y, s));
  const __nv_bfloat162 v23 = __floats2bfloat162_rn(__fmul_rn(f23.x, s), __fmul_rn(f23.y, s));
  return make_uint2(*reinterpret_cast<const uint32_t*>(&v01), *reinterpret_cast<const uint32_t*>(&v23));
#endif
}

// Power-of-two scales (model1_fp8's UE8M0): bf16(e4m3 * 2^e) equals bf16(e4m3) * bf16(2^e) with
// one RNE rounding, because bf16(e4m3) and bf16(2^e) are exact and both sides round the same exact
// product. One bf16x2 multiply then replaces two fp32 multiplies and a pack (5 instructions per
// two codes instead of 6). `scale2` is ue8m0_bf16x2's scale in both halves.
__device__ __forceinline__ uint32_t ue8m0_bf16x2(uint32_t b) {
  // A power of two's (and 2^-127's and NaN's) fp32 high half is its exact bf16.
  return __byte_perm(__float_as_uint(ue8m0_to_float(b)), 0u, 0x3232);
}

__device__ __forceinline__ uint2 dequant_e4m3x4_pow2(uint32_t w, uint32_t scale2) {
#if defined(SELKV_E4M3_SOFTWARE)
  return dequant_e4m3x4(w, bf16_lo(scale2));
#else
  float2 f01, f23;
  e4m3x4_to_float2x2(w, f01, f23);
  const __nv_bfloat162 sc = *reinterpret_cast<const __nv_bfloat162*>(&scale2);
  const __nv_bfloat162 v01 = __hmul2_rn(__floats2bfloat162_rn(f01.x, f01.y), sc);
  const __nv_bfloat162 v23 = __hmul2_rn(__floats2bfloat162_rn(f23.x, f23.y), sc);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&v01), *reinterpret_cast<const uint32_t*>(&v23));
#endif
}

// 8 E4M3 codes (uint2, element 0 in the lowest byte) with one scale -> 8 bf16 (one uint4).
__device__ __forceinline__ uint4 dequant_e4m3x8(const uint2& c, float s) {
  const uint2 a = dequant_e4m3x4(c.x, s), b = dequant_e4m3x4(c.y, s);
  return make_uint4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ uint16_t dequant_e4m3(uint8_t c, float s) {
  return uint16_t(dequant_e4m3x2(c, s) & 0xffffu);
}

// ---- memory helpers --------------------------------------------------------------------------
// Streaming (read-once) 16/8-byte loads: bypass L1 allocation so the cache data does not evict
// the small, reused tables (block table, prefix sums).
__device__ __forceinline__ uint4 ld_stream_u4(const void* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint2 ld_stream_u2(const void* p) {
  return __ldcs(reinterpret_cast<const uint2*>(p));
}
// Read-once 16-byte load through the non-coherent path without allocating in L1
// (inputs of the cache ops are never written by the same kernel).
__device__ __forceinline__ uint4 ld_nc_na_u4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// The same when `pred`, else zeros with no memory access (one predicated load: the zero default is
// the load's own target register, so nothing waits on the load to select it).
__device__ __forceinline__ uint4 ld_nc_na_u4_pred(const void* p, bool pred) {
  uint4 v;
  asm volatile(
      "{\n\t.reg .pred q;\n\t"
      "setp.ne.b32 q, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(int(pred)));
  return v;
}
__device__ __forceinline__ uint2 ld_nc_na_u2(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ void st_u4(void* p, const uint4& v) { *reinterpret_cast<uint4*>(p) = v; }

}  // namespace selkv::dev
