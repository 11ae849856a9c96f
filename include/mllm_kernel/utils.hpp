// Shared host-side helpers for every kernel, CPU or CUDA: error raising with the
// caller's source location, dtype aliases and traits, small integer helpers.
#pragma once

#include <tvm/ffi/error.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "mllm_kernel/source_location.hpp"

#if defined(__CUDACC__) || defined(__HIPCC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

// ---------------------------------------------------------------------------
// dtype aliases. make_cpp_args() spells torch dtypes with these names, so they
// live in the global namespace next to int8_t and friends. In device code the
// 16-bit floats are CUDA's own types; in host-only C++ they are 16-bit storage
// types with float conversion (see to_float / from_float below).
// ---------------------------------------------------------------------------
using fp32_t = float;
using fp64_t = double;
using bool_t = bool;
#if defined(__CUDACC__) || defined(__HIPCC__)
using fp16_t = __half;
using bf16_t = __nv_bfloat16;
using fp8_e4m3_t = __nv_fp8_e4m3;
using fp8_e5m2_t = __nv_fp8_e5m2;
#else
struct fp16_t {
  std::uint16_t bits;
};
struct bf16_t {
  std::uint16_t bits;
};
struct fp8_e4m3_t {
  std::uint8_t bits;
};
struct fp8_e5m2_t {
  std::uint8_t bits;
};
#endif

