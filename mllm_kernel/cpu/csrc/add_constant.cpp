// out = x + c, element-wise, for a compile-time constant C (one instantiation
// per constant) or a run-time float. Any rank and layout; one module handles
// every dtype, dispatching at run time.
#include <cstdint>
#include <type_traits>

#include "mllm_kernel/cpu/dtype_dispatch.hpp"
#include "mllm_kernel/cpu/elementwise.hpp"
#include "mllm_kernel/cpu/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

namespace add_constant_detail {

// Integer constants add with wrap-around (torch's behaviour, and defined in C++).
using ConstantDtypes = DtypeList<fp32_t, bf16_t, fp16_t, fp64_t, int32_t, int64_t>;
// A float constant would turn an integer tensor into a float one: floats only.
using RuntimeDtypes = DtypeList<fp32_t, bf16_t, fp16_t, fp64_t>;

template <typename T, typename Scalar>
T add(T v, Scalar c) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(v) + static_cast<U>(c));
  } else if constexpr (std::is_same_v<T, fp64_t>) {
    return v + static_cast<double>(c);
  } else {
    // fp32, and fp16/bf16 computed in float32 as torch does.
    return from_float<T>(to_float(v) + static_cast<float>(c));
  }
}

template <typename Dtypes, typename Scalar>
void run(TensorView out, TensorView x, Scalar c, int64_t num_threads) {
  SymbolicDevice device;
  Dtypes::allow(TensorMatcher()).device(kDLCPU, device).verify(x, "x");
  TensorMatcher().dtype(x.dtype()).device(kDLCPU, device).verify(out, "out");
  verify_shape_like(out, "out", x, "x");
  // Each element is read before it is written by the same thread: in place works.
  verify_output(out, "out", {{x, "x", Aliasing::kSameView}});
  Dtypes::dispatch(x.dtype(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_map<T, T>(out, x, num_threads, [c](T v) { return add(v, c); });
  });
}

}  // namespace add_constant_detail

template <int C>
void add_constant(TensorView out, TensorView x, int64_t num_threads) {
  add_constant_detail::run<add_constant_detail::ConstantDtypes>(out, x, C, num_threads);
}

inline void add_constant_runtime(TensorView out, TensorView x, double c, int64_t num_threads) {
  add_constant_detail::run<add_constant_detail::RuntimeDtypes>(out, x, c, num_threads);
}

}  // namespace mllm_kernel::cpu
