// SM90 FP8 sparse MLA decode kernel (C5). Design: docs/decode-design.md §2.
//
// One CTA = one 64-head group x one part of the split-KV schedule (a run of (row, 64-token
// block) items). WG0 (producer.cuh) dequantizes FP8 records into a double-buffered bf16 K tile
// ring; WG1 (consumer.cuh, softmax WG) computes S for all 64 tokens, the online softmax and
// O[:, 0:256]; WG2 (PV WG) computes O[:, 256:512] from WG1's P tile. WG1 and WG2 run one source
// (run_consumer_wg) that differs only in the block loop; one copy of its code where
// RegisterSplit::kOneConsumerCopy says so. H = 128 runs as a 2-CTA cluster sharing the dequantized tiles.
#pragma once

#include <cuda_runtime_api.h>

#include <cutlass/arch/reg_reconfig.h>

#include "common/arch.h"

#include "decode/sm90/config.h"
#include "decode/sm90/consumer.cuh"
#include "decode/sm90/invalid_plan.cuh"
#include "decode/sm90/launch.h"
#include "decode/sm90/part_iter.cuh"
#include "decode/sm90/producer.cuh"

namespace selkv::decode::sm90 {

// ---- kernel ---------------------------------------------------------------------------------
// kF16Partials: split rows' partials in fp16 with an inverse scale (partial_scale.h), else fp32
// (decode_params.h f16_partials_by_default; the combine reads the same format). kPacked: the
// records come from a packed KV buffer (C6, selkv/packed.h; producer.cuh), else the paged cache.
// kFormat: the cache's record format, which sets the geometry (DecodeLayout: d_qk 576 or 512) and
// the producer's dequant; model1_fp8 kernels also take the optional extra cache (p.topk_extra).
template <int kNumHeads, bool kDynamic, bool kF16Partials, bool kPacked, KvFormat kFormat>
__global__ void __launch_bounds__(kNumThreads, 1)
sparse_decode_sm90_kernel(const __grid_constant__ DecodeKernelParams p) {
  using L = DecodeLayout<kFormat>;
  using SharedStorage = typename L::SharedStorage;
  constexpr bool kExtra = kFormat == KvFormat::kModel1Fp8;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  if ((cute::cast_smem_ptr_to_uint(smem_raw) & 1023u) != 0) __trap();  // swizzle needs 1 KB alignment
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);
  SELKV_TL(if (threadIdx.x == 0) tl_stamp(0);)

  // Dynamic: the part entry's load goes out first, beside the header's (make_schedule), not after
  // the header check (a second DRAM round trip before the first index load otherwise).
  PartStart entry{};
  if constexpr (kDynamic) entry = load_part_entry(p.metadata, int32_t(blockIdx.y));
  [[maybe_unused]] int32_t extra_len_lane = 0;
  if constexpr (kExtra && kDynamic) extra_len_lane = preload_extra_lengths(p);
  auto make = [&] {
    if constexpr (kExtra) return make_schedule_extra<kDynamic>(p);
    else return make_schedule<kDynamic>(p);
  };
  PartIter it(make());
  if constexpr (kDynamic) {
    if (!it.sched.valid()) {  // the plan does not describe this call (uniform): NaN rows, no walk
      write_nan_rows(p);
      return;
    }
  }
  // grid (H / 64, parts); H = 128 runs as clusters of the two head groups of one part (cluster
  // rank == blockIdx.x). An empty part exits in both CTAs of its cluster, before any cluster sync.
  if (!it.init(int32_t(blockIdx.y), entry)) {  // uniform
    SELKV_TL(if (threadIdx.x == 0) tl_empty_exit(p);)
    return;
  }
  using Traits = DecodeTraits<kNumHeads>;
  constexpr int kCluster = Traits::kCluster;
  const uint32_t rank = kCluster == 2 ? uint32_t(blockIdx.x) : 0u;
  if constexpr (kPacked) prefetch_packed_part_head<kNumHeads, kDynamic>(p, it, rank);

