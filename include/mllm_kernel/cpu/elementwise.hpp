// Element-wise maps over tensors of any rank and layout, vectorised where the
// memory allows it and split over threads for large inputs.
#pragma once

#include <cstdint>

#include "mllm_kernel/cpu/float_blocks.hpp"
#include "mllm_kernel/cpu/parallel.hpp"
#include "mllm_kernel/rows.hpp"
#include "mllm_kernel/tensor.hpp"

namespace mllm_kernel::cpu {

/// out[i] = op(x[i]) for every index of `x`; `out` has x's shape (checked by
/// the caller) and any strides. Dense tensors laid out alike (contiguous,
/// or both transposed the same way) are one flat vectorised loop; anything
/// else goes row by row along the last dim.
template <typename TOut, typename TIn, typename Op>
void unary_map(const TensorView& out, const TensorView& x, int64_t max_threads, const Op& op) {
  const TIn* src = data_ptr<const TIn>(x);
  TOut* dst = data_ptr<TOut>(out);
  if (is_dense(x) && same_strides(x, out)) {
    parallel_for(x.numel(), 2, max_threads, [&](int64_t begin, int64_t end) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) dst[i] = op(src[i]);
    });
    return;
  }
  const RowLayout x_rows(x), out_rows(out);
  const int64_t cols = x_rows.cols(), xs = x_rows.col_stride(), os = out_rows.col_stride();
  parallel_for(x_rows.rows(), 2 * cols, max_threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const TIn* in_row = src + x_rows.row_offset(r);
      TOut* out_row = dst + out_rows.row_offset(r);
      if (xs == 1 && os == 1) {
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) out_row[i] = op(in_row[i]);
      } else {
        for (int64_t i = 0; i < cols; ++i) out_row[i * os] = op(in_row[i * xs]);
      }
    }
  });
}

/// out[i] = op(x[i]) computed in float32 for T = float, bf16 or fp16: `op`
/// maps a float to a float. As unary_map, with dense tensors by blocks where T
/// converts in blocks (float_blocks.hpp).
template <typename T, typename Op>
void float_map(const TensorView& out, const TensorView& x, int64_t max_threads, const Op& op) {
  if (!is_dense(x) || !same_strides(x, out)) {
    unary_map<T, T>(out, x, max_threads, [&op](T v) { return from_float<T>(op(to_float(v))); });
    return;
  }
  const T* src = data_ptr<const T>(x);
  T* dst = data_ptr<T>(out);
  parallel_for(x.numel(), 2, max_threads, [&](int64_t begin, int64_t end) {
    alignas(64) float buf[kFloatBlock];
    for_each_block<T>(end - begin, [&](int64_t at, auto len) {
      const FloatIn<T> in(src + begin + at, len, buf);
      const FloatOut<T> result(dst + begin + at, buf);
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) result.set(i, op(in[i]));
      result.store(len);
    });
  });
}

}  // namespace mllm_kernel::cpu
