// Test kernels for include/mllm_kernel/{tensor,rows,utils}.hpp: each export runs one
// kind of check so the Python tests can trigger every error path.
#include "mllm_kernel/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace check_kernels {
using namespace mllm_kernel;

// x: [n, d] float32/float16 on CPU, row stride free; w: [d] with x's dtype;
// out: [n] float32 contiguous. out[i] = sum_j x[i, j] * w[j].
void row_dot(TensorView out, TensorView x, TensorView w) {
  SymbolicSize n{"num_rows"}, d{"hidden"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher({n, d})
      .dtype<fp32_t, fp16_t>(dtype)
      .device(kDLCPU, device)
      .last_dim_contiguous()
      .verify(x, "x");
  TensorMatcher({d}).dtype(dtype).device(kDLCPU, device).contiguous().verify(w, "w");
  TensorMatcher({n}).dtype<fp32_t>().device(kDLCPU, device).contiguous().verify(out, "out");
  const int64_t row_stride = x.stride(0);
  float* dst = data_ptr<float>(out);
  for (int64_t i = 0; i < n.value(); ++i) {
    float acc = 0.0f;
    for (int64_t j = 0; j < d.value(); ++j) {
      if (is_dtype<fp32_t>(x.dtype())) {
        acc += data_ptr<const float>(x)[i * row_stride + j] * data_ptr<const float>(w)[j];
      } else {
        acc += to_float(data_ptr<const fp16_t>(x)[i * row_stride + j]) *
               to_float(data_ptr<const fp16_t>(w)[j]);
      }
    }
    dst[i] = acc;
  }
}

// x and y: rows of one length; out: x's shape, and half_out: x's with the last dim halved.
void rows_and_shapes(TensorView x, TensorView y, TensorView out, TensorView half_out) {
  SymbolicSize cols{"cols"};
  TensorMatcher().rows(cols).verify(x, "x");
  TensorMatcher().rows(cols).verify(y, "y");
  TensorMatcher().same_shape_as(x, "x").verify(out, "out");
  TensorMatcher().same_shape_as(x, "x", cols.value() / 2).verify(half_out, "half_out");
}

// The row stride as_rows() finds for x (a GPU kernel's view of its rows).
int64_t row_stride(TensorView x) {
  return as_rows(x, "x").row_stride;
}

// x must have exactly the strides [d, 1] for shape [n, d] (given by literal 4).
void fixed_strides(TensorView x) {
  SymbolicSize n{"n"};
  TensorMatcher({n, 4}).strides({4, 1}).verify(x, "x");
}

// x must be a CUDA tensor (CPU tensors trigger the device error).
void needs_cuda(TensorView x) {
  SymbolicDevice device;
  TensorMatcher().device(kDLCUDA, device).verify(x, "x");
}

// Accepts any tensor (any rank, dtype, device): the empty matcher checks nothing.
int64_t any_rank(TensorView x) {
  TensorMatcher().verify(x, "x");
  return x.ndim();
}

void runtime_check(int64_t value) {
  RuntimeCheck(value >= 0, "value must be >= 0, got ", value);
}

void value_check(int64_t value) {
  ValueCheck(value % 2 == 0, "value must be even, got ", value);
}

void panic(int64_t code) {
  Panic("panic with code ", code);
}

// Round trips through the host fp16/bf16 storage types: out = from_float(to_float(x)).
void round_trip_fp16(TensorView out, TensorView x) {
  SymbolicSize n{"n"};
  TensorMatcher({n}).dtype<fp32_t>().contiguous().verify(x, "x");
  TensorMatcher({n}).dtype<fp16_t>().contiguous().verify(out, "out");
  for (int64_t i = 0; i < n.value(); ++i) {
    data_ptr<fp16_t>(out)[i] = from_float<fp16_t>(data_ptr<const float>(x)[i]);
  }
}

void round_trip_bf16(TensorView out, TensorView x) {
  SymbolicSize n{"n"};
  TensorMatcher({n}).dtype<fp32_t>().contiguous().verify(x, "x");
  TensorMatcher({n}).dtype<bf16_t>().contiguous().verify(out, "out");
  for (int64_t i = 0; i < n.value(); ++i) {
    data_ptr<bf16_t>(out)[i] = from_float<bf16_t>(data_ptr<const float>(x)[i]);
  }
}

void widen_fp16(TensorView out, TensorView x) {
  SymbolicSize n{"n"};
  TensorMatcher({n}).dtype<fp16_t>().contiguous().verify(x, "x");
  TensorMatcher({n}).dtype<fp32_t>().contiguous().verify(out, "out");
  for (int64_t i = 0; i < n.value(); ++i) {
    data_ptr<float>(out)[i] = to_float(data_ptr<const fp16_t>(x)[i]);
  }
}

// verify_output alone: may a kernel write `out` while reading `input`?
void write_beside(TensorView out, TensorView input) {
  verify_output(out, "out", {{input, "input"}});
}

}  // namespace check_kernels
