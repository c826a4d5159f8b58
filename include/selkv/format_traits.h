// selkv/format_traits.h — the compile-time layout of each KV record format (DESIGN §1): the one
// definition the cache kernels, the decode producer, the oracle and the runtime helpers of
// selkv/formats.h all read.
//
// A format is a KvFormatTraits<F> specialization. Members:
//   kNopeDim, kTileElems, kNumTiles   quantized (E4M3) latent elements, grouped in scale tiles
//   Scale, kScalesInRecord            scale type per tile; where the scales live (see below)
//   kNopeOffset, kScaleOffset         byte offsets inside a record
//   kRopeDim, kRopeOffset, kHasRope   unquantized bf16 RoPE tail (0 / 0 / false when none)
//   kRecordBytes, kDequantDim         bytes per token; width of the bf16 row a reader produces
//   record_offset(in_page)            byte offset of a token's record inside its page
// Both current formats keep the scales inside the record. A format that stores them per page
// after the records (FlashMLA's MODEL1: 7 tiles of 64, UE8M0 scales) would set kScalesInRecord =
// false and add the page-level scale addressing; kernels that read kScaleOffset assert
// kScalesInRecord so such a format fails to compile instead of reading the wrong bytes.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SELKV_HD __host__ __device__ __forceinline__
#else
#define SELKV_HD inline
#endif

namespace selkv {

enum class KvFormat : int32_t {
  kDsMlaFp8 = 0,  // 656-byte records
  kNopeFp8 = 1,   // 528-byte records
};

namespace detail {

// 512 E4M3 codes, 4 fp32 scales (one per 128 elements), then kRopeDim bf16, all in the record.
template <int kRope>
struct Fp8RecordLayout {
  using Scale = float;
  static constexpr bool kScalesInRecord = true;
  static constexpr int kNopeDim = 512;
  static constexpr int kTileElems = 128;
  static constexpr int kNumTiles = kNopeDim / kTileElems;  // 4
  static constexpr int kRopeDim = kRope;
  static constexpr bool kHasRope = kRopeDim > 0;

  static constexpr int kNopeOffset = 0;
  static constexpr int kScaleOffset = kNopeOffset + kNopeDim;                   // 512
  static constexpr int kScaleEnd = kScaleOffset + kNumTiles * int(sizeof(Scale));  // 528
  static constexpr int kRopeOffset = kHasRope ? kScaleEnd : 0;
  static constexpr int kRecordBytes = kScaleEnd + 2 * kRopeDim;
  static constexpr int kDequantDim = kNopeDim + kRopeDim;

  SELKV_HD static constexpr int64_t record_offset(int64_t in_page) { return in_page * kRecordBytes; }
};

}  // namespace detail

template <KvFormat F>
struct KvFormatTraits;

template <>
struct KvFormatTraits<KvFormat::kDsMlaFp8> : detail::Fp8RecordLayout<64> {  // 656 B, DeepSeek-V3.2
  static constexpr KvFormat kFormat = KvFormat::kDsMlaFp8;
};

template <>
struct KvFormatTraits<KvFormat::kNopeFp8> : detail::Fp8RecordLayout<0> {  // 528 B, GLM NoPE
  static constexpr KvFormat kFormat = KvFormat::kNopeFp8;
};

static_assert(KvFormatTraits<KvFormat::kDsMlaFp8>::kRecordBytes == 656);
static_assert(KvFormatTraits<KvFormat::kNopeFp8>::kRecordBytes == 528);
// 16-byte vector accesses to every part of a record (cache kernels, decode producer).
static_assert(KvFormatTraits<KvFormat::kDsMlaFp8>::kRecordBytes % 16 == 0 &&
              KvFormatTraits<KvFormat::kNopeFp8>::kRecordBytes % 16 == 0);

// The one runtime -> compile-time format switch: fn(KvFormatTraits<f>{}). Values other than
// ds_mla_fp8 take the nope_fp8 branch (argument checks reject them before any launch), as the
// runtime helpers always did.
template <class Fn>
SELKV_HD constexpr decltype(auto) dispatch_format(KvFormat f, Fn&& fn) {
  if (f == KvFormat::kDsMlaFp8) return fn(KvFormatTraits<KvFormat::kDsMlaFp8>{});
  return fn(KvFormatTraits<KvFormat::kNopeFp8>{});
}

}  // namespace selkv
