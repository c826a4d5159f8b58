// selkv — the command-line program: main job (default workload + oracle check), benchmarks.
//
//   selkv                 DeepSeek-V3.2 serving-step workload on the GPU, checked vs the oracle
//   selkv --bench         the full benchmark grid (CSV with --csv FILE)
//   selkv --help
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include "anchor.h"
#include "common/cuda_check.h"
#include "harness.h"
#include "registry.h"
#include "table.h"

namespace selkv::cli {
namespace {

using bench::BenchCase;
using bench::CheckResult;
using bench::OpSpec;
using bench::Workload;

struct Options {
  std::set<std::string> ops;  // empty = all
  std::string csv;
  std::string cases;  // --cases REGEX: benchmark cases whose label matches (any grid, not only --quick's)
  bool bench = false, quick = false, graph = false, no_flush = false, list = false, cpu = false;
  bench::Params params;
};

// A bad flag value is a usage error (exit 2, like an unknown flag), not a failed op (exit 1). The
// op files report one as std::invalid_argument whose message starts with the flag ("--heads ...").
bool is_usage_error(const std::exception& e) {
  return dynamic_cast<const std::invalid_argument*>(&e) != nullptr && std::strncmp(e.what(), "--", 2) == 0;
}

void progress(const char* fmt_str, const std::string& a = "", const std::string& b = "") {
  std::fprintf(stderr, "[selkv] ");
  std::fprintf(stderr, fmt_str, a.c_str(), b.c_str());
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

void print_help() {
  std::printf(
      "selkv — sparse (selected-KV) attention kernels and FP8 KV-cache ops for Hopper GPUs\n\n"
      "usage: selkv [options]\n\n"
      "With no options, runs one DeepSeek-V3.2 serving step on the GPU (ds_mla_fp8 cache, page 64),\n"
      "every op once with its default shape (below): C1 cache write, C2 top-k index conversion, C3\n"
      "gather of a prefill chunk, C5 sparse MLA decode over the converted slots, C4 selected-row\n"
      "dequant, C7 sparse MLA prefill. Checks a sample of every output against the CPU oracle\n"
      "(bit-exact for C1-C4; C5 and C7 within the attention tolerances vs the fp64 oracle) and\n"
      "prints a table with the time, bandwidth and %% of the ceilings measured in the same run.\n"
      "Without a GPU it says so and runs the CPU oracle on a small default instead.\n\n"
      "options:\n"
      "  --ops LIST        comma-separated ops to run (default: all)\n"
      "  --bench           run the benchmark grid instead of the main job\n"
      "  --quick           fewer repetitions; with --bench, the quick subset of the grid\n"
      "  --cases REGEX     with --bench, only the cases whose label (see --list) matches REGEX, from\n"
      "                    the whole grid (--quick then only shortens the repetitions)\n"
      "  --csv FILE        also write CSV rows (op,shape,variant,median_us,...) to FILE ('-' = stdout)\n"
      "  --graph           time every case under CUDA-graph replay\n"
      "  --no-flush        do not flush L2 (512 MiB memset) before each timed call\n"
      "  --list            list ops and benchmark cases, then exit\n"
      "  --cpu             run the CPU oracle path even when a GPU is present\n"
      "  --seed N          input seed (default: fresh each run, printed)\n"
      "  --sample N        rows/records compared with the oracle per op (4096)\n"
      "  --help            this text\n\n"
      "ops and their shape flags:\n");
  for (const OpSpec* op : bench::sorted_ops()) {
    std::printf("  %-10s %s\n", op->key.c_str(), op->summary.c_str());
    for (const auto& p : op->params) std::printf("      --%-14s %s\n", p.name.c_str(), p.help.c_str());
  }
  std::printf(
      "\nexamples:\n"
      "  selkv --ops gather --tokens 128K --page-size 61\n"
      "  selkv --bench --csv out/bench.csv\n"
      "exit status: 0 ok, 1 a check or an op failed, 2 bad usage (unknown flag, bad value) or no GPU\n"
      "for --bench\n");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Returns false (after printing why) on a usage error.
bool parse_args(int argc, char** argv, Options& o) {
  std::set<std::string> value_flags = {"ops", "csv", "cases", "seed", "sample"};
  for (const OpSpec* op : bench::sorted_ops())
    for (const auto& p : op->params) value_flags.insert(p.name);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      std::fprintf(stderr, "selkv: unexpected argument '%s' (see --help)\n", a.c_str());
      return false;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_inline = eq != std::string::npos;
    if (has_inline) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (value_flags.count(name)) {
      if (!has_inline) {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "selkv: --%s needs a value\n", name.c_str());
          return false;
        }
        value = argv[++i];
      }
      if (name == "ops") {
        for (const auto& k : split(value, ',')) {
          if (!bench::find_op(k)) {
            std::fprintf(stderr, "selkv: unknown op '%s' (see --list)\n", k.c_str());
            return false;
          }
          o.ops.insert(k);
        }
      } else if (name == "csv") {
        o.csv = value;
      } else if (name == "cases") {
        try {
          (void)std::regex(value);
        } catch (const std::regex_error&) {
          std::fprintf(stderr, "selkv: --cases '%s' is not a valid regular expression\n", value.c_str());
          return false;
        }
        o.cases = value;
      } else {
        o.params.set(name, value);
      }
      continue;
    }
    if (has_inline) {
      std::fprintf(stderr, "selkv: --%s takes no value\n", name.c_str());
      return false;
    }
    if (name == "bench") o.bench = true;
    else if (name == "quick") o.quick = true;
    else if (name == "graph") o.graph = true;
    else if (name == "no-flush") o.no_flush = true;
    else if (name == "list") o.list = true;
    else if (name == "cpu") o.cpu = true;
    else if (name == "help" || name == "h") {
      print_help();
      std::exit(0);
    } else {
      std::fprintf(stderr, "selkv: unknown option '--%s' (see --help)\n", name.c_str());
      return false;
    }
  }
  return true;
}

bool selected(const Options& o, const std::string& key) { return o.ops.empty() || o.ops.count(key); }

std::vector<const BenchCase*> selected_cases(const Options& o) {
  std::vector<const BenchCase*> v;
  for (const OpSpec* op : bench::sorted_ops()) {
    if (!selected(o, op->key)) continue;
    const std::regex re(o.cases.empty() ? std::string(".") : o.cases);
    for (const auto& c : bench::case_registry()) {
      if (c.op != op->key) continue;
      if (o.cases.empty() ? (!o.quick || c.quick) : std::regex_search(c.label, re)) v.push_back(&c);
    }
  }
  return v;
}

int list_all() {
  std::printf("ops:\n");
  for (const OpSpec* op : bench::sorted_ops()) std::printf("  %-10s %s\n", op->key.c_str(), op->api.c_str());
  std::printf("benchmark cases (* = in --quick, g = graph replay):\n");
  for (const OpSpec* op : bench::sorted_ops()) {
    for (const auto& c : bench::case_registry()) {
      if (c.op != op->key) continue;
      std::printf("  %c%c %-10s %s\n", c.quick ? '*' : ' ', c.graph ? 'g' : ' ', c.op.c_str(),
                  c.label.c_str());
    }
  }
  return 0;
}

// ---- CPU-only path ------------------------------------------------------------------------------

int run_cpu(const Options& o, const std::string& why) {
  std::printf("%s\nRunning the CPU oracle (selkv::ref) on a small default workload instead: the times below\n"
              "are the oracle's on this CPU, not GPU kernel times, and the checks are the oracle's own\n"
              "consistency checks. Run on an SM90 GPU for the real job.\n\n",
              why.c_str());
  Table t({"op", "shape", "cpu time (ms)", "MB/s", "check"}, {false, false, true, true, false});
  int failures = 0;
  std::vector<std::string> notes;
  for (const OpSpec* op : bench::sorted_ops()) {
    if (!selected(o, op->key) || !op->cpu || (o.ops.empty() && !op->in_default_job)) continue;
    progress("oracle: %s", op->key);
    try {
      const bench::CpuReport r = op->cpu(o.params);
      t.add({op->key, r.shape, fmt_num(r.seconds * 1e3, 3), fmt_num(r.bytes / r.seconds / 1e6, 0), r.check.label()});
      if (r.check.failed()) {
        ++failures;
        notes.push_back(op->key + ": " + r.check.detail);
      }
    } catch (const std::exception& e) {
      if (is_usage_error(e)) throw;
      ++failures;
      t.add({op->key, "-", "-", "-", "ERROR"});
      notes.push_back(op->key + ": " + e.what());
    }
  }
  t.print();
  for (const auto& n : notes) std::printf("  %s\n", n.c_str());
  std::printf("\n%s\n", failures ? "FAILED" : "all oracle checks passed (CPU only)");
  return failures ? 1 : 0;
}

// ---- GPU paths ----------------------------------------------------------------------------------

struct GpuContext {
  cudaStream_t stream = nullptr;
  std::unique_ptr<bench::Timer> timer;
  bench::Ceilings ceilings;
  bench::CsvWriter csv;
  std::string gpu, hash;
  std::map<std::string, double> times_by_key;  // Anchored workloads' median times (AnchorInfo::key)
};

// For workloads with a reference time / target (bench/anchor.h): "anchor_us=...;anchor/ours=..."
// for the variant column and a note line with the % of the matmul ceiling and any targets.
std::string anchor_report(GpuContext& g, const Workload& w, double us, std::string* note) {
  const auto* a = dynamic_cast<const bench::Anchored*>(&w);
  if (a == nullptr) return "";
  const bench::AnchorInfo info = a->anchor();
  char buf[256];
  std::string variant, n;
  if (w.flops() > 0 && g.ceilings.matmul_tflops > 0) {
    std::snprintf(buf, sizeof buf, "%.1f%% of bf16 matmul", 100.0 * w.flops() / (us * 1e6) / g.ceilings.matmul_tflops);
    n += buf;
  }
  if (info.anchor_us > 0) {
    std::snprintf(buf, sizeof buf, ";anchor_us=%.1f;anchor/ours=%.2f", info.anchor_us, info.anchor_us / us);
    variant += buf;
    std::snprintf(buf, sizeof buf, "; %s %.1f us, anchor/ours %.2fx", info.anchor_name.c_str(), info.anchor_us,
                  info.anchor_us / us);
    n += buf;
  }
  if (info.target_us > 0) {
    std::snprintf(buf, sizeof buf, "; target <= %.1f us: %s", info.target_us, us <= info.target_us ? "met" : "MISSED");
    n += buf;
  }
  if (!info.rel_key.empty() && info.rel_max > 0) {
    const auto it = g.times_by_key.find(info.rel_key);
    if (it != g.times_by_key.end()) {
      std::snprintf(buf, sizeof buf, ";vs_%s=%.3f", info.rel_key.c_str(), us / it->second);
      variant += buf;
      std::snprintf(buf, sizeof buf, "; %.3fx of %s (target <= %.2fx: %s)", us / it->second, info.rel_key.c_str(),
                    info.rel_max, us / it->second <= info.rel_max ? "met" : "MISSED");
      n += buf;
    } else {
      n += "; " + info.rel_key + " not run, no relative target check";
    }
  }
  if (!info.key.empty()) g.times_by_key[info.key] = us;
  *note = n;
  return variant;
}

bench::TimingConfig timing_config(const Options& o, bool graph, bool flush) {
  bench::TimingConfig cfg;
  if (o.quick) {
    cfg.warmup = 2;
    cfg.groups = 5;
    cfg.reps = 3;
  }
  cfg.graph = graph || o.graph;
  cfg.flush_l2 = flush && !o.no_flush;
  return cfg;
}

void add_ceiling_rows(GpuContext& g, Table& t) {
  const auto& c = g.ceilings;
  bench::CsvRow copy{"ceiling_copy", std::to_string(c.copy_bytes >> 20) + "MiB d2d", "cudaMemcpyAsync",
                     c.copy_timing, 0, c.copy_gbps, 100};
  bench::CsvRow mm{"ceiling_matmul", std::to_string(c.matmul_n) + "^3 bf16", "cublasGemmEx", c.matmul_timing,
                   c.matmul_tflops, 0, 100};
  g.csv.write(copy);
  g.csv.write(mm);
  t.add({"ceiling", copy.shape, copy.variant, fmt_num(c.copy_timing.median_us, 1), fmt_num(c.copy_gbps, 0), "-",
         "100", "-"});
  t.add({"ceiling", mm.shape, mm.variant, fmt_num(c.matmul_timing.median_us, 1), "-", fmt_num(c.matmul_tflops, 1),
         "100", "-"});
}

// Check, then time one workload; adds a table row and a CSV row. Returns false on failure.
bool run_workload(GpuContext& g, const Options& o, const std::string& key, Workload& w, bool graph, bool flush,
                  Table& t, std::vector<std::string>& notes) {
  SELKV_BENCH_CUDA(cudaDeviceSynchronize());  // inputs uploaded through the legacy stream
  progress("%s: checking against the CPU oracle (%s)", key, w.shape());
  const CheckResult chk = w.check(g.stream);
  progress("%s: timing", key);
  bench::LaunchFn before;
  if (w.has_before_each()) before = [&](cudaStream_t s) { w.before_each(s); };
  const bench::Timing tm = g.timer->time([&](cudaStream_t s) { w.run(s); }, timing_config(o, graph, flush), before);
  bench::CsvRow row;
  row.op = key;
  row.shape = w.shape();
  std::string anchor_note;
  row.variant = w.variant() + "/" + tm.mode + anchor_report(g, w, tm.median_us, &anchor_note);
  row.timing = tm;
  row.gbps = w.bytes() / (tm.median_us * 1e3);
  row.tflops = w.flops() / (tm.median_us * 1e6);
  row.pct = bench::pct_of_ceiling(tm.median_us, w.bytes(), w.flops(), g.ceilings);
  g.csv.write(row);
  t.add({key, row.shape, row.variant, fmt_num(tm.median_us, 2), fmt_num(row.gbps, 0),
         w.flops() > 0 ? fmt_num(row.tflops, 1) : "-", fmt_num(row.pct, 1), chk.label()});
  notes.push_back(chk.label() + "  " + key + " " + row.shape + ": " + chk.detail);
  if (!anchor_note.empty()) notes.push_back("      " + key + " " + row.shape + " [" + w.variant() + "]: " + anchor_note);
  return !chk.failed();
}

void init_gpu(GpuContext& g, const Options& o, const std::string& title) {
  int dev = 0;
  SELKV_BENCH_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  SELKV_BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
  g.gpu = prop.name;
  g.hash = bench::git_hash();
  std::printf("selkv %s on %s (sm_%d%d, %d SMs), git %s, seed %llu\n", title.c_str(), g.gpu.c_str(), prop.major,
              prop.minor, prop.multiProcessorCount, g.hash.c_str(), (unsigned long long)o.params.seed());
  if (prop.major != 9)
    std::printf("WARNING: selkv's kernels are built for sm_90a (Hopper); this GPU is sm_%d%d\n", prop.major,
                prop.minor);
  SELKV_BENCH_CUDA(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
  g.timer = std::make_unique<bench::Timer>(g.stream);
  if (!o.csv.empty()) g.csv.open(o.csv, g.hash, g.gpu);
  progress("measuring ceilings (device-to-device copy, cuBLAS bf16 matmul)");
  g.ceilings = bench::measure_ceilings(*g.timer, o.quick);
  std::printf("ceilings (this run): copy %.0f GB/s (best %.0f), bf16 matmul %.0f TFLOP/s (best %.0f)\n\n",
              g.ceilings.copy_gbps, g.ceilings.copy_best_gbps, g.ceilings.matmul_tflops,
              g.ceilings.matmul_best_tflops);
}

Table make_table() {
  return Table({"op", "shape", "variant/timing", "time (us)", "GB/s", "TFLOPS", "% ceiling", "check"},
               {false, false, false, true, true, true, true, false});
}

int finish(Table& t, const std::vector<std::string>& notes, int failures, const Options& o) {
  t.print();
  if (!notes.empty()) std::printf("\nchecks against the CPU oracle (selkv::ref):\n");
  for (const auto& n : notes) std::printf("  %s\n", n.c_str());
  std::printf("\n%% ceiling = roofline time (bytes / copy ceiling, flops / matmul ceiling) over measured time.\n");
  std::printf("times: median of group means, CUDA events%s.\n",
              o.no_flush ? "" : ", L2 flushed (512 MiB memset) before each call");
  if (!o.csv.empty() && o.csv != "-") std::printf("CSV written to %s\n", o.csv.c_str());
  std::printf("%s\n", failures ? "FAILED" : "all checks passed");
  return failures ? 1 : 0;
}

int run_job(const Options& o) {
  GpuContext g;
  init_gpu(g, o, "main job (DeepSeek-V3.2 serving step: ds_mla_fp8, page 64, top-k 2048)");
  Table t = make_table();
  add_ceiling_rows(g, t);
  std::vector<std::string> notes;
  int failures = 0;
  std::vector<const OpSpec*> ops;
  for (const OpSpec* op : bench::sorted_ops())
    if (selected(o, op->key) && (!o.ops.empty() || op->in_default_job)) ops.push_back(op);
  int i = 0;
  for (const OpSpec* op : ops) {
    ++i;
    progress("(%s) %s: preparing inputs", std::to_string(i) + "/" + std::to_string(ops.size()), op->key);
    try {
      std::unique_ptr<Workload> w = op->make(o.params);
      if (!run_workload(g, o, op->key, *w, false, true, t, notes)) ++failures;
    } catch (const std::exception& e) {
      if (is_usage_error(e)) throw;
      ++failures;
      t.add({op->key, "-", "-", "-", "-", "-", "-", "ERROR"});
      notes.push_back("ERROR " + op->key + ": " + e.what());
    }
  }
  return finish(t, notes, failures, o);
}

int run_bench(const Options& o) {
  GpuContext g;
  init_gpu(g, o, std::string("benchmarks") + (o.quick ? " (quick)" : ""));
  Table t = make_table();
  add_ceiling_rows(g, t);
  std::vector<std::string> notes;
  int failures = 0;
  const auto cases = selected_cases(o);
  int i = 0;
  for (const BenchCase* c : cases) {
    ++i;
    progress("(%s) %s: preparing inputs", std::to_string(i) + "/" + std::to_string(cases.size()), c->op);
    try {
      std::unique_ptr<Workload> w = c->make(o.params.seed() + uint64_t(i));
      if (!run_workload(g, o, c->op, *w, c->graph, c->flush_l2, t, notes)) ++failures;
    } catch (const std::exception& e) {
      ++failures;
      t.add({c->op, "-", "-", "-", "-", "-", "-", "ERROR"});
      notes.push_back("ERROR " + c->op + ": " + e.what());
    }
  }
  return finish(t, notes, failures, o);
}

}  // namespace
}  // namespace selkv::cli

