// Rows of the storage dtypes read and written as float32 in kernels' compute
// loops. bf16, and fp16 on most targets, convert element by element inside the
// loops (to_float / from_float: integer and float arithmetic that vectorises).
// Where the hardware converts fp16 vectors (x86's F16C, 16 values per
// instruction with AVX-512; every AArch64 CPU's NEON FCVTL / FCVTN, 4 a
// instruction) that arithmetic is several times slower, so there a row goes by
// blocks: each widened into a float buffer, computed on, and the results
// narrowed back.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#define MLLM_KERNEL_FP16_VECTOR_CONVERSION 1
#elif defined(__aarch64__)
#include <arm_neon.h>
#define MLLM_KERNEL_FP16_VECTOR_CONVERSION 1
#endif

#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

/// Whether rows of T go by widened blocks (see above) rather than converting
/// element by element in the compute loops.
template <typename T>
inline constexpr bool kConvertsInBlocks = false;
#if defined(MLLM_KERNEL_FP16_VECTOR_CONVERSION)
template <>
inline constexpr bool kConvertsInBlocks<fp16_t> = true;
#endif

/// Elements per block: a kernel's few float buffers of this size stay in L1 next
/// to the rows streaming through. Full blocks have it as a compile-time length,
/// so their loops vectorise without remainder code; 128 measured best of 128, 256
/// and 512 (benchmarks/RESULTS.md, issue 30).
inline constexpr int64_t kFloatBlock = 128;

#if defined(MLLM_KERNEL_FP16_VECTOR_CONVERSION)
namespace float_blocks_detail {

#if defined(__F16C__)
// The hardware conversions, kLanes values at a time, rounding fixed to nearest
// even (not read from MXCSR): bit for bit what to_float / from_float compute.
#if defined(__AVX512F__)
inline constexpr int64_t kLanes = 16;

inline void widen_lanes(const fp16_t* src, float* dst) {
  _mm512_storeu_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
}
inline void narrow_lanes(const float* src, fp16_t* dst) {
  const __m256i half =
      _mm512_cvtps_ph(_mm512_loadu_ps(src), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), half);
}
#else
inline constexpr int64_t kLanes = 8;

inline void widen_lanes(const fp16_t* src, float* dst) {
  _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
}
inline void narrow_lanes(const float* src, fp16_t* dst) {
  const __m128i half =
      _mm256_cvtps_ph(_mm256_loadu_ps(src), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), half);
}
#endif
#else
// AArch64: NEON's conversions are in the base ISA (no -march extension needed).
// They round by FPCR, nearest even unless a program changed it, and keep NaN
// payloads (quieted) as long as FPCR's default-NaN bit is off, as Linux leaves
// it: then bit for bit what to_float / from_float compute.
inline constexpr int64_t kLanes = 8;

inline void widen_lanes(const fp16_t* src, float* dst) {
  const float16x8_t half = vreinterpretq_f16_u16(vld1q_u16(reinterpret_cast<const uint16_t*>(src)));
  vst1q_f32(dst, vcvt_f32_f16(vget_low_f16(half)));
  vst1q_f32(dst + 4, vcvt_high_f32_f16(half));
}
inline void narrow_lanes(const float* src, fp16_t* dst) {
  const float16x8_t half = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(src)), vld1q_f32(src + 4));
  vst1q_u16(reinterpret_cast<uint16_t*>(dst), vreinterpretq_u16_f16(half));
}
#endif

}  // namespace float_blocks_detail
#endif

/// dst[i] = to_float(src[i]) for i < n.
template <typename T>
[[gnu::always_inline]] inline void widen(const T* src, float* dst, int64_t n) {
  int64_t head = 0;
#if defined(MLLM_KERNEL_FP16_VECTOR_CONVERSION)
  if constexpr (std::is_same_v<T, fp16_t>) {
    constexpr int64_t lanes = float_blocks_detail::kLanes;
    head = n - n % lanes;
    for (int64_t i = 0; i < head; i += lanes) float_blocks_detail::widen_lanes(src + i, dst + i);
  }
#endif
#pragma omp simd
  for (int64_t i = head; i < n; ++i) dst[i] = to_float(src[i]);
}

/// dst[i] = from_float<T>(src[i]) for i < n.
template <typename T>
[[gnu::always_inline]] inline void narrow(const float* src, T* dst, int64_t n) {
  int64_t head = 0;
#if defined(MLLM_KERNEL_FP16_VECTOR_CONVERSION)
  if constexpr (std::is_same_v<T, fp16_t>) {
    constexpr int64_t lanes = float_blocks_detail::kLanes;
    head = n - n % lanes;
    for (int64_t i = 0; i < head; i += lanes) float_blocks_detail::narrow_lanes(src + i, dst + i);
  }
#endif
#pragma omp simd
  for (int64_t i = head; i < n; ++i) dst[i] = from_float<T>(src[i]);
}

/// Calls body(begin, len) on consecutive blocks covering [0, n): for dtypes
/// that convert in blocks, `len` is std::integral_constant<int64_t,
/// kFloatBlock> for the full blocks and an int64_t for the last one; for the
/// others one call covers the whole range. Always inlined, as are widen and
/// narrow: inside a for_each_block left out of line, a body reads the scalars it
/// captures by reference from memory in every iteration (its float stores might
/// alias them), and GCC vectorises those reads as gathers.
template <typename T, typename Body>
[[gnu::always_inline]] inline void for_each_block(int64_t n, const Body& body) {
  if constexpr (kConvertsInBlocks<T>) {
    int64_t begin = 0;
    for (; begin + kFloatBlock <= n; begin += kFloatBlock) {
      body(begin, std::integral_constant<int64_t, kFloatBlock>{});
    }
    if (begin < n) body(begin, n - begin);
  } else {
    body(int64_t{0}, n);
  }
}

/// `len` values of T at `src` read as floats: x[i]. Where T converts in blocks
/// they are widened into `buf` (kFloatBlock floats) on construction.
template <typename T>
class FloatIn {
 public:
  FloatIn(const T* src, int64_t len, float* buf) : src_(src), buf_(buf) {
    if constexpr (kConvertsInBlocks<T>) widen(src, buf, len);
  }
  float operator[](int64_t i) const {
    if constexpr (kConvertsInBlocks<T>) {
      return buf_[i];
    } else {
      return to_float(src_[i]);
    }
  }

 private:
  const T* src_;
  const float* buf_;
};

/// Floats written as values of T at `dst`: set(i, v), then store(len). Where T
/// converts in blocks they gather in `buf` (kFloatBlock floats) and store()
/// narrows them into `dst`; otherwise each set() converts and writes.
template <typename T>
class FloatOut {
 public:
  FloatOut(T* dst, float* buf) : dst_(dst), buf_(buf) {}
  void set(int64_t i, float v) const {
    if constexpr (kConvertsInBlocks<T>) {
      buf_[i] = v;
    } else {
      dst_[i] = from_float<T>(v);
    }
  }
  void store(int64_t len) const {
    if constexpr (kConvertsInBlocks<T>) narrow(buf_, dst_, len);
  }

 private:
  T* dst_;
  float* buf_;
};

}  // namespace mllm_kernel::cpu
