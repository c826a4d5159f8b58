// Codec unit tests (bf16, E4M3, tile scale) and the golden record vectors (DESIGN §1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/dispatch.h"
#include "formats/codec.h"
#include "reference/oracle.h"
#include "test_util.h"

namespace selkv {
namespace {

using codec::bf16_to_float;
using codec::bits_float;
using codec::e4m3_to_float;
using codec::float_bits;
using codec::float_to_bf16;
using codec::float_to_e4m3;

// ---- independent slow references ---------------------------------------------------------------

// Magnitude of non-negative E4M3 code c (0..0x7E), from the format definition.
double e4m3_magnitude(int c) {
  const int e = (c >> 3) & 15, m = c & 7;
  return e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
}

// Nearest finite E4M3 value by exhaustive search, ties to the even code, |x| >= 448 saturates.
uint8_t slow_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(double(x));
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  double best_err = a;
  for (int c = 1; c <= 0x7e; ++c) {
    const double err = std::fabs(a - e4m3_magnitude(c));
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return uint8_t(sign | best);
}

// fp32 -> bf16 by comparing the two bracketing bf16 values in fp64, ties to even.
uint16_t slow_bf16(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t lo = uint16_t(u >> 16);  // truncation toward zero
  if ((u & 0xffffu) == 0) return lo;
  const uint16_t hi = uint16_t(lo + 1);   // next magnitude away from zero
  auto value = [](uint16_t h) {
    if ((h & 0x7fffu) == 0x7f80u) return std::ldexp(1.0, 128);  // inf as the next "value"
    return double(std::fabs(bits_float(uint32_t(h) << 16)));
  };
  const double a = std::fabs(double(x));
  const double dlo = a - value(lo), dhi = value(hi) - a;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

// ---- E4M3 --------------------------------------------------------------------------------------

TEST(CodecE4m3, AllCodesRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(uint8_t(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_EQ(float_to_e4m3(v), 0x7f) << c;
      continue;
    }
    EXPECT_EQ(double(std::fabs(v)), e4m3_magnitude(c & 0x7f)) << c;
    EXPECT_EQ(std::signbit(v), (c & 0x80) != 0) << c;
    EXPECT_EQ(float_to_e4m3(v), c) << "code " << c << " value " << v;
  }
}

TEST(CodecE4m3, KnownValues) {
  EXPECT_EQ(e4m3_to_float(0x7e), 448.f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.f);
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7.f * std::ldexp(1.f, -9));
  for (int c = 0; c < 0x7e; ++c) EXPECT_LT(e4m3_to_float(uint8_t(c)), e4m3_to_float(uint8_t(c + 1)));
}

TEST(CodecE4m3, TiesBetweenNeighboursGoToEven) {
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = e4m3_to_float(uint8_t(c)), hi = e4m3_to_float(uint8_t(c + 1));
    const float mid = (lo + hi) * 0.5f;  // exact in fp32
    ASSERT_EQ(double(mid), (double(lo) + double(hi)) / 2);
    const int even = (c & 1) ? c + 1 : c;
    EXPECT_EQ(float_to_e4m3(mid), even) << "tie between " << c << " and " << c + 1;
    EXPECT_EQ(float_to_e4m3(-mid), 0x80 | even);
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 0.f)), c);
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 1000.f)), c + 1);
  }
}

TEST(CodecE4m3, Saturation) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {448.f, 448.5f, 449.f, 463.99f, 464.f, 480.f, 1e9f, FLT_MAX, inf}) {
    EXPECT_EQ(float_to_e4m3(x), 0x7e) << x;
    EXPECT_EQ(float_to_e4m3(-x), 0xfe) << -x;
  }
  EXPECT_EQ(float_to_e4m3(447.9f), 0x7e);  // nearer 448 than 416
  EXPECT_EQ(float_to_e4m3(431.f), 0x7d);   // nearer 416
  EXPECT_EQ(float_to_e4m3(432.f), 0x7e);   // tie 416/448 -> even code 0x7e
}

