// selkv/version.h — the version of these headers. Kept equal to project(VERSION) in
// CMakeLists.txt (configuring checks it); selkv::version() returns the library's own, so a
// program can tell when it was compiled against headers of another release.
#pragma once

#define SELKV_VERSION_MAJOR 0
#define SELKV_VERSION_MINOR 1
#define SELKV_VERSION_PATCH 0
#define SELKV_VERSION_STRING "0.1.0"
// One number for preprocessor comparisons: 10000 * major + 100 * minor + patch.
#define SELKV_VERSION (SELKV_VERSION_MAJOR * 10000 + SELKV_VERSION_MINOR * 100 + SELKV_VERSION_PATCH)

namespace selkv {

// The version of the compiled library, e.g. "0.1.0".
const char* version();

}  // namespace selkv
