// Scalar codecs shared by host code, device code and the CPU oracle: bf16 <-> fp32,
// FP8 E4M3 (round-to-nearest-even, saturating to +-448) and the per-tile scale rule.
// Everything here is integer bit manipulation so host and device give identical bits without
// depending on the FP rounding mode. Device kernels may use the hardware converters instead
// (see device_codec.cuh); tests check those agree with these bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "selkv/formats.h"

namespace selkv::codec {

SELKV_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

SELKV_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

SELKV_HD float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

// fp32 -> bf16, round to nearest even; every NaN becomes the canonical 0x7FFF, as the device's
// cvt.rn.bf16.f32 produces, so host and device results are bit-identical even for NaN.
SELKV_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding_bias) >> 16);
}

// Round-to-nearest-even of (value >> shift) for an unsigned integer significand.
SELKV_HD uint32_t shift_rne(uint32_t value, int shift) {
  if (shift <= 0) return value;
  if (shift >= 32) return 0;
  const uint32_t keep = value >> shift;
  const uint32_t rem = value & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return keep + ((rem > half || (rem == half && (keep & 1u))) ? 1u : 0u);
}

// IEEE fp16 -> fp32 (exact).
SELKV_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24, exact in fp32.
  const float mag = float(man) * bits_float(0x33800000u);
  return sign ? -mag : mag;
}

// fp32 -> fp16, round to nearest even, overflow to inf; NaN -> the canonical 0x7FFF, as the
// device's cvt.rn.f16.f32 produces.
SELKV_HD uint16_t float_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  const int exp = int(a >> 23) - 127;
  if (exp >= -14) {  // normal: drop 13 mantissa bits (a carry into the exponent is right)
    const uint32_t v = ((uint32_t(exp + 15) << 10) | ((a >> 13) & 0x3ffu));
    const uint32_t rem = a & 0x1fffu;
    return uint16_t(sign | (v + ((rem > 0x1000u || (rem == 0x1000u && (v & 1u))) ? 1u : 0u)));
  }
  if (exp < -25) return sign;  // below half the smallest subnormal
  // Subnormal: significand with the implicit bit, shifted to units of 2^-24.
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  return uint16_t(sign | shift_rne(sig, -exp - 1));
}

// fp32 -> E4M3 byte: round to nearest even, saturate finite overflow and inf to +-448 (0x7E),
// NaN -> 0x7F. Matches cvt.rn.satfinite.e4m3x2.f32.
SELKV_HD uint8_t float_to_e4m3(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;               // NaN
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7e);  // |x| >= 448 (inf included): saturate
  const int e = int(a >> 23) - 127;
  const uint32_t sig = (a & 0x7fffffu) | (a >= 0x00800000u ? 0x800000u : 0u);
  uint32_t code;
  if (e >= -6) {
    // normal: 1.m x 2^e -> 3 mantissa bits; a carry out of the mantissa bumps the exponent.
    code = (uint32_t(e + 7) << 3) + shift_rne(a & 0x7fffffu, 20);
  } else {
    // subnormal: value in units of 2^-9 is sig * 2^(e + 9 - 23).
    code = a < 0x00800000u ? 0u : shift_rne(sig, 14 - e);
  }
  if (code > 0x7e) code = 0x7e;
  return uint8_t(sign | code);
}

SELKV_HD float e4m3_to_float(uint8_t c) {
  const uint32_t e = (c >> 3) & 0xfu;
  const uint32_t m = c & 0x7u;
  float v;
  if ((c & 0x7f) == 0x7f) {
    v = bits_float(0x7fc00000u);
  } else if (e == 0) {
    v = float(m) * (1.0f / 512.0f);
  } else {
    v = bits_float(((e + 120u) << 23) | (m << 20));  // (1 + m/8) * 2^(e-7)
  }
  return (c & 0x80) ? -v : v;
}

// Per-tile scale from the tile's max |x| (DESIGN §1).
SELKV_HD float tile_scale(float amax, ScaleMode mode) {
  if (mode == ScaleMode::kAmax) {
    const float s = amax / fmt::kE4m3Max;
    return s >= 1.17549435e-38f ? s : 1.17549435e-38f;  // max(amax/448, FLT_MIN)
  }
  float v = amax / fmt::kE4m3Max;
  if (!(v >= fmt::kPow2ScaleFloor)) v = fmt::kPow2ScaleFloor;
  const uint32_t b = float_bits(v);
  int e = int(b >> 23) - 127;       // v is normal: floor(log2 v)
  if (b & 0x7fffffu) e += 1;        // ceil(log2 v)
  if (e > 127) return bits_float(0x7f800000u);
  return bits_float(uint32_t(e + 127) << 23);
}

// UE8M0 (float8_e8m0fnu, MODEL1's scale type): byte b is 2^(b - 127); 0xFF is NaN; no sign,
// no zero. b = 0 is 2^-127, an fp32 subnormal.
SELKV_HD float ue8m0_to_float(uint8_t b) {
  if (b == 0xffu) return bits_float(0x7fc00000u);
  if (b == 0) return bits_float(0x00400000u);
  return bits_float(uint32_t(b) << 23);
}

// Scale -> UE8M0 byte, for the writer's pow2 scales (powers of two in [2^-127, 2^127], where it
// is exact: the fp32 exponent field, 2^-127 the one subnormal); inf and NaN -> 0xFF (NaN), as
// torch's float8_e8m0fnu cast gives. Other values keep their exponent field (2^floor(log2 s)).
SELKV_HD uint8_t float_to_ue8m0(float s) {
  const uint32_t a = float_bits(s) & 0x7fffffffu;
  if (a >= 0x7f800000u) return 0xffu;
  if (a == 0x00400000u) return 0;
  return uint8_t(a >> 23);
}

// Reader rule: bf16(float(e4m3) * s).
SELKV_HD uint16_t dequant_e4m3(uint8_t c, float scale) {
  return float_to_bf16(e4m3_to_float(c) * scale);
}

}  // namespace selkv::codec
