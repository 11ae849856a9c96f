// Test kernels for the host conversions between float32 and the 16-bit floats:
// utils.hpp's element-wise to_float / from_float (the arithmetic every target
// vectorises) and cpu/float_blocks.hpp's widen / narrow (the hardware's vector
// conversions where the build has them, that arithmetic for the rest). The
// element-wise loops carry `omp simd` as the kernels' loops do, so what is
// checked is the vectorised code.
#include <cstdint>
#include <type_traits>

#include "mllm_kernel/cpu/float_blocks.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace conversion_kernels {
using namespace mllm_kernel;

// x: [n] fp16 or bf16; out: [n] float32.
template <typename Fn>
void to_floats(TensorView out, TensorView x, const Fn& fn) {
  SymbolicSize n{"n"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher({n})
      .dtype<fp16_t, bf16_t>(dtype)
      .device(kDLCPU, device)
      .contiguous()
      .verify(x, "x");
  TensorMatcher({n}).dtype<fp32_t>().device(kDLCPU, device).contiguous().verify(out, "out");
  dispatch_dtype<fp16_t, bf16_t>(dtype.value(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    fn(data_ptr<const T>(x), data_ptr<float>(out), n.value());
  });
}

// x: [n] float32; out: [n] fp16 or bf16.
template <typename Fn>
void from_floats(TensorView out, TensorView x, const Fn& fn) {
  SymbolicSize n{"n"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher({n}).dtype<fp32_t>().device(kDLCPU, device).contiguous().verify(x, "x");
  TensorMatcher({n})
      .dtype<fp16_t, bf16_t>(dtype)
      .device(kDLCPU, device)
      .contiguous()
      .verify(out, "out");
  dispatch_dtype<fp16_t, bf16_t>(dtype.value(), "out", [&](auto tag) {
    using T = typename decltype(tag)::type;
    fn(data_ptr<const float>(x), data_ptr<T>(out), n.value());
  });
}

void widen_elementwise(TensorView out, TensorView x) {
  to_floats(out, x, [](const auto* src, float* dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
  });
}

void narrow_elementwise(TensorView out, TensorView x) {
  from_floats(out, x, [](const float* src, auto* dst, int64_t n) {
    using T = std::remove_pointer_t<decltype(dst)>;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = from_float<T>(src[i]);
  });
}

void widen_blocks(TensorView out, TensorView x) {
  to_floats(out, x, [](const auto* src, float* dst, int64_t n) { cpu::widen(src, dst, n); });
}

void narrow_blocks(TensorView out, TensorView x) {
  from_floats(out, x, [](const float* src, auto* dst, int64_t n) { cpu::narrow(src, dst, n); });
}

// Whether fp16 rows go by hardware-converted blocks in this build.
bool fp16_converts_in_blocks() {
  return cpu::kConvertsInBlocks<fp16_t>;
}

}  // namespace conversion_kernels
