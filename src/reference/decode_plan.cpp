// The CPU decode's plan (oracle.h make_decode_metadata): one part, the lengths snapshot.
#include <cstring>

#include "common/check.h"
#include "decode/decode_params.h"
#include "reference/oracle.h"

namespace selkv::ref {

Status make_decode_metadata(const DecodeShape& shape, void* buffer, size_t buffer_bytes, DecodeMetadata* metadata) {
  constexpr const char* kOp = "selkv::ref::make_decode_metadata";
  SELKV_CHECK_ARG(metadata != nullptr, "metadata", "must not be null");
  metadata->valid = false;
  SELKV_CHECK_ARG(shape.batch >= 0, "batch", "must be >= 0, got ", shape.batch);
  SELKV_CHECK_ARG(shape.seq_q >= 0, "seq_q", "must be >= 0, got ", shape.seq_q);
  const int64_t rows = int64_t(shape.batch) * shape.seq_q;
  // decode_metadata_size's rule (the header, tables, prefix sums and the snapshot, 16-byte rounded)
  const size_t need = rows > 0 ? ((size_t(decode::md_ints(int32_t(rows), shape.batch)) * sizeof(int32_t) + 15) & ~size_t(15)) : 0;
  if (buffer_bytes < need)
    return Status(StatusCode::kWorkspaceTooSmall,
                  detail::concat(kOp, ": buffer: needs ", need, " bytes, got ", buffer_bytes));
  SELKV_CHECK_ARG(buffer != nullptr || buffer_bytes == 0, "buffer", "must not be null");
  if (buffer_bytes > 0) {
    std::memset(buffer, 0, buffer_bytes);
    if (shape.topk_length != nullptr && rows > 0) {
      int32_t* lens = static_cast<int32_t*>(buffer) + decode::md_lengths_offset(int32_t(rows));
      for (int32_t b = 0; b < shape.batch; ++b) lens[b] = decode::clamp_topk_length(shape.topk_length[b], shape.topk);
    }
    if (rows > 0) static_cast<int32_t*>(buffer)[decode::md_extra_offset(int32_t(rows), shape.batch)] = shape.extra_topk;
    if (shape.extra_topk_length != nullptr && rows > 0) {
      int32_t* lens2 = static_cast<int32_t*>(buffer) + decode::md_extra_lengths_offset(int32_t(rows), shape.batch);
      for (int32_t b = 0; b < shape.batch; ++b)
        lens2[b] = decode::clamp_topk_length(shape.extra_topk_length[b], shape.extra_topk);
    }
  }
  *metadata = DecodeMetadata{};
  metadata->data = static_cast<int32_t*>(buffer);
  metadata->bytes = buffer_bytes;
  metadata->shape = shape;
  metadata->shape.num_sms = 1;
  metadata->num_sm_parts = 1;
  metadata->min_blocks_per_part = 1;
  metadata->valid = true;
  return Status::Ok();
}

}  // namespace selkv::ref
