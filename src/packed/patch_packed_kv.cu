// C6 patch launcher: check, then one warp per record (patch_packed_kv.cuh), at most 16 CTAs per
// SM (grid-stride beyond). No host sync, no allocation.
#include <cstdint>

#include "common/cuda_check.h"
#include "common/resident_ctas.h"
#include "packed/packed_checks.h"
#include "packed/patch_packed_kv.cuh"
#include "selkv/packed.h"

namespace selkv {
namespace {
constexpr const char* kOp = "selkv::patch_packed_kv";
constexpr int64_t kPatchCtasPerSm = 16;
}  // namespace

Status patch_packed_kv(const PatchPackedKvParams& p, cudaStream_t stream) {
  packed::Work work;
  SELKV_RETURN_IF_ERROR(packed::check_patch(p, &work));
  if (work == packed::Work::kNone) return Status::Ok();
  int sms = 0;
  SELKV_RETURN_IF_ERROR(detail::device_sm_count(kOp, &sms));

  const int64_t rows = int64_t(p.batch) * p.seq_q;
  packed::PatchKernelParams k;
  k.out = static_cast<uint8_t*>(p.packed_kv);
  k.validity = reinterpret_cast<uint32_t*>(k.out + packed::packed_validity_offset(rows, p.topk));
  k.shape = reinterpret_cast<uint64_t*>(k.out + packed::packed_shape_offset(rows, p.topk));
  k.want = packed::packed_shape(p.batch, p.seq_q, p.topk);
  k.entries = rows * p.topk;
  k.positions = p.positions;
  k.records = p.records;
  k.record_stride_bytes = p.record_stride_bytes;
  k.num_records = p.num_records;
  const int64_t want = (p.num_records + packed::kPatchWarps - 1) / packed::kPatchWarps;
  const int64_t cap = int64_t(sms) * kPatchCtasPerSm;
  const unsigned grid = unsigned(want < cap ? want : cap);
  packed::patch_packed_kv_kernel<<<grid, packed::kPatchThreads, 0, stream>>>(k);
  return detail::launch_status(kOp);
}

}  // namespace selkv
