// Gated activations: out[..., :d] = act(input[..., :d]) * input[..., d:], in fp32,
// and the backward of silu_and_mul. A 2-D grid: y walks rows, x walks 16-byte
// vectors within a row (no division per element). Rows whose half-width or
// alignment does not allow vectors move one element at a time.
#include "mllm_kernel/cuda/activation.cuh"
#include "mllm_kernel/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace act {

struct Params {
  void* out;
  int64_t out_stride;
  const void* in;
  int64_t in_stride;
  int64_t rows;
  int64_t vecs_per_row;  // of the output row (d / N)
};

inline constexpr int kThreads = 128;
inline constexpr int64_t kMaxGridY = 65535;

template <typename T, int N, typename Act>
__global__ void act_and_mul_kernel(const Params p) {
  const int64_t d = p.vecs_per_row * N;
  for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    const T* in = static_cast<const T*>(p.in) + row * p.in_stride;
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
    for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
         v < p.vecs_per_row; v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      Vec<T, N> x, y, result;
      x.load(in + v * N);
      y.load(in + d + v * N);
#pragma unroll
      for (int i = 0; i < N; ++i) result[i] = from_float<T>(Act{}(to_float(x[i])) * to_float(y[i]));
      result.store(out + v * N);
    }
  }
}

/// The rows of `input` ([..., 2d], named "input"), checked and bound: `width` = 2d.
inline RowMatrix verify_gated_input(const TensorView& input, SymbolicSize& width,
                                    SymbolicDtype& dtype, SymbolicDevice& device, const char* op) {
  TensorMatcher()
      .dtype<fp32_t, fp16_t, bf16_t>(dtype)
      .device(kDLCUDA, device)
      .rows(width)
      .verify(input, "input");
  ValueCheck(width.value() % 2 == 0, "argument 'input': ", op,
             " needs an even last dim (2 * d), got ", width.value());
  return as_rows(input, "input");
}

template <typename Act>
void act_and_mul(TensorView out, TensorView input, const char* op) {
  SymbolicSize width{"2d"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  const RowMatrix x = verify_gated_input(input, width, dtype, device, op);
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCUDA, device)
      .same_shape_as(input, "input", width.value() / 2)
      .verify(out, "out");
  verify_output(out, "out", {{input, "input"}});
  const RowMatrix y = as_rows(out, "out");
  if (x.rows == 0 || y.cols == 0) return;

  dispatch_dtype<fp32_t, fp16_t, bf16_t>(dtype.value(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVecWidth<T>;
    // The second half starts d elements into the row: it is aligned when d is.
    const bool aligned =
        x.vec_aligned(sizeof(T), W) && y.vec_aligned(sizeof(T), W) && y.cols % W == 0;
    Params p{y.data, y.row_stride, x.data, x.row_stride, x.rows, 0};
    auto run = [&](auto kernel, int64_t vecs_per_row) {
      p.vecs_per_row = vecs_per_row;
      const int64_t blocks_x = div_ceil<int64_t>(vecs_per_row, kThreads);
      const dim3 grid(static_cast<unsigned>(blocks_x),
                      static_cast<unsigned>(x.rows < kMaxGridY ? x.rows : kMaxGridY));
      KernelLauncher(grid, dim3(kThreads), device.value())(kernel, p);
    };
    RuntimeCheck(y.cols / kThreads < (int64_t{1} << 31), op, ": last dim too large");
    if (aligned) {
      run(act_and_mul_kernel<T, W, Act>, y.cols / W);
    } else {
      run(act_and_mul_kernel<T, 1, Act>, y.cols);
    }
  });
}

/// silu_and_mul's backward: gate a, up b, incoming gradient g (of silu(a) * b), s = sigmoid(a):
///   grad_a = g * b * s * (1 + a * (1 - s)),   grad_b = g * a * s.
/// For a < -87 the exponential overflows and s = 0: both gradients are 0 (true values
/// below 1e-36).
struct BackwardParams {
  void* grad_input;  // [rows, 2d]
  int64_t grad_input_stride;
  const void* grad_output;  // [rows, d]
  int64_t grad_output_stride;
  const void* input;  // [rows, 2d]
  int64_t input_stride;
  int64_t rows;
  int64_t vecs_per_row;  // of the d-wide half (d / N)
};