namespace mllm_kernel {

// ---------------------------------------------------------------------------
// Errors. Each throw becomes the named Python exception through tvm-ffi, with
// the kernel source location appended so a user sees which check fired.
// ---------------------------------------------------------------------------
namespace detail {

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

inline std::string where(const source_location& loc) {
  return concat(" [at ", loc.file_name(), ":", loc.line(), "]");
}

[[noreturn]] inline void throw_error(const char* kind, const std::string& message,
                                     const source_location& loc) {
  // The location is in the message; a C++ backtrace would only show this helper.
  throw ::tvm::ffi::Error(kind, message + where(loc), std::string());
}

}  // namespace detail

/// Throws `kind` (a Python exception name: "ValueError", "TypeError",
/// "RuntimeError", ...) carrying the streamed message and the caller's location.
///   Panic("rmsnorm: unsupported hidden size ", d);
template <typename... Args>
struct Panic {
  [[noreturn]] explicit Panic(Args&&... args, source_location loc = source_location::current()) {
    detail::throw_error("RuntimeError", detail::concat(std::forward<Args>(args)...), loc);
  }
};
template <typename... Args>
Panic(Args&&...) -> Panic<Args...>;

/// Raises RuntimeError with the streamed message when `condition` is false.
///   RuntimeCheck(n % 2 == 0, "silu_and_mul: last dim must be even, got ", n);
template <typename... Args>
struct RuntimeCheck {
  explicit RuntimeCheck(bool condition, Args&&... args,
                        source_location loc = source_location::current()) {
    if (!condition) {
      detail::throw_error("RuntimeError", detail::concat(std::forward<Args>(args)...), loc);
    }
  }
};
template <typename... Args>
RuntimeCheck(bool, Args&&...) -> RuntimeCheck<Args...>;

/// Like RuntimeCheck but raises ValueError: for a bad argument value.
template <typename... Args>
struct ValueCheck {
  explicit ValueCheck(bool condition, Args&&... args,
                      source_location loc = source_location::current()) {
    if (!condition) {
      detail::throw_error("ValueError", detail::concat(std::forward<Args>(args)...), loc);
    }
  }
};
template <typename... Args>
ValueCheck(bool, Args&&...) -> ValueCheck<Args...>;

// ---------------------------------------------------------------------------
// Integer helpers.
// ---------------------------------------------------------------------------
template <typename T>
constexpr T div_ceil(T a, T b) {
  return (a + b - 1) / b;
}

template <typename T>
constexpr T round_up(T a, T b) {
  return div_ceil(a, b) * b;
}

// ---------------------------------------------------------------------------
// dtype traits: the DLPack code of each alias, and readable names for errors.
// ---------------------------------------------------------------------------
template <typename T>
struct dtype_trait;

#define MLLM_KERNEL_DTYPE_TRAIT(TYPE, CODE, BITS, NAME)                     \
  template <>                                                               \
  struct dtype_trait<TYPE> {                                                \
    static constexpr DLDataType value{static_cast<uint8_t>(CODE), BITS, 1}; \
    static constexpr const char* name = NAME;                               \
  };
MLLM_KERNEL_DTYPE_TRAIT(fp32_t, kDLFloat, 32, "float32")
MLLM_KERNEL_DTYPE_TRAIT(fp64_t, kDLFloat, 64, "float64")
MLLM_KERNEL_DTYPE_TRAIT(fp16_t, kDLFloat, 16, "float16")
MLLM_KERNEL_DTYPE_TRAIT(bf16_t, kDLBfloat, 16, "bfloat16")
MLLM_KERNEL_DTYPE_TRAIT(fp8_e4m3_t, kDLFloat8_e4m3fn, 8, "float8_e4m3fn")
MLLM_KERNEL_DTYPE_TRAIT(fp8_e5m2_t, kDLFloat8_e5m2, 8, "float8_e5m2")
MLLM_KERNEL_DTYPE_TRAIT(bool_t, kDLBool, 8, "bool")
MLLM_KERNEL_DTYPE_TRAIT(int8_t, kDLInt, 8, "int8")
MLLM_KERNEL_DTYPE_TRAIT(int16_t, kDLInt, 16, "int16")
MLLM_KERNEL_DTYPE_TRAIT(int32_t, kDLInt, 32, "int32")
MLLM_KERNEL_DTYPE_TRAIT(int64_t, kDLInt, 64, "int64")
MLLM_KERNEL_DTYPE_TRAIT(uint8_t, kDLUInt, 8, "uint8")
MLLM_KERNEL_DTYPE_TRAIT(uint16_t, kDLUInt, 16, "uint16")
MLLM_KERNEL_DTYPE_TRAIT(uint32_t, kDLUInt, 32, "uint32")
MLLM_KERNEL_DTYPE_TRAIT(uint64_t, kDLUInt, 64, "uint64")
#undef MLLM_KERNEL_DTYPE_TRAIT

inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

template <typename T>
inline bool is_dtype(DLDataType dtype) {
  return same_dtype(dtype, dtype_trait<T>::value);
}

inline std::string dtype_name(DLDataType dtype) {
  const char* base = "unknown";
  switch (dtype.code) {
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLComplex: base = "complex"; break;
    case kDLBool: return "bool";
    case kDLFloat8_e4m3fn: return "float8_e4m3fn";
    case kDLFloat8_e5m2: return "float8_e5m2";
    default: break;
  }
  std::string name = detail::concat(base, static_cast<int>(dtype.bits));
  if (dtype.lanes != 1) name += detail::concat("x", static_cast<int>(dtype.lanes));
  return name;
}

/// Calls `fn(std::type_identity<T>{})` for the T in Ts whose dtype is `dtype`;
/// raises TypeError naming `arg` when none is (the matchers normally caught it).
///
///   dispatch_dtype<fp32_t, fp16_t, bf16_t>(x.dtype(), "x", [&](auto tag) {
///     using T = typename decltype(tag)::type;
///     ...
///   });
template <typename... Ts, typename Fn>
void dispatch_dtype(DLDataType dtype, const char* arg, Fn&& fn,
                    source_location loc = source_location::current()) {
  const bool found = ((is_dtype<Ts>(dtype) ? (fn(std::type_identity<Ts>{}), true) : false) || ...);
  if (!found) {
    std::string expected;
    ((expected += (expected.empty() ? "" : ", ") + std::string(dtype_trait<Ts>::name)), ...);
    detail::throw_error("TypeError",
                        detail::concat("argument '", arg, "': expected dtype in {", expected,
                                       "} but got ", dtype_name(dtype)),
                        loc);
  }
}

inline std::string device_name(DLDevice device) {
  switch (device.device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return detail::concat("cuda:", device.device_id);
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
    default:
      return detail::concat("device_type=", static_cast<int>(device.device_type), ":",
                            device.device_id);
  }
}

// ---------------------------------------------------------------------------
// Host conversion for the 16-bit float storage types (host-only code; device
// code uses CUDA's intrinsics on __half / __nv_bfloat16 instead). Exact, and
// branch-free so that loops over them auto-vectorise: bit arithmetic for bf16,
// the compiler's _Float16 for fp16 where it has one (one instruction with
// F16C / AVX512-FP16 / NEON), else an exact software conversion.
// ---------------------------------------------------------------------------
#if !defined(__CUDACC__) && !defined(__HIPCC__)
namespace detail {
inline float bits_to_float(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
  const float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24
  return sign ? -magnitude : magnitude;
}

inline std::uint16_t float_to_fp16_bits(float f) {
  // Round to nearest even, overflow to inf, subnormals, NaN stays NaN.
  const std::uint32_t bits = float_to_bits(f);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520
  if (abs < 0x38800000u) {  // below the smallest normal half: scale onto the 2^-24 grid
    const float scaled = bits_to_float(abs) * 16777216.0f;
    return static_cast<std::uint16_t>(sign |
                                      static_cast<std::uint32_t>(__builtin_nearbyintf(scaled)));
  }
  const std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}
}  // namespace detail

inline float to_float(float x) {
  return x;
}
inline float to_float(bf16_t x) {
  return detail::bits_to_float(static_cast<std::uint32_t>(x.bits) << 16);
}
inline float to_float(fp16_t x) {
#ifdef __FLT16_MAX__
  _Float16 h;
  std::memcpy(&h, &x.bits, sizeof(h));
  return static_cast<float>(h);
#else
  return detail::fp16_bits_to_float(x.bits);
#endif
}

template <typename T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) {
  return f;
}
template <>
inline bf16_t from_float<bf16_t>(float f) {
  // Round to nearest even; a NaN stays a (quiet) NaN. Both results are computed
  // and one selected, so loops vectorise.
  const std::uint32_t bits = detail::float_to_bits(f);
  const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (bits >> 16) | 0x40u;
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return bf16_t{static_cast<std::uint16_t>(is_nan ? quiet_nan : rounded)};
}
template <>
inline fp16_t from_float<fp16_t>(float f) {
#ifdef __FLT16_MAX__
  const auto h = static_cast<_Float16>(f);
  std::uint16_t bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return fp16_t{bits};
#else
  return fp16_t{detail::float_to_fp16_bits(f)};
#endif
}
#endif

}  // namespace mllm_kernel
