// The gated delta net (GDN) of Qwen3-Next / Qwen3.5 linear attention: the pieces its
// kernels share (the decode step; the chunked extend reuses the gates, the L2 norm, the
// state pool's slot rules and the state I/O).
//
// Per sequence, value head and token, on a V x K state S, in fp32:
//   g  = -exp(A_log) * softplus(a + dt_bias)     beta = sigmoid(b)            (the gates)
//   q^ = q / sqrt(|q|^2 + 1e-6) * scale           k^ = k / sqrt(|k|^2 + 1e-6)  (the L2 norm)
//   S  = exp(g) S;   u = beta (v - S k^);   S += u k^T;   o = S q^
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/optional.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda::gdn {

// ---------------------------------------------------------------------------
// Gates and the L2 norm: the original mllm-kernel's and fla's constants.
// ---------------------------------------------------------------------------

/// The eps of the L2 norm: x / sqrt(sum(x^2) + eps).
inline constexpr float kL2NormEps = 1e-6f;
/// softplus(x) = x above this (torch's threshold), log(1 + e^x) below.
inline constexpr float kSoftplusThreshold = 20.0f;

__device__ __forceinline__ float softplus(float x) {
  return x > kSoftplusThreshold ? x : log1pf(expf(x));
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

/// The log-space decay g = -exp(A_log) * softplus(a + dt_bias); the state decays by e^g.
__device__ __forceinline__ float log_decay(float a, float A_log, float dt_bias) {
  return -expf(A_log) * softplus(a + dt_bias);
}

/// 1 / |x| of a vector whose squares sum to `sum_sq`, with the norm's eps.
__device__ __forceinline__ float l2_inv_norm(float sum_sq) {
  return rsqrtf(sum_sq + kL2NormEps);
}

// ---------------------------------------------------------------------------
// Gate tensors: one scalar per (sequence, token, head), in whichever float dtype the
// model produced them; read once per token, so the dtype is a run-time switch.
// ---------------------------------------------------------------------------

enum class FloatType : int32_t { kF32, kF16, kBF16 };

/// The FloatType of a float32 / float16 / bfloat16 tensor (the matchers checked it).
inline FloatType float_type(DLDataType dtype) {
  if (is_dtype<fp16_t>(dtype)) return FloatType::kF16;
  if (is_dtype<bf16_t>(dtype)) return FloatType::kBF16;
  return FloatType::kF32;
}

/// Scalars at data + n * stride_n + t * stride_t + h * stride_h (in elements). A kernel
/// that must not wait for them before its next loads takes them in two steps: raw()
/// issues the load, value() converts what it gave (the first use, which waits).
struct FloatTensor {
  const void* data = nullptr;
  FloatType type = FloatType::kF32;
  int64_t stride_n = 0, stride_t = 0, stride_h = 0;

  /// The element's bits (a 16-bit type in the low half), unconverted.
  __device__ __forceinline__ uint32_t raw(int64_t n, int64_t t, int64_t h) const {
    const int64_t i = n * stride_n + t * stride_t + h * stride_h;
    if (type == FloatType::kF32) return static_cast<const uint32_t*>(data)[i];
    return static_cast<const uint16_t*>(data)[i];
  }

  /// The float of bits that raw() gave.
  __device__ __forceinline__ float value(uint32_t bits) const {
    switch (type) {
      case FloatType::kF16: return __half2float(__ushort_as_half(static_cast<uint16_t>(bits)));
      case FloatType::kBF16: return __uint_as_float(bits << 16);
      default: return __uint_as_float(bits);
    }
  }
};

/// The two gates of a token: each from the model's raw projection (`decay` holds a,
/// `update` holds b) or precomputed (`decay` holds g, `update` holds beta).
struct Gates {
  FloatTensor decay, update;
  FloatTensor A_log, dt_bias;  // [heads]; read when raw_decay
  bool raw_decay = true, raw_update = true;
};

struct GateValues {
  float log_decay;  // g: the state decays by e^g
  float beta;
};

/// A token's gate inputs as loaded (FloatTensor::raw bits), for gate_values().
struct RawGates {
  uint32_t decay, update, A_log, dt_bias;
};

/// Issues the loads of a token's gate inputs without waiting for them.
__device__ __forceinline__ RawGates load_raw_gates(const Gates& gates, int64_t n, int64_t t,
                                                   int64_t h) {
  RawGates raw;
  raw.decay = gates.decay.raw(n, t, h);
  raw.update = gates.update.raw(n, t, h);
  raw.A_log = gates.raw_decay ? gates.A_log.raw(0, 0, h) : 0u;
  raw.dt_bias = gates.raw_decay ? gates.dt_bias.raw(0, 0, h) : 0u;
  return raw;
}

/// The lowest log decay a token takes: a decay of e^-100 leaves nothing of an fp32
/// state, and the chunked extend subtracts running sums of log decays, where a decay of
/// 0 (-inf) would give -inf - -inf = NaN.
inline constexpr float kMinLogDecay = -100.0f;

/// The gates of loaded inputs.
__device__ __forceinline__ GateValues gate_values(const Gates& gates, const RawGates& raw) {
  GateValues out;
  const float d = gates.decay.value(raw.decay);
  const float g = gates.raw_decay
                      ? log_decay(d, gates.A_log.value(raw.A_log), gates.dt_bias.value(raw.dt_bias))
                      : d;
  out.log_decay = g < kMinLogDecay ? kMinLogDecay : g;  // NaN stays NaN
  const float u = gates.update.value(raw.update);
  out.beta = gates.raw_update ? sigmoid(u) : u;
  return out;
}

// ---------------------------------------------------------------------------
// The state pool: sequence n's state is pool[index[n]].
// ---------------------------------------------------------------------------

enum class Slot {
  kPadding,     ///< a negative index (-1): start from zeros, write nothing
  kState,       ///< a state of the pool: read, update, write back
  kOutOfRange,  ///< >= the pool's size (a caller's bug): touch nothing, output NaN
};

__device__ __forceinline__ Slot classify_slot(int64_t index, int64_t pool_size) {
  return index < 0 ? Slot::kPadding : index < pool_size ? Slot::kState : Slot::kOutOfRange;
}

/// The initial value of a state element of a sequence without a state in the pool.
__device__ __forceinline__ float missing_state(Slot slot) {
  return slot == Slot::kPadding ? 0.0f : __int_as_float(0x7fc00000);  // quiet NaN
}

/// index[n] of an int32 or int64 index tensor with element stride `stride`.
__device__ __forceinline__ int64_t load_index(const void* indices, bool is_int64, int64_t stride,
                                              int64_t n) {
  return is_int64 ? static_cast<const int64_t*>(indices)[n * stride]
                  : static_cast<const int32_t*>(indices)[n * stride];
}

// ---------------------------------------------------------------------------
// State I/O: 16-byte vectors of fp32 or bf16 state as fp32. A state is read once and
// written once per call, so both go with evict-first hints (ld/st .cs), leaving L2 to
// what is reused (q, k, the gates, the indices).
// ---------------------------------------------------------------------------

/// Elements of S per 16-byte vector.
template <typename S>
inline constexpr int kStateVec = 16 / static_cast<int>(sizeof(S));

/// A 16-byte vector of state, as loaded, as fp32.
template <typename S>
__device__ __forceinline__ void state_to_float(const uint4& bits, float* out) {
  Vec<S, kStateVec<S>> v;
  memcpy(&v, &bits, sizeof(bits));
#pragma unroll
  for (int i = 0; i < kStateVec<S>; ++i) out[i] = to_float(v[i]);
}

/// The 16-byte vector at `ptr` as fp32 where `valid`, else every element `fill`; `ptr`
/// is not read when not `valid`. A predicated load, not a branch, so that the loads
/// after it issue without waiting for the slot's test.
template <typename S>
__device__ __forceinline__ void load_state_or(const S* ptr, bool valid, float fill, float* out) {
  uint4 bits = make_uint4(0, 0, 0, 0);
  asm("{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %4, 0;\n"
      "  @p ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%5];\n"
      "}\n"
      : "+r"(bits.x), "+r"(bits.y), "+r"(bits.z), "+r"(bits.w)
      : "r"(static_cast<int>(valid)), "l"(ptr));
  state_to_float<S>(bits, out);
#pragma unroll
  for (int i = 0; i < kStateVec<S>; ++i) out[i] = valid ? out[i] : fill;
}

template <typename S>
__device__ __forceinline__ void store_state(S* ptr, const float* in) {
  Vec<S, kStateVec<S>> v;
#pragma unroll
  for (int i = 0; i < kStateVec<S>; ++i) v[i] = from_float<S>(in[i]);
  uint4 bits;
  memcpy(&bits, &v, sizeof(bits));
  __stcs(reinterpret_cast<uint4*>(ptr), bits);
}

/// N consecutive elements of T, unconverted (a first use waits for them): one vector
/// load when `vector` (the address is aligned to N elements), else N scalar loads.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_elements(const T* ptr, bool vector) {
  Vec<T, N> v;
  if (vector) {
    v.load(ptr);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = ptr[i];
  }
  return v;
}

// ---------------------------------------------------------------------------
// Rows of the state: a row (one value index, K elements) is split over a group of
// lanes, so its dot products end in a reduction over the group.
// ---------------------------------------------------------------------------

/// Sums each of `values` over aligned groups of kGroup lanes (a power of two <= 32) of
/// a full warp. A xor butterfly: both partners add the same two numbers at each step,
/// so every lane of a group ends with bit-identical sums.
template <int kGroup, int N>
__device__ __forceinline__ void group_reduce_sum(float (&values)[N]) {
  static_assert(kGroup >= 1 && kGroup <= kWarpSize && (kGroup & (kGroup - 1)) == 0);
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int i = 0; i < N; ++i) values[i] += __shfl_xor_sync(0xffffffffu, values[i], offset);
  }
}

