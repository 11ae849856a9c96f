// Declarative tensor checks. A kernel states what each argument must look like:
//
//   SymbolicSize num_tokens{"num_tokens"}, hidden{"hidden"};
//   SymbolicDevice device;
//   TensorMatcher({num_tokens, hidden}).dtype<fp16_t, bf16_t>().device(kDLCUDA, device)
//       .last_dim_contiguous().verify(input, "input");
//   TensorMatcher({hidden}).dtype(input.dtype()).device(kDLCUDA, device).verify(weight, "weight");
//
// A symbolic size (or device) is bound by the first tensor that uses it and must
// match in every later one. A failed check raises, in Python, TypeError (dtype)
// or ValueError (anything else) naming the argument, what was expected, what came,
// and the file:line of the verify() call.
#pragma once

#include <tvm/ffi/container/tensor.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "mllm_kernel/utils.hpp"

namespace mllm_kernel {

using ::tvm::ffi::TensorView;

/// "[2, 3, 4]": a shape or stride list for error messages.
inline std::string dims_str(::tvm::ffi::ShapeView dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
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
  /// The dtype must equal `dtype` (for example another argument's).
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
    if (check_strides_) check_dims(tensor.strides(), strides_, "stride", tensor, arg, loc);
    if (contiguous_ && !tensor.IsContiguous()) {
      fail("ValueError", arg, loc, "expected a contiguous tensor but got shape ",
           dims_str(tensor.shape()), " with strides ", dims_str(tensor.strides()));
    }
    if (last_dim_contiguous_ && tensor.ndim() > 0 && tensor.size(-1) > 1 &&
        tensor.stride(-1) != 1) {
      fail("ValueError", arg, loc, "expected stride 1 in the last dim but got strides ",
           dims_str(tensor.strides()));
    }
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

  std::string expected_dims_str(const DimList& dims) const {
    std::string s = "[";
    for (size_t i = 0; i < dims.size(); ++i) {
      if (i) s += ", ";
      const Dim& d = dims[i];
      if (d.symbol()) {
        s += d.symbol()->name();
        if (d.symbol()->bound()) s += "=" + std::to_string(d.symbol()->value());
      } else {
        s += d.is_any() ? "*" : std::to_string(d.literal());
      }
    }
    return s + "]";
  }

  void check_dtype(const TensorView& tensor, const char* arg, const source_location& loc) const {
    if (num_dtypes_ == 0) return;
    for (int i = 0; i < num_dtypes_; ++i) {
      if (same_dtype(dtypes_[i], tensor.dtype())) return;
    }
    std::string expected;
    for (int i = 0; i < num_dtypes_; ++i) expected += (i ? ", " : "") + dtype_name(dtypes_[i]);
    fail("TypeError", arg, loc, "expected dtype in {", expected, "} but got ",
         dtype_name(tensor.dtype()));
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
  SymbolicDevice* device_ = nullptr;
  DLDeviceType device_type_ = kDLCPU;
  bool check_shape_ = false;
  bool check_strides_ = false;
  bool contiguous_ = false;
  bool last_dim_contiguous_ = false;
};

/// The tensor's data pointer as T*, honouring DLPack's byte_offset.
template <typename T>
inline T* data_ptr(const TensorView& tensor) {
  return reinterpret_cast<T*>(static_cast<char*>(tensor.data_ptr()) + tensor.byte_offset());
}

}  // namespace mllm_kernel
