// The switches and the clock the decode and combine kernels' launch timelines share (measurement
// builds only, SELKV_DECODE_TIMELINE=1; the stamps: sm90/timeline.cuh and combine.cu; usage in
// docs/gpu-runs.md). Normal builds see the two switches at 0 and nothing else.
#pragma once

#ifndef SELKV_DECODE_TIMELINE
#define SELKV_DECODE_TIMELINE 0
#endif
// SELKV_DECODE_TIMELINE_SKIP=N: print launches N .. N + 5 of the process instead of the first six
// (past a bench case's oracle check and warmups, so the printed launches are timed ones, after the
// bench's flush).
#ifndef SELKV_DECODE_TIMELINE_SKIP
#define SELKV_DECODE_TIMELINE_SKIP 0
#endif

#if SELKV_DECODE_TIMELINE
namespace selkv::decode {

// Whether the kernel's `launch`-th launch of the process (0-based) is printed.
__device__ __forceinline__ bool timeline_prints_launch(unsigned launch) {
  return launch >= SELKV_DECODE_TIMELINE_SKIP && launch < SELKV_DECODE_TIMELINE_SKIP + 6;
}

// Global nanosecond clock, comparable across SMs.
__device__ __forceinline__ unsigned long long timeline_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

// The decode launch's print kernel (static in its instantiation's translation unit, beside its
// stamps), enqueued by launch_decode_combine after the combine: a print kernel between the two
// launches would break their programmatic dependent launch, so the timeline could not show the
// hand-over. Host side; set by launch_sparse_decode_sm90, cleared when enqueued.
inline void (*g_tl_print_decode)(cudaStream_t) = nullptr;
inline void tl_enqueue_decode_print(cudaStream_t stream) {
  if (g_tl_print_decode != nullptr) g_tl_print_decode(stream);
  g_tl_print_decode = nullptr;
}

}  // namespace selkv::decode
#endif
