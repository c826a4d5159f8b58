#include "harness.h"

#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <memory>

namespace selkv::bench {

// ---- Timer ------------------------------------------------------------------------------------

Timer::Timer(cudaStream_t stream, size_t flush_bytes) : stream_(stream), flush_buf_(flush_bytes) {}

Timer::~Timer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

// DESIGN §6 flush: write a buffer > 2x L2. That leaves the L2 full of dirty lines, which the
// timed op then pays to write back (measurable up to ~2x the traffic of a 15-30 MB op).
// SELKV_BENCH_FLUSH=clean adds a read sweep over half the buffer after the memset, so the op
// starts with a cold *and clean* L2. SELKV_BENCH_FLUSH=icache (or clean,icache) then runs a kernel
// of 256 KB of straight-line code on every SM: the memset leaves the SMs' instruction caches
// holding the op's own code from its previous call, which a serving engine (other kernels between
// two calls of one layer) never gives it. The mode is recorded in the timing column.
namespace {
bool flush_env_has(const char* word) {
  const char* env = std::getenv("SELKV_BENCH_FLUSH");
  return env && std::string(env).find(word) != std::string::npos;
}
}  // namespace

bool Timer::clean_flush() {
  static const bool clean = flush_env_has("clean");
  return clean;
}

bool Timer::icache_flush() {
  static const bool icache = flush_env_has("icache");
  return icache;
}

std::string Timer::flush_mode() {
  return std::string(clean_flush() ? ",clean-flush" : "") + (icache_flush() ? ",icache-flush" : "");
}

void Timer::flush(cudaStream_t s) {
  flush_buf_.fill_async(0, s);
  if (clean_flush()) {
    const size_t half = (flush_buf_.bytes() / 2) & ~size_t(15);
    device_read_sweep(flush_buf_.get(), half, static_cast<uint8_t*>(flush_buf_.get()) + half, s);
  }
  if (icache_flush()) device_icache_sweep(flush_buf_.get(), s);
}

void Timer::ensure_events(size_t n) {
  while (events_.size() < n) {
    cudaEvent_t e;
    SELKV_BENCH_CUDA(cudaEventCreate(&e));
    events_.push_back(e);
  }
}

namespace {

Timing summarize(std::vector<double> group_us, int samples, std::string mode) {
  Timing t;
  std::sort(group_us.begin(), group_us.end());
  const size_t n = group_us.size();
  t.median_us = n % 2 ? group_us[n / 2] : 0.5 * (group_us[n / 2 - 1] + group_us[n / 2]);
  t.min_us = group_us.front();
  t.max_us = group_us.back();
  t.samples = samples;
  t.mode = std::move(mode);
  return t;
}

float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  SELKV_BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

}  // namespace

Timing Timer::time(const LaunchFn& fn, const TimingConfig& cfg, const LaunchFn& before) {
  if (cfg.groups < 1 || cfg.reps < 1) throw std::invalid_argument("Timer: groups and reps must be >= 1");
  for (int i = 0; i < cfg.warmup; ++i) {
    if (before) before(stream_);
    fn(stream_);
  }
  SELKV_BENCH_CUDA(cudaStreamSynchronize(stream_));
  SELKV_BENCH_CUDA(cudaGetLastError());
  if (!cfg.graph || before) return time_eager(fn, cfg, before);
  try {
    return time_graph(fn, cfg);
  } catch (const CudaFailure& e) {
    // Timing through event nodes inside the graph is the preferred mode; if this driver
    // rejects it, time replays of back-to-back calls with events around the launch instead.
    const cudaError_t sticky = cudaDeviceSynchronize();
    if (sticky != cudaSuccess) throw;  // a real fault, not a timing-mode limitation
    std::fprintf(stderr, "[selkv] graph timing with event nodes failed (%s); timing whole replays\n", e.what());
    TimingConfig plain = cfg;
    plain.flush_l2 = false;
    return time_graph(fn, plain, /*event_nodes=*/false);
  }
}

// One group: with the flush (or a `before` step), each call gets its own event pair after its
// memset, so the memset is outside the measured interval; without either, one pair spans `reps`
// back-to-back calls.
Timing Timer::time_eager(const LaunchFn& fn, const TimingConfig& cfg, const LaunchFn& before) {
  std::vector<double> groups;
  const bool per_call = cfg.flush_l2 || before;
  ensure_events(per_call ? 2 * size_t(cfg.reps) : 2);
  for (int g = 0; g < cfg.groups; ++g) {
    double us = 0;
    if (per_call) {
      for (int r = 0; r < cfg.reps; ++r) {
        if (cfg.flush_l2) flush(stream_);
        if (before) before(stream_);
        SELKV_BENCH_CUDA(cudaEventRecord(events_[2 * r], stream_));
        fn(stream_);
        SELKV_BENCH_CUDA(cudaEventRecord(events_[2 * r + 1], stream_));
      }
      SELKV_BENCH_CUDA(cudaEventSynchronize(events_[2 * cfg.reps - 1]));
      for (int r = 0; r < cfg.reps; ++r) us += 1e3 * elapsed_ms(events_[2 * r], events_[2 * r + 1]);
    } else {
      SELKV_BENCH_CUDA(cudaEventRecord(events_[0], stream_));
      for (int r = 0; r < cfg.reps; ++r) fn(stream_);
      SELKV_BENCH_CUDA(cudaEventRecord(events_[1], stream_));
      SELKV_BENCH_CUDA(cudaEventSynchronize(events_[1]));
      us = 1e3 * elapsed_ms(events_[0], events_[1]);
    }
    SELKV_BENCH_CUDA(cudaGetLastError());
    groups.push_back(us / cfg.reps);
  }
  return summarize(std::move(groups), cfg.groups * cfg.reps,
                   (cfg.flush_l2 ? "eager" + flush_mode() : "eager,warm-L2") + (before ? ",untimed-before" : ""));
}

// The same group captured once into a graph (event records become graph nodes through
// cudaEventRecordExternal) and replayed: no host launch overhead between calls.
// Without event nodes (fallback), the graph holds `reps` back-to-back calls and the events are
// recorded on the stream around each replay.
Timing Timer::time_graph(const LaunchFn& fn, const TimingConfig& cfg, bool event_nodes) {
  if (!event_nodes && cfg.flush_l2) throw std::invalid_argument("Timer: graph timing without event nodes cannot flush");
  const size_t nev = cfg.flush_l2 ? 2 * size_t(cfg.reps) : 2;
  ensure_events(nev);
  cudaGraph_t graph = nullptr;
  SELKV_BENCH_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    if (cfg.flush_l2) {
      for (int r = 0; r < cfg.reps; ++r) {
        flush(stream_);
        SELKV_BENCH_CUDA(cudaEventRecordWithFlags(events_[2 * r], stream_, cudaEventRecordExternal));
        fn(stream_);
        SELKV_BENCH_CUDA(cudaEventRecordWithFlags(events_[2 * r + 1], stream_, cudaEventRecordExternal));
      }
    } else if (event_nodes) {
      SELKV_BENCH_CUDA(cudaEventRecordWithFlags(events_[0], stream_, cudaEventRecordExternal));
      for (int r = 0; r < cfg.reps; ++r) fn(stream_);
      SELKV_BENCH_CUDA(cudaEventRecordWithFlags(events_[1], stream_, cudaEventRecordExternal));
    } else {
      for (int r = 0; r < cfg.reps; ++r) fn(stream_);
    }
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  SELKV_BENCH_CUDA(cudaStreamEndCapture(stream_, &graph));
  std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> graph_guard(graph, cudaGraphDestroy);
  cudaGraphExec_t exec = nullptr;
  SELKV_BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::unique_ptr<CUgraphExec_st, decltype(&cudaGraphExecDestroy)> exec_guard(exec, cudaGraphExecDestroy);
  SELKV_BENCH_CUDA(cudaGraphUpload(exec, stream_));
  SELKV_BENCH_CUDA(cudaGraphLaunch(exec, stream_));  // warm replay
  SELKV_BENCH_CUDA(cudaStreamSynchronize(stream_));

  std::vector<double> groups;
  for (int g = 0; g < cfg.groups; ++g) {
    if (!event_nodes) SELKV_BENCH_CUDA(cudaEventRecord(events_[0], stream_));
    SELKV_BENCH_CUDA(cudaGraphLaunch(exec, stream_));
    if (!event_nodes) SELKV_BENCH_CUDA(cudaEventRecord(events_[1], stream_));
    SELKV_BENCH_CUDA(cudaStreamSynchronize(stream_));
    double us = 0;
    if (cfg.flush_l2) {
      for (int r = 0; r < cfg.reps; ++r) us += 1e3 * elapsed_ms(events_[2 * r], events_[2 * r + 1]);
    } else {
      us = 1e3 * elapsed_ms(events_[0], events_[1]);
    }
    groups.push_back(us / cfg.reps);
  }
  return summarize(std::move(groups), cfg.groups * cfg.reps,
                   cfg.flush_l2 ? "graph" + flush_mode() : event_nodes ? "graph,warm-L2" : "graph-replay,warm-L2");
}

// ---- ceilings ---------------------------------------------------------------------------------

namespace {

void cublas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw CudaFailure(std::string("cuBLAS ") + what + " failed: " + cublasGetStatusString(st));
}

}  // namespace

