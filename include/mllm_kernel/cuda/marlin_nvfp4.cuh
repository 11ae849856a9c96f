// NVFP4 weights as the Marlin kernels read them, in the format of vLLM's Marlin (and so
// sglang's and the original mllm-kernel's):
//   dequant(q) = e2m1(q) * s * g,
// q an e2m1 code packed as a 4-bit weight (gptq_marlin_repack, num_bits=4), s >= 0 the
// e4m3 scale of its 16 k rows and column, g the global scale. Neither scale comes as the
// checkpoint stores it (mllm_kernel/cuda/jit/marlin_format.py writes both):
//   - each scale is the byte "S0E5M3" of s * 2^7: bits 14..7 of that value in fp16 (5
//     exponent bits, 3 mantissa bits, no sign; exact, since every e4m3 value times 2^7
//     is a normal fp16 number), after marlin_permute_scales; each pair of group rows
//     (2r, 2r + 1) is one row of 2N bytes, 8 columns of group 2r then the same 8 of
//     group 2r + 1, and in each 4 bytes the middle two swap (nvfp4_marlin_process_scales);
//   - g comes in the activations' dtype times 2^(E2m1Dequant::kExponentGap - 7)
//     (nvfp4_marlin_process_global_scale).
// Everything here is bit moves and at most one exact multiply by a power of two.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "mllm_kernel/cuda/dequant.cuh"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace marlin {

/// e2m1 codes (sign, 2 exponent bits, 1 mantissa bit) of a packed 4-bit word as `T`
/// pairs, by moving bits: the sign to T's sign bit, exponent and mantissa under the low
/// bits of T's exponent and the top of its mantissa. The result is the code's value
/// times 2^-kExponentGap (the difference of the exponent biases: fp16 15 - 1, bf16
/// 127 - 1), exactly, the subnormal +-0.5 and both zeros included. Pairs as for 4-bit
/// integers (dequant.cuh): the nibbles at bits 4 i and 16 + 4 i.
template <typename T>
struct E2m1Dequant {
  static constexpr bool kHalf = std::is_same_v<T, __half>;
  static constexpr int kExponentGap = kHalf ? 14 : 126;
  // From a nibble's top (bit 15) down to T's: T's exponent bits less e2m1's 2.
  static constexpr int kDown = kHalf ? 3 : 6;

  /// Pair `i` (0..3) of `word` as the bits of two T values (nibble 4 i low, 16 + 4 i high).
  __host__ __device__ static constexpr uint32_t pair_bits(uint32_t word, int i) {
    // Nibbles 4 i and 16 + 4 i at bits 12..15 and 28..31, each sign on its half's.
    const uint32_t top = word << (12 - 4 * i);
    return (top & 0x80008000u) | ((top & 0x70007000u) >> kDown);
  }

  __device__ __forceinline__ static Pair<T> pair(uint32_t word, int i) {
    return pair_from_bits<T>(pair_bits(word, i));
  }
};

/// The group scales' S0E5M3 bytes as `T` values s * 2^kExponent, exactly, for every
/// non-negative e4m3 scale (zero and subnormals included). fp16 takes a byte's bits as
/// its exponent and mantissa (s * 2^7). bf16 takes them under its exponent's low 5 bits
/// (s * 2^7 * 2^-112, a normal bf16 value or zero), then times 2^127: s * 2^22, so that
/// the product with an e2m1 weight (times 2^-126) is a normal bf16 value, v * s * 2^-104,
/// for every scale; the epilogue's global factor takes the 2^-15 that is left.
template <typename T>
struct Nvfp4Scales {
  static constexpr bool kHalf = std::is_same_v<T, __half>;
  static constexpr int kExponent = kHalf ? 7 : 22;
  // From a byte's top (bit 15) down to bit 14 (fp16's exponent top) or bit 11 (bf16's
  // fifth exponent bit).
  static constexpr int kDown = kHalf ? 1 : 4;

  /// Bytes i and i + 2 (i = 0, 1) of `word` as the bits of two T values (byte i low),
  /// before bf16's multiply (pair() does it).
  __host__ __device__ static constexpr uint32_t pair_bits(uint32_t word, int i) {
    const uint32_t high = i == 0 ? word << 8 : word;  // bytes i, i + 2 at bits 8..15, 24..31
    return (high & 0xff00ff00u) >> kDown;
  }

  __device__ __forceinline__ static Pair<T> pair(uint32_t word, int i) {
    const Pair<T> bits = pair_from_bits<T>(pair_bits(word, i));
    if constexpr (kHalf) {
      return bits;
    } else {
      return __hmul2(bits, pair_from_bits<T>(0x7f007f00u));  // 2^127 each, exact
    }
  }

  /// A lane's 8 scales (columns 8 j .. 8 j + 7 of a row of permuted scales) from their 8
  /// bytes, stored s0 s2 s1 s3 s4 s6 s5 s7 so that each word's bytes (i, i + 2) are a pair.
  __device__ __forceinline__ static Vec<T, 8> eight(uint2 bytes) {
    Vec<T, 8> scales;
    Pair<T>* pairs = reinterpret_cast<Pair<T>*>(scales.data);
    pairs[0] = pair(bytes.x, 0);
    pairs[1] = pair(bytes.x, 1);
    pairs[2] = pair(bytes.y, 0);
    pairs[3] = pair(bytes.y, 1);
    return scales;
  }

  /// What the sums of (weight times scale) products are multiplied by at the end: the
  /// global scale as stored, g * 2^(kExponentGap - 7), times 2^(7 - kExponent).
  __device__ __forceinline__ static float global_factor(const void* global_scale) {
    return static_cast<float>(*static_cast<const T*>(global_scale)) * (kHalf ? 1.f : 1.f / 32768.f);
  }
};

/// Byte offset of the 8 scale bytes of group `group` and permuted columns column0 ..
/// column0 + 7 (column0 a multiple of 8) in the NVFP4 scales of `n` columns.
__host__ __device__ constexpr int64_t nvfp4_scale_offset(int64_t group, int64_t column0,
                                                         int64_t n) {
  return (group / 2) * 2 * n + 2 * column0 + 8 * (group % 2);
}

}  // namespace marlin
}  // namespace mllm_kernel::cuda
