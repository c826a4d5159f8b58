// C4 launcher: validate, pick the mode from the shapes (host, no sync), size a one-wave
// grid-stride grid from an occupancy query (cached per kernel and device; plain queries, legal
// during stream capture).
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "cache/dequant_selected.cuh"
#include "common/cuda_check.h"
#include "selkv/dequant.h"

namespace selkv {
namespace {

constexpr const char* kOp = "selkv::dequant_selected_kv";
using Kernel = void (*)(cache::DequantSelectedKernelParams);

// SM count x resident CTAs of `kernel` on the current device.
Status wave_ctas(Kernel kernel, int64_t* ctas) {
  constexpr int kMaxDevices = 64, kMaxKernels = 32;
  static std::mutex mu;
  static Kernel keys[kMaxKernels] = {};
  static int cached[kMaxKernels][kMaxDevices] = {};
  int dev = 0;
  SELKV_CUDA_RETURN(cudaGetDevice(&dev), kOp);
  int slot = -1;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < kMaxKernels; ++i) {
      if (keys[i] == kernel || keys[i] == nullptr) {
        keys[i] = kernel;
        slot = i;
        break;
      }
    }
    if (slot >= 0 && dev < kMaxDevices && cached[slot][dev] > 0) {
      *ctas = cached[slot][dev];
      return Status::Ok();
    }
  }
  int sms = 0, per_sm = 0;
  SELKV_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), kOp);
  SELKV_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, cache::kDequantThreads, 0),
                    kOp);
  const int v = sms * (per_sm > 0 ? per_sm : 1);
  if (slot >= 0 && dev < kMaxDevices) {
    std::lock_guard<std::mutex> lock(mu);
    cached[slot][dev] = v;
  }
  *ctas = v;
  return Status::Ok();
}

// One resident wave at most, `tasks` spread evenly: every warp runs ceil(tasks / warps) or one
// task fewer, where warps <= the resident warps.
Status launch_tasks(Kernel kernel, cache::DequantSelectedKernelParams k, cudaStream_t stream) {
  int64_t ctas = 0;
  SELKV_RETURN_IF_ERROR(wave_ctas(kernel, &ctas));
  const int64_t wave_warps = ctas * cache::kDequantWarps;
  const int64_t tasks = k.tasks > 0 ? k.tasks : 1;
  const int64_t rounds = (tasks + wave_warps - 1) / wave_warps;
  const int64_t warps = (tasks + rounds - 1) / rounds;
  const unsigned grid = unsigned((warps + cache::kDequantWarps - 1) / cache::kDequantWarps);
  kernel<<<grid, cache::kDequantThreads, 0, stream>>>(k);
  return Status::Ok();
}

template <bool kRope>
Kernel selected_kernel(int r, bool pipe, bool ef) {
  if (ef) return cache::dequant_selected_rows_kernel<kRope, 4, false, true>;
  if (r == 8) {
    return pipe ? cache::dequant_selected_rows_kernel<kRope, 8, true, false>
                : cache::dequant_selected_rows_kernel<kRope, 8, false, false>;
  }
  return pipe ? cache::dequant_selected_rows_kernel<kRope, 4, true, false>
              : cache::dequant_selected_rows_kernel<kRope, 4, false, false>;
}

