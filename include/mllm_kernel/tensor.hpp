// Declarative tensor checks. A kernel states what each argument must look like:
//
//   SymbolicSize hidden{"hidden"};
//   SymbolicDtype dtype;
//   SymbolicDevice device;
//   TensorMatcher().dtype<fp16_t, bf16_t>(dtype).device(kDLCUDA, device).rows(hidden)
//       .verify(input, "input");
//   TensorMatcher().dtype(dtype).device(kDLCUDA, device).same_shape_as(input, "input")
//       .verify(out, "out");
//   TensorMatcher({hidden}).dtype(dtype).device(kDLCUDA, device).verify(weight, "weight");
//
// A symbolic size, dtype or device is bound by the first tensor that uses it and
// must match in every later one; a mismatch names the tensor that bound it.
//
// Every op that writes into a caller's tensor also states how that output may
// share memory with its inputs (see verify_output below):
//
//   verify_output(out, "out", {{input, "input", Aliasing::kSameView}, {weight, "weight"}});
//
// A failed check raises, in Python, TypeError (dtype) or ValueError (anything
// else) naming the argument, what was expected, what came, and the file:line of
// the verify() call.
#pragma once

#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "mllm_kernel/utils.hpp"

namespace mllm_kernel {

using ::tvm::ffi::TensorView;

/// "[a, b, c]" from item(0), ..., item(n - 1): the one way error messages print a
/// shape or stride list, actual or expected.
template <typename Item>
std::string bracketed(std::size_t n, const Item& item) {
  std::string s = "[";
  for (std::size_t i = 0; i < n; ++i) s += (i ? ", " : "") + item(i);
  return s + "]";
}

/// "[2, 3, 4]": a tensor's shape or strides.
inline std::string dims_str(::tvm::ffi::ShapeView dims) {
  return bracketed(dims.size(), [&](std::size_t i) { return std::to_string(dims[i]); });
}

/// A size shared between tensors, named in error messages.
class SymbolicSize {
 public:
  explicit SymbolicSize(const char* name) : name_(name) {}
  SymbolicSize(const SymbolicSize&) = delete;
  SymbolicSize& operator=(const SymbolicSize&) = delete;

  const char* name() const { return name_; }
  bool bound() const { return value_ >= 0; }
  /// The bound value; a kernel reads it after verify() has run.
  int64_t value(source_location loc = source_location::current()) const {
    if (!bound()) {
      detail::throw_error(
          "RuntimeError",
          detail::concat("symbolic size '", name_, "' read before any tensor bound it"), loc);
    }
    return value_;
  }
  /// Binds the size up front (for example from a scalar argument).
  void bind(int64_t value, const char* bound_by) {
    value_ = value;
    bound_by_ = bound_by;
  }
  const char* bound_by() const { return bound_by_; }

 private:
  const char* name_;
  const char* bound_by_ = "";
  int64_t value_ = -1;
};

/// A dtype shared between tensors: "the dtype of 'input'".
class SymbolicDtype {
 public:
  SymbolicDtype() = default;
  SymbolicDtype(const SymbolicDtype&) = delete;
  SymbolicDtype& operator=(const SymbolicDtype&) = delete;

  bool bound() const { return bound_; }
  /// The bound dtype; a kernel reads it (to dispatch) after verify() has run.
  DLDataType value() const { return dtype_; }
  const char* bound_by() const { return bound_by_; }
  void bind(DLDataType dtype, const char* bound_by) {
    dtype_ = dtype;
    bound_by_ = bound_by;
    bound_ = true;
  }

 private:
  DLDataType dtype_{};
  const char* bound_by_ = "";
  bool bound_ = false;
};

/// A device shared between tensors: "all tensors on one device".
class SymbolicDevice {
 public:
  SymbolicDevice() = default;
  SymbolicDevice(const SymbolicDevice&) = delete;
  SymbolicDevice& operator=(const SymbolicDevice&) = delete;

  bool bound() const { return bound_; }
  DLDevice value() const { return device_; }
  const char* bound_by() const { return bound_by_; }
  void bind(DLDevice device, const char* bound_by) {
    device_ = device;
    bound_by_ = bound_by;
    bound_ = true;
  }