Ceilings measure_ceilings(Timer& timer, bool quick, size_t copy_bytes, int matmul_n) {
  Ceilings c;
  cudaStream_t s = timer.stream();
  TimingConfig cfg;
  cfg.flush_l2 = false;  // both working sets are far larger than L2
  cfg.warmup = 2;
  cfg.groups = quick ? 5 : 10;
  cfg.reps = 1;

  {  // device-to-device copy, bytes read + written
    if (quick) copy_bytes /= 2;
    DeviceBuffer src(copy_bytes), dst(copy_bytes);
    device_fill_random_bytes(src.get(), copy_bytes, 0x5eed, s);
    c.copy_timing = timer.time(
        [&](cudaStream_t st) {
          SELKV_BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, st));
        },
        cfg);
    c.copy_bytes = copy_bytes;
    c.copy_gbps = 2.0 * double(copy_bytes) / (c.copy_timing.median_us * 1e3);
    c.copy_best_gbps = 2.0 * double(copy_bytes) / (c.copy_timing.min_us * 1e3);
  }
  {  // bf16 GEMM through cuBLAS on random data
    const int n = matmul_n;
    const size_t elems = size_t(n) * n;
    DeviceBuffer a(elems * 2), b(elems * 2), out(elems * 2);
    device_fill_random_bf16(a.get(), elems, 0xa11ce, s);
    device_fill_random_bf16(b.get(), elems, 0xb0b, s);
    cublasHandle_t handle = nullptr;
    cublas_check(cublasCreate(&handle), "create");
    std::unique_ptr<cublasContext, decltype(&cublasDestroy)> guard(handle, cublasDestroy);
    cublas_check(cublasSetStream(handle, s), "set stream");
    const float alpha = 1.0f, beta = 0.0f;
    cfg.reps = 3;
    c.matmul_timing = timer.time(
        [&](cudaStream_t) {
          cublas_check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(),
                                    CUDA_R_16BF, n, b.get(), CUDA_R_16BF, n, &beta, out.get(),
                                    CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "GemmEx");
        },
        cfg);
    const double flops = 2.0 * double(n) * n * n;
    c.matmul_n = n;
    c.matmul_tflops = flops / (c.matmul_timing.median_us * 1e6);
    c.matmul_best_tflops = flops / (c.matmul_timing.min_us * 1e6);
    SELKV_BENCH_CUDA(cudaStreamSynchronize(s));
  }
  return c;
}

