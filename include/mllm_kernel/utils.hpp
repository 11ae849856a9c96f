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
// code uses CUDA's intrinsics on __half / __nv_bfloat16 instead). Exact, round
// to nearest even, and written as integer/float arithmetic and selects only, so
// that loops over them auto-vectorise on any target (AVX2, AVX-512, NEON). Not
// _Float16: GCC converts it one element at a time (a scalar vcvtph2ps /
// vcvtsh2ss) and then leaves the whole loop around it scalar.
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

// condition ? a : b, through bit masks. A ?: (or std::min / std::max, which
// pick a reference) can reach the vectoriser as a branch: GCC moves float
// arithmetic that only one side uses into it, or selects between addresses.
// Where vectors have no masked operations (NEON) it cannot make that loop
// branch-free again, as float operations and loads may trap, and the whole
// loop stays scalar.
inline std::uint32_t select_bits(bool condition, std::uint32_t a, std::uint32_t b) {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
  return (a & mask) | (b & ~mask);
}

/// The float value of IEEE half `h`; NaNs come out quiet with their payload
/// (as F16C's vcvtph2ps and torch do).
inline float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t magnitude = h & 0x7fffu;
  // Normal halves: exponent and mantissa moved into float position, with the
  // exponent rebiased by 224 = 2 * (127 - 15) so that the half's all-ones
  // exponent lands on the float's (inf, NaN); the 2^-112 scale then takes
  // back the extra 112. Exact: no rounding happens.
  const std::uint32_t normal =
      float_to_bits(bits_to_float((magnitude << 13) + (224u << 23)) * 0x1p-112f);
  // Subnormal halves are mantissa * 2^-24: as the low mantissa bits of 0.5f
  // they read 0.5 + mantissa * 2^-24, and subtracting 0.5 is exact.
  const std::uint32_t subnormal = float_to_bits(bits_to_float(magnitude | (126u << 23)) - 0.5f);
  return bits_to_float(sign | select_bits(magnitude < 0x400u, subnormal, normal));
}

/// IEEE half bits of `f`, rounded to nearest even; overflow gives inf,
/// subnormal results are exact, a NaN stays a quiet NaN keeping the top of its
/// payload (as F16C's vcvtps2ph and torch do).
inline std::uint16_t float_to_fp16_bits(float f) {
  const std::uint32_t bits = float_to_bits(f);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t abs = bits & 0x7fffffffu;
  // |f| * 4, except that |f| >= 2^16 (far past the half's range) overflows
  // to inf on the first product, which the steps below keep an inf.
  const float scaled = (bits_to_float(abs) * 0x1p112f) * 0x1p-110f;
  // Adding 2^(e + 15), e = |f|'s exponent (at least the half's smallest
  // normal, -14), makes the float addition round `scaled` to a multiple of
  // 4 * the half's ulp at e: the hardware's round to nearest even does the
  // rounding. The sum's low 5 exponent bits are then e + 14 and its mantissa
  // holds the half's 11 significant bits (implicit bit included), so their
  // sum is the half's exponent and mantissa, a carry included; subnormals
  // land on exponent bits 0 with the mantissa alone.
  const std::uint32_t exponent = abs & 0x7f800000u;
  const std::uint32_t rounding_exponent = exponent < (113u << 23) ? (113u << 23) : exponent;
  const std::uint32_t sum = float_to_bits(bits_to_float(rounding_exponent + (15u << 23)) + scaled);
  const std::uint32_t finite = ((sum >> 13) & 0x7c00u) + (sum & 0xfffu);
  const std::uint32_t nan = 0x7e00u | ((abs >> 13) & 0x3ffu);
  return static_cast<std::uint16_t>(sign | select_bits(abs > 0x7f800000u, nan, finite));
}
}  // namespace detail

inline float to_float(float x) {
  return x;
}
inline float to_float(bf16_t x) {
  return detail::bits_to_float(static_cast<std::uint32_t>(x.bits) << 16);
}
inline float to_float(fp16_t x) {
  return detail::fp16_bits_to_float(x.bits);
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
  return fp16_t{detail::float_to_fp16_bits(f)};
}
#endif

}  // namespace mllm_kernel