 private:
  DLDevice device_{kDLCPU, 0};
  const char* bound_by_ = "";
  bool bound_ = false;
};

/// One entry of an expected shape or stride list: a literal, a SymbolicSize or kAnySize.
class Dim {
 public:
  Dim() = default;
  Dim(int64_t literal) : literal_(literal) {}      // NOLINT(google-explicit-constructor)
  Dim(int literal) : literal_(literal) {}          // NOLINT(google-explicit-constructor)
  Dim(SymbolicSize& symbol) : symbol_(&symbol) {}  // NOLINT(google-explicit-constructor)

  bool is_any() const { return symbol_ == nullptr && literal_ < 0; }
  SymbolicSize* symbol() const { return symbol_; }
  int64_t literal() const { return literal_; }

 private:
  SymbolicSize* symbol_ = nullptr;
  int64_t literal_ = -1;
};

/// Matches any size in a shape or stride list.
inline constexpr int64_t kAnySize = -1;

/// A fixed-capacity list of Dim: checks run on every call, so no heap allocation.
class DimList {
 public:
  static constexpr int kMaxDims = 8;
  DimList() = default;
  DimList(std::initializer_list<Dim> dims) {
    for (const Dim& d : dims) {
      if (size_ < kMaxDims) dims_[size_] = d;
      ++size_;  // an over-long list fails every rank check with its real length
    }
  }
  std::size_t size() const { return size_; }
  const Dim& operator[](std::size_t i) const { return dims_[i]; }

 private:
  std::array<Dim, kMaxDims> dims_{};
  std::size_t size_ = 0;
};

namespace detail {

/// Raises ValueError naming `arg` unless `tensor` has at least one dim.
inline void check_not_scalar(const TensorView& tensor, const char* arg,
                             const source_location& loc) {
  if (tensor.ndim() < 1) {
    throw_error("ValueError", concat("argument '", arg, "': expected at least 1 dim, got a scalar"),
                loc);
  }
}

/// Raises ValueError naming `arg` unless the last dim has stride 1 (or one element).
inline void check_last_dim_contiguous(const TensorView& tensor, const char* arg,
                                      const source_location& loc) {
  if (tensor.ndim() > 0 && tensor.size(-1) > 1 && tensor.stride(-1) != 1) {
    throw_error("ValueError",
                concat("argument '", arg, "': expected stride 1 in the last dim but got strides ",
                       dims_str(tensor.strides()), "; call .contiguous() on it first"),
                loc);
  }
}

}  // namespace detail

class TensorMatcher {
 public:
  /// Any rank, any shape.
  TensorMatcher() = default;
  /// Exactly this rank; each dim a literal, a SymbolicSize or kAnySize.
  TensorMatcher(std::initializer_list<Dim> shape) : shape_(shape), check_shape_(true) {}

  /// The dtype must be one of Ts (the aliases of utils.hpp).
  template <typename... Ts>
  TensorMatcher& dtype() {
    (add_dtype(dtype_trait<Ts>::value), ...);
    return *this;
  }
  /// The dtype must be one of Ts, and the one every tensor sharing `symbol` has.
  template <typename... Ts>
  TensorMatcher& dtype(SymbolicDtype& symbol) {
    (add_dtype(dtype_trait<Ts>::value), ...);
    dtype_symbol_ = &symbol;
    return *this;
  }
  /// The dtype must equal `dtype` (a fixed one; for another argument's, share a SymbolicDtype).
  TensorMatcher& dtype(DLDataType dtype) {
    add_dtype(dtype);
    return *this;
  }
  /// The device type must be `type`; every tensor sharing `device` must be on the same one.
  TensorMatcher& device(DLDeviceType type, SymbolicDevice& device) {
    device_type_ = type;
    device_ = &device;
    return *this;
  }
  /// Row-major contiguous.
  TensorMatcher& contiguous() {
    contiguous_ = true;
    return *this;
  }
  /// Stride 1 in the last dim (rows may be strided).
  TensorMatcher& last_dim_contiguous() {
    last_dim_contiguous_ = true;
    return *this;
  }
  /// Rows of `cols` contiguous elements: at least 1 dim, the last one `cols` long
  /// with stride 1; the leading dims (any strides) enumerate the rows.
  TensorMatcher& rows(SymbolicSize& cols) {
    row_cols_ = &cols;
    last_dim_contiguous_ = true;
    return *this;
  }
  /// The shape of `ref` (named `ref_arg` in errors).
  TensorMatcher& same_shape_as(const TensorView& ref, const char* ref_arg) {
    shape_ref_ = &ref;
    shape_ref_arg_ = ref_arg;
    return *this;
  }
  /// The shape of `ref` with its last dim replaced by `last_dim` (gated activations'
  /// halved rows); a SymbolicSize not bound yet is bound here.
  TensorMatcher& same_shape_as(const TensorView& ref, const char* ref_arg, Dim last_dim) {
    same_shape_as(ref, ref_arg);
    shape_ref_last_ = last_dim;
    replace_last_ = true;
    return *this;
  }
  /// Exact strides, in elements; entries as for the shape.
  TensorMatcher& strides(std::initializer_list<Dim> strides) {
    strides_ = strides;
    check_strides_ = true;
    return *this;
  }

