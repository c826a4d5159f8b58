// Oracle: encode/decode of one KV record (DESIGN §1), built only from the scalar rules in
// formats/codec.h so it is bit-exact by construction.
#include <cmath>
#include <cstring>

#include "formats/codec.h"
#include "reference/oracle.h"

namespace selkv::ref {

void encode_record(const uint16_t* latent, const uint16_t* rope, KvFormat format, ScaleMode mode,
                   uint8_t* record) {
  for (int tile = 0; tile < fmt::kNumTiles; ++tile) {
    const uint16_t* x = latent + tile * fmt::kTileElems;
    // amax in fp32 over the bf16 inputs (exact: |bf16| is representable in fp32).
    float amax = 0.f;
    for (int i = 0; i < fmt::kTileElems; ++i) {
      const float a = std::fabs(codec::bf16_to_float(x[i]));
      if (a > amax) amax = a;
    }
    const float s = codec::tile_scale(amax, mode);
    for (int i = 0; i < fmt::kTileElems; ++i) {
      record[fmt::kNopeOffset + tile * fmt::kTileElems + i] =
          codec::float_to_e4m3(codec::bf16_to_float(x[i]) / s);
    }
    std::memcpy(record + fmt::kScaleOffset + 4 * tile, &s, 4);  // little-endian host
  }
  if (fmt::has_rope(format)) {
    std::memcpy(record + fmt::kRopeOffset, rope, 2 * fmt::kRopeDim);  // RoPE stays bf16
  }
}

void decode_record(const uint8_t* record, KvFormat format, uint16_t* out) {
  float scales[fmt::kNumTiles];
  std::memcpy(scales, record + fmt::kScaleOffset, sizeof(scales));
  for (int i = 0; i < fmt::kNopeDim; ++i) {
    out[i] = codec::dequant_e4m3(record[fmt::kNopeOffset + i], scales[i / fmt::kTileElems]);
  }
  if (fmt::has_rope(format)) {
    std::memcpy(out + fmt::kNopeDim, record + fmt::kRopeOffset, 2 * fmt::kRopeDim);
  }
}

}  // namespace selkv::ref