/// Two partial sums (even and odd elements): half the dependent chain of one, which is
/// what a lane waits for between its state's arrival and its first shuffle.
template <int N>
__device__ __forceinline__ float dot(const float (&x)[N], const float (&y)[N]) {
  static_assert(N % 2 == 0);
  float even = 0.0f, odd = 0.0f;
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    even = fmaf(x[i], y[i], even);
    odd = fmaf(x[i + 1], y[i + 1], odd);
  }
  return even + odd;
}

/// One token's update of a row's elements: s = decay * s + u_k * k, where u_k is the
/// row's u = beta (v - S k^) times the 1 / |k| that turns k into k^.
template <int N>
__device__ __forceinline__ void update_row(float (&s)[N], const float (&k)[N], float decay,
                                           float u_k) {
#pragma unroll
  for (int i = 0; i < N; ++i) s[i] = fmaf(decay, s[i], u_k * k[i]);
}

// ---------------------------------------------------------------------------
// Host-side argument rules both entry points (decode, extend) share.
// ---------------------------------------------------------------------------

/// True when `x` (a CUDA tensor) starts at and steps through its leading dims by
/// multiples of `bytes`.
inline bool aligned_rows(const TensorView& x, int64_t bytes) {
  const int64_t elem = x.dtype().bits / 8;
  if (reinterpret_cast<std::uintptr_t>(data_ptr<char>(x)) % bytes != 0) return false;
  for (int i = 0; i + 1 < x.ndim(); ++i) {
    if (x.size(i) > 1 && (x.stride(i) * elem) % bytes != 0) return false;
  }
  return true;
}

