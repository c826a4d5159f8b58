// selkv/format_traits.h — the compile-time layout of each KV record format (DESIGN §1): the one
// definition the cache kernels, the decode producer, the oracle and the runtime helpers of
// selkv/formats.h all read.
//
// A format is a KvFormatTraits<F> specialization. Members:
//   kNopeDim, kTileElems, kNumTiles   quantized (E4M3) latent elements, grouped in scale tiles
//   Scale, kScalesInRecord            scale type per tile; where the scales live (see below)
//   kNopeOffset, kRopeOffset          byte offsets of the NoPE codes / bf16 RoPE inside a record
//   kScaleOffset                      byte offset of the scales inside a record (in-record only)
//   kRopeDim, kHasRope                unquantized bf16 RoPE tail (0 / false when none)
//   kRecordBytes                      bytes of one token's data, scales included (656, 528, 584)
//   kRecordStride                     distance of consecutive records in a page
//   kDequantDim                       width of the bf16 row a reader produces
//   record_offset(in_page)            byte offset of a token's record inside its page
//   scale_offset(in_page, page_size)  byte offset of a token's first scale inside its page
//   page_bytes(page_size)             bytes a page of page_size tokens occupies (block stride >=)
// ds_mla_fp8 and nope_fp8 keep fp32 scales inside the record (kScalesInRecord; a page is
// page_size records back to back). FlashMLA's MODEL1 (model1_fp8) stores per page first the
// page_size 576-byte records (448 E4M3 NoPE codes, 64 bf16 RoPE), then page_size x 8 bytes of
// UE8M0 scales (7 tiles of 64 + 1 pad byte), the page padded to a multiple of 576 bytes: its
// scale_offset depends on page_size and it has no kScaleOffset, so code that reads kScaleOffset
// fails to compile for it instead of reading the wrong bytes.
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
  kModel1Fp8 = 2, // FlashMLA MODEL1: 576-byte records + 8 scale bytes per token in the page tail
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
  static constexpr int kRecordStride = kRecordBytes;
  static constexpr int kDequantDim = kNopeDim + kRopeDim;

  SELKV_HD static constexpr int64_t record_offset(int64_t in_page) { return in_page * kRecordBytes; }
  SELKV_HD static constexpr int64_t scale_offset(int64_t in_page, int64_t /*page_size*/) {
    return record_offset(in_page) + kScaleOffset;
  }
  SELKV_HD static constexpr int64_t page_bytes(int64_t page_size) { return page_size * kRecordBytes; }
};

// FlashMLA's MODEL1 (its tests/quant.py, FP8KVCacheLayout.MODEL1_FP8Sparse): per page,
//   [0, page_size * 576)                        token t's record at t * 576: 448 E4M3 NoPE codes
//                                               (value i at byte i), then 64 bf16 RoPE at 448
//   [page_size * 576, page_size * 584)          token t's 7 UE8M0 scales (tile k: values
//                                               [64k, 64k + 64)) + 1 pad byte at page_size*576 + 8t
//   padding to page_bytes = round_up(page_size * 584, 576)
// A UE8M0 byte b is the scale 2^(b - 127) (b = 0xFF: NaN).
struct Model1Layout {
  using Scale = uint8_t;  // UE8M0
  static constexpr bool kScalesInRecord = false;
  static constexpr int kNopeDim = 448;
  static constexpr int kTileElems = 64;
  static constexpr int kNumTiles = kNopeDim / kTileElems;  // 7
  static constexpr int kRopeDim = 64;
  static constexpr bool kHasRope = true;

  static constexpr int kNopeOffset = 0;
  static constexpr int kRopeOffset = kNopeDim;                  // 448
  static constexpr int kRecordStride = kRopeOffset + 2 * kRopeDim;  // 576
  static constexpr int kScaleStride = kNumTiles + 1;            // 8: 7 scales + 1 pad byte
  static constexpr int kRecordBytes = kRecordStride + kScaleStride;  // 584 bytes per token
  static constexpr int kPageAlign = 576;                         // pages padded to a multiple
  static constexpr int kDequantDim = kNopeDim + kRopeDim;        // 512

  SELKV_HD static constexpr int64_t record_offset(int64_t in_page) { return in_page * kRecordStride; }
  SELKV_HD static constexpr int64_t scale_offset(int64_t in_page, int64_t page_size) {
    return page_size * kRecordStride + in_page * kScaleStride;
  }
  SELKV_HD static constexpr int64_t page_bytes(int64_t page_size) {
    return (page_size * kRecordBytes + kPageAlign - 1) / kPageAlign * kPageAlign;
  }
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

template <>
struct KvFormatTraits<KvFormat::kModel1Fp8> : detail::Model1Layout {  // 584 B/token, FlashMLA MODEL1
  static constexpr KvFormat kFormat = KvFormat::kModel1Fp8;
};

static_assert(KvFormatTraits<KvFormat::kDsMlaFp8>::kRecordBytes == 656);
static_assert(KvFormatTraits<KvFormat::kNopeFp8>::kRecordBytes == 528);
// 16-byte vector accesses to every part of a record (cache kernels, decode producer).
static_assert(KvFormatTraits<KvFormat::kDsMlaFp8>::kRecordBytes % 16 == 0 &&
              KvFormatTraits<KvFormat::kNopeFp8>::kRecordBytes % 16 == 0);
// MODEL1: records (576 = 36 x 16), the RoPE offset (448) and every page are 16-byte aligned; a
// token's 8 scale bytes are 8-byte aligned.
static_assert(KvFormatTraits<KvFormat::kModel1Fp8>::kRecordBytes == 584 &&
              KvFormatTraits<KvFormat::kModel1Fp8>::kRecordStride % 16 == 0 &&
              KvFormatTraits<KvFormat::kModel1Fp8>::kRopeOffset % 16 == 0 &&
              KvFormatTraits<KvFormat::kModel1Fp8>::page_bytes(61) == 62 * 576);

// The one runtime -> compile-time format switch: fn(KvFormatTraits<f>{}). Unknown values take
// the nope_fp8 branch (argument checks reject them before any launch), as the runtime helpers
// always did.
template <class Fn>
SELKV_HD constexpr decltype(auto) dispatch_format(KvFormat f, Fn&& fn) {
  if (f == KvFormat::kDsMlaFp8) return fn(KvFormatTraits<KvFormat::kDsMlaFp8>{});
  if (f == KvFormat::kModel1Fp8) return fn(KvFormatTraits<KvFormat::kModel1Fp8>{});
  return fn(KvFormatTraits<KvFormat::kNopeFp8>{});
}

}  // namespace selkv
