// y = x + C for a compile-time constant C (one instantiation per constant).
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

template <int C>
void add_constant(TensorView out, TensorView x) {
  SymbolicSize n{"numel"};
  SymbolicDevice device;
  TensorMatcher({n}).dtype<fp32_t>().device(kDLCPU, device).contiguous().verify(x, "x");
  TensorMatcher({n}).dtype<fp32_t>().device(kDLCPU, device).contiguous().verify(out, "out");
  const float* src = data_ptr<const float>(x);
  float* dst = data_ptr<float>(out);
  for (int64_t i = 0, e = n.value(); i < e; ++i) dst[i] = src[i] + static_cast<float>(C);
}

}  // namespace mllm_kernel::cpu