/// Checks that exactly one form of a gate is given: `given` (precomputed) or every one
/// of `raw`; names the argument at fault.
inline void check_gate_form(const tvm::ffi::Optional<TensorView>& given, const char* given_name,
                            std::initializer_list<std::pair<bool, const char*>> raw,
                            const char* raw_names) {
  for (const auto& [present, name] : raw) {
    ValueCheck(!(given.has_value() && present), "argument '", name, "': pass either ", given_name,
               "= or ", raw_names, ", not both (", name, " must be None when ", given_name,
               "= is given)");
    ValueCheck(given.has_value() || present, "argument '", name, "': required (a tensor) unless ",
               given_name, "= is given");
  }
}

/// Checks the head counts and head dims both ops support: head_k_dim and head_v_dim
/// 64, 128 or 256, at least one key and one value head, and value heads a multiple of
/// key heads.
inline void check_head_dims(int64_t K, int64_t V, int64_t H, int64_t HV) {
  ValueCheck(K == 64 || K == 128 || K == 256,
             "argument 'q': head_k_dim (the last dim) must be 64, 128 or 256, got ", K);
  ValueCheck(V == 64 || V == 128 || V == 256,
             "argument 'v': head_v_dim (the last dim) must be 64, 128 or 256, got ", V);
  ValueCheck(H >= 1, "argument 'q': expected at least one head (num_k_heads), got 0");
  ValueCheck(HV >= 1, "argument 'v': expected at least one head (num_v_heads), got 0");
  ValueCheck(HV % H == 0, "argument 'v': num_v_heads (", HV,
             ") must be a multiple of q's num_k_heads (", H, ")");
}