double pct_of_ceiling(double time_us, double bytes, double flops, const Ceilings& c) {
  if (time_us <= 0) return 0;
  double floor_us = 0;
  if (bytes > 0 && c.copy_gbps > 0) floor_us = std::max(floor_us, bytes / (c.copy_gbps * 1e3));
  if (flops > 0 && c.matmul_tflops > 0) floor_us = std::max(floor_us, flops / (c.matmul_tflops * 1e6));
  return 100.0 * floor_us / time_us;
}

// ---- provenance -------------------------------------------------------------------------------

namespace {

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// The source tree this file was compiled from (CMake passes absolute paths).
std::string source_root() {
  std::string f = __FILE__;
  const size_t slash = f.rfind("/bench/");
  return slash == std::string::npos ? std::string(".") : f.substr(0, slash);
}

bool looks_like_hash(const std::string& s) {
  return s.size() >= 7 && std::all_of(s.begin(), s.end(), [](char ch) {
           return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
         });
}

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return trim(line);
}

}  // namespace

std::string git_hash() {
  if (const char* env = std::getenv("SELKV_GIT_HASH"); env && *env) return env;
  const std::string root = source_root();
  const std::string cmd = "git -C '" + root + "' rev-parse --short=12 HEAD 2>/dev/null";
  if (std::FILE* p = popen(cmd.c_str(), "r")) {
    std::array<char, 128> buf{};
    std::string out;
    while (std::fgets(buf.data(), int(buf.size()), p)) out += buf.data();
    const int rc = pclose(p);
    out = trim(out);
    if (rc == 0 && looks_like_hash(out)) return out;
  }
  // No git binary: read .git directly (HEAD -> ref file or packed-refs).
  std::string head = read_first_line(root + "/.git/HEAD");
  if (head.rfind("ref: ", 0) == 0) {
    const std::string ref = head.substr(5);
    std::string h = read_first_line(root + "/.git/" + ref);
    if (h.empty()) {
      std::ifstream packed(root + "/.git/packed-refs");
      std::string line;
      while (std::getline(packed, line))
        if (line.size() > 41 && line.compare(41, std::string::npos, ref) == 0) h = line.substr(0, 40);
    }
    head = h;
  }
  if (looks_like_hash(head)) return head.substr(0, 12);
  return "unknown";
}