  /// Checks `tensor` (named `arg` in errors) and binds its symbolic sizes/device.
  const TensorMatcher& verify(const TensorView& tensor, const char* arg,
                              source_location loc = source_location::current()) const {
    check_dtype(tensor, arg, loc);
    check_device(tensor, arg, loc);
    if (check_shape_) check_dims(tensor.shape(), shape_, "dim", tensor, arg, loc);
    if (shape_ref_ != nullptr) check_shape_like_ref(tensor, arg, loc);
    if (row_cols_ != nullptr) check_rows(tensor, arg, loc);
    if (check_strides_) check_dims(tensor.strides(), strides_, "stride", tensor, arg, loc);
    if (contiguous_ && !tensor.IsContiguous()) {
      fail("ValueError", arg, loc, "expected a contiguous tensor but got shape ",
           dims_str(tensor.shape()), " with strides ", dims_str(tensor.strides()),
           "; call .contiguous() on it first");
    }
    if (last_dim_contiguous_) detail::check_last_dim_contiguous(tensor, arg, loc);
    return *this;
  }

 private:
  template <typename... Args>
  [[noreturn]] static void fail(const char* kind, const char* arg, const source_location& loc,
                                Args&&... parts) {
    detail::throw_error(
        kind, detail::concat("argument '", arg, "': ", std::forward<Args>(parts)...), loc);
  }

  void add_dtype(DLDataType dtype) {
    if (num_dtypes_ < static_cast<int>(dtypes_.size())) dtypes_[num_dtypes_++] = dtype;
  }

  /// "hidden=8", "*", "4": one expected dim.
  static std::string dim_str(const Dim& d) {
    if (SymbolicSize* s = d.symbol()) {
      return s->bound() ? detail::concat(s->name(), "=", s->value()) : std::string(s->name());
    }
    return d.is_any() ? "*" : std::to_string(d.literal());
  }

  static std::string expected_dims_str(const DimList& dims) {
    return bracketed(dims.size(), [&](std::size_t i) { return dim_str(dims[i]); });
  }

  void check_dtype(const TensorView& tensor, const char* arg, const source_location& loc) const {
    const DLDataType got = tensor.dtype();
    if (num_dtypes_ > 0) {
      bool allowed = false;
      for (int i = 0; i < num_dtypes_ && !allowed; ++i) allowed = same_dtype(dtypes_[i], got);
      if (!allowed) {
        std::string expected;
        for (int i = 0; i < num_dtypes_; ++i) expected += (i ? ", " : "") + dtype_name(dtypes_[i]);
        fail("TypeError", arg, loc, "expected dtype in {", expected, "} but got ", dtype_name(got));
      }
    }
    if (dtype_symbol_ == nullptr) return;
    if (!dtype_symbol_->bound()) {
      dtype_symbol_->bind(got, arg);
    } else if (!same_dtype(dtype_symbol_->value(), got)) {
      fail("TypeError", arg, loc, "expected dtype ", dtype_name(dtype_symbol_->value()), " as in '",
           dtype_symbol_->bound_by(), "' but got ", dtype_name(got));
    }
  }