int main(int argc, char** argv) {
  using namespace selkv::cli;
  Options o;
  if (!parse_args(argc, argv, o)) return 2;
  if (!o.cases.empty() && selected_cases(o).empty()) {
    std::fprintf(stderr, "selkv: --cases '%s' matches no benchmark case of the selected ops (see --list)\n",
                 o.cases.c_str());
    return 2;
  }
  if (o.list) return list_all();
  if (!o.params.has("seed")) o.params.set("seed", std::to_string(std::random_device{}() & 0x7fffffff));

  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  const bool gpu = err == cudaSuccess && n > 0;
  const std::string no_gpu = err == cudaSuccess ? std::string("no NVIDIA GPU found") : selkv::detail::cuda_error_text(err);
  try {
    if (!gpu || o.cpu) {
      if (o.bench) {
        std::fprintf(stderr, "selkv: --bench needs an NVIDIA GPU (%s)\n", gpu ? "--cpu given" : no_gpu.c_str());
        return 2;
      }
      const std::string why = o.cpu ? std::string("--cpu: GPU not used.") : "No GPU to run on: " + no_gpu + ".";
      return run_cpu(o, why);
    }
    return o.bench ? run_bench(o) : run_job(o);
  } catch (const std::exception& e) {
    if (is_usage_error(e)) {
      std::fprintf(stderr, "selkv: %s (see --help)\n", e.what());
      return 2;
    }
    std::fprintf(stderr, "selkv: %s\n", e.what());
    return 1;
  }
}
