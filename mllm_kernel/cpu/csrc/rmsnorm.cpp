// RMSNorm over the last dim, the fused residual-add variant of sglang/FlashInfer,
// and the backward of the plain one. Rows (all leading dims) may be strided; each
// row must be contiguous. Computed in float32 for every dtype; threads split the rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

#include "mllm_kernel/cpu/parallel.hpp"
#include "mllm_kernel/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

namespace rmsnorm_detail {

inline float inv_rms(float sum_squares, int64_t hidden, float eps) {
  return 1.0f / std::sqrt(sum_squares / static_cast<float>(hidden) + eps);
}

// rmsnorm_backward sums grad_weight over the rows in at most this many blocks of
// consecutive rows (one thread each), then adds the blocks in order: the number of
// blocks depends on the shape only, so the result does not depend on num_threads.
inline constexpr int64_t kMaxWeightPartials = 64;

}  // namespace rmsnorm_detail

/// out = input / sqrt(mean(input^2, -1) + eps) * weight
inline void rmsnorm(TensorView out, TensorView input, TensorView weight, double eps,
                    int64_t num_threads) {
  SymbolicSize hidden_dim{"hidden"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, bf16_t, fp16_t>(dtype)
      .device(kDLCPU, device)
      .rows(hidden_dim)
      .verify(input, "input");
  TensorMatcher({hidden_dim})
      .dtype(dtype)
      .device(kDLCPU, device)
      .contiguous()
      .verify(weight, "weight");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCPU, device)
      .same_shape_as(input, "input")
      .last_dim_contiguous()
      .verify(out, "out");
  // A row is read in full (the sum) before it is written: in place works.
  verify_output(out, "out", {{input, "input", Aliasing::kSameView}, {weight, "weight"}});

  const RowLayout x_rows(input), out_rows(out);
  const int64_t hidden = hidden_dim.value();
  if (hidden == 0) return;
  const auto epsf = static_cast<float>(eps);
  dispatch_dtype<fp32_t, bf16_t, fp16_t>(dtype.value(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x_data = data_ptr<const T>(input);
    const T* w = data_ptr<const T>(weight);
    T* out_data = data_ptr<T>(out);
    parallel_for(x_rows.rows(), 3 * hidden, num_threads, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = x_data + x_rows.row_offset(r);
        T* yr = out_data + out_rows.row_offset(r);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < hidden; ++i) sum += to_float(xr[i]) * to_float(xr[i]);
        const float scale = rmsnorm_detail::inv_rms(sum, hidden, epsf);
#pragma omp simd
        for (int64_t i = 0; i < hidden; ++i) {
          yr[i] = from_float<T>(to_float(xr[i]) * scale * to_float(w[i]));
        }
      }
    });
  });
}

/// In place: residual += input; input = rmsnorm(residual) * weight. The sum is kept in
/// float32 for the norm (residual stores it rounded to its dtype), as FlashInfer.
inline void fused_add_rmsnorm(TensorView input, TensorView residual, TensorView weight, double eps,
                              int64_t num_threads) {
  SymbolicSize hidden_dim{"hidden"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, bf16_t, fp16_t>(dtype)
      .device(kDLCPU, device)
      .rows(hidden_dim)
      .verify(input, "input");
  TensorMatcher({hidden_dim})
      .dtype(dtype)
      .device(kDLCPU, device)
      .contiguous()
      .verify(weight, "weight");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCPU, device)
      .same_shape_as(input, "input")
      .last_dim_contiguous()
      .verify(residual, "residual");
  verify_output(input, "input", {{residual, "residual"}, {weight, "weight"}});
  verify_output(residual, "residual", {{weight, "weight"}});

  const RowLayout x_rows(input), res_rows(residual);
  const int64_t hidden = hidden_dim.value();
  if (hidden == 0) return;
  const auto epsf = static_cast<float>(eps);
  dispatch_dtype<fp32_t, bf16_t, fp16_t>(dtype.value(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* x_data = data_ptr<T>(input);
    T* res_data = data_ptr<T>(residual);
    const T* w = data_ptr<const T>(weight);
    parallel_for(x_rows.rows(), 4 * hidden, num_threads, [&](int64_t begin, int64_t end) {
      const std::unique_ptr<float[]> sum_row(new float[hidden]);
      float* s = sum_row.get();
      for (int64_t r = begin; r < end; ++r) {
        T* xr = x_data + x_rows.row_offset(r);
        T* rr = res_data + res_rows.row_offset(r);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < hidden; ++i) {
          s[i] = to_float(xr[i]) + to_float(rr[i]);
          rr[i] = from_float<T>(s[i]);
          sum += s[i] * s[i];
        }
        const float scale = rmsnorm_detail::inv_rms(sum, hidden, epsf);
#pragma omp simd
        for (int64_t i = 0; i < hidden; ++i) xr[i] = from_float<T>(s[i] * scale * to_float(w[i]));
      }
    });
  });
}

