// GPU tests of C1 write_kv_cache, C2 convert_req_indices_to_slots, C3 gather_kv_bf16 and of the
// hardware E4M3 converters (src/formats/device_codec.cuh): bit-exact against the CPU oracle and
// formats/codec.h. Skip without a GPU. Every failure prints the seed (SELKV_TEST_SEED=<seed>
// reproduces it).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "formats/codec.h"
#include "formats/device_codec.cuh"
#include "gpu_test_util.h"
#include "reference/oracle.h"
#include "selkv/cache_ops.h"
#include "test_util.h"

namespace selkv {
namespace {

using test::DevBuf;
using test::test_seed;

#define SEED_TRACE(extra) SCOPED_TRACE("SELKV_TEST_SEED=" + std::to_string(test_seed()) + " " + (extra))

// bf16 bits that are a NaN (any payload, either sign). The codec tests compare NaN results as NaN:
// the oracle's payload is host-dependent.
bool bf16_bits_are_nan(uint16_t w) { return (w & 0x7fff) > 0x7f80; }

// Bytewise comparison with a readable first mismatch.
template <typename T>
::testing::AssertionResult same_bits(const std::vector<T>& want, const std::vector<T>& got) {
  if (want.size() != got.size())
    return ::testing::AssertionFailure() << "size " << want.size() << " vs " << got.size();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(T)) != 0) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << want.size() << " elements differ; first at " << first << ": want "
         << uint64_t(want[first]) << " got " << uint64_t(got[first]);
}

std::mt19937_64 make_rng(uint64_t salt) { return std::mt19937_64(test_seed() * 0x9E3779B97F4A7C15ull + salt); }

// ---- hardware E4M3 vs codec.h ----------------------------------------------------------------

__global__ void encode_kernel(const float* x, uint8_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = dev::e4m3(x[i]);
  }
}

// For each (code, scale) pair: dequantized bf16 bits; also the plain float value of each code.
__global__ void decode_kernel(const float* scales, int num_scales, uint16_t* out, float* values) {
  const int code = threadIdx.x;  // 256 threads
  if (blockIdx.x == 0) values[code] = dev::e4m3_to_float(uint8_t(code));
  for (int s = blockIdx.x; s < num_scales; s += gridDim.x) {
    out[s * 256 + code] = dev::dequant_e4m3(uint8_t(code), scales[s]);
  }
}

// Vector forms (byte/lane order) against the scalar ones.
__global__ void vector_codec_kernel(const uint16_t* bf16_in, uint8_t* enc, const float* scale,
                                    uint16_t* dec, int64_t groups) {
  const int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (g >= groups) return;
  float x[8];
  dev::unpack_bf16x8(reinterpret_cast<const uint4*>(bf16_in)[g], x);
  const uint2 q = dev::encode_e4m3x8(x);
  reinterpret_cast<uint2*>(enc)[g] = q;
  reinterpret_cast<uint4*>(dec)[g] = dev::dequant_e4m3x8(q, scale[g]);
}

// UE8M0: every byte through the device twin; every code x every scale byte through the reader
// rule (model1_fp8's dequant) and through the decode kernels' bf16 power-of-two form (four codes a
// word, each code in every byte position); the pow2 scale -> byte encoding on the device.
__global__ void ue8m0_kernel(float* scale_of, uint16_t* dequant, uint16_t* dequant_pow2, uint8_t* enc,
                             const float* amax, int n_amax) {
  const int b = blockIdx.x, code = threadIdx.x;  // 256 x 256
  const float s = dev::ue8m0_to_float(uint32_t(b));
  if (code == 0) scale_of[b] = s;
  dequant[b * 256 + code] = dev::dequant_e4m3(uint8_t(code), s);
  uint32_t w = 0;
  for (int i = 0; i < 4; ++i) w |= uint32_t((code + 64 * i) & 255) << (8 * i);
  const uint2 v = dev::dequant_e4m3x4_pow2(w, dev::ue8m0_bf16x2(uint32_t(b)));
  const uint32_t out[4] = {v.x & 0xffffu, v.x >> 16, v.y & 0xffffu, v.y >> 16};
  for (int i = 0; i < 4; ++i) dequant_pow2[(i * 256 + b) * 256 + ((code + 64 * i) & 255)] = uint16_t(out[i]);
  for (int i = b * 256 + code; i < n_amax; i += 256 * 256) {
    enc[i] = codec::float_to_ue8m0(codec::tile_scale(amax[i], ScaleMode::kPow2));
  }
}

