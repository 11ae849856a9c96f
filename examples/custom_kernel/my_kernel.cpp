// A user's own templated CPU kernel: out = x * kScale, for float32 tensors of any
// shape (contiguous). The checks raise TypeError / ValueError in Python naming
// the argument; the template parameter is chosen from Python via make_cpp_args.
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace my_namespace {

template <int kScale>
void my_kernel(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  using namespace mllm_kernel;
  SymbolicDevice device;
  TensorMatcher().dtype<fp32_t>().device(kDLCPU, device).contiguous().verify(x, "x");
  TensorMatcher().dtype<fp32_t>().device(kDLCPU, device).contiguous().verify(out, "out");
  ValueCheck(out.numel() == x.numel(), "argument 'out': expected ", x.numel(),
             " elements like 'x', got ", out.numel());
  const float* src = data_ptr<const float>(x);
  float* dst = data_ptr<float>(out);
  for (int64_t i = 0, n = x.numel(); i < n; ++i) dst[i] = src[i] * kScale;
}

}  // namespace my_namespace
