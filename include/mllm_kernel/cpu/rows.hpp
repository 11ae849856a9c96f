// Tensors of any rank seen as rows: the last dim is the row, every leading dim
// (with any strides) enumerates rows. Kernels that work row by row (norms,
// softmax, activations) use this instead of requiring a contiguous 2-D input.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

/// Raises ValueError unless `tensor` (named `arg`) has the shape of `ref`
/// (named `ref_arg`), with the last dim replaced by `last_dim` when that is >= 0:
/// for outputs, whose rank follows the input's.
inline void verify_shape_like(const TensorView& tensor, const char* arg, const TensorView& ref,
                              const char* ref_arg, int64_t last_dim = -1,
                              source_location loc = source_location::current()) {
  const int ndim = static_cast<int>(ref.ndim());
  bool same = tensor.ndim() == ndim;
  for (int i = 0; same && i < ndim; ++i) {
    const int64_t expected = (i == ndim - 1 && last_dim >= 0) ? last_dim : ref.size(i);
    same = tensor.size(i) == expected;
  }
  if (same) return;
  std::string expected = "[";
  for (int i = 0; i < ndim; ++i) {
    expected += (i ? ", " : "");
    expected += std::to_string((i == ndim - 1 && last_dim >= 0) ? last_dim : ref.size(i));
  }
  expected += "]";
  const std::string how = last_dim >= 0 ? "' with the last dim replaced" : "'";
  detail::throw_error(
      "ValueError",
      detail::concat("argument '", arg, "': expected shape ", expected, " (the shape of '", ref_arg,
                     how, ") but got ", dims_str(tensor.shape())),
      loc);
}

/// True when the elements fill one gap-free block of memory in some dim order
/// (contiguous, or a permutation of contiguous such as a transpose).
inline bool is_dense(const TensorView& t) {
  std::array<std::pair<int64_t, int64_t>, 16> dims{};  // (stride, size) of dims with size > 1
  int n = 0;
  for (int i = 0; i < t.ndim(); ++i) {
    if (t.size(i) == 0) return true;
    if (t.size(i) > 1) {
      if (n == static_cast<int>(dims.size())) return false;
      dims[n++] = {t.stride(i), t.size(i)};
    }
  }
  std::sort(dims.begin(), dims.begin() + n);
  int64_t expected = 1;
  for (int i = 0; i < n; ++i) {
    if (dims[i].first != expected) return false;
    expected *= dims[i].second;
  }
  return true;
}

/// True when `a` and `b` step through memory identically (strides of size-1 dims ignored).
inline bool same_strides(const TensorView& a, const TensorView& b) {
  if (a.ndim() != b.ndim()) return false;
  for (int i = 0; i < a.ndim(); ++i) {
    if (a.size(i) > 1 && a.stride(i) != b.stride(i)) return false;
  }
  return true;
}

/// Row r of a tensor starts at element offset row_offset(r); its elements are
/// col_stride() apart. Leading dims that are laid out as one are merged, so the
/// usual cases (contiguous, sliced rows) cost one multiply per row.
class RowLayout {
 public:
  explicit RowLayout(const TensorView& t) {
    const int ndim = static_cast<int>(t.ndim());
    if (ndim > 0) {
      cols_ = t.size(-1);
      col_stride_ = cols_ > 1 ? t.stride(-1) : 1;
    }
    // Leading dims, innermost first, merging a dim into the previous one when
    // stepping it equals stepping over all of the previous one.
    for (int i = ndim - 2; i >= 0; --i) {
      const int64_t size = t.size(i), stride = t.stride(i);
      rows_ *= size;
      if (size == 1) continue;
      if (num_dims_ > 0 && stride == strides_[num_dims_ - 1] * sizes_[num_dims_ - 1]) {
        sizes_[num_dims_ - 1] *= size;
      } else {
        RuntimeCheck(num_dims_ < kMaxDims, "tensors of more than ", kMaxDims + 1,
                     " non-mergeable dims are not supported");
        sizes_[num_dims_] = size;
        strides_[num_dims_] = stride;
        ++num_dims_;
      }
    }
  }

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t col_stride() const { return col_stride_; }

  int64_t row_offset(int64_t row) const {
    if (num_dims_ == 1) return row * strides_[0];
    int64_t offset = 0;
    for (int i = 0; i < num_dims_; ++i) {
      offset += (row % sizes_[i]) * strides_[i];
      row /= sizes_[i];
    }
    return offset;
  }

 private:
  static constexpr int kMaxDims = 16;
  std::array<int64_t, kMaxDims> sizes_{};    // innermost first
  std::array<int64_t, kMaxDims> strides_{};  // innermost first
  int num_dims_ = 0;
  int64_t rows_ = 1;
  int64_t cols_ = 1;
  int64_t col_stride_ = 1;
};

}  // namespace mllm_kernel::cpu
