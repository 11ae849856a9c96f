// Softmax of x / temperature along the last dim of `x` (the Python side moves the
// requested dim last, so that dim may have any stride). Three passes over a row, in
// float32: the max; exp((x - max) / temperature) into a per-thread buffer (a contiguous
// float32 row: into `out`), summed; the scaled store.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>

#include "mllm_kernel/cpu/float_blocks.hpp"
#include "mllm_kernel/cpu/parallel.hpp"
#include "mllm_kernel/cpu/vec_math.hpp"
#include "mllm_kernel/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

namespace softmax_detail {

// A row with any strides, element by element.
template <typename T>
void softmax_strided_row(const T* x, int64_t xs, T* out, int64_t os, int64_t n, float scale,
                         float* buf) {
  float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
  for (int64_t i = 0; i < n; ++i) {
    const float v = to_float(x[i * xs]);
    max = v > max ? v : max;
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    buf[i] = vec_exp((to_float(x[i * xs]) - max) * scale);
    sum += buf[i];
  }
  const float inv_sum = 1.0f / sum;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i * os] = from_float<T>(buf[i] * inv_sum);
}

// A contiguous row, by blocks where T converts in blocks (float_blocks.hpp).
template <typename T>
void softmax_row(const T* x, T* out, int64_t n, float scale, float* buf, float* block_buf) {
  float max = -std::numeric_limits<float>::infinity();
  for_each_block<T>(n, [&](int64_t at, auto len) {
    const FloatIn<T> xb(x + at, len, block_buf);
    float part = max;
#pragma omp simd reduction(max : part)
    for (int64_t i = 0; i < len; ++i) part = xb[i] > part ? xb[i] : part;
    max = part;
  });
  // float32 keeps the exps in `out` itself, as torch does: the row then goes out
  // while the exp pass computes, rather than in a pass of its own.
  float* exps = buf;
  if constexpr (std::is_same_v<T, float>) exps = out;
  float sum = 0.0f;
  for_each_block<T>(n, [&](int64_t at, auto len) {
    const FloatIn<T> xb(x + at, len, block_buf);
    float* e = exps + at;
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int64_t i = 0; i < len; ++i) {
      e[i] = vec_exp((xb[i] - max) * scale);
      part += e[i];
    }
    sum += part;
  });
  const float inv_sum = 1.0f / sum;
  for_each_block<T>(n, [&](int64_t at, auto len) {
    const FloatOut<T> y(out + at, block_buf);
    const float* e = exps + at;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) y.set(i, e[i] * inv_sum);
    y.store(len);
  });
}

}  // namespace softmax_detail

/// out = softmax(x / temperature) over the last dim; `out` may alias `x`.
inline void softmax(TensorView out, TensorView x, double temperature, int64_t num_threads) {
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher().dtype<fp32_t, bf16_t, fp16_t>(dtype).device(kDLCPU, device).verify(x, "x");
  TensorMatcher().dtype(dtype).device(kDLCPU, device).same_shape_as(x, "x").verify(out, "out");
  // A row is read in full (max and sum) before it is written: in place works.
  verify_output(out, "out", {{x, "x", Aliasing::kSameView}});
  ValueCheck(temperature > 0.0 && std::isfinite(temperature),
             "argument 'temperature': expected a finite value > 0, got ", temperature);
  // max(x / t) = max(x) / t for t > 0, so the max pass reads x unscaled. Below
  // t = 1 / FLT_MAX the scale would be inf and the max's (x - max) * scale = 0 * inf a
  // NaN: FLT_MAX instead keeps every other factor at exp(-huge) = 0 as 1 / t would, and
  // the few that differ by a denormal step agree with 1 / t to float precision.
  const float scale = static_cast<float>(std::fmin(1.0 / temperature, FLT_MAX));

  const RowLayout x_rows(x), out_rows(out);
  const int64_t n = x_rows.cols(), xs = x_rows.col_stride(), os = out_rows.col_stride();
  if (n == 0) return;
  dispatch_dtype<fp32_t, bf16_t, fp16_t>(dtype.value(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x_data = data_ptr<const T>(x);
    T* out_data = data_ptr<T>(out);
    parallel_for(x_rows.rows(), n * (2 + kExpCost), num_threads, [&](int64_t begin, int64_t end) {
      const std::unique_ptr<float[]> buffer(new float[n]);
      alignas(64) float block_buf[kFloatBlock];
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = x_data + x_rows.row_offset(r);
        T* yr = out_data + out_rows.row_offset(r);
        if (xs == 1 && os == 1) {
          softmax_detail::softmax_row(xr, yr, n, scale, buffer.get(), block_buf);
        } else {
          softmax_detail::softmax_strided_row(xr, xs, yr, os, n, scale, buffer.get());
        }
      }
    });
  });
}

}  // namespace mllm_kernel::cpu