template <bool kRope>
Kernel full_pool_kernel(int r, bool vec, bool ef) {
  if (ef) return vec ? cache::dequant_full_pool_kernel<kRope, 4, 4, true> : cache::dequant_full_pool_kernel<kRope, 4, 1, true>;
  if (r == 8) {
    return vec ? cache::dequant_full_pool_kernel<kRope, 8, 4, false> : cache::dequant_full_pool_kernel<kRope, 8, 1, false>;
  }
  return vec ? cache::dequant_full_pool_kernel<kRope, 4, 4, false> : cache::dequant_full_pool_kernel<kRope, 4, 1, false>;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Temporary A/B switch (bench only): 0 = previous kernel, 1 = R4, 2 = R8, 3 = R4 pipelined
// (selected; full pool as 1), 4 = R8 pipelined (selected; full pool as 2), 5 = R4 with
// evict-first record loads, 6 = R4 with CTA-minor warp numbering.
int variant() {
  static const int v = [] {
    const char* e = std::getenv("SELKV_C4_VARIANT");
    return e != nullptr ? std::atoi(e) : 1;
  }();
  return v;
}

template <bool kRope, bool kSelected>
void launch_v1(const cache::DequantSelectedKernelParams& k, unsigned grid, cudaStream_t stream) {
  cache::dequant_selected_kernel_v1<kRope, kSelected><<<grid, cache::kDequantThreads, 0, stream>>>(k);
}

Status device_sms(int* sms) {
  int dev = 0;
  SELKV_CUDA_RETURN(cudaGetDevice(&dev), kOp);
  SELKV_CUDA_RETURN(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev), kOp);
  return Status::Ok();
}

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
  k.page = cache::FastDivmod(uint32_t(p.cache.page_size));
  k.indices = p.indices;
  k.idx_stride = p.indices_row_stride;
  k.topk_length = p.topk_length;
  k.num_tokens = p.num_tokens;
  k.topk = p.topk;
  k.kdiv = cache::FastDivmod(uint32_t(p.topk));
  k.ws = static_cast<uint8_t*>(p.workspace);
  k.ws_row_bytes = p.workspace_row_stride * 2;
  k.rows = rows;
  k.num_entries = N;
  k.out_idx = p.out_indices;
  k.out_stride = p.out_indices_row_stride;
  const bool rope = fmt::has_rope(p.cache.format);

  const int var = variant();
  if (var == 0) {
    int sms = 0;
    SELKV_RETURN_IF_ERROR(device_sms(&sms));
    int64_t want = (rows + cache::kDequantRowsPerStep - 1) / cache::kDequantRowsPerStep;
    if (!selected) {
      const int64_t idx_ctas = (N + 4 * cache::kDequantThreads - 1) / (4 * cache::kDequantThreads);
      if (idx_ctas > want) want = idx_ctas;
    }
    const int64_t cap = int64_t(sms) * 8;
    const unsigned grid = unsigned(want < cap ? (want > 0 ? want : 1) : cap);
    if (rope) {
      selected ? launch_v1<true, true>(k, grid, stream) : launch_v1<true, false>(k, grid, stream);
    } else {
      selected ? launch_v1<false, true>(k, grid, stream) : launch_v1<false, false>(k, grid, stream);
    }
    return detail::launch_status(kOp);
  }
  const int r = (var == 2 || var == 4) ? 8 : 4;
  const bool pipe = var == 3 || var == 4;
  const bool ef = var == 5;
  k.cta_minor = var == 6 ? 1 : 0;

  if (selected) {
    k.tasks = (rows + r - 1) / r;  // batches of r rows
    SELKV_RETURN_IF_ERROR(launch_tasks(rope ? selected_kernel<true>(r, pipe, ef) : selected_kernel<false>(r, pipe, ef), k,
                                       stream));
  } else {
    // 16-byte index units when every unit stays inside one row and is 16-byte aligned.
    const bool vec = p.topk % 4 == 0 && p.indices_row_stride % 4 == 0 && p.out_indices_row_stride % 4 == 0 &&
                     aligned16(p.indices) && aligned16(p.out_indices);
    const int v = vec ? 4 : 1;
    const int64_t units_per_task = int64_t(32) * (r / 2);
    k.idx_units = N / v;
    const int64_t row_tasks = (rows + r - 1) / r;
    const int64_t idx_tasks = (k.idx_units + units_per_task - 1) / units_per_task;
    k.tasks = row_tasks > idx_tasks ? row_tasks : idx_tasks;
    SELKV_RETURN_IF_ERROR(launch_tasks(rope ? full_pool_kernel<true>(r, vec, ef) : full_pool_kernel<false>(r, vec, ef), k,
                                       stream));
  }
  return detail::launch_status(kOp);
}

}  // namespace selkv