  void check_shape_like_ref(const TensorView& tensor, const char* arg,
                            const source_location& loc) const {
    const TensorView& ref = *shape_ref_;
    const int64_t ndim = ref.ndim();
    SymbolicSize* last_symbol = replace_last_ ? shape_ref_last_.symbol() : nullptr;
    if (last_symbol != nullptr && !last_symbol->bound() && tensor.ndim() == ndim) {
      last_symbol->bind(tensor.size(-1), arg);
    }
    auto expected = [&](int64_t i) {
      return replace_last_ && i == ndim - 1
                 ? (last_symbol ? last_symbol->value() : shape_ref_last_.literal())
                 : ref.size(i);
    };
    bool same = tensor.ndim() == ndim;
    for (int64_t i = 0; same && i < ndim; ++i) {
      same = (replace_last_ && i == ndim - 1 && shape_ref_last_.is_any()) ||
             tensor.size(i) == expected(i);
    }
    if (same) return;
    const std::string shape = bracketed(static_cast<std::size_t>(ndim), [&](std::size_t i) {
      const auto dim = static_cast<int64_t>(i);
      return replace_last_ && dim == ndim - 1 ? dim_str(shape_ref_last_)
                                              : std::to_string(expected(dim));
    });
    fail("ValueError", arg, loc, "expected shape ", shape, " (the shape of '", shape_ref_arg_,
         replace_last_ ? "' with the last dim replaced" : "'", ") but got ",
         dims_str(tensor.shape()));
  }

  void check_rows(const TensorView& tensor, const char* arg, const source_location& loc) const {
    detail::check_not_scalar(tensor, arg, loc);
    const int64_t cols = tensor.size(-1);
    SymbolicSize& symbol = *row_cols_;
    if (!symbol.bound()) {
      symbol.bind(cols, arg);
    } else if (symbol.value() != cols) {
      fail("ValueError", arg, loc, "expected rows of ", symbol.name(), "=", symbol.value(),
           " elements (the last dim) as in '", symbol.bound_by(), "' but got shape ",
           dims_str(tensor.shape()));
    }
  }

  void check_device(const TensorView& tensor, const char* arg, const source_location& loc) const {
    if (device_ == nullptr) return;
    const DLDevice got = tensor.device();
    if (got.device_type != device_type_) {
      fail("ValueError", arg, loc, "expected a tensor on ", device_name(DLDevice{device_type_, 0}),
           " but got one on ", device_name(got));
    }
    if (!device_->bound()) {
      device_->bind(got, arg);
    } else if (device_->value().device_id != got.device_id) {
      fail("ValueError", arg, loc, "expected the device of '", device_->bound_by(), "' (",
           device_name(device_->value()), ") but got ", device_name(got),
           "; all tensors must be on one device");
    }
  }

  void check_dims(::tvm::ffi::ShapeView got, const DimList& expected, const char* what,
                  const TensorView& tensor, const char* arg, const source_location& loc) const {
    const bool is_shape = what[0] == 'd';
    if (got.size() != expected.size()) {
      fail("ValueError", arg, loc, "expected ", expected.size(), " dims with ",
           is_shape ? "shape " : "strides ", expected_dims_str(expected), " but got ", got.size(),
           " dims with ", is_shape ? "shape " : "strides ", dims_str(got));
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      const Dim& d = expected[i];
      if (d.is_any()) continue;
      // A stride is irrelevant where the dim has size 1 (torch reports any value there).
      if (!is_shape && tensor.size(static_cast<int64_t>(i)) <= 1) continue;
      if (SymbolicSize* s = d.symbol()) {
        if (!s->bound()) {
          s->bind(got[i], arg);
        } else if (s->value() != got[i]) {
          fail("ValueError", arg, loc, "expected ", what, " ", i, " (", s->name(), ") to be ",
               s->value(), " as in '", s->bound_by(), "' but got ", got[i], " (",
               is_shape ? "shape " : "strides ", dims_str(got), ")");
        }
      } else if (d.literal() != got[i]) {
        fail("ValueError", arg, loc, "expected ", what, " ", i, " to be ", d.literal(), " but got ",
             got[i], " (", is_shape ? "shape " : "strides ", dims_str(got), ")");
      }
    }
  }

