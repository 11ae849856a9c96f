// Element conversions between the storage dtypes and float that GCC/Clang can
// auto-vectorise: branch-free bit arithmetic for bf16, the compiler's _Float16
// for fp16 (one instruction with F16C / AVX512-FP16 / NEON, a libgcc call
// elsewhere). utils.hpp's to_float / from_float are exact too, but their
// branches keep loops scalar.
#pragma once

#include <bit>
#include <cstdint>

#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

inline float load_float(float x) {
  return x;
}
inline float load_float(bf16_t x) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16);
}
inline float load_float(fp16_t x) {
#ifdef __FLT16_MAX__
  return static_cast<float>(std::bit_cast<_Float16>(x.bits));
#else
  return to_float(x);
#endif
}

template <typename T>
inline T store_float(float f);
template <>
inline float store_float<float>(float f) {
  return f;
}
template <>
inline bf16_t store_float<bf16_t>(float f) {
  // Round to nearest even; a NaN stays a (quiet) NaN. Both branches are
  // computed and selected, so the loop vectorises.
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (bits >> 16) | 0x40u;
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return bf16_t{static_cast<std::uint16_t>(is_nan ? quiet_nan : rounded)};
}
template <>
inline fp16_t store_float<fp16_t>(float f) {
#ifdef __FLT16_MAX__
  return fp16_t{std::bit_cast<std::uint16_t>(static_cast<_Float16>(f))};
#else
  return from_float<fp16_t>(f);
#endif
}

}  // namespace mllm_kernel::cpu
