// Glue shared by the op files: where a kernel runs (Backend), the CUDA device/stream scope,
// Status -> Python exception, and the argument forms several ops share (format strings, the
// paged cache tensor).
//
// Pattern for an op family (one .cpp file each, see cache_ops.cpp):
//   1. TORCH_LIBRARY_FRAGMENT(selkv, m): the schemas (out-variants; mutated args annotated).
//   2. One function template per op, `template <Backend B> void op(...)`, that
//        - checks devices with check_devices(kOp, device_type(B), {...}),
//        - runs the tensor checks and fills the C++ Params struct (one shared helper),
//        - calls selkv::op(p, stream) for kCuda, selkv::ref::op(p) for kCpu, nothing for kMeta
//          (the Meta kernel is what torch.compile / FakeTensor run: checks only),
//        - turns a non-ok Status into an exception with throw_if_error.
//   3. TORCH_LIBRARY_IMPL(selkv, CUDA|CPU|Meta, m) registering the three instantiations.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "selkv/formats.h"
#include "selkv/status.h"
#include "tensor_checks.h"

namespace selkv::torch_ext {

enum class Backend { kCuda, kCpu, kMeta };

constexpr c10::DeviceType device_type(Backend b) {
  return b == Backend::kCuda ? c10::DeviceType::CUDA
         : b == Backend::kCpu ? c10::DeviceType::CPU
                              : c10::DeviceType::Meta;
}

// Makes `t`'s device current for the lifetime of the scope and yields torch's current stream
// on it, so the C++ call is ordered with the surrounding torch work and is captured by
// torch.cuda.graph.
class CudaScope {
 public:
  explicit CudaScope(const at::Tensor& t)
      : guard_(t.device()), stream_(c10::cuda::getCurrentCUDAStream(t.device().index())) {}
  cudaStream_t stream() const { return stream_.stream(); }

 private:
  c10::cuda::CUDAGuard guard_;
  c10::cuda::CUDAStream stream_;
};

// A non-ok Status from the C++ API becomes a Python exception carrying its message (which names
// the op and the argument). Unsupported configurations raise NotImplementedError, everything
// else RuntimeError (NotImplementedError is a RuntimeError subclass, so `except RuntimeError`
// catches both).
inline void throw_if_error(const Status& st) {
  if (st.ok()) return;
  TORCH_CHECK_NOT_IMPLEMENTED(st.code() != StatusCode::kUnsupported, st.message());
  TORCH_CHECK(false, st.message());
}

// ---- shared argument forms ---------------------------------------------------------------------
inline KvFormat parse_format(const char* op, std::string_view s) {
  if (s == "ds_mla_fp8") return KvFormat::kDsMlaFp8;
  if (s == "nope_fp8") return KvFormat::kNopeFp8;
  if (s == "model1_fp8") return KvFormat::kModel1Fp8;
  TORCH_CHECK(false, op, ": format: expected 'ds_mla_fp8', 'nope_fp8' or 'model1_fp8', got '", s, "'");
}

inline ScaleMode parse_scale_mode(const char* op, std::string_view s) {
  if (s == "pow2") return ScaleMode::kPow2;
  if (s == "amax") return ScaleMode::kAmax;
  TORCH_CHECK(false, op, ": scale_mode: expected 'pow2' or 'amax', got '", s, "'");
}

// The paged FP8 cache tensor: uint8 [num_blocks, page_size, record_bytes(format)], each page
// dense; the block stride is taken from cache.stride(0) (it may exceed a page, e.g. a slice of
// a larger per-layer allocation). model1_fp8: [num_blocks, page_size, 584] rows are a view of the
// page bytes (FlashMLA's convention; records then the scale tail), the block stride must cover
// the padded page (fmt::page_bytes, a multiple of 576).
struct CacheTensorView {
  int64_t num_blocks = 0;
  int32_t page_size = 0;
  int64_t block_stride_bytes = 0;
};

inline CacheTensorView check_cache_tensor(const char* op, const char* name, const at::Tensor& cache,
                                          KvFormat format) {
  const int rb = fmt::record_bytes(format);
  const std::string doc =
      "[num_blocks, page_size, " + std::to_string(rb) + "] for " + fmt::format_name(format);
  TensorArg(op, name, cache, doc.c_str()).dtype(at::kByte).dims(3).size(2, rb).inner_contiguous();
  CacheTensorView v;
  v.num_blocks = cache.size(0);
  v.page_size = to_int32(op, "page_size (cache.size(1))", cache.size(1));
  TORCH_CHECK(v.page_size <= 1 || cache.stride(1) == rb, op, ": ", name,
              ": each page must be dense (stride ", rb, " in dim 1), got strides ",
              cache.strides());
  // The stride of a dim of size 1 carries no information: use the dense value then.
  const int64_t dense = fmt::page_bytes(format, v.page_size);
  v.block_stride_bytes = v.num_blocks <= 1 ? std::max(cache.stride(0), dense) : cache.stride(0);
  return v;
}

}  // namespace selkv::torch_ext
