#include "selkv/status.h"

namespace selkv {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "Ok";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kUnsupported: return "Unsupported";
    case StatusCode::kWorkspaceTooSmall: return "WorkspaceTooSmall";
    case StatusCode::kCudaError: return "CudaError";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "Ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace selkv