/// The backward of out = x * r * weight, r = 1 / sqrt(mean(x^2) + eps) per row of `input`:
///   grad_input  = r * grad_output * weight - x * r^3 / hidden * sum(grad_output * weight * x)
///   grad_weight = sum over all rows of grad_output * x * r
/// grad_input has input's shape and dtype (it may be grad_output itself); grad_weight is
/// float32 [hidden] and overwritten; weight has input's dtype. Float32 math.
inline void rmsnorm_backward(TensorView grad_input, TensorView grad_weight, TensorView grad_output,
                             TensorView input, TensorView weight, double eps, int64_t num_threads) {
  SymbolicSize hidden_dim{"hidden"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, bf16_t, fp16_t>(dtype)
      .device(kDLCPU, device)
      .rows(hidden_dim)
      .verify(input, "input");
  TensorMatcher({hidden_dim})
      .dtype(dtype)
      .device(kDLCPU, device)
      .contiguous()
      .verify(weight, "weight");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCPU, device)
      .same_shape_as(input, "input")
      .last_dim_contiguous()
      .verify(grad_output, "grad_output");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCPU, device)
      .same_shape_as(input, "input")
      .last_dim_contiguous()
      .verify(grad_input, "grad_input");
  TensorMatcher({hidden_dim})
      .dtype<fp32_t>()
      .device(kDLCPU, device)
      .contiguous()
      .verify(grad_weight, "grad_weight");
  ValueCheck(eps >= 0.0 && eps < 1e30, "argument 'eps': expected a finite value >= 0, got ", eps);
  // Each element of a row is read before the same iteration writes it: in place works.
  verify_output(grad_input, "grad_input",
                {{grad_output, "grad_output", Aliasing::kSameView},
                 {input, "input"},
                 {weight, "weight"},
                 {grad_weight, "grad_weight"}});
  verify_output(grad_weight, "grad_weight",
                {{grad_output, "grad_output"}, {input, "input"}, {weight, "weight"}});

  const RowLayout x_rows(input), g_rows(grad_output), dx_rows(grad_input);
  const int64_t hidden = hidden_dim.value(), rows = x_rows.rows();
  if (hidden == 0) return;
  const int64_t cost = 5 * hidden;  // per row: read x, g, w twice (from cache), write dx
  const int64_t parts = threads_for(rows, cost, rmsnorm_detail::kMaxWeightPartials);
  const std::unique_ptr<float[]> partials(new float[parts * hidden]);
  const auto epsf = static_cast<float>(eps);
  dispatch_dtype<fp32_t, bf16_t, fp16_t>(dtype.value(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x_data = data_ptr<const T>(input);
    const T* g_data = data_ptr<const T>(grad_output);
    const T* w = data_ptr<const T>(weight);
    T* dx_data = data_ptr<T>(grad_input);
    const int64_t rows_per_part = div_ceil<int64_t>(rows, parts);
    parallel_for(parts, rows_per_part * cost, num_threads, [&](int64_t begin, int64_t end) {
      for (int64_t part = begin; part < end; ++part) {
        float* acc = partials.get() + part * hidden;
        std::fill(acc, acc + hidden, 0.0f);
        for (int64_t r = rows * part / parts; r < rows * (part + 1) / parts; ++r) {
          const T* xr = x_data + x_rows.row_offset(r);
          const T* gr = g_data + g_rows.row_offset(r);
          T* dxr = dx_data + dx_rows.row_offset(r);
          float sum_sq = 0.0f, dot = 0.0f;
#pragma omp simd reduction(+ : sum_sq, dot)
          for (int64_t i = 0; i < hidden; ++i) {
            const float x = to_float(xr[i]);
            sum_sq += x * x;
            dot += to_float(gr[i]) * to_float(w[i]) * x;
          }
          const float scale = rmsnorm_detail::inv_rms(sum_sq, hidden, epsf);
          const float x_coef = dot * scale * scale * scale / static_cast<float>(hidden);
#pragma omp simd
          for (int64_t i = 0; i < hidden; ++i) {
            const float x = to_float(xr[i]), g = to_float(gr[i]);
            acc[i] += g * x * scale;
            dxr[i] = from_float<T>(scale * g * to_float(w[i]) - x_coef * x);
          }
        }
      }
    });
  });
  float* dw = data_ptr<float>(grad_weight);
  parallel_for(hidden, 2 * parts, num_threads, [&](int64_t begin, int64_t end) {
    std::fill(dw + begin, dw + end, 0.0f);
    for (int64_t part = 0; part < parts; ++part) {
      const float* acc = partials.get() + part * hidden;
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) dw[i] += acc[i];
    }
  });
}

}  // namespace mllm_kernel::cpu
