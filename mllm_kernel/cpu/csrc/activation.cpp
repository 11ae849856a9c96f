// SwiGLU's gate: out = silu(input[..., :d]) * input[..., d:] for input of last dim
// 2d, and its backward. Rows may be strided; each row must be contiguous. Computed in
// float32.
#include <cstdint>

#include "mllm_kernel/cpu/float_blocks.hpp"
#include "mllm_kernel/cpu/parallel.hpp"
#include "mllm_kernel/cpu/vec_math.hpp"
#include "mllm_kernel/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

namespace silu_and_mul_detail {

/// Half the last dim of `x` (named `arg`), whose rows `width` bound: raises unless even.
inline int64_t half_width(const TensorView& x, const char* arg, const SymbolicSize& width) {
  ValueCheck(width.value() % 2 == 0, "argument '", arg,
             "': expected an even last dim (gate and up halves), got shape ", dims_str(x.shape()));
  return width.value() / 2;
}

}  // namespace silu_and_mul_detail

inline void silu_and_mul(TensorView out, TensorView input, int64_t num_threads) {
  SymbolicSize width{"2d"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, bf16_t, fp16_t>(dtype)
      .device(kDLCPU, device)
      .rows(width)
      .verify(input, "input");
  const int64_t d = silu_and_mul_detail::half_width(input, "input", width);
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCPU, device)
      .same_shape_as(input, "input", d)
      .last_dim_contiguous()
      .verify(out, "out");
  verify_output(out, "out", {{input, "input"}});

  const RowLayout x_rows(input), out_rows(out);
  dispatch_dtype<fp32_t, bf16_t, fp16_t>(dtype.value(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x_data = data_ptr<const T>(input);
    T* out_data = data_ptr<T>(out);
    parallel_for(x_rows.rows(), d * (3 + kExpCost), num_threads, [&](int64_t begin, int64_t end) {
      alignas(64) float gate_buf[kFloatBlock], up_buf[kFloatBlock];
      for (int64_t r = begin; r < end; ++r) {
        const T* gate_row = x_data + x_rows.row_offset(r);
        T* yr = out_data + out_rows.row_offset(r);
        for_each_block<T>(d, [&](int64_t at, auto len) {
          const FloatIn<T> gate(gate_row + at, len, gate_buf), up(gate_row + d + at, len, up_buf);
          const FloatOut<T> y(yr + at, gate_buf);
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) y.set(i, vec_silu(gate[i]) * up[i]);
          y.store(len);
        });
      }
    });
  });
}

/// The backward of out = silu(gate) * up, input = [gate | up] of last dim 2d:
///   grad_gate = grad_output * up * s * (1 + gate * (1 - s)),  s = sigmoid(gate)
///   grad_up   = grad_output * silu(gate)
/// grad_input ([gate | up] grads) has input's shape and dtype; grad_output is [..., d].
inline void silu_and_mul_backward(TensorView grad_input, TensorView grad_output, TensorView input,
                                  int64_t num_threads) {
  SymbolicSize width{"2d"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, bf16_t, fp16_t>(dtype)
      .device(kDLCPU, device)
      .rows(width)
      .verify(input, "input");
  const int64_t d = silu_and_mul_detail::half_width(input, "input", width);
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCPU, device)
      .same_shape_as(input, "input", d)
      .last_dim_contiguous()
      .verify(grad_output, "grad_output");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCPU, device)
      .same_shape_as(input, "input")
      .last_dim_contiguous()
      .verify(grad_input, "grad_input");
  verify_output(grad_input, "grad_input", {{grad_output, "grad_output"}, {input, "input"}});

  const RowLayout x_rows(input), g_rows(grad_output), dx_rows(grad_input);
  dispatch_dtype<fp32_t, bf16_t, fp16_t>(dtype.value(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x_data = data_ptr<const T>(input);
    const T* g_data = data_ptr<const T>(grad_output);
    T* dx_data = data_ptr<T>(grad_input);
    parallel_for(x_rows.rows(), d * (5 + kExpCost), num_threads, [&](int64_t begin, int64_t end) {
      alignas(64) float gate_buf[kFloatBlock], up_buf[kFloatBlock], g_buf[kFloatBlock];
      for (int64_t r = begin; r < end; ++r) {
        const T* gate_row = x_data + x_rows.row_offset(r);
        const T* g_row = g_data + g_rows.row_offset(r);
        T* dx_row = dx_data + dx_rows.row_offset(r);
        for_each_block<T>(d, [&](int64_t at, auto len) {
          const FloatIn<T> gate(gate_row + at, len, gate_buf), up(gate_row + d + at, len, up_buf),
              g(g_row + at, len, g_buf);
          // Each input is read at i before the same iteration writes i of a buffer.
          const FloatOut<T> grad_gate(dx_row + at, gate_buf), grad_up(dx_row + d + at, up_buf);
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) {
            const float a = gate[i], b = up[i], go = g[i];
            const float s = 1.0f / (1.0f + vec_exp(-a));
            grad_gate.set(i, go * b * s * (1.0f + a * (1.0f - s)));
            grad_up.set(i, go * a * s);
          }
          grad_gate.store(len);
          grad_up.store(len);
        });
      }
    });
  });
}

}  // namespace mllm_kernel::cpu