TEST(CodecE4m3, ZerosNaNAndSubnormals) {
  EXPECT_EQ(float_to_e4m3(0.f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.f), 0x80);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(float_to_e4m3(bits_float(0x7f800001u)), 0x7f);  // signalling NaN
  const float u = std::ldexp(1.f, -9);                     // one subnormal step
  EXPECT_EQ(float_to_e4m3(u), 0x01);
  EXPECT_EQ(float_to_e4m3(0.5f * u), 0x00);     // tie 0 / 0x01 -> 0
  EXPECT_EQ(float_to_e4m3(-0.5f * u), 0x80);
  EXPECT_EQ(float_to_e4m3(0.75f * u), 0x01);
  EXPECT_EQ(float_to_e4m3(1.5f * u), 0x02);     // tie 0x01 / 0x02 -> 0x02
  EXPECT_EQ(float_to_e4m3(2.5f * u), 0x02);     // tie 0x02 / 0x03 -> 0x02
  EXPECT_EQ(float_to_e4m3(7.5f * u), 0x08);     // tie 0x07 / smallest normal 0x08 -> 0x08
  EXPECT_EQ(float_to_e4m3(1e-30f), 0x00);
  EXPECT_EQ(float_to_e4m3(-1e-30f), 0x80);
  EXPECT_EQ(float_to_e4m3(bits_float(1u)), 0x00);           // fp32 subnormal
  EXPECT_EQ(float_to_e4m3(bits_float(0x80000001u)), 0x80);
}

