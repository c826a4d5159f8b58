// C4 launcher: validate, pick the mode from the shapes (host, no sync), size the grid-stride grid
// (selected: up to 16 CTAs per SM; full pool: one resident wave from an occupancy query, cached per
// kernel and device). Plain attribute/occupancy queries only: legal during stream capture.
#include <cstdint>

#include "cache/dequant_selected.cuh"
#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/resident_ctas.h"
#include "selkv/dequant.h"

namespace selkv {
namespace {

constexpr const char* kOp = "selkv::dequant_selected_kv";

// Selected mode's grid cap in CTAs per SM (4 are resident): the fastest of the caps measured
// (docs/perf-log.md: C4 selected grid cap).
constexpr int64_t kSelectedCtasPerSm = 16;

// One resident wave at most, `tasks` spread evenly: every warp runs ceil(tasks / warps) or one
// task fewer, where warps <= the resident warps.
template <auto kKernel>
Status launch_tasks(cache::DequantSelectedKernelParams k, cudaStream_t stream) {
  int64_t ctas = 0;
  SELKV_RETURN_IF_ERROR(detail::resident_ctas<kKernel>(cache::kDequantThreads, 0, kOp, &ctas));
  const int64_t wave_warps = ctas * cache::kDequantWarps;
  const int64_t tasks = k.tasks > 0 ? k.tasks : 1;
  const int64_t rounds = (tasks + wave_warps - 1) / wave_warps;
  const int64_t warps = (tasks + rounds - 1) / rounds;
  const unsigned grid = unsigned((warps + cache::kDequantWarps - 1) / cache::kDequantWarps);
  kKernel<<<grid, cache::kDequantThreads, 0, stream>>>(k);
  return Status::Ok();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

Status dequant_selected_kv(const DequantSelectedParams& p, cudaStream_t stream) {
  SELKV_RETURN_IF_ERROR(check_dequant_selected(p));
  const int64_t P = p.cache.num_slots();
  const int64_t N = p.num_tokens * int64_t(p.topk);
  const bool selected = dequant_selected_mode(p.num_tokens, p.topk, P) == DequantMode::kSelected;
  const int64_t rows = dequant_selected_workspace_rows(p.num_tokens, p.topk, P);
  if (N == 0) return Status::Ok();  // nothing to remap; rows = 0 too

  cache::DequantSelectedKernelParams k;
  k.cache = static_cast<const uint8_t*>(p.cache.data);
  k.num_slots = P;
  k.block_stride_bytes = p.cache.block_stride_bytes;
  k.page = FastDivmod(uint32_t(p.cache.page_size));
  k.page_size = p.cache.page_size;
  k.indices = p.indices;
  k.idx_stride = p.indices_row_stride;
  k.topk_length = p.topk_length;
  k.num_tokens = p.num_tokens;
  k.topk = p.topk;
  k.kdiv = FastDivmod(uint32_t(p.topk));
  k.ws = static_cast<uint8_t*>(p.workspace);
  k.ws_row_bytes = p.workspace_row_stride * 2;
  k.rows = rows;
  k.num_entries = N;
  k.out_idx = p.out_indices;
  k.out_stride = p.out_indices_row_stride;

  if (selected) {
    // Grid-stride over 32-row CTA steps, at most 16 CTAs per SM (4 resident).
    int sms = 0;
    SELKV_RETURN_IF_ERROR(detail::device_sm_count(kOp, &sms));
    const int64_t want = (rows + cache::kDequantRowsPerStep - 1) / cache::kDequantRowsPerStep;
    const int64_t cap = int64_t(sms) * kSelectedCtasPerSm;
    const unsigned grid = unsigned(want < cap ? want : cap);  // rows >= 1 here
    dispatch_format(p.cache.format, [&](auto f) {
      cache::dequant_selected_kernel<decltype(f)><<<grid, cache::kDequantThreads, 0, stream>>>(k);
    });
  } else {
    // 16-byte index units when every unit stays inside one row and is 16-byte aligned.
    const bool vec = p.topk % 4 == 0 && p.indices_row_stride % 4 == 0 && p.out_indices_row_stride % 4 == 0 &&
                     aligned16(p.indices) && aligned16(p.out_indices);
    const int64_t v = vec ? 4 : 1;
    const int64_t units_per_task = int64_t(32) * cache::kFullPoolUnits;
    k.idx_units = N / v;
    const int64_t row_tasks = (rows + cache::kFullPoolRows - 1) / cache::kFullPoolRows;
    const int64_t idx_tasks = (k.idx_units + units_per_task - 1) / units_per_task;
    k.tasks = row_tasks > idx_tasks ? row_tasks : idx_tasks;
    // Index-unit width: 16-byte units or single entries.
    SELKV_RETURN_IF_ERROR(dispatch_format(p.cache.format, [&](auto f) {
      return detail::dispatch_bool(vec, [&](auto v4) {
        return launch_tasks<cache::dequant_full_pool_kernel<decltype(f), decltype(v4)::value ? 4 : 1>>(k, stream);
      });
    }));
  }
  return detail::launch_status(kOp);
}

}  // namespace selkv
