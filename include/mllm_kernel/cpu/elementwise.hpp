// Element-wise maps over tensors of any rank and layout, vectorised where the
// memory allows it and split over threads for large inputs.
#pragma once

#include <cstdint>

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

}  // namespace mllm_kernel::cpu
