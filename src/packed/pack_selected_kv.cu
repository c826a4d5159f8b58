// C6 pack launcher: check, then one warp per unit (pack_selected_kv.cuh). Groups are split into
// slices only when there are at most half as many groups as resident warps (one occupancy query
// per device, legal during stream capture), so a large pack loads each index once and a small one
// still spreads over the SMs. No host sync, no allocation.
#include <cstdint>

#include "common/cuda_check.h"
#include "common/resident_ctas.h"
#include "packed/pack_selected_kv.cuh"
#include "packed/packed_checks.h"
#include "selkv/packed.h"

namespace selkv {
namespace {
constexpr const char* kOp = "selkv::pack_selected_kv";
}  // namespace

Status pack_selected_kv(const PackSelectedKvParams& p, cudaStream_t stream) {
  packed::Work work;
  SELKV_RETURN_IF_ERROR(packed::check_pack(p, &work));
  if (work == packed::Work::kNone) return Status::Ok();

  int64_t wave_ctas = 0;
  SELKV_RETURN_IF_ERROR(
      detail::resident_ctas<packed::pack_selected_kv_kernel>(packed::kPackThreads, 0, kOp, &wave_ctas));
  const int64_t wave_warps = wave_ctas * packed::kPackWarps;
  const int64_t rows = int64_t(p.batch) * p.seq_q;
  const int64_t groups = rows * p.topk / packed::kGroupEntries;
  // As many slices as keep every unit in the first wave (rounding up would start a second wave of
  // a few CTAs after the first: twice the latency of a small pack).
  int64_t splits = wave_warps / groups;
  splits = splits < 1 ? 1 : splits > packed::kMaxPackSplits ? packed::kMaxPackSplits : splits;

  packed::PackKernelParams k;
  k.cache = static_cast<const uint8_t*>(p.cache.data);
  k.num_slots = p.cache.num_slots();
  k.block_stride_bytes = p.cache.block_stride_bytes;
  k.page = FastDivmod(uint32_t(p.cache.page_size));
  k.indices = p.indices;
  k.idx_batch_stride = p.indices_batch_stride;
  k.idx_seq_stride = p.indices_seq_stride;
  k.topk_length = p.topk_length;
  k.seq = FastDivmod(uint32_t(p.seq_q));
  k.row_groups = FastDivmod(uint32_t(p.topk / packed::kGroupEntries));
  k.out = static_cast<uint8_t*>(p.packed_kv);
  k.validity = reinterpret_cast<uint32_t*>(k.out + packed::packed_validity_offset(rows, p.topk));
  k.shape = reinterpret_cast<uint64_t*>(k.out + packed::packed_shape_offset(rows, p.topk));
  k.shape_words = packed::packed_shape(p.batch, p.seq_q, p.topk);
  k.num_units = groups * splits;
  k.splits = int32_t(splits);
  const unsigned grid = unsigned((k.num_units + packed::kPackWarps - 1) / packed::kPackWarps);
  packed::pack_selected_kv_kernel<<<grid, packed::kPackThreads, 0, stream>>>(k);
  return detail::launch_status(kOp);
}

}  // namespace selkv
