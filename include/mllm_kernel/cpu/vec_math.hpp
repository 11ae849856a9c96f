// Math functions written so that loops calling them auto-vectorise: no libm
// calls, no branches, only arithmetic, bit casts and selects.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

/// condition ? a : b without a branch (see detail::select_bits: with ?:, or
/// std::min / std::max, loops calling these functions stay scalar on NEON).
inline float select(bool condition, float a, float b) {
  return std::bit_cast<float>(mllm_kernel::detail::select_bits(
      condition, std::bit_cast<std::uint32_t>(a), std::bit_cast<std::uint32_t>(b)));
}

/// e^x within 2 ulp for x in [-87.3, 88.3]; 0 below (where e^x is subnormal),
/// saturating at e^88.37 up to 88.72 and inf above; NaN stays NaN.
inline float vec_exp(float x) {
  // e^x = 2^n * e^r with n = round(x / ln 2) and |r| <= ln(2) / 2 (Cody-Waite
  // reduction, then the Cephes expf polynomial for e^r).
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  // Adding 1.5 * 2^23 rounds to an integer kept in the low mantissa bits:
  // round-to-nearest and the float -> int conversion without a cvt (NaN-safe).
  constexpr float kRoundMagic = 12582912.0f;
  constexpr std::uint32_t kMagicBits = 0x4b400000u;

  const float xc = select(x < -87.33654f, -87.33654f, select(x > 88.37f, 88.37f, x));
  const float shifted = xc * kLog2e + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * (r * r) + r + 1.0f;
  const std::uint32_t exponent = std::bit_cast<std::uint32_t>(shifted) - kMagicBits + 127u;
  const float result = er * std::bit_cast<float>(exponent << 23);
  const float inf = std::numeric_limits<float>::infinity();
  return select(x < -87.33654f, 0.0f, select(x > 88.72283f, inf, result));
}

/// x * sigmoid(x).
inline float vec_silu(float x) {
  return x / (1.0f + vec_exp(-x));
}

}  // namespace mllm_kernel::cpu
