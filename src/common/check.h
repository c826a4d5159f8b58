// Argument checks for entry points. Each failed check returns a Status whose message names
// the operation and the argument, e.g.
//   SELKV_CHECK_ARG(p.slot_mapping != nullptr, "slot_mapping", "must not be null");
// inside a function that declared `constexpr const char* kOp = "selkv::write_kv_cache";`.
#pragma once

#include <sstream>
#include <string>

#include "selkv/status.h"

namespace selkv::detail {

template <typename... Ts>
inline std::string concat(const Ts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <typename... Ts>
inline Status arg_error(const char* op, const char* arg, const Ts&... what) {
  return Status(StatusCode::kInvalidArgument, concat(op, ": ", arg, ": ", what...));
}

}  // namespace selkv::detail

// Requires `kOp` (const char*) in scope.
#define SELKV_CHECK_ARG(cond, arg, ...)                                  \
  do {                                                                   \
    if (!(cond)) return ::selkv::detail::arg_error(kOp, arg, __VA_ARGS__); \
  } while (0)

#define SELKV_CHECK_SUPPORTED(cond, ...)                                                  \
  do {                                                                                    \
    if (!(cond))                                                                          \
      return ::selkv::Status(::selkv::StatusCode::kUnsupported,                           \
                             ::selkv::detail::concat(kOp, ": ", __VA_ARGS__));            \
  } while (0)

#define SELKV_RETURN_IF_ERROR(expr)         \
  do {                                      \
    ::selkv::Status _selkv_st = (expr);     \
    if (!_selkv_st.ok()) return _selkv_st;  \
  } while (0)
