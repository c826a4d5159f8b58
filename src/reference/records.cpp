// Oracle: encode/decode of one token's record and scales (DESIGN §1), built only from the scalar
// rules in formats/codec.h so it is bit-exact by construction.
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "formats/codec.h"
#include "reference/oracle.h"

namespace selkv::ref {

namespace {

template <class Fmt>
constexpr bool kFp32InRecord = Fmt::kScalesInRecord && sizeof(typename Fmt::Scale) == 4;
template <class Fmt>
constexpr bool kUe8m0InPage = !Fmt::kScalesInRecord && sizeof(typename Fmt::Scale) == 1;

template <class Fmt>
void encode(const uint16_t* latent, const uint16_t* rope, ScaleMode mode, uint8_t* page, int64_t page_size,
            int64_t in_page) {
  static_assert(kFp32InRecord<Fmt> || kUe8m0InPage<Fmt>, "a scale placement the oracle knows");
  if constexpr (kUe8m0InPage<Fmt>) {
    if (mode != ScaleMode::kPow2) {
      throw std::invalid_argument("selkv::ref::encode_token: model1_fp8 takes scale_mode pow2 only");
    }
  }
  uint8_t* record = page + Fmt::record_offset(in_page);
  uint8_t* scales = page + Fmt::scale_offset(in_page, page_size);
  for (int tile = 0; tile < Fmt::kNumTiles; ++tile) {
    const uint16_t* x = latent + tile * Fmt::kTileElems;
    // amax in fp32 over the bf16 inputs (exact: |bf16| is representable in fp32).
    float amax = 0.f;
    for (int i = 0; i < Fmt::kTileElems; ++i) {
      const float a = std::fabs(codec::bf16_to_float(x[i]));
      if (a > amax) amax = a;
    }
    const float s = codec::tile_scale(amax, mode);
    for (int i = 0; i < Fmt::kTileElems; ++i) {
      record[Fmt::kNopeOffset + tile * Fmt::kTileElems + i] =
          codec::float_to_e4m3(codec::bf16_to_float(x[i]) / s);
    }
    if constexpr (kFp32InRecord<Fmt>) {
      std::memcpy(scales + 4 * tile, &s, 4);  // little-endian host
    } else {
      scales[tile] = codec::float_to_ue8m0(s);  // s is a power of two (or inf -> 0xFF)
    }
  }
  if constexpr (kUe8m0InPage<Fmt>) {
    for (int b = Fmt::kNumTiles; b < Fmt::kScaleStride; ++b) scales[b] = 0;  // pad byte
  }
  if constexpr (Fmt::kHasRope) {
    std::memcpy(record + Fmt::kRopeOffset, rope, 2 * Fmt::kRopeDim);  // RoPE stays bf16
  }
}

template <class Fmt>
void decode(const uint8_t* page, int64_t page_size, int64_t in_page, uint16_t* out) {
  static_assert(kFp32InRecord<Fmt> || kUe8m0InPage<Fmt>, "a scale placement the oracle knows");
  const uint8_t* record = page + Fmt::record_offset(in_page);
  const uint8_t* sp = page + Fmt::scale_offset(in_page, page_size);
  float scales[Fmt::kNumTiles];
  if constexpr (kFp32InRecord<Fmt>) {
    std::memcpy(scales, sp, sizeof(scales));
  } else {
    for (int k = 0; k < Fmt::kNumTiles; ++k) scales[k] = codec::ue8m0_to_float(sp[k]);
  }
  for (int i = 0; i < Fmt::kNopeDim; ++i) {
    out[i] = codec::dequant_e4m3(record[Fmt::kNopeOffset + i], scales[i / Fmt::kTileElems]);
  }
  if constexpr (Fmt::kHasRope) {
    std::memcpy(out + Fmt::kNopeDim, record + Fmt::kRopeOffset, 2 * Fmt::kRopeDim);
  }
}

}  // namespace

void encode_token(const uint16_t* latent, const uint16_t* rope, KvFormat format, ScaleMode mode, uint8_t* page,
                  int64_t page_size, int64_t in_page) {
  dispatch_format(format, [&](auto f) { encode<decltype(f)>(latent, rope, mode, page, page_size, in_page); });
}

void decode_token(const uint8_t* page, KvFormat format, int64_t page_size, int64_t in_page, uint16_t* out) {
  dispatch_format(format, [&](auto f) { decode<decltype(f)>(page, page_size, in_page, out); });
}

void encode_slot(const uint16_t* latent, const uint16_t* rope, ScaleMode mode, const PagedKvCache& view,
                 uint8_t* cache, int64_t slot) {
  const int64_t block = slot / view.page_size;
  encode_token(latent, rope, view.format, mode, cache + view.page_offset(block), view.page_size,
               slot - block * view.page_size);
}

void decode_slot(const PagedKvCache& view, int64_t slot, uint16_t* out) {
  const int64_t block = slot / view.page_size;
  decode_token(static_cast<const uint8_t*>(view.data) + view.page_offset(block), view.format, view.page_size,
               slot - block * view.page_size, out);
}

void encode_record(const uint16_t* latent, const uint16_t* rope, KvFormat format, ScaleMode mode,
                   uint8_t* record) {
  encode_token(latent, rope, format, mode, record, 1, 0);
}

void decode_record(const uint8_t* record, KvFormat format, uint16_t* out) {
  decode_token(record, format, 1, 0, out);
}

}  // namespace selkv::ref
