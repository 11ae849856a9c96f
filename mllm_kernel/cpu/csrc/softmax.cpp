// Softmax along the last dim of `x` (the Python side moves the requested dim
// last, so that dim may have any stride). Computed in float32 in a per-thread
// row buffer: exp(x - max) / sum.
#include <cstdint>
#include <limits>
#include <memory>

#include "mllm_kernel/cpu/dtype_dispatch.hpp"
#include "mllm_kernel/cpu/float_convert.hpp"
#include "mllm_kernel/cpu/parallel.hpp"
#include "mllm_kernel/cpu/rows.hpp"
#include "mllm_kernel/cpu/vec_math.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

namespace softmax_detail {

template <typename T>
void load_row(const T* src, int64_t stride, int64_t n, float* dst) {
  if (stride == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = load_float(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = load_float(src[i * stride]);
  }
}

template <typename T>
void store_row(const float* src, float scale, int64_t n, T* dst, int64_t stride) {
  if (stride == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = store_float<T>(src[i] * scale);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i * stride] = store_float<T>(src[i] * scale);
  }
}

// Replaces row[i] by exp(row[i] - max) and returns 1 / sum of them.
inline float exp_and_inverse_sum(float* row, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
  for (int64_t i = 0; i < n; ++i) max = row[i] > max ? row[i] : max;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    row[i] = vec_exp(row[i] - max);
    sum += row[i];
  }
  return 1.0f / sum;
}

}  // namespace softmax_detail

inline void softmax(TensorView out, TensorView x, int64_t num_threads) {
  SymbolicDevice device;
  FloatDtypes::allow(TensorMatcher()).device(kDLCPU, device).verify(x, "x");
  TensorMatcher().dtype(x.dtype()).device(kDLCPU, device).verify(out, "out");
  verify_shape_like(out, "out", x, "x");

  const RowLayout x_rows(x), out_rows(out);
  const int64_t n = x_rows.cols();
  if (n == 0) return;
  FloatDtypes::dispatch(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x_data = data_ptr<const T>(x);
    T* out_data = data_ptr<T>(out);
    parallel_for(x_rows.rows(), n, num_threads, [&](int64_t begin, int64_t end) {
      const std::unique_ptr<float[]> buffer(new float[n]);
      float* row = buffer.get();
      for (int64_t r = begin; r < end; ++r) {
        softmax_detail::load_row(x_data + x_rows.row_offset(r), x_rows.col_stride(), n, row);
        const float inv_sum = softmax_detail::exp_and_inverse_sum(row, n);
        softmax_detail::store_row(row, inv_sum, n, out_data + out_rows.row_offset(r),
                                  out_rows.col_stride());
      }
    });
  });
}

}  // namespace mllm_kernel::cpu
