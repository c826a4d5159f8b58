// Runtime value -> compile-time constant, for picking a kernel instantiation: fn receives a
// std::integral_constant (formats go through dispatch_format, selkv/format_traits.h).
#pragma once

#include <type_traits>
#include <utility>

namespace selkv::detail {

template <class Fn>
decltype(auto) dispatch_bool(bool b, Fn&& fn) {
  if (b) return std::forward<Fn>(fn)(std::true_type{});
  return std::forward<Fn>(fn)(std::false_type{});
}

// fn(std::integral_constant<T, V>{}) for the first V in kValues equal to v; v must be one of them
// (callers check their arguments first), the last one is taken otherwise.
template <auto kFirst, auto... kRest, class Fn>
decltype(auto) dispatch_value(decltype(kFirst) v, Fn&& fn) {
  using C = std::integral_constant<decltype(kFirst), kFirst>;
  if constexpr (sizeof...(kRest) == 0) {
    return std::forward<Fn>(fn)(C{});
  } else {
    if (v == kFirst) return std::forward<Fn>(fn)(C{});
    return dispatch_value<kRest...>(v, std::forward<Fn>(fn));
  }
}

}  // namespace selkv::detail
