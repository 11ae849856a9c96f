// Integer and fp8 weights -> fp16/bf16 pairs in registers, exactly. Integers take
// the magic-number trick: OR-ing a small integer q into the low mantissa bits of a 16-bit float
// whose unit in the last place is 1 gives `magic + q`; subtracting `magic + zero`
// leaves `q - zero` without a conversion instruction. fp16 uses magic 1024 (ulp 1
// up to 2048), bf16 magic 128 (ulp 1 up to 256: enough for 4-bit values; 8-bit
// values in bf16 go through fp32 with magic 2^23 instead).
//
// A 32-bit word holds four pairs. Which two values form a pair is the caller's
// layout; here a pair is (bits at 4*i, bits at 16 + 4*i) for 4-bit words (i = 0..3)
// and (byte i, byte i + 2) for 8-bit words (i = 0..1), the order in which the Marlin
// format interleaves them so that each pair lands in one register.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace mllm_kernel::cuda {

/// The packed pair type of a 16-bit float type.
template <typename T>
using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;

template <typename T>
__device__ __forceinline__ Pair<T> pair_from_bits(uint32_t bits) {
  Pair<T> pair;
  *reinterpret_cast<uint32_t*>(&pair) = bits;
  return pair;
}

template <typename T>
__device__ __forceinline__ uint32_t bits_of(Pair<T> pair) {
  return *reinterpret_cast<uint32_t*>(&pair);
}

template <typename T>
__device__ __forceinline__ Pair<T> pair_of(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    return __floats2half2_rn(lo, hi);
  } else {
    return __floats2bfloat162_rn(lo, hi);
  }
}

/// (a & mask) | bits in one instruction (ptxas emits two for the plain expression).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t mask, uint32_t bits) {
  uint32_t out;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(out) : "r"(a), "r"(mask), "r"(bits));
  return out;
}

/// Unsigned `Bits`-bit integers (4 or 8) of a packed word as `T` pairs of `q - zero`.
template <typename T, int Bits>
struct IntDequant {
  static_assert(Bits == 4 || Bits == 8, "IntDequant: 4- or 8-bit integers");
  static constexpr bool kViaFloat = Bits == 8 && !std::is_same_v<T, __half>;
  static constexpr float kMagic =
      kViaFloat ? 8388608.0f : (std::is_same_v<T, __half> ? 1024.f : 128.f);
  static constexpr uint32_t kMagicBits = std::is_same_v<T, __half> ? 0x64006400u : 0x43004300u;

  /// What pair() subtracts: `magic + zero` for both values of a pair (exact for
  /// zero in [0, 2^Bits)).
  using Offset = std::conditional_t<kViaFloat, float, Pair<T>>;

  __device__ __forceinline__ static Offset offset(float zero) {
    if constexpr (kViaFloat) {
      return kMagic + zero;
    } else {
      return pair_of<T>(kMagic + zero, kMagic + zero);
    }
  }

  /// offset(zero) for an integer zero point in [0, 2^Bits), by OR-ing it into the
  /// magic number's mantissa (exact, no conversion instructions).
  __device__ __forceinline__ static Offset int_offset(uint32_t zero) {
    if constexpr (kViaFloat) {
      return __uint_as_float(0x4b000000u | zero);
    } else {
      return pair_from_bits<T>(kMagicBits | zero | (zero << 16));
    }
  }

  /// Pair `i` of `word` as `magic + kTopStep q`, q moved into the top `Bits` bits of the
  /// mantissa (kTopStep: 64 for 4-bit and 4 for 8-bit values in fp16, 8 for 4-bit in
  /// bf16), exact. In sums of these values the magic weighs 16 steps (4-bit) or q's
  /// range (8-bit), not 1024 or 128 steps as with q in the low bits, so removing it
  /// afterwards (DeferredScales) cancels far less. Not for kViaFloat.
  static constexpr int kTopShift = (std::is_same_v<T, __half> ? 10 : 7) - Bits;
  static constexpr float kTopStep = static_cast<float>(1 << (kViaFloat ? 0 : kTopShift));
  __device__ __forceinline__ static Pair<T> top_biased_pair(uint32_t word, int i) {
    static_assert(!kViaFloat, "8-bit values in bf16 do not fit its mantissa");
    constexpr uint32_t kValueMask = ((1u << Bits) - 1) * 0x00010001u;
    const int shift = kTopShift - Bits * i;
    const uint32_t moved = shift >= 0 ? word << shift : word >> -shift;
    return pair_from_bits<T>(and_or(moved, kValueMask << kTopShift, kMagicBits));
  }

  /// Pair `i` of `word` (0..3 for 4 bits, 0..1 for 8) minus the zero passed to
  /// offset(), exact. Called with a constant `i` (an unrolled loop), the shifts and
  /// selectors fold away.
  __device__ __forceinline__ static Pair<T> pair(uint32_t word, int i, Offset offset) {
    if constexpr (Bits == 4) {
      return __hsub2(pair_from_bits<T>(and_or(word >> (4 * i), 0x000f000fu, kMagicBits)), offset);
    } else if constexpr (!kViaFloat) {
      // bytes {i, 0x64, i + 2, 0x64}: two fp16 values 1024 + q
      const uint32_t biased = __byte_perm(word, 0x64646464u, 0x4040u | i | ((i + 2) << 8));
      return __hsub2(pair_from_bits<T>(biased), offset);
    } else {
      // bytes {i, 0, 0, 0x4b}: the fp32 value 2^23 + q
      const float lo = __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7440u | i)) - offset;
      const float hi = __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7440u | (i + 2))) - offset;
      return pair_of<T>(lo, hi);
    }
  }
};

/// fp8 e4m3 (float8_e4m3fn) bytes of a packed word as `T` pairs, by moving bits: a
/// byte's sign to T's sign bit, its 4 exponent and 3 mantissa bits under the low bits of
/// T's exponent and the top of its mantissa. The result is the byte's value times
/// 2^-kExponentGap (the difference of the exponent biases: fp16 15 - 7, bf16 127 - 7),
/// exactly, subnormals included (they land on T's subnormals or, in bf16, its normals'
/// range); the scales carry 2^kExponentGap, as vLLM's Marlin expects them (its
/// fp8_fused_exponent_bias_into_scales). NaN bytes (0x7f, 0xff) come out as finite
/// values. Pairs as for 8-bit integers: (byte i, byte i + 2).
template <typename T>
struct Fp8Dequant {
  // T's mantissa bits less e4m3's 3: how far a byte's exponent and mantissa move up.
  static constexpr int kShift = std::is_same_v<T, __half> ? 7 : 4;
  static constexpr int kExponentGap = std::is_same_v<T, __half> ? 8 : 120;

  /// Pair `i` (0 or 1) of `word` as the bits of two T values (byte i low, i + 2 high).
  __host__ __device__ static constexpr uint32_t pair_bits(uint32_t word, int i) {
    // Bytes i and i + 2 at bits 8..15 and 24..31, where each half's sign bit is theirs.
    const uint32_t high = i == 0 ? word << 8 : word;
    return (high & 0x80008000u) | ((high & 0x7f007f00u) >> (8 - kShift));
  }

  __device__ __forceinline__ static Pair<T> pair(uint32_t word, int i) {
    return pair_from_bits<T>(pair_bits(word, i));
  }
};

}  // namespace mllm_kernel::cuda