  DimList shape_;
  DimList strides_;
  std::array<DLDataType, 16> dtypes_{};
  int num_dtypes_ = 0;
  SymbolicDtype* dtype_symbol_ = nullptr;
  SymbolicSize* row_cols_ = nullptr;
  const TensorView* shape_ref_ = nullptr;
  const char* shape_ref_arg_ = "";
  Dim shape_ref_last_;
  bool replace_last_ = false;
  SymbolicDevice* device_ = nullptr;
  DLDeviceType device_type_ = kDLCPU;
  bool check_shape_ = false;
  bool check_strides_ = false;
  bool contiguous_ = false;
  bool last_dim_contiguous_ = false;
};

// ---------------------------------------------------------------------------
// Outputs: a kernel that writes a caller's tensor while reading others gives a
// silently wrong result when the output has a zero stride (an expanded view: many
// threads write one element) or overlaps an input it has not finished reading.
// ---------------------------------------------------------------------------

/// How an output may share memory with one input.
enum class Aliasing {
  kNone,      ///< never: any overlap is an error
  kSameView,  ///< in place: exactly the same view (pointer, shape, strides) is fine
};

/// One input an output is checked against.
struct OutputInput {
  const TensorView& tensor;
  const char* arg;
  Aliasing aliasing = Aliasing::kNone;
};

namespace detail {

/// The bytes a tensor can touch, described so that the common disjoint layouts
/// (two column blocks of one row-major buffer: q and k of a fused qkv) are told
/// apart from real overlaps: every byte lies in [lo, hi), and in some
/// `base + k * period + [0, block)` (period 0: one block only).
struct Footprint {
  bool empty = true;
  uintptr_t base = 0, lo = 0, hi = 0;
  int64_t block = 0, period = 0;
};

inline Footprint footprint(const TensorView& t) {
  Footprint f;
  const int64_t elem = (static_cast<int64_t>(t.dtype().bits) * t.dtype().lanes + 7) / 8;
  for (int i = 0; i < t.ndim(); ++i) {
    if (t.size(i) == 0) return f;
  }
  f.empty = false;
  f.base = reinterpret_cast<uintptr_t>(t.data_ptr()) + t.byte_offset();
  int64_t low = 0, high = 0;
  for (int i = 0; i < t.ndim(); ++i) {
    const int64_t extent = t.stride(i) * (t.size(i) - 1) * elem;
    (extent < 0 ? low : high) += extent;
  }
  f.lo = f.base + low;
  f.hi = f.base + high + elem;
  // The innermost contiguous run is one block: the last dim and, outwards, every dim
  // that steps by exactly the run so far (the heads of a [T, H, D] view of a fused
  // [T, 3 H D] projection are one run of H D); every other dim steps by a multiple of
  // the period. Dims of size 1 take no step.
  int outer = static_cast<int>(t.ndim());
  f.block = elem;
  for (; outer > 0; --outer) {
    const int i = outer - 1;
    if (t.size(i) == 1) continue;
    if (t.stride(i) * elem != f.block) break;
    f.block *= t.size(i);
  }
  for (int i = 0; i < outer; ++i) {
    if (t.size(i) > 1) f.period = std::gcd(f.period, t.stride(i) * elem);
  }
  return f;
}

/// True when two elements of `t` share memory without a zero stride (as_strided or
/// unfold views): ordered by stride, each dim of size > 1 must step past all the
/// elements of the dims below it.
inline bool overlaps_itself(const TensorView& t) {
  // (|stride|, size) of the dims of size > 1: on the stack up to 16 dims (every call's
  // output is checked: no allocation on the hot path), on the heap past that.
  constexpr int kOnStack = 16;
  std::array<std::pair<int64_t, int64_t>, kOnStack> on_stack{};
  std::vector<std::pair<int64_t, int64_t>> on_heap;
  std::pair<int64_t, int64_t>* dims = on_stack.data();
  if (t.ndim() > kOnStack) {
    on_heap.resize(static_cast<size_t>(t.ndim()));
    dims = on_heap.data();
  }
  int count = 0;
  for (int i = 0; i < t.ndim(); ++i) {
    if (t.size(i) == 0) return false;
    if (t.size(i) > 1) dims[count++] = {t.stride(i) < 0 ? -t.stride(i) : t.stride(i), t.size(i)};
  }
  std::sort(dims, dims + count);
  int64_t reach = 0;  // the farthest element of the dims so far, in elements
  for (int i = 0; i < count; ++i) {
    if (dims[i].first <= reach) return true;
    reach += dims[i].first * (dims[i].second - 1);
  }
  return false;
}

inline bool same_view(const TensorView& a, const TensorView& b) {
  if (a.ndim() != b.ndim() || !same_dtype(a.dtype(), b.dtype())) return false;
  for (int i = 0; i < a.ndim(); ++i) {
    if (a.size(i) != b.size(i) || (a.size(i) > 1 && a.stride(i) != b.stride(i))) return false;
  }
  return true;
}

/// True when `a` and `b` (on one device) may share a byte.
inline bool may_overlap(const Footprint& a, const Footprint& b) {
  if (a.empty || b.empty || a.hi <= b.lo || b.hi <= a.lo) return false;
  const int64_t period = std::gcd(a.period, b.period);
  if (period == 0 || a.block > period || b.block > period) return true;
  // Both repeat with `period`; within it a holds [0, a.block), b [shift, shift + b.block).
  const int64_t diff = static_cast<int64_t>(b.base - a.base);
  const int64_t shift = ((diff % period) + period) % period;
  return !(shift >= a.block && shift + b.block <= period);
}

}  // namespace detail

/// Checks that a kernel may write `out` (named `arg`) while reading `inputs`:
/// no zero stride in a dim of size > 1, no two elements in one place, and no memory
/// shared with an input except
/// an identical view of one marked Aliasing::kSameView. Raises ValueError naming
/// both arguments.
inline void verify_output(const TensorView& out, const char* arg,
                          std::initializer_list<OutputInput> inputs,
                          source_location loc = source_location::current()) {
  for (int i = 0; i < out.ndim(); ++i) {
    if (out.size(i) > 1 && out.stride(i) == 0) {
      detail::throw_error(
          "ValueError",
          detail::concat("argument '", arg, "': has stride 0 in dim ", i, " (strides ",
                         dims_str(out.strides()),
                         "), an expanded view whose elements are "
                         "shared; write into a tensor with its own memory (torch.empty_like, "
                         ".contiguous()) instead"),
          loc);
    }
  }
  if (detail::overlaps_itself(out)) {
    detail::throw_error(
        "ValueError",
        detail::concat("argument '", arg, "': its elements share memory (strides ",
                       dims_str(out.strides()), " for shape ", dims_str(out.shape()),
                       "), so threads would write one element twice; write into a tensor "
                       "with its own memory (torch.empty_like, .contiguous()) instead"),
        loc);
  }
  const detail::Footprint written = detail::footprint(out);
  for (const OutputInput& input : inputs) {
    const DLDevice a = out.device(), b = input.tensor.device();
    if (a.device_type != b.device_type || a.device_id != b.device_id) continue;
    const detail::Footprint read = detail::footprint(input.tensor);
    if (!detail::may_overlap(written, read)) continue;
    const bool same = written.base == read.base && detail::same_view(out, input.tensor);
    if (same && input.aliasing == Aliasing::kSameView) continue;
    detail::throw_error(
        "ValueError",
        same ? detail::concat("argument '", arg, "': is the same memory as argument '", input.arg,
                              "', and this kernel cannot work in place; pass a "
                              "separate output tensor")
             : detail::concat("argument '", arg, "': overlaps argument '", input.arg,
                              "' in memory without being the same view of it, so the kernel "
                              "would read values it already overwrote; pass a separate "
                              "output tensor",
                              input.aliasing == Aliasing::kSameView
                                  ? detail::concat(" (or '", input.arg, "' itself)")
                                  : std::string()),
        loc);
  }
}

/// The tensor's data pointer as T*, honouring DLPack's byte_offset.
template <typename T>
inline T* data_ptr(const TensorView& tensor) {
  return reinterpret_cast<T*>(static_cast<char*>(tensor.data_ptr()) + tensor.byte_offset());
}

}  // namespace mllm_kernel
