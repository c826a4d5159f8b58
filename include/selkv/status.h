// selkv/status.h — the result every entry point returns.
//
// Entry points never throw and never abort: a bad argument comes back as a Status whose
// message names the operation and the argument ("selkv::write_kv_cache: slot_mapping: ...").
#pragma once

#include <string>
#include <utility>

namespace selkv {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,    // a caller error: wrong shape, dtype, stride, null pointer, ...
  kUnsupported = 2,        // a valid request this build/arch does not implement
  kWorkspaceTooSmall = 3,  // the message says how many bytes/rows are needed
  kCudaError = 4,          // a CUDA runtime error (launch failure, no device, ...)
  kInternal = 5,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: selkv::op: arg: what is wrong"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace selkv
