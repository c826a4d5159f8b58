// Oracle: encode/decode of one KV record (DESIGN §1), built only from the scalar rules in
// formats/codec.h so it is bit-exact by construction.
#include <cmath>
#include <cstring>

#include "formats/codec.h"
#include "reference/oracle.h"

namespace selkv::ref {

namespace {

template <class Fmt>
void encode(const uint16_t* latent, const uint16_t* rope, ScaleMode mode, uint8_t* record) {
  static_assert(Fmt::kScalesInRecord && sizeof(typename Fmt::Scale) == 4, "fp32 scales in the record");
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
    std::memcpy(record + Fmt::kScaleOffset + 4 * tile, &s, 4);  // little-endian host
  }
  if constexpr (Fmt::kHasRope) {
    std::memcpy(record + Fmt::kRopeOffset, rope, 2 * Fmt::kRopeDim);  // RoPE stays bf16
  }
}

template <class Fmt>
void decode(const uint8_t* record, uint16_t* out) {
  static_assert(Fmt::kScalesInRecord && sizeof(typename Fmt::Scale) == 4, "fp32 scales in the record");
  float scales[Fmt::kNumTiles];
  std::memcpy(scales, record + Fmt::kScaleOffset, sizeof(scales));
  for (int i = 0; i < Fmt::kNopeDim; ++i) {
    out[i] = codec::dequant_e4m3(record[Fmt::kNopeOffset + i], scales[i / Fmt::kTileElems]);
  }
  if constexpr (Fmt::kHasRope) {
    std::memcpy(out + Fmt::kNopeDim, record + Fmt::kRopeOffset, 2 * Fmt::kRopeDim);
  }
}

}  // namespace

void encode_record(const uint16_t* latent, const uint16_t* rope, KvFormat format, ScaleMode mode,
                   uint8_t* record) {
  dispatch_format(format, [&](auto f) { encode<decltype(f)>(latent, rope, mode, record); });
}

void decode_record(const uint8_t* record, KvFormat format, uint16_t* out) {
  dispatch_format(format, [&](auto f) { decode<decltype(f)>(record, out); });
}

}  // namespace selkv::ref
