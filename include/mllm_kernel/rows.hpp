// Tensors of any rank seen as rows: the last dim is the row, every leading dim
// (with any strides) enumerates rows. Row-wise kernels (norms, softmax,
// activations), CPU or CUDA, use this instead of requiring a contiguous 2-D
// input. Host code: the matchers of tensor.hpp check the arguments (`.rows(n)`,
// `.same_shape_as(ref, "ref")`), this header turns a checked tensor into the
// addresses a kernel walks.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel {

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

  /// True when row r starts at r * row_stride(): the leading dims merged into one.
  bool evenly_strided() const { return num_dims_ <= 1 || rows_ == 0; }
  /// The distance between rows, in elements, when evenly_strided().
  int64_t row_stride() const { return num_dims_ == 1 ? strides_[0] : cols_ * col_stride_; }

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
  // Innermost first; entries past num_dims_ are never read (left uninitialised: a
  // layout is built on every call of a kernel's host code).
  std::array<int64_t, kMaxDims> sizes_;
  std::array<int64_t, kMaxDims> strides_;
  int num_dims_ = 0;
  int64_t rows_ = 1;
  int64_t cols_ = 1;
  int64_t col_stride_ = 1;
};

/// Rows as a GPU kernel indexes them: element (r, c) at data + r * row_stride + c.
struct RowMatrix {
  void* data;
  int64_t rows;
  int64_t cols;
  int64_t row_stride;  // in elements

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }

  /// True when every row (of elements of `elem_size` bytes) starts on a boundary of
  /// `vec_elems` elements and splits into whole vectors: the vectorised path applies.
  bool vec_aligned(int64_t elem_size, int64_t vec_elems) const {
    const auto address = reinterpret_cast<std::uintptr_t>(data);
    return address % static_cast<std::uintptr_t>(elem_size * vec_elems) == 0 &&
           cols % vec_elems == 0 && (rows <= 1 || row_stride % vec_elems == 0);
  }
};

/// `tensor` (named `arg` in errors) as a RowMatrix: raises ValueError unless it has
/// at least 1 dim, stride 1 in the last one, and leading dims that collapse into one
/// evenly strided row index (x[:, :k] and transposed batches of rows do).
inline RowMatrix as_rows(const TensorView& tensor, const char* arg,
                         source_location loc = source_location::current()) {
  detail::check_not_scalar(tensor, arg, loc);
  detail::check_last_dim_contiguous(tensor, arg, loc);
  const RowLayout layout(tensor);
  if (!layout.evenly_strided()) {
    detail::throw_error(
        "ValueError",
        detail::concat("argument '", arg,
                       "': its leading dims must collapse into one evenly strided row index, but "
                       "shape ",
                       dims_str(tensor.shape()), " has strides ", dims_str(tensor.strides()),
                       "; pass a .contiguous() tensor"),
        loc);
  }
  return RowMatrix{data_ptr<void>(tensor), layout.rows(), layout.cols(), layout.row_stride()};
}

/// `tensor` (named `arg`) as [size(0), everything else]: each slice t[i] must be
/// contiguous, the first dim may be strided. For per-token rows (KV cache writes).
inline RowMatrix as_first_dim_rows(const TensorView& tensor, const char* arg,
                                   source_location loc = source_location::current()) {
  detail::check_not_scalar(tensor, arg, loc);
  int64_t cols = 1;
  for (int64_t i = tensor.ndim() - 1; i >= 1; --i) {
    if (tensor.size(i) != 1 && tensor.stride(i) != cols) {
      detail::throw_error(
          "ValueError",
          detail::concat("argument '", arg, "': each ", arg, "[i] must be contiguous, but dim ", i,
                         " has stride ", tensor.stride(i), " (expected ", cols,
                         "); call .contiguous() on it first"),
          loc);
    }
    cols *= tensor.size(i);
  }
  return RowMatrix{data_ptr<void>(tensor), tensor.size(0), cols, tensor.stride(0)};
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

/// A row norm's epsilon (added to the mean square before the root), on either device:
/// finite and >= 0.
inline void check_norm_eps(double eps) {
  ValueCheck(eps >= 0.0 && eps < 1e30, "argument 'eps': expected a finite value >= 0, got ", eps);
}

}  // namespace mllm_kernel
