// Benchmark harness (DESIGN §6): CUDA-event timing with warm-up, median of groups, an L2
// flush before each timed call, optional CUDA-graph replay; ceilings (device-to-device copy
// and a cuBLAS bf16 matmul) measured in the same run; CSV output.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"

namespace selkv::bench {

struct TimingConfig {
  int warmup = 5;          // untimed calls first (module load, caches, clocks)
  int groups = 15;         // statistics are over group means
  int reps = 5;            // calls per group
  bool flush_l2 = true;    // 512 MiB memset before every timed call (outside the events)
  bool graph = false;      // capture one group into a CUDA graph and time its replays
};

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;  // over group means, per call
  int samples = 0;                               // timed calls in total
  std::string mode;                              // "eager", "eager,warm-L2", "graph", ...
};

// Enqueues one call of the op under test on the stream; throws (OpFailure/CudaFailure) on error.
using LaunchFn = std::function<void(cudaStream_t)>;

class Timer {
 public:
  static constexpr size_t kDefaultFlushBytes = size_t(512) << 20;  // > 2x the 60 MB L2 of H200

  explicit Timer(cudaStream_t stream, size_t flush_bytes = kDefaultFlushBytes);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // `before` (optional): enqueued before each timed call, after the flush, outside the events
  // (eager timing, one event pair per call).
  Timing time(const LaunchFn& fn, const TimingConfig& cfg, const LaunchFn& before = nullptr);
  cudaStream_t stream() const { return stream_; }

 private:
  void flush(cudaStream_t s);
  static bool clean_flush();
  static bool icache_flush();
  static std::string flush_mode();  // ",clean-flush" / ",icache-flush" suffixes of the timing column
  void ensure_events(size_t n);
  Timing time_eager(const LaunchFn& fn, const TimingConfig& cfg, const LaunchFn& before = nullptr);
  Timing time_graph(const LaunchFn& fn, const TimingConfig& cfg, bool event_nodes = true);

  cudaStream_t stream_;
  DeviceBuffer flush_buf_;
  std::vector<cudaEvent_t> events_;
};

// Roofline ceilings measured on this GPU in this run.
struct Ceilings {
  double copy_gbps = 0;       // median, bytes read + written per second / 1e9
  double copy_best_gbps = 0;
  double matmul_tflops = 0;   // median
  double matmul_best_tflops = 0;
  Timing copy_timing, matmul_timing;
  size_t copy_bytes = 0;      // bytes copied per call (read + write = 2x this)
  int matmul_n = 0;
};
// copy: cudaMemcpyAsync of copy_bytes (default 2 GiB) device to device;
// matmul: cublasGemmEx n^3 bf16 in, fp32 accumulate, bf16 out, random inputs.
Ceilings measure_ceilings(Timer& timer, bool quick, size_t copy_bytes = size_t(2) << 30,
                          int matmul_n = 8192);

// 100 * (roofline time) / measured time, roofline time = max(bytes / copy BW, flops / matmul).
double pct_of_ceiling(double time_us, double bytes, double flops, const Ceilings& c);

// Current commit: $SELKV_GIT_HASH, else `git rev-parse` in the source tree, else "unknown".
std::string git_hash();
std::string gpu_name(int device);

struct CsvRow {
  std::string op, shape, variant;
  Timing timing;
  double tflops = 0, gbps = 0, pct = 0;
};

class CsvWriter {
 public:
  CsvWriter() = default;
  ~CsvWriter();
  // Opens (truncates) path and writes the header; "-" writes to stdout.
  void open(const std::string& path, std::string git_hash, std::string gpu);
  bool is_open() const { return file_ != nullptr; }
  void write(const CsvRow& row);
  static const char* header();

 private:
  std::FILE* file_ = nullptr;
  bool owns_ = false;
  std::string git_hash_, gpu_;
};

}  // namespace selkv::bench
