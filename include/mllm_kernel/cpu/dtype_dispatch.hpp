// One list of dtypes per kernel, used both to validate a tensor (TypeError
// naming the dtype) and to pick the template instantiation at run time.
#pragma once

#include <type_traits>
#include <utility>

#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

template <typename... Ts>
struct DtypeList {
  /// `matcher` restricted to these dtypes.
  static TensorMatcher allow(TensorMatcher matcher) {
    matcher.dtype<Ts...>();
    return matcher;
  }

  /// Calls f(std::type_identity<T>{}) for the T whose dtype is `dtype` (of argument `arg`).
  ///   FloatDtypes::dispatch(x.dtype(), "x", [&](auto tag) { using T = typename
  ///   decltype(tag)::type; });
  template <typename F>
  static void dispatch(DLDataType dtype, const char* arg, F&& f,
                       source_location loc = source_location::current()) {
    dispatch_dtype<Ts...>(dtype, arg, std::forward<F>(f), loc);
  }
};

/// The floating dtypes LLM ops take; they compute in float32.
using FloatDtypes = DtypeList<fp32_t, bf16_t, fp16_t>;

}  // namespace mllm_kernel::cpu
