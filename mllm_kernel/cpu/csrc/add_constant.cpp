// out = src + c, element-wise, for a compile-time constant C (one instantiation
// per constant) or a run-time float. Any rank and layout; one module handles
// every dtype, dispatching at run time.
#include <cstdint>
#include <type_traits>

#include "mllm_kernel/cpu/elementwise.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

namespace add_constant_detail {

// Integers and fp64; the float32-computed dtypes go through float_map.
template <typename T, typename Scalar>
T add(T v, Scalar c) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(v) + static_cast<U>(c));
  } else {
    return v + static_cast<double>(c);
  }
}

/// out = src + c for src of one of the dtypes Ts.
template <typename... Ts, typename Scalar>
void run(TensorView out, TensorView src, Scalar c, int64_t num_threads) {
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher().dtype<Ts...>(dtype).device(kDLCPU, device).verify(src, "src");
  TensorMatcher().dtype(dtype).device(kDLCPU, device).same_shape_as(src, "src").verify(out, "out");
  // Each element is read before it is written by the same thread: in place works.
  verify_output(out, "out", {{src, "src", Aliasing::kSameView}});
  dispatch_dtype<Ts...>(dtype.value(), "src", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, fp32_t> || std::is_same_v<T, bf16_t> ||
                  std::is_same_v<T, fp16_t>) {
      // Computed in float32 as torch does, fp16 and bf16 included.
      const auto cf = static_cast<float>(c);
      float_map<T>(out, src, num_threads, [cf](float v) { return v + cf; });
    } else {
      unary_map<T, T>(out, src, num_threads, [c](T v) { return add(v, c); });
    }
  });
}

}  // namespace add_constant_detail

template <int C>
void add_constant(TensorView out, TensorView src, int64_t num_threads) {
  // Integer constants add with wrap-around (torch's behaviour, and defined in C++).
  add_constant_detail::run<fp32_t, bf16_t, fp16_t, fp64_t, int32_t, int64_t>(out, src, C,
                                                                             num_threads);
}

inline void add_constant_runtime(TensorView out, TensorView src, double c, int64_t num_threads) {
  // A float constant would turn an integer tensor into a float one: floats only.
  add_constant_detail::run<fp32_t, bf16_t, fp16_t, fp64_t>(out, src, c, num_threads);
}

}  // namespace mllm_kernel::cpu