template <typename T, int N>
__global__ void silu_and_mul_backward_kernel(const BackwardParams p) {
  const int64_t d = p.vecs_per_row * N;
  for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    const T* in = static_cast<const T*>(p.input) + row * p.input_stride;
    const T* grad = static_cast<const T*>(p.grad_output) + row * p.grad_output_stride;
    T* out = static_cast<T*>(p.grad_input) + row * p.grad_input_stride;
    for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
         v < p.vecs_per_row; v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      Vec<T, N> a, b, g, grad_a, grad_b;
      a.load(in + v * N);
      b.load(in + d + v * N);
      g.load(grad + v * N);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const float af = to_float(a[i]), bf = to_float(b[i]), gf = to_float(g[i]);
        const float s = fast_rcp(1.0f + __expf(-af));
        grad_a[i] = from_float<T>(gf * bf * s * fmaf(af, 1.0f - s, 1.0f));
        grad_b[i] = from_float<T>(gf * af * s);
      }
      grad_a.store(out + v * N);
      grad_b.store(out + d + v * N);
    }
  }
}

}  // namespace act

inline void silu_and_mul(TensorView out, TensorView input) {
  act::act_and_mul<Silu>(out, input, "silu_and_mul");
}
inline void gelu_and_mul(TensorView out, TensorView input) {
  act::act_and_mul<Gelu>(out, input, "gelu_and_mul");
}
inline void gelu_tanh_and_mul(TensorView out, TensorView input) {
  act::act_and_mul<GeluTanh>(out, input, "gelu_tanh_and_mul");
}

/// The backward of out = silu(input[..., :d]) * input[..., d:]: grad_input ([..., 2d],
/// input's shape and dtype) from grad_output ([..., d]) and input. fp32 math.
inline void silu_and_mul_backward(TensorView grad_input, TensorView grad_output, TensorView input) {
  using namespace act;
  SymbolicSize width{"2d"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  const RowMatrix x = verify_gated_input(input, width, dtype, device, "silu_and_mul_backward");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCUDA, device)
      .same_shape_as(input, "input", width.value() / 2)
      .verify(grad_output, "grad_output");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCUDA, device)
      .same_shape_as(input, "input")
      .verify(grad_input, "grad_input");
  verify_output(grad_input, "grad_input", {{grad_output, "grad_output"}, {input, "input"}});
  const RowMatrix g = as_rows(grad_output, "grad_output"), dx = as_rows(grad_input, "grad_input");
  if (x.rows == 0 || g.cols == 0) return;
  RuntimeCheck(g.cols / kThreads < (int64_t{1} << 31), "silu_and_mul_backward: last dim too large");

  dispatch_dtype<fp32_t, fp16_t, bf16_t>(dtype.value(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVecWidth<T>;
    // The second halves start d elements into the rows: aligned when d is.
    const bool aligned =
        x.vec_aligned(sizeof(T), W) && dx.vec_aligned(sizeof(T), W) && g.vec_aligned(sizeof(T), W);
    BackwardParams p{dx.data, dx.row_stride, g.data, g.row_stride, x.data, x.row_stride, x.rows, 0};
    auto run = [&](auto kernel, int64_t vecs_per_row) {
      p.vecs_per_row = vecs_per_row;
      const int64_t blocks_x = div_ceil<int64_t>(vecs_per_row, kThreads);
      const dim3 grid(static_cast<unsigned>(blocks_x),
                      static_cast<unsigned>(x.rows < kMaxGridY ? x.rows : kMaxGridY));
      KernelLauncher(grid, dim3(kThreads), device.value())(kernel, p);
    };
    if (aligned) {
      run(silu_and_mul_backward_kernel<T, W>, g.cols / W);
    } else {
      run(silu_and_mul_backward_kernel<T, 1>, g.cols);
    }
  });
}

}  // namespace mllm_kernel::cuda
