// Row-wise kernels (norms, activations, softmax) see a tensor of any rank as a
// matrix [rows, cols]: the last dim is contiguous and the leading dims collapse
// into one evenly strided row index. Views such as x[:, :k] or a transposed
// batch of rows qualify; anything else is rejected naming the argument.
#pragma once

#include <cstdint>

#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel {

/// A tensor as [rows, cols] with elements (r, c) at data + r * row_stride + c.
struct RowMatrix {
  void* data;
  int64_t rows;
  int64_t cols;
  int64_t row_stride;  // in elements

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

/// The rank of `tensor` (named `arg`); raises ValueError for a scalar.
inline int64_t at_least_1d(const TensorView& tensor, const char* arg, source_location loc) {
  if (tensor.ndim() < 1) {
    detail::throw_error(
        "ValueError", detail::concat("argument '", arg, "': expected at least 1 dim, got a scalar"),
        loc);
  }
  return tensor.ndim();
}

/// `tensor` (named `arg` in errors) seen as rows of its last dim.
inline RowMatrix as_rows(const TensorView& tensor, const char* arg,
                         source_location loc = source_location::current()) {
  const int64_t ndim = at_least_1d(tensor, arg, loc);
  const int64_t cols = tensor.size(-1);
  if (cols > 1 && tensor.stride(-1) != 1) {
    detail::throw_error(
        "ValueError",
        detail::concat("argument '", arg, "': expected stride 1 in the last dim but got stride ",
                       tensor.stride(-1), "; call .contiguous() on it first"),
        loc);
  }
  int64_t rows = 1;
  int64_t row_stride = cols;
  bool seen = false;  // the innermost leading dim of size > 1 sets the row stride
  for (int64_t i = ndim - 2; i >= 0; --i) {
    const int64_t size = tensor.size(i);
    if (size == 1) continue;
    if (!seen) {
      row_stride = tensor.stride(i);
      seen = true;
    } else if (tensor.stride(i) != row_stride * rows) {
      detail::throw_error("ValueError",
                          detail::concat("argument '", arg, "': its leading dims must collapse ",
                                         "into one evenly strided row index, but dim ", i,
                                         " has stride ", tensor.stride(i), " (expected ",
                                         row_stride * rows, "); pass a .contiguous() tensor"),
                          loc);
    }
    rows *= size;
  }
  return RowMatrix{data_ptr<void>(tensor), rows, cols, row_stride};
}

/// `tensor` (named `arg`) as [size(0), everything else]: each slice t[i] must be
/// contiguous, the first dim may be strided. For per-token rows (KV cache writes).
inline RowMatrix as_first_dim_rows(const TensorView& tensor, const char* arg,
                                   source_location loc = source_location::current()) {
  const int64_t ndim = at_least_1d(tensor, arg, loc);
  int64_t cols = 1;
  for (int64_t i = ndim - 1; i >= 1; --i) {
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

/// True when each row of `m` (elements of `elem_size` bytes) starts on a boundary of
/// `vec_elems` elements and splits into whole vectors: the vectorised path applies.
inline bool rows_vec_aligned(const RowMatrix& m, int64_t elem_size, int64_t vec_elems) {
  const auto address = reinterpret_cast<std::uintptr_t>(m.data);
  return address % static_cast<std::uintptr_t>(elem_size * vec_elems) == 0 &&
         m.cols % vec_elems == 0 && (m.rows <= 1 || m.row_stride % vec_elems == 0);
}

/// Raises ValueError unless `got` (named `arg`) has the shape of `ref` (named `ref_arg`).
inline void check_same_shape(const TensorView& got, const char* arg, const TensorView& ref,
                             const char* ref_arg,
                             source_location loc = source_location::current()) {
  bool same = got.ndim() == ref.ndim();
  for (int64_t i = 0; same && i < got.ndim(); ++i) same = got.size(i) == ref.size(i);
  if (!same) {
    auto str = [](const TensorView& t) {
      std::string s = "[";
      for (int64_t i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
      return s + "]";
    };
    detail::throw_error("ValueError",
                        detail::concat("argument '", arg, "': expected the shape of '", ref_arg,
                                       "' ", str(ref), " but got ", str(got)),
                        loc);
  }
}

}  // namespace mllm_kernel
