// Tensor-level argument checks for the torch ops: what the C++ API cannot see through raw
// pointers (dtype, device, rank, sizes, the innermost stride). Everything else — null pointers,
// row strides, alignment, value ranges, supported configurations — is checked by the C++ entry
// point itself, which reports through selkv::Status.
//
// Every failure raises a c10::Error (RuntimeError in Python) whose message names the op and the
// argument, in the same form as the C++ API:
//   "selkv::write_kv_cache: latent: expected dtype BFloat16, got Float"
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace selkv::torch_ext {

// One tensor argument of one op. `shape_doc` (e.g. "[num_tokens, 512]") is quoted in shape
// errors. Checks chain: TensorArg(kOp, "latent", latent, "[T, 512]").dtype(kBFloat16).dims(2);
class TensorArg {
 public:
  TensorArg(const char* op, const char* name, const at::Tensor& t, const char* shape_doc = nullptr)
      : op_(op), name_(name), t_(t), shape_doc_(shape_doc) {}

  const TensorArg& dtype(at::ScalarType expected) const {
    TORCH_CHECK(t_.scalar_type() == expected, op_, ": ", name_, ": expected dtype ", expected,
                ", got ", t_.scalar_type());
    return *this;
  }
  const TensorArg& dims(int64_t expected) const {
    TORCH_CHECK(t_.dim() == expected, op_, ": ", name_, ": expected a ", expected,
                "-d tensor", doc(), ", got shape ", t_.sizes());
    return *this;
  }
  // size(dim) == expected
  const TensorArg& size(int64_t dim, int64_t expected) const {
    TORCH_CHECK(t_.size(dim) == expected, op_, ": ", name_, ": expected size ", expected,
                " in dim ", dim, doc(), ", got shape ", t_.sizes());
    return *this;
  }
  // size(dim) >= at_least
  const TensorArg& min_size(int64_t dim, int64_t at_least) const {
    TORCH_CHECK(t_.size(dim) >= at_least, op_, ": ", name_, ": expected size >= ", at_least,
                " in dim ", dim, doc(), ", got shape ", t_.sizes());
    return *this;
  }
  // The innermost dim is dense (stride 1); outer strides are passed to the C++ API, which
  // checks them. A dim of size <= 1 has no meaningful stride and is accepted as is.
  const TensorArg& inner_contiguous() const {
    const int64_t d = t_.dim() - 1;
    TORCH_CHECK(d < 0 || t_.size(d) <= 1 || t_.stride(d) == 1, op_, ": ", name_,
                ": expected stride 1 in the last dim, got strides ", t_.strides());
    return *this;
  }
  // For the 1-d arrays the C++ API takes without a stride.
  const TensorArg& contiguous() const {
    TORCH_CHECK(t_.is_contiguous(), op_, ": ", name_,
                ": expected a contiguous tensor, got shape ", t_.sizes(), " with strides ",
                t_.strides());
    return *this;
  }

 private:
  std::string doc() const {
    return shape_doc_ ? std::string(" (shape ") + shape_doc_ + ")" : std::string();
  }

  const char* op_;
  const char* name_;
  const at::Tensor& t_;
  const char* shape_doc_;
};

// A (name, tensor) pair for device checks; an absent optional tensor is skipped.
struct NamedTensor {
  NamedTensor(const char* n, const at::Tensor& t) : name(n), tensor(&t) {}
  NamedTensor(const char* n, const std::optional<at::Tensor>& t)
      : name(n), tensor(t.has_value() ? &*t : nullptr) {}
  const char* name;
  const at::Tensor* tensor;
};

// All tensors are of device type `type` and on the device of the first one (normally the output,
// which decides where the op runs).
inline void check_devices(const char* op, c10::DeviceType type,
                          std::initializer_list<NamedTensor> tensors) {
  const NamedTensor* first = nullptr;
  for (const NamedTensor& a : tensors) {
    if (a.tensor == nullptr) continue;
    const c10::Device dev = a.tensor->device();
    TORCH_CHECK(dev.type() == type, op, ": ", a.name, ": expected a ", c10::DeviceTypeName(type, /*lower_case=*/false),
                " tensor, got one on ", dev);
    if (first == nullptr) {
      first = &a;
    } else {
      TORCH_CHECK(dev == first->tensor->device(), op, ": ", a.name, ": expected a tensor on ",
                  first->tensor->device(), " (the device of ", first->name, "), got one on ", dev);
    }
  }
}

// A size or scalar argument narrowed to the int32 the C++ API takes.
inline int32_t to_int32(const char* op, const char* name, int64_t v) {
  TORCH_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
              op, ": ", name, ": ", v, " does not fit in int32");
  return static_cast<int32_t>(v);
}

// A float argument (a Python float, double here) narrowed to the fp32 the C++ API takes: a finite
// value that fp32 cannot hold (1e-50 would become 0, 1e39 inf) is named here with the value the
// caller passed; the C++ API checks the narrowed value's own rules (e.g. sm_scale's).
inline float to_float(const char* op, const char* name, double v) {
  const float f = static_cast<float>(v);
  TORCH_CHECK(!std::isfinite(v) || (std::isfinite(f) && (f != 0.f || v == 0.0)), op, ": ", name, ": ", v,
              " is not representable in fp32 (it would become ", f, ")");
  return f;
}

// Meta kernels: meta tensors have no data, so the C++ API's checks run on stand-in addresses
// (never dereferenced), one per call of this object: tensors that share a storage share a 16 TiB
// region and sit at their storage offsets in it, so the overlap and alignment checks see what the
// run would (allocations are at least 256-byte aligned); distinct storages get distinct regions.
class MetaStandIns {
 public:
  // A present, non-empty tensor's stand-in (an empty one has no address to check, as when run).
  // A symbolic size (torch.compile's dynamic shapes) counts as non-empty, a symbolic offset as 0.
  void* operator()(const at::Tensor& t) {
    const auto numel = t.sym_numel().maybe_as_int();
    if (numel.has_value() && *numel == 0) return nullptr;
    const void* storage = t.storage().unsafeGetStorageImpl();
    size_t i = 0;
    while (i < storages_.size() && storages_[i] != storage) ++i;
    if (i == storages_.size()) storages_.push_back(storage);
    const int64_t offset = t.sym_storage_offset().maybe_as_int().value_or(0);
    return static_cast<char*>(region(i + 1)) + offset * int64_t(t.itemsize());
  }
  void* operator()(const std::optional<at::Tensor>& t) { return t.has_value() ? (*this)(*t) : nullptr; }

 private:
  static void* region(uintptr_t r) { return reinterpret_cast<void*>(r << 44); }
  std::vector<const void*> storages_;
};
// Whether a Meta call's tensors all have concrete sizes (torch.compile's dynamic shapes give
// symbolic ones, whose values the checks cannot read: such a call is checked when it runs).
inline bool concrete_sizes(std::initializer_list<std::optional<at::Tensor>> ts) {
  for (const auto& t : ts)
    if (t.has_value() && t->unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return false;
  return true;
}

// Data pointers for the Params structs; meta tensors (shape-only, torch.compile) have none.
inline const void* data_or_null(const at::Tensor& t) {
  return t.is_meta() ? nullptr : t.const_data_ptr();
}
inline void* mutable_data_or_null(const at::Tensor& t) {
  return t.is_meta() ? nullptr : t.mutable_data_ptr();
}
inline const void* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() ? data_or_null(*t) : nullptr;
}
inline void* mutable_data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() ? mutable_data_or_null(*t) : nullptr;
}

}  // namespace selkv::torch_ext