  if (threadIdx.x == 0) {
    CUTE_UNROLL
    for (int i = 0; i < kNumKBufs; ++i) {
      cutlass::arch::ClusterBarrier::init(&ss.bar_full[i], 128);
      cutlass::arch::ClusterBarrier::init(&ss.bar_remote[i], 1);  // expect_tx + the peer's bytes
      cutlass::arch::ClusterBarrier::init(&ss.bar_empty[i], Traits::kEmptyArrivals);
    }
    cutlass::arch::ClusterBarrier::init(&ss.bar_first_loads, 4);  // one lane per producer warp
    cutlass::arch::fence_barrier_init();
  }
  if constexpr (kCluster == 2) {
    cute::cluster_arrive_relaxed();  // barriers of both CTAs initialized before any remote access
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  // Programmatic dependent launch: the combine kernel may be scheduled now; it waits
  // (griddepcontrol.wait) for this grid's completion and memory flush before reading partials.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  const int wg = int(threadIdx.x) / 128;
  // Branch order sets the code layout (ptxas places the else path first): the producer's code right
  // after the prologue, then the consumers'. With the producer's code last, a
  // call with cold instruction caches (as in a serving engine) started its first KV block later
  // (docs/perf-log.md: decode code layout).
  using Regs = RegisterSplit<kNumHeads, kDynamic, kF16Partials, kPacked, kFormat>;
  if (wg != 0) {
    // packed: the buffer's shape words (p.cache is the buffer, p.num_slots its B * S_q * K)
    const uint64_t* shape_words = nullptr;
    if constexpr (kPacked)
      shape_words = reinterpret_cast<const uint64_t*>(p.cache + packed::packed_shape_offset(1, p.num_slots));
    if constexpr (Regs::kOneConsumerCopy) {
      cutlass::arch::warpgroup_reg_alloc<Regs::kShared>();
      run_consumer_wg<L, kNumHeads, kF16Partials, Regs, kEitherWg>(p, ss, it, shape_words);
    } else if (wg == 2) {
      if constexpr (Regs::kPvWg != kLaunchRegs) cutlass::arch::warpgroup_reg_dealloc<Regs::kPvWg>();
      run_consumer_wg<L, kNumHeads, kF16Partials, Regs, 1>(p, ss, it, nullptr);
    } else {
      cutlass::arch::warpgroup_reg_alloc<Regs::kSoftmaxWg>();
      run_consumer_wg<L, kNumHeads, kF16Partials, Regs, 0>(p, ss, it, shape_words);
    }
  } else {
    cutlass::arch::warpgroup_reg_dealloc<Regs::kProducer>();
    run_producer<L, kNumHeads, kDynamic, kPacked>(p, ss, it, rank, extra_len_lane);
  }
  if constexpr (kCluster == 2) {
    // No CTA exits while its peer may still write its smem or arrive on its barriers.
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  }
  SELKV_TL(if (threadIdx.x == 0) tl_stamp(11);)
#else
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) __trap();  // built without sm_90a
#endif
}

// Host launch (explicitly instantiated in instantiations/*.cu).
template <int kNumHeads, bool kDynamic, bool kF16Partials, bool kPacked, KvFormat kFormat>
cudaError_t launch_sparse_decode_sm90(const DecodeKernelParams& p, cudaStream_t stream) {
  auto kernel = &sparse_decode_sm90_kernel<kNumHeads, kDynamic, kF16Partials, kPacked, kFormat>;
  constexpr int kSmem = int(sizeof(typename DecodeLayout<kFormat>::SharedStorage));
  cudaError_t err =
      selkv::detail::set_max_dynamic_smem_once<&sparse_decode_sm90_kernel<kNumHeads, kDynamic, kF16Partials, kPacked, kFormat>>(kSmem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(DecodeTraits<kNumHeads>::kCluster, p.num_sm_parts, 1);
  cfg.blockDim = dim3(kNumThreads, 1, 1);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = DecodeTraits<kNumHeads>::kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = DecodeTraits<kNumHeads>::kCluster > 1 ? 1 : 0;
  SELKV_TL(tl_enqueue_decode_print(stream);)  // a previous launch's print not yet enqueued
  err = cudaLaunchKernelEx(&cfg, kernel, p);
  if (err != cudaSuccess) return err;
  // Timeline builds: the print of what this launch stamped, enqueued after the combine (or before
  // the next decode launch when there was none).
  SELKV_TL(g_tl_print_decode = [](cudaStream_t s) { tl_print_kernel<<<1, 1, 0, s>>>(); };)
  return cudaGetLastError();
}

// How many clusters (H = 128) / CTAs (H = 64) of the decode kernel can be resident at once on the
// current device, for a grid of `parts` parts: the part count must not exceed it (a second wave
// would double the time).
template <int kNumHeads>
cudaError_t max_resident_sparse_decode_sm90(int parts, int* count) {
  // (the native fixed fp16 ds_mla_fp8 instantiation stands for all: one CTA per SM, the same
  // registers and cluster shape; model1_fp8's smaller smem plan still fits only one)
  auto kernel = &sparse_decode_sm90_kernel<kNumHeads, false, true, false, KvFormat::kDsMlaFp8>;
  constexpr int kSmem = int(sizeof(SharedStorage));
  cudaError_t err = selkv::detail::set_max_dynamic_smem_once<
      &sparse_decode_sm90_kernel<kNumHeads, false, true, false, KvFormat::kDsMlaFp8>>(kSmem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(DecodeTraits<kNumHeads>::kCluster, parts > 0 ? parts : 1, 1);
  cfg.blockDim = dim3(kNumThreads, 1, 1);
  cfg.dynamicSmemBytes = kSmem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = DecodeTraits<kNumHeads>::kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaOccupancyMaxActiveClusters(count, kernel, &cfg);
}

}  // namespace selkv::decode::sm90
