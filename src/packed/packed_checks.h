// Argument validation of the C6 pack / patch ops (include/selkv/packed.h). Pure C++, no CUDA
// call: the GPU launchers and the CPU oracle (src/reference/packed.cpp) run the same rules, and
// the CPU suite (tests/cpp/test_packed_checks.cpp) reaches every rejection. packed_checks.cpp is
// built into selkv_reference (CMakeLists.txt), which the oracle can link and the core links.
#pragma once

#include "selkv/packed.h"
#include "selkv/status.h"

namespace selkv::packed {

// What a caller must do after a successful check: nothing (zero rows, no records), or run.
enum class Work { kNone, kLaunch };

Status check_pack(const PackSelectedKvParams& p, Work* work);
Status check_patch(const PatchPackedKvParams& p, Work* work);

}  // namespace selkv::packed
