// Registry of benchmarkable ops and benchmark cases.
//
// Each op adds ONE file under bench/ that
//   - implements a Workload (device inputs, the timed call, a sample check against the oracle),
//   - registers an OpSpec (the CLI key, shape flags, the main-job default, a CPU-oracle demo),
//   - registers its BenchCases (the benchmark grid),
// all through SELKV_BENCH_REGISTER(fn). Nothing else needs editing: tools/main.cpp discovers
// ops and cases through op_registry() / case_registry().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "selkv/status.h"

namespace selkv::bench {

struct CheckResult {
  enum class State { kNotRun, kPass, kFail };
  State state = State::kNotRun;
  std::string detail;  // "bit-exact, 4096 records" / first mismatch

  static CheckResult pass(std::string d) { return {State::kPass, std::move(d)}; }
  static CheckResult fail(std::string d) { return {State::kFail, std::move(d)}; }
  bool failed() const { return state == State::kFail; }
  std::string label() const {
    return state == State::kPass ? "PASS" : state == State::kFail ? "FAIL" : "-";
  }
};

// One prepared instance of an op on the device.
class Workload {
 public:
  virtual ~Workload() = default;
  virtual std::string shape() const = 0;     // "T=16384 page=64 ds_mla_fp8"
  virtual std::string variant() const = 0;   // "pow2", "counts+compact", ...
  virtual double bytes() const = 0;          // bytes the op must move (DESIGN §6)
  virtual double flops() const { return 0; }
  // Enqueue the op once (the timed call). Throws OpFailure on a non-ok Status.
  virtual void run(cudaStream_t stream) = 0;
  // Work enqueued before each timed call, after the L2 flush, untimed (e.g. the pack whose buffer a
  // packed decode reads, as a runtime runs it just before the attention). has_before_each() false:
  // none, and the timing loop is the plain one.
  virtual bool has_before_each() const { return false; }
  virtual void before_each(cudaStream_t) {}
  // Poison the outputs, run once, compare a sample with the CPU oracle (bit-exact where the
  // op is exact). Synchronizes.
  virtual CheckResult check(cudaStream_t stream) = 0;
};

// Shape knobs from the command line (--tokens 4096 ...). Unset knobs take the op's default.
class Params {
 public:
  void set(const std::string& name, const std::string& value) { values_[name] = value; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  int64_t get_int(const std::string& name, int64_t dflt) const;
  std::string get_str(const std::string& name, const std::string& dflt) const;
  uint64_t seed() const { return uint64_t(get_int("seed", 0x5e1c7)); }
  int64_t sample() const { return get_int("sample", 4096); }  // rows/records to check

 private:
  std::map<std::string, std::string> values_;
};

// Result of an oracle-only run on a machine without a GPU.
struct CpuReport {
  std::string shape;
  double seconds = 0;
  double bytes = 0;
  CheckResult check;
};

struct ParamSpec {
  std::string name;  // flag without dashes: "tokens"
  std::string help;
};

struct OpSpec {
  std::string key;        // CLI name, also the CSV op column: "write"
  std::string api;        // "selkv::write_kv_cache"
  std::string summary;    // one line for --help
  int order = 0;          // position in the main job
  bool in_default_job = true;
  std::vector<ParamSpec> params;  // flags this op reads (shared names are fine)
  // Main job on a GPU: the workload for these params (op defaults where unset).
  std::function<std::unique_ptr<Workload>(const Params&)> make;
  // No GPU: run the CPU oracle on a small default and self-check it.
  std::function<CpuReport(const Params&)> cpu;
};

struct BenchCase {
  std::string op;     // OpSpec::key
  std::string label;  // shape summary for --list: "T=16384 ds_mla_fp8 pow2"
  bool quick = false;  // part of --quick
  bool graph = false;  // time under CUDA-graph replay (small shapes)
  bool flush_l2 = true;
  std::function<std::unique_ptr<Workload>(uint64_t seed)> make;
};

std::vector<OpSpec>& op_registry();      // sorted by order on read via sorted_ops()
std::vector<BenchCase>& case_registry();
std::vector<const OpSpec*> sorted_ops();
const OpSpec* find_op(const std::string& key);

struct Registrar {
  explicit Registrar(void (*fn)()) { fn(); }
};

}  // namespace selkv::bench

// Runs `fn` at static-initialization time to add ops/cases (bench/*.cpp are linked directly
// into the executable, so these objects are never dropped).
#define SELKV_BENCH_REGISTER(fn)                                  \
  static void fn();                                               \
  static const ::selkv::bench::Registrar fn##_registrar_{&fn};    \
  static void fn()