TEST(CodecE4m3, BruteForceAgainstSlowReference) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  std::vector<float> xs;
  // Boundaries: every code value, neighbour midpoints and their fp32 neighbours, both signs.
  for (int c = 0; c <= 0x7e; ++c) {
    const float v = e4m3_to_float(uint8_t(c));
    const float next = c < 0x7e ? e4m3_to_float(uint8_t(c + 1)) : 512.f;
    const float mid = (v + next) * 0.5f;
    for (float x : {v, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f),
                    std::nextafter(v, 0.f), std::nextafter(v, 1e9f)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  // Random fp32 bit patterns (all classes) and random values in the E4M3 range.
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> ex(-14, 10);
  for (int i = 0; i < 1000000; ++i) xs.push_back(bits_float(bits(rng)));
  for (int i = 0; i < 2000000; ++i) {
    const float x = std::ldexp(mant(rng), ex(rng));
    xs.push_back((rng() & 1) ? -x : x);
  }
  int64_t mismatches = 0;
  for (float x : xs) {
    const uint8_t got = float_to_e4m3(x), want = slow_e4m3(x);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "x=" << x << " bits=0x" << std::hex << float_bits(x) << " got 0x"
                    << int(got) << " want 0x" << int(want) << std::dec << " seed " << seed;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- tile scale --------------------------------------------------------------------------------

TEST(CodecScale, Pow2Properties) {
  std::mt19937_64 rng(test::test_seed());
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> ex(-40, 40);
  std::vector<float> amaxes = {0.f, 1e-30f, 1e-4f, 448e-4f, std::nextafter(448e-4f, 1.f), 1.f,
                               448.f, 449.f, 896.f, 1e6f, 3e38f};
  for (int i = 0; i < 100000; ++i) amaxes.push_back(std::ldexp(mant(rng), ex(rng)));
  for (float amax : amaxes) {
    const float s = codec::tile_scale(amax, ScaleMode::kPow2);
    ASSERT_TRUE(std::isfinite(s) && s > 0) << amax;
    EXPECT_EQ(float_bits(s) & 0x7fffffu, 0u) << "not a power of two: " << s;
    const float v = std::max(amax / 448.f, 1e-4f);
    EXPECT_GE(s, v) << amax;
    EXPECT_LT(s * 0.5f, v) << amax;  // the smallest such power of two
    if (amax <= 448e-4f * 0.999f) {
      EXPECT_EQ(s, std::ldexp(1.f, -13)) << amax;  // the 1e-4 floor
    }
  }
  EXPECT_EQ(codec::tile_scale(448.f, ScaleMode::kPow2), 1.f);
  EXPECT_EQ(codec::tile_scale(449.f, ScaleMode::kPow2), 2.f);
  EXPECT_EQ(codec::tile_scale(std::numeric_limits<float>::quiet_NaN(), ScaleMode::kPow2),
            std::ldexp(1.f, -13));  // NaN amax falls to the floor rather than poisoning s
}

TEST(CodecScale, AmaxMode) {
  EXPECT_EQ(codec::tile_scale(0.f, ScaleMode::kAmax), FLT_MIN);
  EXPECT_EQ(codec::tile_scale(448.f, ScaleMode::kAmax), 1.f);
  EXPECT_EQ(codec::tile_scale(3.f, ScaleMode::kAmax), 3.f / 448.f);
  EXPECT_EQ(codec::tile_scale(1e-40f, ScaleMode::kAmax), FLT_MIN);
}

TEST(CodecScale, Pow2DequantIsExactInBf16) {
  for (int e = -13; e <= 20; ++e) {
    const float s = std::ldexp(1.f, e);
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;
      const float exact = e4m3_to_float(uint8_t(c)) * s;
      EXPECT_EQ(bf16_to_float(codec::dequant_e4m3(uint8_t(c), s)), exact) << c << " " << s;
    }
  }
}

// ---- bf16 --------------------------------------------------------------------------------------

TEST(CodecBf16, RoundNearestEven) {
  EXPECT_EQ(float_to_bf16(1.f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-0.f), 0x8000);
  EXPECT_EQ(float_to_bf16(1.f + std::ldexp(1.f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(float_to_bf16(1.f + 3 * std::ldexp(1.f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(std::nextafter(1.f + std::ldexp(1.f, -8), 2.f)), 0x3f81);
  EXPECT_EQ(float_to_bf16(std::nextafter(1.f + 3 * std::ldexp(1.f, -8), 0.f)), 0x3f81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(float_to_bf16(FLT_MAX), 0x7f80);  // rounds up past the largest bf16
  EXPECT_EQ(float_to_bf16(bits_float(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(float_to_bf16(bits_float(1u)), 0x0000);  // fp32 subnormal rounds to 0
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fff0000u}) {
    const uint16_t h = float_to_bf16(bits_float(nan));
    EXPECT_EQ(h & 0x7f80u, 0x7f80u);
    EXPECT_NE(h & 0x007fu, 0u) << std::hex << nan;  // still a NaN, never inf
    EXPECT_TRUE(std::isnan(bf16_to_float(h)));
    EXPECT_EQ(h, 0x7fffu) << "NaN must be canonical (the device's cvt.rn.bf16.f32 result)";
  }
  for (uint32_t h = 0; h < 0x10000u; ++h) {  // every bf16 survives the round trip
    const float f = bf16_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), h);
  }
}

TEST(CodecBf16, BruteForceAgainstSlowReference) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::uniform_int_distribution<uint32_t> bits;
  int64_t mismatches = 0;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = bits(rng);
    if (i & 1) u = (u & 0xffff0000u) | 0x8000u;  // exact ties half of the time
    const float x = bits_float(u);
    if (std::isnan(x)) continue;
    if (float_to_bf16(x) != slow_bf16(x) && ++mismatches <= 10) {
      ADD_FAILURE() << std::hex << "bits=0x" << u << " got 0x" << float_to_bf16(x) << " want 0x"
                    << slow_bf16(x) << std::dec << " seed " << seed;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- golden record vectors ---------------------------------------------------------------------

constexpr int kTokens = 96;

struct GoldenCase {
  KvFormat format;
  ScaleMode mode;
  const char* records;
  const char* decoded;  // ds_mla decode [96, 576]; nope records decode to its first 512 columns
};

class GoldenRecords : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenRecords, EncodeByteExactAndDecodeBitExact) {
  const GoldenCase gc = GetParam();
  const auto latent = test::read_vector<uint16_t>("fmt_latent_bf16.bin");
  const auto rope = test::read_vector<uint16_t>("fmt_rope_bf16.bin");
  const auto want = test::read_vector<uint8_t>(std::string(gc.records) + ".bin");
  const auto decoded = test::read_vector<uint16_t>(std::string(gc.decoded) + ".bin");
  SELKV_REQUIRE_VECTOR(latent, "fmt_latent_bf16.bin");
  SELKV_REQUIRE_VECTOR(rope, "fmt_rope_bf16.bin");
  SELKV_REQUIRE_VECTOR(want, gc.records);
  SELKV_REQUIRE_VECTOR(decoded, gc.decoded);
  const int rb = fmt::record_bytes(gc.format);
  const int dim = fmt::dequant_dim(gc.format);
  ASSERT_EQ(latent.size(), size_t(kTokens) * 512);
  ASSERT_EQ(rope.size(), size_t(kTokens) * 64);
  ASSERT_EQ(want.size(), size_t(kTokens) * rb);
  ASSERT_EQ(decoded.size(), size_t(kTokens) * 576);

  std::vector<uint8_t> rec(rb);
  std::vector<uint16_t> dec(dim);
  for (int t = 0; t < kTokens; ++t) {
    ref::encode_record(&latent[t * 512], &rope[t * 64], gc.format, gc.mode, rec.data());
    for (int i = 0; i < rb; ++i) {
      ASSERT_EQ(rec[i], want[size_t(t) * rb + i]) << "token " << t << " byte " << i;
    }
    ref::decode_record(&want[size_t(t) * rb], gc.format, dec.data());
    for (int i = 0; i < dim; ++i) {
      ASSERT_EQ(dec[i], decoded[size_t(t) * 576 + i]) << "token " << t << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllFormats, GoldenRecords,
    ::testing::Values(
        GoldenCase{KvFormat::kDsMlaFp8, ScaleMode::kPow2, "fmt_ds_mla_fp8_pow2", "fmt_ds_mla_fp8_pow2_decoded"},
        GoldenCase{KvFormat::kNopeFp8, ScaleMode::kPow2, "fmt_nope_fp8_pow2", "fmt_ds_mla_fp8_pow2_decoded"},
        GoldenCase{KvFormat::kDsMlaFp8, ScaleMode::kAmax, "fmt_ds_mla_fp8_amax", "fmt_ds_mla_fp8_amax_decoded"},
        GoldenCase{KvFormat::kNopeFp8, ScaleMode::kAmax, "fmt_nope_fp8_amax", "fmt_ds_mla_fp8_amax_decoded"}),
    [](const auto& info) { return std::string(info.param.records).substr(4); });

// The record layout the vectors pin: scales are the documented fp32 words, RoPE is verbatim.
TEST(GoldenRecordsLayout, ScalesAndRope) {
  const auto latent = test::read_vector<uint16_t>("fmt_latent_bf16.bin");
  const auto rope = test::read_vector<uint16_t>("fmt_rope_bf16.bin");
  const auto rec = test::read_vector<uint8_t>("fmt_ds_mla_fp8_pow2.bin");
  SELKV_REQUIRE_VECTOR(latent, "fmt_latent_bf16.bin");
  SELKV_REQUIRE_VECTOR(rope, "fmt_rope_bf16.bin");
  SELKV_REQUIRE_VECTOR(rec, "fmt_ds_mla_fp8_pow2.bin");
  for (int t = 0; t < kTokens; ++t) {
    const uint8_t* r = &rec[size_t(t) * 656];
    EXPECT_EQ(std::memcmp(r + 528, &rope[t * 64], 128), 0) << t;
    for (int k = 0; k < 4; ++k) {
      float s;
      std::memcpy(&s, r + 512 + 4 * k, 4);
      float amax = 0.f;
      for (int i = 0; i < 128; ++i)
        amax = std::max(amax, std::fabs(bf16_to_float(latent[t * 512 + k * 128 + i])));
      EXPECT_EQ(s, codec::tile_scale(amax, ScaleMode::kPow2)) << t << " tile " << k;
    }
  }
}

// ---- format traits and dispatch -----------------------------------------------------------------

// DESIGN §1's byte map, spelled out independently of the traits.
TEST(FormatTraits, MatchDesignLayout) {
  using Ds = KvFormatTraits<KvFormat::kDsMlaFp8>;
  using Nope = KvFormatTraits<KvFormat::kNopeFp8>;
  static_assert(Ds::kNopeOffset == 0 && Ds::kScaleOffset == 512 && Ds::kRopeOffset == 528 &&
                Ds::kRecordBytes == 656 && Ds::kDequantDim == 576 && Ds::kHasRope && Ds::kRopeDim == 64);
  static_assert(Nope::kNopeOffset == 0 && Nope::kScaleOffset == 512 && Nope::kRopeOffset == 0 &&
                Nope::kRecordBytes == 528 && Nope::kDequantDim == 512 && !Nope::kHasRope && Nope::kRopeDim == 0);
  static_assert(Ds::kNumTiles * Ds::kTileElems == Ds::kNopeDim && Nope::kNumTiles == 4);
  static_assert(Ds::record_offset(3) == 3 * 656 && Nope::record_offset(3) == 3 * 528);
  // The in-record formats: scales at the record's kScaleOffset, pages of page_size records (the
  // page_size argument of scale_offset is unused).
  static_assert(Ds::scale_offset(3, 61) == 3 * 656 + 512 && Nope::scale_offset(3, 2) == 3 * 528 + 512);
  static_assert(Ds::page_bytes(61) == 61 * 656 && Nope::page_bytes(69) == 69 * 528);
  static_assert(Ds::kRecordStride == 656 && Nope::kRecordStride == 528);
  // model1_fp8 (FlashMLA's quant.py, MODEL1_FP8Sparse): 448 NoPE codes + 64 bf16 RoPE per
  // 576-byte record, 7 UE8M0 scales + 1 pad byte per token after the page's records, pages
  // padded to a multiple of 576.
  using M1 = KvFormatTraits<KvFormat::kModel1Fp8>;
  static_assert(M1::kNopeDim == 448 && M1::kTileElems == 64 && M1::kNumTiles == 7 && M1::kRopeDim == 64 &&
                M1::kHasRope && M1::kNopeOffset == 0 && M1::kRopeOffset == 448 && M1::kRecordStride == 576 &&
                M1::kRecordBytes == 584 && M1::kDequantDim == 512 && !M1::kScalesInRecord &&
                sizeof(M1::Scale) == 1);
  static_assert(M1::record_offset(3) == 3 * 576 && M1::scale_offset(3, 61) == 61 * 576 + 3 * 8 &&
                M1::scale_offset(0, 1) == 576);
  static_assert(M1::page_bytes(1) == 1152 && M1::page_bytes(2) == 1728 && M1::page_bytes(61) == 35712 &&
                M1::page_bytes(64) == 37440 && M1::page_bytes(72) == 73 * 576);
  // The runtime helpers are the traits, one format at a time.
  for (const KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8, KvFormat::kModel1Fp8}) {
    dispatch_format(f, [&](auto t) {
      using T = decltype(t);
      EXPECT_EQ(T::kFormat, f);
      EXPECT_EQ(fmt::record_bytes(f), T::kRecordBytes);
      EXPECT_TRUE(fmt::known_format(f));
      for (int64_t ps : {1, 2, 61, 64, 69}) EXPECT_EQ(fmt::page_bytes(f, ps), T::page_bytes(ps));
      EXPECT_EQ(fmt::has_rope(f), T::kHasRope);
      EXPECT_EQ(fmt::dequant_dim(f), T::kDequantDim);
      EXPECT_EQ(fmt::nope_dim(f), T::kNopeDim);
      EXPECT_EQ(fmt::rope_dim(f), T::kRopeDim);
    });
  }
}

// ---- model1_fp8 (FlashMLA MODEL1) ----------------------------------------------------------------

TEST(CodecUe8m0, AllBytesAndPow2Scales) {
  for (int b = 0; b < 256; ++b) {
    const float s = codec::ue8m0_to_float(uint8_t(b));
    if (b == 255) {
      EXPECT_TRUE(std::isnan(s));
      continue;
    }
    EXPECT_EQ(double(s), std::ldexp(1.0, b - 127)) << b;  // 2^(b - 127), b = 0 a subnormal
    EXPECT_EQ(codec::float_to_ue8m0(s), b) << b;          // round trip of every scale
  }
  EXPECT_EQ(codec::float_to_ue8m0(std::numeric_limits<float>::infinity()), 0xff);
  EXPECT_EQ(codec::float_to_ue8m0(std::numeric_limits<float>::quiet_NaN()), 0xff);
  // Every pow2 scale the writer can produce is a UE8M0 value (2^-13 .. 2^127, or inf -> NaN).
  for (float amax : {0.f, 1e-30f, 0.0448f, 1.f, 448.f, 449.f, 3e38f}) {
    const float s = codec::tile_scale(amax, ScaleMode::kPow2);
    EXPECT_EQ(codec::ue8m0_to_float(codec::float_to_ue8m0(s)), s) << amax;
  }
  EXPECT_EQ(codec::float_to_ue8m0(codec::tile_scale(0.f, ScaleMode::kPow2)), 114);  // 2^-13 (the 1e-4 floor)
}

// Independent model of one MODEL1 token (FlashMLA quant.py semantics): per 64-value tile
// s = 2^ceil(log2(max(amax / 448, 1e-4))) in fp64 log2, UE8M0 byte = log2(s) + 127, codes by
// exhaustive nearest-even search (slow_e4m3) of x / s; RoPE bytes verbatim; pad byte 0.
void model1_expected_token(const uint16_t* latent, const uint16_t* rope, std::vector<uint8_t>& page,
                           int64_t page_size, int64_t t) {
  for (int k = 0; k < 7; ++k) {
    double amax = 0;
    for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(double(bf16_to_float(latent[64 * k + i]))));
    const int e = int(std::ceil(std::log2(std::max(amax / 448.0, double(1e-4f)))));
    page[size_t(page_size * 576 + 8 * t + k)] = uint8_t(e + 127);
    for (int i = 0; i < 64; ++i) {
      page[size_t(t * 576 + 64 * k + i)] = slow_e4m3(float(std::ldexp(double(bf16_to_float(latent[64 * k + i])), -e)));
    }
  }
  page[size_t(page_size * 576 + 8 * t + 7)] = 0;
  for (int i = 0; i < 64; ++i) {
    page[size_t(t * 576 + 448 + 2 * i)] = uint8_t(rope[i] & 0xff);
    page[size_t(t * 576 + 448 + 2 * i + 1)] = uint8_t(rope[i] >> 8);
  }
}

class Model1Golden : public ::testing::TestWithParam<int> {};

// A whole page written token by token through encode_token: every byte as the independent model
// says, the padding after the scale tail untouched; decode_token bit-exact against
// bf16(e4m3 * 2^e) computed in fp64.
TEST_P(Model1Golden, PageBytesAndDecode) {
  const int64_t P = GetParam();
  const int64_t pb = fmt::page_bytes(KvFormat::kModel1Fp8, P);
  ASSERT_EQ(pb, (P * 584 + 575) / 576 * 576);
  std::mt19937_64 rng(test::test_seed() + uint64_t(P));
  std::vector<uint16_t> latent = test::randn_bf16(size_t(P) * 448, 1.f, rng);
  const std::vector<uint16_t> rope = test::randn_bf16(size_t(P) * 64, 1.f, rng);
  // Tiles of varied magnitude: a zero tile (the 1e-4 floor), a huge and a tiny one, a tile whose
  // amax is exactly 448 * 2^k (s = 2^k exactly), values that saturate nothing.
  for (int64_t t = 0; t < P; ++t) {
    uint16_t* x = &latent[size_t(t) * 448];
    const int kind = int(t % 4);
    for (int i = 0; i < 64; ++i) {
      if (kind == 0) x[64 + i] = 0;                                          // tile 1 zero
      if (kind == 1) x[128 + i] = test::bf16(test::f32(x[128 + i]) * 1e4f);  // tile 2 big
      if (kind == 2) x[192 + i] = test::bf16(test::f32(x[192 + i]) * 1e-6f); // tile 3 tiny
    }
    if (kind == 3) x[256 + 5] = test::bf16(-448.f * 4.f);  // tile 4: amax = 448 * 2^2
  }
  std::vector<uint8_t> page(size_t(pb), 0xcd), want(size_t(pb), 0xcd);
  for (int64_t t = 0; t < P; ++t) {
    ref::encode_token(&latent[size_t(t) * 448], &rope[size_t(t) * 64], KvFormat::kModel1Fp8, ScaleMode::kPow2,
                      page.data(), P, t);
    model1_expected_token(&latent[size_t(t) * 448], &rope[size_t(t) * 64], want, P, t);
  }
  for (int64_t i = 0; i < pb; ++i) ASSERT_EQ(page[size_t(i)], want[size_t(i)]) << "page " << P << " byte " << i;
  for (int64_t i = P * 584; i < pb; ++i) ASSERT_EQ(page[size_t(i)], 0xcd) << "padding byte " << i;

  std::vector<uint16_t> out(512);
  for (int64_t t = 0; t < P; ++t) {
    ref::decode_token(page.data(), KvFormat::kModel1Fp8, P, t, out.data());
    for (int i = 0; i < 448; ++i) {
      const int e = int(page[size_t(P * 576 + 8 * t + i / 64)]) - 127;
      const uint8_t c = page[size_t(t * 576 + i)];
      const double v = (c & 0x80 ? -1.0 : 1.0) * std::ldexp(e4m3_magnitude(c & 0x7f), e);
      ASSERT_EQ(out[size_t(i)], slow_bf16(float(v))) << "token " << t << " element " << i;
      // pow2 scales make the round trip exact in bf16 wherever the code is not subnormal
    }
    ASSERT_EQ(std::memcmp(&out[448], &rope[size_t(t) * 64], 128), 0) << "rope of token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, Model1Golden, ::testing::Values(1, 2, 61, 64));

// Hand-built bytes for known inputs: page_size 2, token 1.
TEST(Model1Golden, HandBuiltToken) {
  std::vector<uint16_t> latent(448, 0), rope(64);
  for (int i = 0; i < 64; ++i) latent[i] = test::bf16(1.f);     // tile 0: amax 1 -> s = 2^-8 (byte 119)
  latent[64] = test::bf16(-448.f);                               // tile 1: amax 448 -> s = 1 (byte 127)
  latent[65] = test::bf16(3.f);
  // tile 2 zero: s = 2^-13 (byte 114); tiles 3-6: one value 0.5 -> s = 2^-9 (byte 118)
  for (int k = 3; k < 7; ++k) latent[64 * k + 7] = test::bf16(0.5f);
  for (int i = 0; i < 64; ++i) rope[i] = uint16_t(0x3f80 + i);
  std::vector<uint8_t> page(size_t(fmt::page_bytes(KvFormat::kModel1Fp8, 2)), 0xcd);
  ASSERT_EQ(page.size(), 1728u);
  ref::encode_token(latent.data(), rope.data(), KvFormat::kModel1Fp8, ScaleMode::kPow2, page.data(), 2, 1);
  const uint8_t* rec = &page[576];  // token 1's record
  EXPECT_EQ(rec[0], 0x78);          // 1 / 2^-8 = 256 = 2^8: e4m3 exponent field 15
  EXPECT_EQ(rec[63], 0x78);
  EXPECT_EQ(rec[64], 0xfe);         // -448
  EXPECT_EQ(rec[65], 0x44);         // 3 = 1.5 * 2^1
  EXPECT_EQ(rec[66], 0x00);
  EXPECT_EQ(rec[128], 0x00);        // zero tile
  EXPECT_EQ(rec[64 * 3 + 7], 0x78); // 0.5 / 2^-9 = 256
  EXPECT_EQ(rec[448], 0x80);        // rope[0] = 0x3f80, little endian
  EXPECT_EQ(rec[449], 0x3f);
  EXPECT_EQ(rec[575], 0x3f);        // rope[63] = 0x3fbf
  const uint8_t want_scales[8] = {119, 127, 114, 118, 118, 118, 118, 0};
  EXPECT_EQ(std::memcmp(&page[2 * 576 + 8], want_scales, 8), 0);  // token 1's scales
  for (size_t i = 0; i < 576; ++i) EXPECT_EQ(page[i], 0xcd) << "token 0 record byte " << i;
  for (size_t i = 1152; i < 1160; ++i) EXPECT_EQ(page[i], 0xcd) << "token 0 scale byte " << i;
  for (size_t i = 1168; i < 1728; ++i) EXPECT_EQ(page[i], 0xcd) << "padding byte " << i;
  // encode_record: the token alone, the page_size-1 layout (576 record bytes, then 8 scale bytes).
  std::vector<uint8_t> rec1(584);
  ref::encode_record(latent.data(), rope.data(), KvFormat::kModel1Fp8, ScaleMode::kPow2, rec1.data());
  EXPECT_EQ(std::memcmp(rec1.data(), rec, 576), 0);
  EXPECT_EQ(std::memcmp(rec1.data() + 576, want_scales, 8), 0);
  // UE8M0 holds powers of two only.
  EXPECT_THROW(ref::encode_record(latent.data(), rope.data(), KvFormat::kModel1Fp8, ScaleMode::kAmax, rec1.data()),
               std::invalid_argument);
}

TEST(Dispatch, PicksTheMatchingConstant) {
  auto id = [](auto c) { return int(decltype(c)::value); };
  EXPECT_EQ(detail::dispatch_bool(true, id), 1);
  EXPECT_EQ(detail::dispatch_bool(false, id), 0);
  EXPECT_EQ((detail::dispatch_value<64, 128>(64, id)), 64);
  EXPECT_EQ((detail::dispatch_value<64, 128>(128, id)), 128);
  EXPECT_EQ((detail::dispatch_value<576, 512>(576, id)), 576);
  EXPECT_EQ((detail::dispatch_value<576, 512>(512, id)), 512);
  EXPECT_EQ((detail::dispatch_value<1, 2, 3>(2, id)), 2);
  EXPECT_EQ((detail::dispatch_value<1, 2, 3>(7, id)), 3);  // unchecked values take the last one
}

}  // namespace
}  // namespace selkv