TEST(DeviceCodecGpu, Ue8m0MatchesCodec) {
  SELKV_REQUIRE_GPU();
  SEED_TRACE("");
  auto rng = make_rng(5);
  std::vector<float> amax(1 << 16);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7f800000u);  // every non-negative float up to inf
  for (auto& a : amax) a = codec::bits_float(bits(rng));
  amax[0] = 0.f;
  amax[1] = std::numeric_limits<float>::infinity();
  DevBuf dsc(256 * 4), ddq(256 * 256 * 2), ddq2(4 * 256 * 256 * 2), denc(amax.size()), damax(amax.size() * 4);
  damax.upload(amax);
  ue8m0_kernel<<<256, 256>>>(dsc.as<float>(), ddq.as<uint16_t>(), ddq2.as<uint16_t>(), denc.as<uint8_t>(),
                             damax.as<float>(), int(amax.size()));
  CUDA_OK(cudaDeviceSynchronize());
  const auto sc = dsc.download<float>();
  auto dq = ddq.download<uint16_t>();
  auto dq2 = ddq2.download<uint16_t>();
  const auto enc = denc.download<uint8_t>();
  // NaN results are compared as NaN, payload aside: both sides must be NaN.
  auto nan_canonical = [](uint16_t w) -> uint16_t { return bf16_bits_are_nan(w) ? uint16_t(0x7fff) : w; };
  for (auto& w : dq) w = nan_canonical(w);
  for (auto& w : dq2) w = nan_canonical(w);
  std::vector<float> want_sc(256);
  std::vector<uint16_t> want_dq(256 * 256);
  std::vector<uint8_t> want_enc(amax.size());
  for (int b = 0; b < 256; ++b) {
    want_sc[size_t(b)] = codec::ue8m0_to_float(uint8_t(b));
    for (int c = 0; c < 256; ++c) {
      want_dq[size_t(b) * 256 + size_t(c)] = nan_canonical(codec::dequant_e4m3(uint8_t(c), want_sc[size_t(b)]));
    }
  }
  for (size_t i = 0; i < amax.size(); ++i) want_enc[i] = codec::float_to_ue8m0(codec::tile_scale(amax[i], ScaleMode::kPow2));
  EXPECT_TRUE(same_bits(want_sc, sc));
  EXPECT_TRUE(same_bits(want_dq, dq));
  for (size_t i = 0; i < 4; ++i) {  // byte position i of the word
    const std::vector<uint16_t> got(dq2.begin() + i * want_dq.size(), dq2.begin() + (i + 1) * want_dq.size());
    EXPECT_TRUE(same_bits(want_dq, got)) << "dequant_e4m3x4_pow2, byte " << i;
  }
  EXPECT_TRUE(same_bits(want_enc, enc));
}

float next_up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float next_down(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }

TEST(DeviceCodecGpu, E4m3EncodeMatchesCodec) {
  SELKV_REQUIRE_GPU();
  SEED_TRACE("");
  auto rng = make_rng(1);
  std::vector<float> xs;
  // Every representable value, the midpoints between neighbours (ties), and 1 ulp either side.
  std::vector<float> vals;
  for (int c = 0; c < 0x7f; ++c) vals.push_back(codec::e4m3_to_float(uint8_t(c)));
  vals.push_back(480.f);  // the would-be next value: 464 is the 448/480 tie
  for (size_t i = 0; i < vals.size(); ++i) {
    for (float sgn : {1.f, -1.f}) {
      const float v = sgn * vals[i];
      xs.insert(xs.end(), {v, next_up(v), next_down(v)});
      if (i + 1 < vals.size()) {
        const float mid = sgn * (vals[i] + vals[i + 1]) * 0.5f;
        xs.insert(xs.end(), {mid, next_up(mid), next_down(mid)});
      }
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.f, -0.f, inf, -inf, 448.f, -448.f, 449.f, 463.99f, 464.f, 464.01f,
                            -464.f, 1e30f, -1e30f, std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::min(), -std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(), 1e-40f, -1e-40f,
                            1.f / 1024, 1.f / 1024 + 1e-9f, 3.f / 1024, -3.f / 1024};
  xs.insert(xs.end(), std::begin(specials), std::end(specials));
  // Random bit patterns (every exponent, subnormals included; NaN patterns filtered out below
  // and checked separately) and random values in the E4M3 range.
  for (int i = 0; i < 3000000; ++i) {
    float f = codec::bits_float(uint32_t(rng()));
    if (std::isnan(f)) f = 1.f;
    xs.push_back(f);
  }
  std::uniform_real_distribution<float> u(-500.f, 500.f);
  std::uniform_real_distribution<float> small(-0.02f, 0.02f);
  for (int i = 0; i < 1500000; ++i) xs.push_back(u(rng));
  for (int i = 0; i < 500000; ++i) xs.push_back(small(rng));

  DevBuf dx(xs.size() * 4), dq(xs.size());
  dx.upload(xs);
  encode_kernel<<<1024, 256>>>(dx.as<float>(), dq.as<uint8_t>(), int64_t(xs.size()));
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = dq.download<uint8_t>();
  size_t bad = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const uint8_t want = codec::float_to_e4m3(xs[i]);
    if (got[i] != want && bad++ < 10) {
      ADD_FAILURE() << "x=" << xs[i] << " (0x" << std::hex << codec::float_bits(xs[i])
                    << ") hw=0x" << int(got[i]) << " codec=0x" << int(want) << std::dec;
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << xs.size();

  // NaN inputs (only reachable from NaN latents): codec says 0x7F for every NaN.
  std::vector<float> nans = {codec::bits_float(0x7fc00000u), codec::bits_float(0xffc00000u),
                             codec::bits_float(0x7f800001u), codec::bits_float(0xff800001u),
                             codec::bits_float(0x7fffffffu), codec::bits_float(0xffffffffu)};
  DevBuf dn(nans.size() * 4), dnq(nans.size());
  dn.upload(nans);
  encode_kernel<<<1, 32>>>(dn.as<float>(), dnq.as<uint8_t>(), int64_t(nans.size()));
  CUDA_OK(cudaDeviceSynchronize());
  const auto gn = dnq.download<uint8_t>();
  for (size_t i = 0; i < nans.size(); ++i) {
    EXPECT_EQ(int(gn[i]), int(codec::float_to_e4m3(nans[i])))
        << "NaN input 0x" << std::hex << codec::float_bits(nans[i]);
  }
}

TEST(DeviceCodecGpu, E4m3DecodeMatchesCodec) {
  SELKV_REQUIRE_GPU();
  SEED_TRACE("");
  auto rng = make_rng(2);
  std::vector<float> scales;
  for (int e = -20; e <= 30; ++e) scales.push_back(std::ldexp(1.f, e));  // pow2 mode
  std::uniform_real_distribution<float> u(0.f, 4.f);
  for (int i = 0; i < 2000; ++i) scales.push_back(codec::tile_scale(u(rng) * std::pow(10.f, float(i % 12) - 6), ScaleMode::kAmax));
  for (int i = 0; i < 1000; ++i) scales.push_back(codec::bits_float(uint32_t(rng()) & 0x7f7fffffu));
  scales.insert(scales.end(), {0.f, std::numeric_limits<float>::min(), 1e-40f,
                               std::numeric_limits<float>::denorm_min(), 1e30f,
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::infinity()});
  const int ns = int(scales.size());
  DevBuf ds(scales.size() * 4), dout(size_t(ns) * 256 * 2), dval(256 * 4);
  ds.upload(scales);
  decode_kernel<<<256, 256>>>(ds.as<float>(), ns, dout.as<uint16_t>(), dval.as<float>());
  CUDA_OK(cudaDeviceSynchronize());
  const auto vals = dval.download<float>();
  for (int c = 0; c < 256; ++c) {
    const float want = codec::e4m3_to_float(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(vals[c])) << "code " << c;
    } else {
      EXPECT_EQ(codec::float_bits(vals[c]), codec::float_bits(want)) << "code " << c;
    }
  }
  const auto got = dout.download<uint16_t>();
  size_t bad = 0;
  for (int s = 0; s < ns; ++s) {
    for (int c = 0; c < 256; ++c) {
      const uint16_t want = codec::dequant_e4m3(uint8_t(c), scales[s]);
      const uint16_t g = got[size_t(s) * 256 + c];
      const bool ok = bf16_bits_are_nan(want) ? bf16_bits_are_nan(g) : g == want;  // NaN as NaN
      if (!ok && bad++ < 10) {
        ADD_FAILURE() << "code 0x" << std::hex << c << " scale 0x" << codec::float_bits(scales[s])
                      << " hw=0x" << g << " codec=0x" << want << std::dec;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(DeviceCodecGpu, VectorFormsKeepElementOrder) {
  SELKV_REQUIRE_GPU();
  SEED_TRACE("");
  auto rng = make_rng(3);
  const int64_t groups = 4096;
  auto in = test::randn_bf16(size_t(groups) * 8, 30.f, rng);
  std::vector<float> scales(groups);
  std::uniform_real_distribution<float> u(0.01f, 2.f);
  for (auto& s : scales) s = u(rng);
  DevBuf din(in.size() * 2), denc(in.size()), dsc(groups * 4), ddec(in.size() * 2);
  din.upload(in);
  dsc.upload(scales);
  vector_codec_kernel<<<(groups + 127) / 128, 128>>>(din.as<uint16_t>(), denc.as<uint8_t>(),
                                                     dsc.as<float>(), ddec.as<uint16_t>(), groups);
  CUDA_OK(cudaDeviceSynchronize());
  const auto enc = denc.download<uint8_t>();
  const auto dec = ddec.download<uint16_t>();
  std::vector<uint8_t> want_enc(in.size());
  std::vector<uint16_t> want_dec(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    want_enc[i] = codec::float_to_e4m3(codec::bf16_to_float(in[i]));
    want_dec[i] = codec::dequant_e4m3(want_enc[i], scales[i / 8]);
  }
  EXPECT_TRUE(same_bits(want_enc, enc));
  EXPECT_TRUE(same_bits(want_dec, dec));
}

// ---- C1 write_kv_cache -----------------------------------------------------------------------

// Latent values with a spread of tile magnitudes: normal, tiny (subnormal after scaling), huge,
// all-zero and single-spike tiles.
std::vector<uint16_t> make_kv_rows(int64_t T, int64_t stride, std::mt19937_64& rng) {
  std::vector<uint16_t> v(size_t(T) * stride, 0x7fc1);  // row padding: NaN, never read
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t t = 0; t < T; ++t) {
    for (int tile = 0; tile < 4; ++tile) {
      const int kind = int(rng() % 8);
      const float mag = kind == 0 ? 1e-30f : kind == 1 ? 1e20f : kind == 2 ? 0.f
                        : kind == 3 ? 1e-6f : float(std::ldexp(1.0, int(rng() % 20) - 10));
      for (int i = 0; i < 128; ++i) {
        float x = nd(rng) * mag;
        if (kind == 4) x = (i == int(rng() % 128)) ? 448.f * mag : 0.f;
        v[size_t(t) * stride + tile * 128 + i] = test::bf16(x);
      }
    }
    for (int i = 0; i < 64; ++i) v[size_t(t) * stride + 512 + i] = test::bf16(nd(rng));
  }
  return v;
}

struct WriteCase {
  int page_size;
  KvFormat format;
  ScaleMode mode;
  int extra_stride;  // bytes beyond the page (multiple of 16)
  int64_t min_blocks = 5;  // more blocks -> more tokens (persistent warps walk several tokens)
};

void run_write_case(const WriteCase& c, uint64_t salt) {
  SEED_TRACE("page_size=" + std::to_string(c.page_size) + " format=" + std::to_string(int(c.format)) +
             " mode=" + std::to_string(int(c.mode)) + " extra=" + std::to_string(c.extra_stride));
  auto rng = make_rng(salt);
  const int64_t num_blocks = c.min_blocks + int64_t(rng() % 4);
  // page_size * record_bytes for the in-record formats; model1_fp8: padded to a multiple of 576.
  const int64_t stride = fmt::page_bytes(c.format, c.page_size) + c.extra_stride;
  const int64_t num_slots = num_blocks * c.page_size;
  const int64_t T = std::min<int64_t>(num_slots, c.min_blocks > 5 ? num_slots : 150) + 12;
  // kv rows as vLLM lays them out: [T, 576] with latent then RoPE (rope pointer = row + 512;
  // model1_fp8 reads the first 448 latent values of each row).
  const int64_t row_stride = 576 + 8 * int64_t(rng() % 3);
  const auto kv = make_kv_rows(T, row_stride, rng);

  std::vector<int64_t> perm(num_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(T);
  for (int64_t t = 0; t < T; ++t) {
    const int r = int(rng() % 10);
    if (r == 0) slots[t] = -1;                                   // CUDA-graph padding
    else if (r == 1) slots[t] = -int64_t(rng() % 1000) - 2;      // other negatives
    else if (r == 2) slots[t] = num_slots + int64_t(rng() % 3);  // out of range: ignored
    else if (r == 3) slots[t] = std::numeric_limits<int64_t>::max();
    else slots[t] = perm[size_t(t) % perm.size()];               // unique while t < num_slots
  }
  // Unique valid slots only (duplicates would race): drop repeats.
  std::vector<char> used(num_slots, 0);
  for (auto& s : slots) {
    if (s < 0 || s >= num_slots) continue;
    if (used[s]) {
      s = -1;
    } else {
      used[s] = 1;
    }
  }

  std::vector<uint8_t> cache(size_t(num_blocks * stride));
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = (i & 1) ? 0xFF : uint8_t(0x7F | (i & 0x80));

  DevBuf dkv(kv.size() * 2), dslots(slots.size() * 8), dcache(cache.size());
  dkv.upload(kv);
  dslots.upload(slots);
  dcache.upload(cache);

  WriteKvCacheParams p;
  p.latent = dkv.as<void>();
  p.latent_row_stride = row_stride;
  p.rope = fmt::has_rope(c.format) ? dkv.as<void>(1024) : nullptr;
  p.rope_row_stride = row_stride;
  p.slot_mapping = dslots.as<int64_t>();
  p.num_tokens = T;
  p.cache = dcache.as<void>();
  p.num_blocks = num_blocks;
  p.page_size = c.page_size;
  p.block_stride_bytes = stride;
  p.format = c.format;
  p.scale_mode = c.mode;
  const Status st = write_kv_cache(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  WriteKvCacheParams h = p;
  h.latent = kv.data();
  h.rope = fmt::has_rope(c.format) ? kv.data() + 512 : nullptr;
  h.slot_mapping = slots.data();
  h.cache = cache.data();
  ASSERT_TRUE(ref::write_kv_cache(h).ok());
  // Every byte: written records equal the oracle's, everything else still holds the poison.
  EXPECT_TRUE(same_bits(cache, dcache.download<uint8_t>()));
}

TEST(WriteKvCacheGpu, BitExactVsOracle) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 100;
  for (int ps : {2, 4, 61, 64, 69}) {
    for (KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8}) {
      for (ScaleMode m : {ScaleMode::kPow2, ScaleMode::kAmax}) {
        run_write_case({ps, f, m, (ps % 2) ? 48 : 0}, ++salt);
      }
    }
  }
}

// model1_fp8 (pow2 only): records, the scale tails and the page padding (the poison must
// survive there) byte for byte against the oracle; page 1 too (one token per padded page).
TEST(WriteKvCacheGpu, Model1BitExactVsOracle) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 160;
  for (int ps : {1, 2, 4, 61, 64, 69}) {
    run_write_case({ps, KvFormat::kModel1Fp8, ScaleMode::kPow2, 0}, ++salt);
    run_write_case({ps, KvFormat::kModel1Fp8, ScaleMode::kPow2, 32}, ++salt);
  }
  run_write_case({64, KvFormat::kModel1Fp8, ScaleMode::kPow2, 0, 1200}, ++salt);  // many tokens per warp
}

// Far more tokens than resident warps: every warp walks several tokens (prefetch path).
TEST(WriteKvCacheGpu, ManyTokensPerWarp) {
  SELKV_REQUIRE_GPU();
  run_write_case({64, KvFormat::kDsMlaFp8, ScaleMode::kPow2, 0, 1200}, 151);
  run_write_case({61, KvFormat::kNopeFp8, ScaleMode::kAmax, 48, 1300}, 152);
}

// ---- C2 convert_req_indices_to_slots ---------------------------------------------------------

struct ConvertCase {
  int page_size;
  int topk;
  int extra_stride;
  bool compact;
  bool counts;
  bool in_place;
  int64_t rows = 0;  // 0: a few random rows; more rows than resident CTAs walk several rows each
  bool lens = false;  // rows' positions bounded by token_seq_lens
};

void run_convert_case(const ConvertCase& c, uint64_t salt) {
  SEED_TRACE("page_size=" + std::to_string(c.page_size) + " topk=" + std::to_string(c.topk) +
             " extra=" + std::to_string(c.extra_stride) + " compact=" + std::to_string(c.compact) +
             " counts=" + std::to_string(c.counts) + " in_place=" + std::to_string(c.in_place));
  auto rng = make_rng(salt);
  const int num_reqs = 3 + int(rng() % 4);
  const int max_blocks = 4 + int(rng() % 8);
  const int64_t num_blocks = int64_t(num_reqs) * max_blocks;
  const int64_t T = c.rows > 0 ? c.rows + int64_t(rng() % 20) : 5 + int64_t(rng() % 20);
  const int64_t stride = c.topk + c.extra_stride;
  const int64_t bt_stride = max_blocks + int64_t(rng() % 3);

  // Shuffled block table with holes and garbage ids.
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> bt(size_t(num_reqs) * bt_stride, 0x7fffffff);
  for (int r = 0; r < num_reqs; ++r) {
    for (int b = 0; b < max_blocks; ++b) {
      int32_t id = perm[size_t(r) * max_blocks + b];
      const int k = int(rng() % 12);
      if (k == 0) id = -1;
      else if (k == 1) id = int32_t(num_blocks);
      else if (k == 2) id = std::numeric_limits<int32_t>::max();
      bt[size_t(r) * bt_stride + b] = id;
    }
  }
  // req_id_per_token is LONGER than T with garbage past T (the seed-004 regression): the op
  // must read only T entries and write only T rows.
  std::vector<int32_t> req_ids(size_t(T) + 37);
  for (int64_t t = 0; t < T; ++t) {
    const int k = int(rng() % 10);
    req_ids[t] = k == 0 ? -1 : k == 1 ? num_reqs : int32_t(rng() % num_reqs);
  }
  for (size_t t = T; t < req_ids.size(); ++t) req_ids[t] = int32_t(rng() % num_reqs);

  const int32_t span = max_blocks * c.page_size;
  std::vector<int32_t> idx(size_t(T) * stride, 0x11111111);
  for (int64_t t = 0; t < T; ++t) {
    for (int k = 0; k < c.topk; ++k) {
      const int r = int(rng() % 16);
      int32_t v = int32_t(rng() % span);
      if (r == 0) v = -1;
      else if (r == 1) v = -int32_t(rng() % 100000) - 2;
      else if (r == 2) v = span + int32_t(rng() % 1000);
      else if (r == 3) v = std::numeric_limits<int32_t>::max();
      else if (r == 4) v = std::numeric_limits<int32_t>::min();
      idx[size_t(t) * stride + k] = v;
    }
  }

  // c.lens: the rows' positions bounded (token_seq_lens, longer than T like req_ids): lengths
  // inside the span, 0, negative and INT32_MAX.
  const bool with_lens = c.lens;
  std::vector<int32_t> lens(size_t(T) + 37);
  for (auto& l : lens) {
    const int k = int(rng() % 8);
    l = k == 0 ? 0 : k == 1 ? -int32_t(rng() % 100) : k == 2 ? std::numeric_limits<int32_t>::max()
                                                           : int32_t(rng() % (span + 10));
  }

  // Out: exactly T rows, with guard words before and after.
  constexpr int64_t kGuard = 64;
  const int64_t out_elems = T * stride;
  std::vector<int32_t> out(size_t(out_elems + 2 * kGuard), 0x5A5A5A5A);
  std::vector<int32_t> counts(size_t(T + 2 * kGuard), 0x3C3C3C3C);
  if (c.in_place) std::copy(idx.begin(), idx.end(), out.begin() + kGuard);

  DevBuf dbt(bt.size() * 4), dreq(req_ids.size() * 4), didx(idx.size() * 4), dout(out.size() * 4),
      dcnt(counts.size() * 4), dlens(lens.size() * 4);
  dlens.upload(lens);
  dbt.upload(bt);
  dreq.upload(req_ids);
  didx.upload(idx);
  dout.upload(out);
  dcnt.upload(counts);

  ConvertIndicesParams p;
  p.req_local_indices = c.in_place ? dout.as<int32_t>(kGuard * 4) : didx.as<int32_t>();
  p.indices_row_stride = stride;
  p.req_id_per_token = dreq.as<int32_t>();
  p.block_table = dbt.as<int32_t>();
  p.block_table_row_stride = bt_stride;
  p.num_reqs = num_reqs;
  p.max_blocks_per_req = max_blocks;
  p.num_tokens = T;
  p.topk = c.topk;
  p.page_size = c.page_size;
  p.num_blocks = num_blocks;
  p.out_slots = dout.as<int32_t>(kGuard * 4);
  p.out_row_stride = stride;
  p.valid_counts = c.counts ? dcnt.as<int32_t>(kGuard * 4) : nullptr;
  p.compact = c.compact;
  p.token_seq_lens = with_lens ? dlens.as<int32_t>() : nullptr;
  const Status st = convert_req_indices_to_slots(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  ConvertIndicesParams h = p;
  h.req_local_indices = c.in_place ? out.data() + kGuard : idx.data();
  h.req_id_per_token = req_ids.data();
  h.block_table = bt.data();
  h.out_slots = out.data() + kGuard;
  h.valid_counts = c.counts ? counts.data() + kGuard : nullptr;
  h.token_seq_lens = with_lens ? lens.data() : nullptr;
  ASSERT_TRUE(ref::convert_req_indices_to_slots(h).ok());
  EXPECT_TRUE(same_bits(out, dout.download<int32_t>())) << "out_slots (incl. guards)";
  EXPECT_TRUE(same_bits(counts, dcnt.download<int32_t>())) << "valid_counts (incl. guards)";
}

TEST(ConvertIndicesGpu, BitExactVsOracle) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 200;
  for (int ps : {2, 4, 61, 64, 69}) {
    for (int topk : {1, 7, 64, 2048, 2500, 4096}) {
      for (int mode = 0; mode < 8; ++mode) {  // every mode with and without token_seq_lens
        const bool compact = mode & 1, counts = mode & 2, lens = mode & 4;
        run_convert_case({ps, topk, 0, compact, counts, false, 0, lens}, ++salt);
      }
    }
  }
  // Padded rows (stride > topk, scalar path when unaligned), in place.
  for (int mode = 0; mode < 4; ++mode) {
    const bool compact = mode & 1, lens = mode & 2;
    run_convert_case({64, 2048, 4, compact, true, false, 0, lens}, ++salt);
    run_convert_case({64, 2048, 3, compact, true, false, 0, lens}, ++salt);
    run_convert_case({61, 2048, 0, compact, true, true, 0, lens}, ++salt);
    run_convert_case({61, 3001, 5, compact, true, true, 0, lens}, ++salt);
  }
}

// Many more rows than resident CTAs: the persistent fast path walks several rows per CTA
// (next row prefetched), in every mode, in place too.
TEST(ConvertIndicesGpu, ManyRows) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 260;
  for (int topk : {64, 2048}) {
    for (int mode = 0; mode < 8; ++mode) {
      const bool compact = mode & 1, counts = mode & 2, lens = mode & 4;
      run_convert_case({64, topk, 0, compact, counts, false, 3000, lens}, ++salt);
    }
    run_convert_case({61, topk, 0, true, true, true, 3000}, ++salt);
    run_convert_case({61, topk, 0, true, true, true, 3000, true}, ++salt);
  }
}

TEST(ConvertIndicesGpu, ZeroTopkZeroFillsCounts) {
  SELKV_REQUIRE_GPU();
  const int64_t T = 9;
  std::vector<int32_t> counts(T, 7);
  DevBuf dcnt(T * 4);
  dcnt.upload(counts);
  ConvertIndicesParams p;
  p.num_tokens = T;
  p.topk = 0;
  p.page_size = 64;
  p.valid_counts = dcnt.as<int32_t>();
  ASSERT_TRUE(convert_req_indices_to_slots(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(same_bits(std::vector<int32_t>(T, 0), dcnt.download<int32_t>()));
}

// ---- C3 gather_kv_bf16 -----------------------------------------------------------------------

struct GatherCase {
  int page_size;
  KvFormat format;
  int num_reqs;
  int max_len;
  int extra_stride;
};

// Builds a cache where only the records the requests read hold valid encodings; every other
// byte is a NaN pattern (E4M3 0xFF, scale 0xFFFFFFFF; model1_fp8: UE8M0 0xFF is NaN too), so a
// stray read shows in the output.
struct GatherSetup {
  std::vector<uint8_t> cache;
  std::vector<int32_t> bt, starts, lens, ws;
  int64_t num_blocks = 0, stride = 0, bt_stride = 0, out_rows = 0, out_stride = 0;
  int max_blocks = 0;
};

GatherSetup make_gather(const GatherCase& c, std::mt19937_64& rng) {
  GatherSetup g;
  const int max_len = c.max_len;
  g.max_blocks = (max_len + 2 * c.page_size) / c.page_size + 1;
  g.num_blocks = int64_t(c.num_reqs) * g.max_blocks + 3;
  g.stride = fmt::page_bytes(c.format, c.page_size) + c.extra_stride;
  g.bt_stride = g.max_blocks + int64_t(rng() % 3);
  g.cache.assign(size_t(g.num_blocks * g.stride), 0xFF);
  std::vector<int32_t> perm(g.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  g.bt.assign(size_t(c.num_reqs) * g.bt_stride, -7);
  for (int r = 0; r < c.num_reqs; ++r) {
    for (int b = 0; b < g.max_blocks; ++b) {
      int32_t id = perm[size_t(r) * g.max_blocks + b];
      const int k = int(rng() % 25);
      if (k == 0) id = -1;                          // missing block: zero rows
      else if (k == 1) id = int32_t(g.num_blocks);  // out of range: zero rows
      g.bt[size_t(r) * g.bt_stride + b] = id;
    }
  }
  g.out_stride = fmt::dequant_dim(c.format) + 8 * int64_t(rng() % 2);
  int64_t row = int64_t(rng() % 3);
  for (int r = 0; r < c.num_reqs; ++r) {
    const int k = int(rng() % 10);
    int32_t len = k == 0 ? 0 : int32_t(rng() % (max_len + 1));  // empty requests, short chunks
    int32_t start = int32_t(rng() % (c.page_size * 2 + 1));    // inside a page
    if (k == 1) start = -int32_t(rng() % 5) - 1;               // negative positions: zero rows
    if (k == 2) len = int32_t(c.page_size * (g.max_blocks - 1) - start + 3);  // runs past table
    if (start + int64_t(len) > int64_t(c.page_size) * g.max_blocks + 8)
      len = int32_t(int64_t(c.page_size) * g.max_blocks + 8 - start);
    if (len < 0) len = 0;
    g.starts.push_back(start);
    g.lens.push_back(len);
    g.ws.push_back(int32_t(row));
    row += len + int64_t(rng() % 3);  // gaps: rows no request writes stay poisoned
  }
  // The last request runs past out_rows: the tail is clipped.
  g.out_rows = std::max<int64_t>(1, row - (c.num_reqs > 1 ? int64_t(rng() % 5) : 0));

  // Valid records exactly where a request reads.
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> lat(512), rope(64);
  for (int r = 0; r < c.num_reqs; ++r) {
    for (int64_t i = 0; i < g.lens[r]; ++i) {
      const int64_t pos = int64_t(g.starts[r]) + i;
      if (pos < 0 || pos / c.page_size >= g.max_blocks) continue;
      const int32_t id = g.bt[size_t(r) * g.bt_stride + pos / c.page_size];
      if (id < 0 || id >= g.num_blocks) continue;
      const float mag = std::ldexp(1.f, int(rng() % 24) - 12);
      for (auto& x : lat) x = test::bf16(nd(rng) * mag);
      for (auto& x : rope) x = test::bf16(nd(rng));
      const ScaleMode m = (rng() & 1) && c.format != KvFormat::kModel1Fp8 ? ScaleMode::kAmax : ScaleMode::kPow2;
      ref::encode_token(lat.data(), rope.data(), c.format, m, g.cache.data() + id * g.stride, c.page_size,
                        pos % c.page_size);
    }
  }
  return g;
}

GatherKvParams gather_params(const GatherCase& c, const GatherSetup& g) {
  GatherKvParams p;
  p.num_blocks = g.num_blocks;
  p.page_size = c.page_size;
  p.block_stride_bytes = g.stride;
  p.format = c.format;
  p.block_table_row_stride = g.bt_stride;
  p.max_blocks_per_req = g.max_blocks;
  p.num_reqs = c.num_reqs;
  p.out_row_stride = g.out_stride;
  p.out_rows = g.out_rows;
  return p;
}

void run_gather_case(const GatherCase& c, uint64_t salt) {
  SEED_TRACE("page_size=" + std::to_string(c.page_size) + " format=" + std::to_string(int(c.format)) +
             " reqs=" + std::to_string(c.num_reqs) + " max_len=" + std::to_string(c.max_len));
  auto rng = make_rng(salt);
  const GatherSetup g = make_gather(c, rng);
  constexpr int64_t kGuardRows = 2;
  const int64_t out_elems = (g.out_rows + 2 * kGuardRows) * g.out_stride;
  std::vector<uint16_t> out(size_t(out_elems), 0xFFBF);  // poison: a NaN bf16

  DevBuf dcache(g.cache.size()), dbt(g.bt.size() * 4), dst(g.starts.size() * 4),
      dlen(g.lens.size() * 4), dws(g.ws.size() * 4), dout(out.size() * 2);
  dcache.upload(g.cache);
  dbt.upload(g.bt);
  dst.upload(g.starts);
  dlen.upload(g.lens);
  dws.upload(g.ws);
  dout.upload(out);

  GatherKvParams p = gather_params(c, g);
  p.cache = dcache.as<void>();
  p.block_table = dbt.as<int32_t>();
  p.seq_starts = dst.as<int32_t>();
  p.seq_lens = dlen.as<int32_t>();
  p.ws_starts = dws.as<int32_t>();
  p.out = dout.as<void>(kGuardRows * g.out_stride * 2);
  const Status st = gather_kv_bf16(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  GatherKvParams h = gather_params(c, g);
  h.cache = g.cache.data();
  h.block_table = g.bt.data();
  h.seq_starts = g.starts.data();
  h.seq_lens = g.lens.data();
  h.ws_starts = g.ws.data();
  h.out = out.data() + kGuardRows * g.out_stride;
  ASSERT_TRUE(ref::gather_kv_bf16(h).ok());
  EXPECT_TRUE(same_bits(out, dout.download<uint16_t>())) << "out (incl. guard rows)";
}

TEST(GatherKvGpu, BitExactVsOracle) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 300;
  for (int ps : {2, 4, 61, 64, 69}) {
    for (KvFormat f : {KvFormat::kDsMlaFp8, KvFormat::kNopeFp8}) {
      run_gather_case({ps, f, 1 + int(ps % 5), 200, 0}, ++salt);
      run_gather_case({ps, f, 9, 70, 32}, ++salt);
    }
  }
}

// model1_fp8: scales from the page tail, 448 + 64 wide rows, NaN-poisoned unreferenced bytes.
TEST(GatherKvGpu, Model1BitExactVsOracle) {
  SELKV_REQUIRE_GPU();
  uint64_t salt = 360;
  for (int ps : {1, 2, 4, 61, 64, 69}) {
    run_gather_case({ps, KvFormat::kModel1Fp8, 1 + int(ps % 5), 200, 0}, ++salt);
    run_gather_case({ps, KvFormat::kModel1Fp8, 9, 70, 32}, ++salt);
  }
  run_gather_case({64, KvFormat::kModel1Fp8, 700, 12, 0}, ++salt);   // many requests
  run_gather_case({61, KvFormat::kModel1Fp8, 3, 15000, 16}, ++salt); // long requests
}

// More requests than threads per CTA (multi-entry prefix runs) and the request limit.
TEST(GatherKvGpu, ManyRequests) {
  SELKV_REQUIRE_GPU();
  run_gather_case({64, KvFormat::kDsMlaFp8, 700, 12, 0}, 401);
  run_gather_case({4, KvFormat::kNopeFp8, 4096, 3, 16}, 402);
}

// Long requests: warps take chunks of up to 32 tokens and pipeline batches within a chunk.
TEST(GatherKvGpu, LongRequests) {
  SELKV_REQUIRE_GPU();
  run_gather_case({64, KvFormat::kDsMlaFp8, 4, 20000, 0}, 403);
  run_gather_case({61, KvFormat::kNopeFp8, 3, 15000, 16}, 404);
}

// ---- determinism and CUDA graphs -------------------------------------------------------------

TEST(CacheOpsGpu, GraphReplayAndRepeatBitwiseEqual) {
  SELKV_REQUIRE_GPU();
  SEED_TRACE("");
  auto rng = make_rng(500);
  // C1 inputs
  const int page = 61;
  const int64_t T = 300, nb = 8, stride = int64_t(page) * 656 + 16, rs = 576;
  const auto kv = make_kv_rows(T, rs, rng);
  std::vector<int64_t> slots(T);
  std::vector<int64_t> perm(nb * page);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t t = 0; t < T; ++t) slots[t] = (t % 7 == 3) ? -1 : perm[t];
  // C3 inputs over the same cache (positions 0..nb*page-1 of one request through an identity
  // table) and C2 inputs.
  // Two requests, so the table has two rows (both the identity).
  std::vector<int32_t> bt(2 * nb);
  for (int64_t i = 0; i < 2 * nb; ++i) bt[i] = int32_t(i % nb);
  std::vector<int32_t> starts = {5, 0}, lens = {int32_t(nb * page - 5), 100}, ws = {0, int32_t(nb * page - 5)};
  const int64_t out_rows = nb * page - 5 + 100;
  const int topk = 256;
  std::vector<int32_t> idx(size_t(T) * topk), req(T, 0);
  for (auto& v : idx) v = int32_t(rng() % (nb * page + 50)) - 25;

  DevBuf dkv(kv.size() * 2), dslots(T * 8), dbt(2 * nb * 4), dst(8), dlen(8), dws(8), didx(idx.size() * 4),
      dreq(T * 4);
  dkv.upload(kv);
  dslots.upload(slots);
  dbt.upload(bt);
  dst.upload(starts);
  dlen.upload(lens);
  dws.upload(ws);
  didx.upload(idx);
  dreq.upload(req);

  struct Outs {
    DevBuf cache, out, slots, counts;
    Outs(size_t a, size_t b, size_t c, size_t d) : cache(a), out(b), slots(c), counts(d) {}
  };
  auto make_outs = [&] { return new Outs(size_t(nb * stride), size_t(out_rows * 576 * 2), idx.size() * 4, T * 4); };
  auto enqueue = [&](Outs& o, cudaStream_t s) {
    EXPECT_EQ(cudaMemsetAsync(o.cache.ptr, 0xFF, o.cache.bytes, s), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(o.out.ptr, 0xEE, o.out.bytes, s), cudaSuccess);
    WriteKvCacheParams w;
    w.latent = dkv.as<void>();
    w.latent_row_stride = rs;
    w.rope = dkv.as<void>(1024);
    w.rope_row_stride = rs;
    w.slot_mapping = dslots.as<int64_t>();
    w.num_tokens = T;
    w.cache = o.cache.ptr;
    w.num_blocks = nb;
    w.page_size = page;
    w.block_stride_bytes = stride;
    w.scale_mode = ScaleMode::kAmax;
    EXPECT_TRUE(write_kv_cache(w, s).ok());
    GatherKvParams g;
    g.cache = o.cache.ptr;
    g.num_blocks = nb;
    g.page_size = page;
    g.block_stride_bytes = stride;
    g.block_table = dbt.as<int32_t>();
    g.block_table_row_stride = nb;
    g.max_blocks_per_req = int32_t(nb);
    g.seq_starts = dst.as<int32_t>();
    g.seq_lens = dlen.as<int32_t>();
    g.ws_starts = dws.as<int32_t>();
    g.num_reqs = 2;
    g.out = o.out.ptr;
    g.out_row_stride = 576;
    g.out_rows = out_rows;
    EXPECT_TRUE(gather_kv_bf16(g, s).ok());
    ConvertIndicesParams c;
    c.req_local_indices = didx.as<int32_t>();
    c.indices_row_stride = topk;
    c.req_id_per_token = dreq.as<int32_t>();
    c.block_table = dbt.as<int32_t>();
    c.block_table_row_stride = nb;
    c.num_reqs = 1;
    c.max_blocks_per_req = int32_t(nb);
    c.num_tokens = T;
    c.topk = topk;
    c.page_size = page;
    c.num_blocks = nb;
    c.out_slots = o.slots.as<int32_t>();
    c.out_row_stride = topk;
    c.valid_counts = o.counts.as<int32_t>();
    c.compact = true;
    EXPECT_TRUE(convert_req_indices_to_slots(c, s).ok());
  };

  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::unique_ptr<Outs> eager1(make_outs()), eager2(make_outs()), graphed(make_outs());
  enqueue(*eager1, s);
  enqueue(*eager2, s);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  enqueue(*graphed, s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaGraphLaunch(exec, s));  // replay twice: idempotent
  CUDA_OK(cudaStreamSynchronize(s));

  for (Outs* o : {eager2.get(), graphed.get()}) {
    EXPECT_TRUE(same_bits(eager1->cache.download<uint8_t>(), o->cache.download<uint8_t>()));
    EXPECT_TRUE(same_bits(eager1->out.download<uint16_t>(), o->out.download<uint16_t>()));
    EXPECT_TRUE(same_bits(eager1->slots.download<int32_t>(), o->slots.download<int32_t>()));
    EXPECT_TRUE(same_bits(eager1->counts.download<int32_t>(), o->counts.download<int32_t>()));
  }
  // The eager chain also matches the oracle end to end (C1 -> C3).
  std::vector<uint8_t> hcache(size_t(nb * stride), 0xFF);
  WriteKvCacheParams hw;
  hw.latent = kv.data();
  hw.latent_row_stride = rs;
  hw.rope = kv.data() + 512;
  hw.rope_row_stride = rs;
  hw.slot_mapping = slots.data();
  hw.num_tokens = T;
  hw.cache = hcache.data();
  hw.num_blocks = nb;
  hw.page_size = page;
  hw.block_stride_bytes = stride;
  hw.scale_mode = ScaleMode::kAmax;
  ASSERT_TRUE(ref::write_kv_cache(hw).ok());
  EXPECT_TRUE(same_bits(hcache, eager1->cache.download<uint8_t>()));

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace selkv
