// RMSNorm over the last dim, the fused residual-add variant of sglang/FlashInfer,
// and the backward of the plain one. Rows (all leading dims) may be strided; each
// row must be contiguous. Computed in float32 for every dtype; threads split the rows.
// fused_add_rmsnorm normalises the residual as stored (the float32 sum rounded to the
// dtype), as the CUDA kernel does: the devices differ only by float32 rounding inside
// the norm (the order of the sum of squares, CUDA's rsqrtf).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

#include "mllm_kernel/cpu/float_blocks.hpp"
#include "mllm_kernel/cpu/parallel.hpp"
#include "mllm_kernel/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

namespace rmsnorm_detail {

inline float inv_rms(float sum_squares, int64_t hidden, float eps) {
  return 1.0f / std::sqrt(sum_squares / static_cast<float>(hidden) + eps);
}

/// dst[i] = from_float<T>(x[i] + res[i]) (dst may be res's row) and s[i] = to_float(dst[i]),
/// the sums as stored, which fused_add_rmsnorm normalises; returns the sum of s[i]^2.
/// Where T converts in blocks the hardware rounds the block into dst and widens it back;
/// otherwise each element rounds in the one loop. Always inlined (see for_each_block).
template <typename T, typename Len>
[[gnu::always_inline]] inline float store_sum(const FloatIn<T>& x, const FloatIn<T>& res, Len len,
                                              T* dst, float* s) {
  float sum_squares = 0.0f;
  if constexpr (kConvertsInBlocks<T>) {
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) s[i] = x[i] + res[i];
    narrow(s, dst, len);
    widen(dst, s, len);
#pragma omp simd reduction(+ : sum_squares)
    for (int64_t i = 0; i < len; ++i) sum_squares += s[i] * s[i];
  } else {
#pragma omp simd reduction(+ : sum_squares)
    for (int64_t i = 0; i < len; ++i) {
      // from_float twice rather than a local T: GCC does not vectorise a bf16_t copy.
      const float sum = x[i] + res[i];
      dst[i] = from_float<T>(sum);
      s[i] = to_float(from_float<T>(sum));
      sum_squares += s[i] * s[i];
    }
  }
  return sum_squares;
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
  check_norm_eps(eps);

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
      alignas(64) float x_buf[kFloatBlock], w_buf[kFloatBlock];
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = x_data + x_rows.row_offset(r);
        T* yr = out_data + out_rows.row_offset(r);
        float sum = 0.0f;
        for_each_block<T>(hidden, [&](int64_t at, auto len) {
          const FloatIn<T> x(xr + at, len, x_buf);
          float part = 0.0f;
#pragma omp simd reduction(+ : part)
          for (int64_t i = 0; i < len; ++i) part += x[i] * x[i];
          sum += part;
        });
        const float scale = rmsnorm_detail::inv_rms(sum, hidden, epsf);
        for_each_block<T>(hidden, [&](int64_t at, auto len) {
          const FloatIn<T> x(xr + at, len, x_buf), wf(w + at, len, w_buf);
          const FloatOut<T> y(yr + at, x_buf);  // x[i] is read before y[i] overwrites it
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) y.set(i, x[i] * scale * wf[i]);
          y.store(len);
        });
      }
    });
  });
}

/// In place: residual = round(input + residual) (the sum in float32, rounded to the
/// dtype); input = rmsnorm(residual) * weight of residual as stored, in float32.
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
  check_norm_eps(eps);

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
      alignas(64) float x_buf[kFloatBlock], r_buf[kFloatBlock];
      for (int64_t r = begin; r < end; ++r) {
        T* xr = x_data + x_rows.row_offset(r);
        T* rr = res_data + res_rows.row_offset(r);
        float sum = 0.0f;
        for_each_block<T>(hidden, [&](int64_t at, auto len) {
          const FloatIn<T> x(xr + at, len, x_buf), res(rr + at, len, r_buf);
          sum += rmsnorm_detail::store_sum(x, res, len, rr + at, sum_row.get() + at);
        });
        const float scale = rmsnorm_detail::inv_rms(sum, hidden, epsf);
        for_each_block<T>(hidden, [&](int64_t at, auto len) {
          const FloatIn<T> wf(w + at, len, r_buf);  // r_buf is free in this pass
          const FloatOut<T> x_out(xr + at, x_buf);
          const float* s = sum_row.get() + at;
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) x_out.set(i, s[i] * scale * wf[i]);
          x_out.store(len);
        });
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
  check_norm_eps(eps);
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
      alignas(64) float x_buf[kFloatBlock], g_buf[kFloatBlock], w_buf[kFloatBlock];
      for (int64_t part = begin; part < end; ++part) {
        float* acc_row = partials.get() + part * hidden;
        std::fill(acc_row, acc_row + hidden, 0.0f);
        for (int64_t r = rows * part / parts; r < rows * (part + 1) / parts; ++r) {
          const T* xr = x_data + x_rows.row_offset(r);
          const T* gr = g_data + g_rows.row_offset(r);
          T* dxr = dx_data + dx_rows.row_offset(r);
          float sum_sq = 0.0f, dot = 0.0f;
          for_each_block<T>(hidden, [&](int64_t at, auto len) {
            const FloatIn<T> x(xr + at, len, x_buf), g(gr + at, len, g_buf), wf(w + at, len, w_buf);
            float sum_sq_part = 0.0f, dot_part = 0.0f;
#pragma omp simd reduction(+ : sum_sq_part, dot_part)
            for (int64_t i = 0; i < len; ++i) {
              sum_sq_part += x[i] * x[i];
              dot_part += g[i] * wf[i] * x[i];
            }
            sum_sq += sum_sq_part;
            dot += dot_part;
          });
          const float scale = rmsnorm_detail::inv_rms(sum_sq, hidden, epsf);
          const float x_coef = dot * scale * scale * scale / static_cast<float>(hidden);
          for_each_block<T>(hidden, [&](int64_t at, auto len) {
            const FloatIn<T> x(xr + at, len, x_buf), g(gr + at, len, g_buf), wf(w + at, len, w_buf);
            // g[i] is read before dx[i] overwrites it (grad_output may be grad_input).
            const FloatOut<T> dx(dxr + at, g_buf);
            float* acc = acc_row + at;
#pragma omp simd
            for (int64_t i = 0; i < len; ++i) {
              acc[i] += g[i] * x[i] * scale;
              dx.set(i, scale * g[i] * wf[i] - x_coef * x[i]);
            }
            dx.store(len);
          });
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
