// Argument rules of C8 (include/selkv/qsa.h). Pure C++, no CUDA call: the GPU entry points and
// the CPU oracle (src/reference/qsa.cpp) run the same rules, and tests/cpp/test_qsa_checks.cpp
// reaches every rejection. qsa_checks.cpp is built into selkv_reference (CMakeLists.txt), which
// the oracle can link and the core links.
#pragma once

#include <cstddef>

#include "selkv/qsa.h"
#include "selkv/status.h"

namespace selkv::qsa {

// What a caller must do after a successful check: nothing (zero rows), or run.
enum class Work { kNone, kLaunch };

// What the call reads and writes: the attention (q, caches, out, lse, the optional plan) or only
// the plan's inputs (selection, req_ids, positions, seq_lens, block_table) and the plan buffer.
enum class Use { kAttention, kPlan };

// `op` names the caller in messages. `device` adds the GPU's alignment rules. For Use::kPlan,
// `metadata` / `metadata_bytes` are the plan being written (an output); for kAttention the
// optional p.metadata is checked as an input.
Status check_params(const char* op, const QsaSparsePrefillParams& p, Use use, bool device, Work* work,
                    const void* metadata = nullptr, size_t metadata_bytes = 0);

}  // namespace selkv::qsa
