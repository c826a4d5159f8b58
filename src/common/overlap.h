// Memory extents of strided views, for the rule of DESIGN §2: an output must not share memory with
// another output or with an input (documented in-place forms excepted), and no two elements of one
// output may alias. Host only; decided from pointers, sizes and strides alone (never from data).
//
// The check is by extent: the bytes [lo, hi) between a view's first and last element. Two views
// whose extents intersect are rejected even if their elements interleave without touching; that
// is conservative, and no layout these ops take needs interleaving.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "common/check.h"

namespace selkv::detail {

// One dim of a view: size, and stride in elements.
struct Dim {
  int64_t size;
  int64_t stride;
};

// 128-bit arithmetic: no size, stride or pointer can overflow it.
struct Extent {
  __int128 lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
};

// Extent of a strided view of `elem_bytes`-byte elements at `ptr`; empty when ptr is null or a
// size is <= 0 (nothing is accessed).
inline Extent extent_of(const void* ptr, int64_t elem_bytes, std::initializer_list<Dim> dims) {
  Extent e;
  if (ptr == nullptr || elem_bytes <= 0) return e;
  __int128 lo = 0, hi = 0;
  for (const Dim& d : dims) {
    if (d.size <= 0) return e;
    const __int128 span = __int128(d.size - 1) * d.stride;
    (span < 0 ? lo : hi) += span;
  }
  const __int128 base = __int128(reinterpret_cast<uintptr_t>(ptr));
  e.lo = base + lo * elem_bytes;
  e.hi = base + hi * elem_bytes + elem_bytes;
  return e;
}

// A plain byte range [ptr, ptr + bytes).
inline Extent byte_range(const void* ptr, int64_t bytes) {
  return extent_of(ptr, 1, {Dim{bytes, 1}});
}

inline bool overlaps(const Extent& a, const Extent& b) {
  return !a.empty() && !b.empty() && a.lo < b.hi && b.lo < a.hi;
}

// Whether two distinct index tuples of the view can address the same element. Sufficient and
// exact for nested layouts: with the dims of size > 1 sorted by |stride|, each |stride| must exceed
// the largest offset the smaller dims reach (a stride 0 on a dim of size > 1 always aliases).
inline bool self_overlaps(std::initializer_list<Dim> dims) {
  Dim d[8];
  int n = 0;
  for (const Dim& x : dims) {
    if (x.size <= 1) continue;
    if (n == 8) return true;  // no view here has more dims; fail closed
    d[n++] = Dim{x.size, x.stride < 0 ? -x.stride : x.stride};
  }
  std::sort(d, d + n, [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  __int128 reach = 0;  // largest element offset of the dims sorted so far
  for (int i = 0; i < n; ++i) {
    if (d[i].stride <= reach) return true;
    reach += __int128(d[i].size - 1) * d[i].stride;
  }
  return false;
}

// kInvalidArgument naming `out` when the output `out` overlaps `other`.
inline Status check_disjoint(const char* op, const char* out, const Extent& out_extent,
                             const char* other, const Extent& other_extent) {
  if (!overlaps(out_extent, other_extent)) return Status::Ok();
  return arg_error(op, out, "overlaps ", other,
                   " (an output must not share memory with another output or an input)");
}

// A view with the name errors use for it.
struct NamedExtent {
  const char* name;
  Extent extent;
};

// check_disjoint of `out` against each of `others` in order (the first overlap is reported).
inline Status check_disjoint_from(const char* op, const char* out, const Extent& out_extent,
                                  std::initializer_list<NamedExtent> others) {
  for (const NamedExtent& o : others) SELKV_RETURN_IF_ERROR(check_disjoint(op, out, out_extent, o.name, o.extent));
  return Status::Ok();
}

// kInvalidArgument naming `out` when two of its elements alias (e.g. a stride-0 / expanded dim).
inline Status check_no_self_overlap(const char* op, const char* out, std::initializer_list<Dim> dims) {
  if (!self_overlaps(dims)) return Status::Ok();
  return arg_error(op, out, "strides make distinct elements share memory (an expanded or ",
                   "overlapping output); each element needs its own memory");
}

}  // namespace selkv::detail