std::string gpu_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "unknown";
  return prop.name;
}

// ---- CSV --------------------------------------------------------------------------------------

namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

}  // namespace

const char* CsvWriter::header() {
  return "op,shape,variant,median_us,min_us,max_us,TFLOPS,GB/s,pct_of_ceiling,git_hash,gpu";
}

CsvWriter::~CsvWriter() {
  if (file_ && owns_) std::fclose(file_);
}

void CsvWriter::open(const std::string& path, std::string git_hash, std::string gpu) {
  if (path == "-") {
    file_ = stdout;
    owns_ = false;
  } else {
    file_ = std::fopen(path.c_str(), "w");
    if (!file_) throw std::runtime_error("cannot write CSV file " + path);
    owns_ = true;
  }
  git_hash_ = std::move(git_hash);
  gpu_ = std::move(gpu);
  std::fprintf(file_, "%s\n", header());
  std::fflush(file_);
}

void CsvWriter::write(const CsvRow& r) {
  if (!file_) return;
  std::fprintf(file_, "%s,%s,%s,%.3f,%.3f,%.3f,%.3f,%.1f,%.1f,%s,%s\n", csv_field(r.op).c_str(),
               csv_field(r.shape).c_str(), csv_field(r.variant).c_str(), r.timing.median_us,
               r.timing.min_us, r.timing.max_us, r.tflops, r.gbps, r.pct,
               csv_field(git_hash_).c_str(), csv_field(gpu_).c_str());
  std::fflush(file_);
}

}  // namespace selkv::bench
