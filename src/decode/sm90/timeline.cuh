// Launch timeline of the SM90 decode kernel, a measurement build (SELKV_DECODE_TIMELINE=1; the
// macros expand to nothing otherwise). Evidence for docs/perf-log.md; usage in docs/gpu-runs.md.
#pragma once

#include <cstdio>

#include "decode/sm90/config.h"
#include "decode/timeline_clock.cuh"

namespace selkv::decode::sm90 {

// Globaltimer stamps per CTA; a one-thread kernel enqueued after the combine (timeline_clock.cuh:
// tl_enqueue_decode_print, so the decode -> combine hand-over is not disturbed) prints min / median
// / max of every stamp relative to the first CTA's entry, for the first launches of the process (run
// one case per process). Stamps:
// 0 entry, 1 producer's first publish, 2 producer end, 3 softmax WG's first Q ready, 4 its first S
// done, 5 its end, 6 the start of its last row's epilogue (store_row), 7 the producer's start (after the
// cluster sync), 8 its first index in a register, 9 its first round's first record chunk in a register
// (8 and 9 make thread 0 wait for the value), 10 the PV WG's end, 11 the CTA's exit (after the cluster's
// last barrier), 12-14 the softmax WG's and 15-17 the PV WG's last row epilogue (store_row): scaled
// (after the partial scale and its stores), staged (after the stmatrix), stored (after the copy-out),
// 18 the producer's first round converted, 19 its second round's first record chunk in a register
// (at the start of its conversion; thread 0 waits for it), 20 warp 3's first publish (lane 0), 21 the
// softmax WG's first block: this CTA's half complete (bar_full), 22 the whole tile complete (H = 128:
// the peer's half too, bar_remote; 4 - 22 is then the first S wgmmas alone).
// The 4-heads combine kernel adds its own stamps (entry, wait, lse table, merged, row ready, end:
// combine.cu), for the same launches.
#if SELKV_DECODE_TIMELINE
inline constexpr int kTlStamps = 23;
inline constexpr int kTlMaxCtas = 512;  // CTAs stamped per launch (the grid is at most one per SM)
__device__ unsigned long long g_tl[kTlMaxCtas][kTlStamps];
__device__ unsigned int g_tl_done;
__device__ unsigned int g_tl_prints;
__device__ __forceinline__ int tl_cta() { return int(blockIdx.y * gridDim.x + blockIdx.x); }
__device__ __forceinline__ void tl_stamp(int k) {
  if (tl_cta() < kTlMaxCtas) g_tl[tl_cta()][k] = timeline_now();
}
// Makes the calling thread wait until v (a load's destination) has arrived.
__device__ volatile uint32_t g_tl_sink;
__device__ __forceinline__ void tl_wait_value(uint32_t v) { g_tl_sink = v; }
// Called once per CTA when it is done (empty CTAs too): counts the CTAs. The decode kernel makes no
// call (a printf in it made ptxas serialize its wgmma, which slowed the consumers' phases the
// timeline measures); tl_print_kernel, launched after it, prints and resets.
__device__ unsigned int g_tl_ctas;  // CTAs of the launch just finished (0: nothing to print)
__device__ int g_tl_rows;
__device__ __forceinline__ void tl_finish(const DecodeKernelParams& p) {
  __threadfence();
  const unsigned total = gridDim.x * gridDim.y;
  if (atomicAdd(&g_tl_done, 1u) != total - 1) return;
  g_tl_done = 0;
  g_tl_rows = p.num_rows;
  g_tl_ctas = total;
}
// An empty part's CTA: no stamps of its own (its entry stamp is cleared), then tl_finish.
__device__ __forceinline__ void tl_empty_exit(const DecodeKernelParams& p) {
  if (tl_cta() < kTlMaxCtas) g_tl[tl_cta()][0] = 0;
  tl_finish(p);
}
// One thread, launched after each decode launch (the same translation unit: the stamps are this
// unit's globals): prints launches SKIP .. SKIP + 5 of the process, min / median / max of every
// stamp relative to the first CTA's entry, then clears the stamps.
static __global__ void tl_print_kernel() {  // static: one per translation unit, beside its stamps
  const unsigned total = g_tl_ctas;
  if (total == 0) return;
  g_tl_ctas = 0;
  const int n = int(total < kTlMaxCtas ? total : kTlMaxCtas);
  const unsigned launch = g_tl_prints++;
  if (timeline_prints_launch(launch)) {
    unsigned long long t0 = ~0ull;
    for (int c = 0; c < n; ++c)
      if (g_tl[c][0] != 0 && g_tl[c][0] < t0) t0 = g_tl[c][0];
    printf("TIMELINE decode rows=%d ctas=%d t0=%llu ns (us from t0: min / median / max)\n", g_tl_rows, n, t0);
    const char* names[kTlStamps] = {"entry", "producer_first_publish", "producer_end", "q_ready", "first_S", "end",
                                    "last_epilogue_start", "producer_start", "index0_ready", "records0_ready",
                                    "pv_end", "exit", "sm_epi_scaled", "sm_epi_staged", "sm_epi_stored",
                                    "pv_epi_scaled", "pv_epi_staged", "pv_epi_stored", "round0_converted",
                                    "records1_ready", "w3_first_publish", "first_local_half", "first_tile_whole"};
    for (int k = 0; k < kTlStamps; ++k) {
      unsigned long long v[kTlMaxCtas];
      int m = 0;
      for (int c = 0; c < n; ++c)
        if (g_tl[c][0] != 0 && g_tl[c][k] >= t0) v[m++] = g_tl[c][k] - t0;
      for (int i = 1; i < m; ++i)  // insertion sort: timeline builds only
        for (int j = i; j > 0 && v[j - 1] > v[j]; --j) { const unsigned long long x = v[j]; v[j] = v[j - 1]; v[j - 1] = x; }
      if (m > 0)
        printf("TIMELINE   %-24s %8.2f %8.2f %8.2f  (%d CTAs)\n", names[k], v[0] * 1e-3, v[m / 2] * 1e-3, v[m - 1] * 1e-3, m);
    }
  }
  for (int c = 0; c < n; ++c)
    for (int k = 0; k < kTlStamps; ++k) g_tl[c][k] = 0;
}
#define SELKV_TL(...) __VA_ARGS__
#else
#define SELKV_TL(...)
#endif

}  // namespace selkv::decode::sm90