/// The two gates' tensors as a call gives them: the decay (`g`, or the raw `a`) and the
/// update (`beta`, or the raw `b`), with their argument names, once check_gate_forms
/// has passed.
struct GateTensors {
  const TensorView& decay;
  const TensorView& update;
  const char* decay_name;
  const char* update_name;
};

/// Checks that each gate comes in exactly one form (precomputed `g` / `beta`, or raw
/// `a`, `A_log`, `dt_bias` / `b`) and returns the tensors given.
inline GateTensors check_gate_forms(const tvm::ffi::Optional<TensorView>& g,
                                    const tvm::ffi::Optional<TensorView>& beta,
                                    const tvm::ffi::Optional<TensorView>& a,
                                    const tvm::ffi::Optional<TensorView>& b,
                                    const tvm::ffi::Optional<TensorView>& A_log,
                                    const tvm::ffi::Optional<TensorView>& dt_bias) {
  check_gate_form(
      g, "g",
      {{a.has_value(), "a"}, {A_log.has_value(), "A_log"}, {dt_bias.has_value(), "dt_bias"}},
      "(a, A_log, dt_bias)");
  check_gate_form(beta, "beta", {{b.has_value(), "b"}}, "b");
  return {g.has_value() ? *g : *a, beta.has_value() ? *beta : *b, g.has_value() ? "g" : "a",
          beta.has_value() ? "beta" : "b"};
}

/// Checks the raw decay gate's per-head parameters: A_log and dt_bias, [num_v_heads]
/// each, fp32, fp16 or bf16, on `device`.
inline void check_head_parameters(const TensorView& A_log, const TensorView& dt_bias,
                                  SymbolicSize& heads_v, SymbolicDevice& device) {
  TensorMatcher({heads_v})
      .dtype<fp32_t, fp16_t, bf16_t>()
      .device(kDLCUDA, device)
      .verify(A_log, "A_log");
  TensorMatcher({heads_v})
      .dtype<fp32_t, fp16_t, bf16_t>()
      .device(kDLCUDA, device)
      .verify(dt_bias, "dt_bias");
}

/// Checks the state pool, binding its sizes and dtype: [pool_size, num_v_heads,
/// head_v_dim, head_k_dim], fp32 or bf16, the last two dims contiguous, each state on a
/// 16-byte boundary (the kernels move it in 16-byte vectors).
inline void check_state_pool(const TensorView& state_pool, SymbolicSize& pool,
                             SymbolicSize& heads_v, SymbolicSize& dim_v, SymbolicSize& dim_k,
                             SymbolicDtype& state_dtype, SymbolicDevice& device) {
  TensorMatcher({pool, heads_v, dim_v, dim_k})
      .dtype<fp32_t, bf16_t>(state_dtype)
      .device(kDLCUDA, device)
      .strides({kAnySize, kAnySize, dim_k, 1})
      .verify(state_pool, "state_pool");
  ValueCheck(aligned_rows(state_pool, 16), "argument 'state_pool': each state must start at a ",
             "16-byte aligned address (data pointer and strides of the first two dims), got "
             "strides ",
             dims_str(state_pool.strides()));
}

}  // namespace mllm_kernel::cuda::gdn
