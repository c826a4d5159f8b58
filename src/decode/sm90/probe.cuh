// Cycle probe of the SM90 decode kernel (SELKV_DECODE_PROBE=1 builds only; expands to nothing
// otherwise). Evidence for docs/perf-log.md.
#pragma once

#include <cstdio>

#include "decode/sm90/config.h"

namespace selkv::decode::sm90 {

// Cycle probe (SELKV_DECODE_PROBE=1 builds only; never in the library default): thread 0 of the
// producer and of each consumer warpgroup accumulates clock64 deltas per phase and prints them
// for the first few CTAs that finish. Evidence for docs/perf-log.md.
#ifndef SELKV_DECODE_PROBE
#define SELKV_DECODE_PROBE 0
#endif
#if SELKV_DECODE_PROBE
__device__ int g_decode_probe_prints[2][3];  // [H / 64 - 1][producer, consumer 0, consumer 1]
// Print for the large grid shapes only (H=128: 256 rows, H=64: 64 rows), 3 CTAs per role.
template <int kNumHeads>
__device__ __forceinline__ bool probe_should_print(const DecodeKernelParams& p, int role) {
  return p.metadata[2] == (kNumHeads == 128 ? 256 : 64) &&
         atomicAdd(&g_decode_probe_prints[kNumHeads / 64 - 1][role], 1) < 3;
}
__device__ __forceinline__ unsigned long long probe_clk() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
#define SELKV_PROBE(...) __VA_ARGS__
#else
#define SELKV_PROBE(...)
#endif

}  // namespace selkv::decode::sm90
