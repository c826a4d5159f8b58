// Shared pieces of the C1-C3 workloads: format names, cache geometry, random FP8 records.
#pragma once

#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.h"
#include "formats/codec.h"
#include "registry.h"
#include "selkv/formats.h"

namespace selkv::bench {

inline KvFormat parse_format(const std::string& s) {
  if (s == "ds_mla_fp8") return KvFormat::kDsMlaFp8;
  if (s == "nope_fp8") return KvFormat::kNopeFp8;
  if (s == "model1_fp8") return KvFormat::kModel1Fp8;
  throw std::invalid_argument("--format: expected ds_mla_fp8, nope_fp8 or model1_fp8, got '" + s + "'");
}
inline const char* format_name(KvFormat f) { return fmt::format_name(f); }

inline ScaleMode parse_scale_mode(const std::string& s) {
  if (s == "pow2") return ScaleMode::kPow2;
  if (s == "amax") return ScaleMode::kAmax;
  throw std::invalid_argument("--scale-mode: expected pow2 or amax, got '" + s + "'");
}
inline const char* scale_mode_name(ScaleMode m) { return m == ScaleMode::kPow2 ? "pow2" : "amax"; }

inline int32_t checked_page_size(int64_t p) {
  if (p < 1 || p > (1 << 20)) throw std::invalid_argument("--page-size must be in [1, 2^20]");
  return int32_t(p);
}
inline int64_t checked_positive(const char* name, int64_t v) {
  if (v < 1) throw std::invalid_argument(std::string("--") + name + " must be >= 1");
  return v;
}

// Random but well-formed records for readers (C3): E4M3 bytes without NaN codes, tile scales
// that are half powers of two (pow2 writer) and half arbitrary (amax writer), random bf16 RoPE.
inline void fill_random_records(uint8_t* cache, int64_t num_slots, KvFormat format, Rng& rng) {
  const int rec = fmt::record_bytes(format);
  for (int64_t s = 0; s < num_slots; ++s) {
    uint8_t* r = cache + s * rec;
    for (int i = 0; i < fmt::kNopeDim; i += 8) {
      uint64_t w = rng.next();
      for (int j = 0; j < 8; ++j, w >>= 8) {
        uint8_t b = uint8_t(w);
        if ((b & 0x7f) == 0x7f) b &= 0xfe;  // 0x7f/0xff are NaN in E4M3
        r[i + j] = b;
      }
    }
    for (int k = 0; k < fmt::kNumTiles; ++k) {
      float scale = (s + k) % 2 ? float(std::ldexp(1.0, int(rng.range(-14, 2))))
                                : float(1e-4 + rng.uniform() * 2e-2);
      std::memcpy(r + fmt::kScaleOffset + 4 * k, &scale, 4);
    }
    if (fmt::has_rope(format)) {
      for (int i = 0; i < fmt::kRopeDim; ++i) {
        const uint16_t h = codec::float_to_bf16(rng.normal());
        std::memcpy(r + fmt::kRopeOffset + 2 * i, &h, 2);
      }
    }
  }
}

// Random well-formed pages of any format: num_blocks pages of `page` tokens at `block_stride`.
// The in-record formats: fill_random_records page by page (the same bytes as one call over
// dense pages). model1_fp8: random E4M3 codes (no NaN), UE8M0 scales 2^-14 .. 2^2, zero pad
// bytes, random bf16 RoPE; the page padding is left as it is.
inline void fill_random_cache(uint8_t* cache, int64_t num_blocks, int32_t page, int64_t block_stride,
                              KvFormat format, Rng& rng) {
  if (format != KvFormat::kModel1Fp8) {
    for (int64_t b = 0; b < num_blocks; ++b) fill_random_records(cache + b * block_stride, page, format, rng);
    return;
  }
  using M1 = KvFormatTraits<KvFormat::kModel1Fp8>;
  for (int64_t b = 0; b < num_blocks; ++b) {
    uint8_t* pg = cache + b * block_stride;
    for (int64_t t = 0; t < page; ++t) {
      uint8_t* r = pg + M1::record_offset(t);
      for (int i = 0; i < M1::kNopeDim; i += 8) {
        uint64_t w = rng.next();
        for (int j = 0; j < 8; ++j, w >>= 8) {
          uint8_t v = uint8_t(w);
          if ((v & 0x7f) == 0x7f) v &= 0xfe;
          r[i + j] = v;
        }
      }
      uint8_t* sc = pg + M1::scale_offset(t, page);
      for (int k = 0; k < M1::kNumTiles; ++k) sc[k] = uint8_t(127 + rng.range(-14, 2));
      sc[M1::kNumTiles] = 0;
      for (int i = 0; i < M1::kRopeDim; ++i) {
        const uint16_t h = codec::float_to_bf16(rng.normal());
        std::memcpy(r + M1::kRopeOffset + 2 * i, &h, 2);
      }
    }
  }
}

// A monotonic wall clock for the CPU-oracle runs.
class Stopwatch {
 public:
  Stopwatch() : t0_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::chrono::steady_clock::time_point t0_;
};

inline std::string hex_byte(uint32_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b & 0xffu);
  return buf;
}

}  // namespace selkv::bench
