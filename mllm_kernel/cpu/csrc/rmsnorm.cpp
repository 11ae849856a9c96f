// RMSNorm over the last dim, and the fused residual-add variant of
// sglang/FlashInfer. Rows (all leading dims) may be strided; each row must be
// contiguous. Computed in float32 for every dtype; threads split the rows.
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

}  // namespace rmsnorm_detail

/// out = x / sqrt(mean(x^2, -1) + eps) * weight
inline void rmsnorm(TensorView out, TensorView x, TensorView weight, double eps,
                    int64_t num_threads) {
  SymbolicSize hidden_dim{"hidden"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, bf16_t, fp16_t>(dtype)
      .device(kDLCPU, device)
      .rows(hidden_dim)
      .verify(x, "x");
  TensorMatcher({hidden_dim})
      .dtype(dtype)
      .device(kDLCPU, device)
      .contiguous()
      .verify(weight, "weight");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCPU, device)
      .same_shape_as(x, "x")
      .last_dim_contiguous()
      .verify(out, "out");
  // A row is read in full (the sum) before it is written: in place works.
  verify_output(out, "out", {{x, "x", Aliasing::kSameView}, {weight, "weight"}});

  const RowLayout x_rows(x), out_rows(out);
  const int64_t hidden = hidden_dim.value();
  if (hidden == 0) return;
  const auto epsf = static_cast<float>(eps);
  dispatch_dtype<fp32_t, bf16_t, fp16_t>(dtype.value(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x_data = data_ptr<const T>(x);
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

/// In place: residual += x; x = rmsnorm(residual) * weight. The sum is kept in
/// float32 for the norm (residual stores it rounded to its dtype), as FlashInfer.
inline void fused_add_rmsnorm(TensorView x, TensorView residual, TensorView weight, double eps,
                              int64_t num_threads) {
  SymbolicSize hidden_dim{"hidden"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, bf16_t, fp16_t>(dtype)
      .device(kDLCPU, device)
      .rows(hidden_dim)
      .verify(x, "x");
  TensorMatcher({hidden_dim})
      .dtype(dtype)
      .device(kDLCPU, device)
      .contiguous()
      .verify(weight, "weight");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCPU, device)
      .same_shape_as(x, "x")
      .last_dim_contiguous()
      .verify(residual, "residual");
  verify_output(x, "x", {{residual, "residual"}, {weight, "weight"}});
  verify_output(residual, "residual", {{weight, "weight"}});

  const RowLayout x_rows(x), res_rows(residual);
  const int64_t hidden = hidden_dim.value();
  if (hidden == 0) return;
  const auto epsf = static_cast<float>(eps);
  dispatch_dtype<fp32_t, bf16_t, fp16_t>(dtype.value(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* x_data = data_ptr<T>(x);
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

}  // namespace mllm_kernel::cpu
