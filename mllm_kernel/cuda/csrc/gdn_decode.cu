// gdn_decode: the gated delta net's decode step (Qwen3-Next / Qwen3.5 linear attention)
// for T >= 1 tokens per sequence, on states kept in a pool; the math is in gdn.cuh.
//
// Design. Per token the rule does about 6 flops per state element and touches each
// element once, so the kernel is bound by the state's bytes: its floor is reading and
// writing 2 * HV * V * K * sizeof(state) per sequence. Everything below serves one
// streaming pass over the state at full bandwidth:
//
// * A state row (one value index, K elements) needs only q, k, v[row] and the gates:
//   its two dot products (S k, S q) and its rank-1 update involve no other row. So a row
//   belongs to a group of G = K / 16 lanes of one warp, each lane holding 16 of its
//   elements in registers (4 16-byte vectors of fp32 state, 2 of bf16), and the dot
//   products end in a butterfly over those G lanes: no shared memory, no barrier.
// * A lane's vectors are interleaved: vector i of lane j starts at column
//   (i * G + j) * (16 / sizeof(state)), so the G lanes of a row read whole contiguous
//   lines with each load instruction. q and k are read at the same columns.
// * A lane holds the same columns of kRows rows, so q and k sit in registers once for
//   all of them; kRows keeps 8 16-byte state vectors per lane in flight (2 rows of fp32,
//   4 of bf16). A CTA covers up to 64 rows (the smallest V) of one (sequence, value
//   head); the 1-D grid (no 65535 limit on sequences) walks V slices, then heads, then
//   sequences, so consecutive CTAs stream consecutive memory.
// * Measured on an H100 at Qwen3-Next's heads (H=16, HV=32, K=V=128; CUDA graphs; times
//   over a same-size copy_): this shape, capped at 128 registers for fp32 (4 CTAs of 128
//   threads per SM), runs at 1.05x / 1.03x / 0.88x the copy at 32 / 128 / 512
//   sequences. Uncapped (143 registers) it was 3-5% slower; 4 fp32 rows per lane 12%
//   slower at one sequence; one 16-byte vector per lane per row (4 q/k values a lane
//   instead of 16, 80 registers, 6 CTAs per SM) 4% faster at 512 sequences but 17% and
//   7% slower at 1 and 8. For bf16 state, 4 rows instead of 2 took 1.32x to 1.11x.
// * One butterfly per token: with the L2 norms folded in, every sum it needs is over
//   the raw vectors: S.k and S.q per row, |k|^2, |q|^2 and q.k, all reduced at once:
//     kv = e^g (S.k) / |k|,   u = beta (v - kv),   S = e^g S + (u / |k|) k,
//     o  = (e^g (S.q) + (u / |k|) (q.k)) * scale / |q|
// * The sequence's index and token 0's q, k, v and gates are loaded first, then the
//   state, evict-first as it is stored (read once, written once: 5-8% faster than plain
//   loads and stores at 32-128 sequences); token t + 1's inputs are loaded while token
//   t's outputs are stored. Over T tokens the state stays in registers: it is read and
//   written once per call whatever T (speculative verify costs one pass, not T).
#include <tvm/ffi/optional.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "mllm_kernel/cuda/gdn.cuh"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace gdn_decode_impl {

/// The launch shape for a state of S elements and head_k_dim K (design note above).
template <typename S, int K>
struct Shape {
  static constexpr int kVec = gdn::kStateVec<S>;   // elements per 16-byte vector
  static constexpr int kElems = 16;                // elements of a row per lane
  static constexpr int kGroup = K / kElems;        // lanes per row
  static constexpr int kRows = 8 * kVec / kElems;  // rows per lane: 8 vectors in flight
  static constexpr int kThreads = 64 * kGroup / kRows < 128 ? 64 * kGroup / kRows : 128;
  static constexpr int kRowsPerCta = kThreads / kGroup * kRows;
  static constexpr int kMinCtasPerSm = sizeof(S) == 4 ? 4 : 3;  // 128 / 168 registers
  static_assert(K % kElems == 0 && kGroup <= kWarpSize && kRows <= kGroup);
  static_assert(64 % kRowsPerCta == 0, "a CTA's rows must divide every head_v_dim");
};

/// A [batch, tokens, heads, dim] tensor with a contiguous last dim (strides in elements).
struct Heads {
  void* data = nullptr;
  int64_t stride_n = 0, stride_t = 0, stride_h = 0;

  template <typename T>
  __device__ __forceinline__ T* at(int64_t n, int64_t t, int64_t h) const {
    return static_cast<T*>(data) + n * stride_n + t * stride_t + h * stride_h;
  }
};

struct Params {
  Heads q, k, v, out;
  Heads intermediate;  // [batch, tokens, heads, V * K] when the caller asked for it
  gdn::Gates gates;
  void* state = nullptr;
  int64_t state_stride_slot = 0, state_stride_head = 0, pool_size = 0;
  const void* indices = nullptr;
  int64_t indices_stride = 0;
  bool indices_int64 = false;
  int32_t* errors = nullptr;  // counts indices >= pool_size when given
  int tokens = 0, num_v_heads = 0, head_ratio = 1, slices = 1;
  float scale = 1.0f;
  bool l2norm = true;
  bool vector_qk = true;  // q and k rows allow vector loads at every lane's columns
};

/// One token's inputs for a lane: its columns of q and k, v at its rows, the gates.
template <int kElems, int kRows>
struct TokenInputs {
  float q[kElems], k[kElems];
  float v[kRows];
  gdn::GateValues gate;
};

template <typename T, typename Sh>
__device__ __forceinline__ void load_token(const Params& p, int64_t n, int t, int h, int hv,
                                           int row0, int lane,
                                           TokenInputs<Sh::kElems, Sh::kRows>& in) {
  const T* q = p.q.at<const T>(n, t, h);
  const T* k = p.k.at<const T>(n, t, h);
#pragma unroll
  for (int i = 0; i < Sh::kElems / Sh::kVec; ++i) {
    const int col = (i * Sh::kGroup + lane) * Sh::kVec;
    gdn::load_floats<T, Sh::kVec>(q + col, p.vector_qk, in.q + i * Sh::kVec);
    gdn::load_floats<T, Sh::kVec>(k + col, p.vector_qk, in.k + i * Sh::kVec);
  }
  const T* v = p.v.at<const T>(n, t, hv) + row0;
#pragma unroll
  for (int r = 0; r < Sh::kRows; ++r) in.v[r] = to_float(v[r]);
  in.gate = gdn::load_gates(p.gates, n, t, hv);
}

/// Stores a lane's rows of the state at `rows` (row0's first element).
template <typename S, int K>
__device__ __forceinline__ void store_rows(
    S* rows, int lane, const float (&s)[Shape<S, K>::kRows][Shape<S, K>::kElems]) {
  using Sh = Shape<S, K>;
#pragma unroll
  for (int r = 0; r < Sh::kRows; ++r) {
#pragma unroll
    for (int i = 0; i < Sh::kElems / Sh::kVec; ++i) {
      gdn::store_state(rows + r * K + (i * Sh::kGroup + lane) * Sh::kVec, s[r] + i * Sh::kVec);
    }
  }
}

template <typename T, typename S, int K>
__global__ void __launch_bounds__(Shape<S, K>::kThreads, Shape<S, K>::kMinCtasPerSm)
    gdn_decode_kernel(const Params p) {
  using Sh = Shape<S, K>;
  constexpr int G = Sh::kGroup, kVec = Sh::kVec, kRows = Sh::kRows, kElems = Sh::kElems;

  const int64_t cta = blockIdx.x;
  const int slice = static_cast<int>(cta % p.slices);
  const int64_t seq_head = cta / p.slices;
  const int hv = static_cast<int>(seq_head % p.num_v_heads);
  const int64_t n = seq_head / p.num_v_heads;
  const int h = hv / p.head_ratio;
  const int lane = static_cast<int>(threadIdx.x) % G;
  const int row0 = slice * Sh::kRowsPerCta + static_cast<int>(threadIdx.x) / G * kRows;

  const int64_t index = gdn::load_index(p.indices, p.indices_int64, p.indices_stride, n);
  TokenInputs<kElems, kRows> in;
  load_token<T, Sh>(p, n, 0, h, hv, row0, lane, in);

  const gdn::Slot slot = gdn::classify_slot(index, p.pool_size);
  S* state = slot != gdn::Slot::kState ? nullptr
                                       : static_cast<S*>(p.state) + index * p.state_stride_slot +
                                             hv * p.state_stride_head + row0 * K;
  float s[kRows][kElems];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < kElems / kVec; ++i) {
      if (state != nullptr) {
        gdn::load_state(state + r * K + (i * G + lane) * kVec, s[r] + i * kVec);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) s[r][i * kVec + e] = gdn::missing_state(slot);
      }
    }
  }
  if (slot == gdn::Slot::kOutOfRange && p.errors != nullptr && hv == 0 && slice == 0 &&
      threadIdx.x == 0) {
    atomicAdd(p.errors, 1);
  }

  for (int t = 0; t < p.tokens; ++t) {
    // sums: S.k and S.q per row, then |k|^2, |q|^2, q.k.
    constexpr int kKK = 2 * kRows, kQQ = kKK + 1, kQK = kKK + 2;
    float sums[2 * kRows + 3];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      sums[2 * r] = gdn::dot(s[r], in.k);
      sums[2 * r + 1] = gdn::dot(s[r], in.q);
    }
    sums[kKK] = gdn::dot(in.k, in.k);
    sums[kQQ] = gdn::dot(in.q, in.q);
    sums[kQK] = gdn::dot(in.q, in.k);
    gdn::group_reduce_sum<G>(sums);

    const float inv_k = p.l2norm ? gdn::l2_inv_norm(sums[kKK]) : 1.0f;
    const float q_scale = (p.l2norm ? gdn::l2_inv_norm(sums[kQQ]) : 1.0f) * p.scale;
    const float decay = expf(in.gate.log_decay);
    T* o = p.out.at<T>(n, t, hv) + row0;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float u = in.gate.beta * (in.v[r] - decay * sums[2 * r] * inv_k);
      const float u_k = u * inv_k;
      if (lane == r) o[r] = from_float<T>((decay * sums[2 * r + 1] + u_k * sums[kQK]) * q_scale);
      gdn::update_row(s[r], in.k, decay, u_k);
    }
    if (p.intermediate.data != nullptr) {
      store_rows<S, K>(p.intermediate.at<S>(n, t, hv) + row0 * K, lane, s);
    }
    if (t + 1 < p.tokens) load_token<T, Sh>(p, n, t + 1, h, hv, row0, lane, in);
  }
  if (state != nullptr) store_rows<S, K>(state, lane, s);
}

template <typename T, typename S, int K>
void launch(Params p, int64_t batch, int64_t value_dim, DLDevice device) {
  using Sh = Shape<S, K>;
  p.slices = static_cast<int>(value_dim / Sh::kRowsPerCta);
  const int64_t ctas = batch * p.num_v_heads * p.slices;
  RuntimeCheck(ctas < (int64_t{1} << 31), "gdn_decode: at most 2^31 - 1 CTAs (batch x ",
               "num_v_heads x ", p.slices, " per head), got ", ctas, "; split the batch");
  if (ctas == 0 || p.tokens == 0) return;
  KernelLauncher(dim3(static_cast<unsigned>(ctas)), dim3(Sh::kThreads), device)(
      gdn_decode_kernel<T, S, K>, p);
}

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

/// (batch, token, head) strides of a [B, H, D] or [B, T, H, D] tensor.
inline Heads heads(const TensorView& x, bool with_tokens) {
  Heads out;
  out.data = data_ptr<char>(x);
  out.stride_n = x.stride(0);
  out.stride_t = with_tokens ? x.stride(1) : 0;
  out.stride_h = x.stride(with_tokens ? 2 : 1);
  return out;
}

/// A gate tensor, [B, HV] or [B, T, HV], as the kernel reads it.
inline gdn::FloatTensor gate(const TensorView& x, bool with_tokens) {
  gdn::FloatTensor out;
  out.data = data_ptr<char>(x);
  out.type = gdn::float_type(x.dtype());
  out.stride_n = x.stride(0);
  out.stride_t = with_tokens ? x.stride(1) : 0;
  out.stride_h = x.stride(with_tokens ? 2 : 1);
  return out;
}

/// A per-head parameter, [HV], as the kernel reads it.
inline gdn::FloatTensor head_parameter(const TensorView& x) {
  gdn::FloatTensor out;
  out.data = data_ptr<char>(x);
  out.type = gdn::float_type(x.dtype());
  out.stride_h = x.stride(0);
  return out;
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

}  // namespace gdn_decode_impl

/// The gated delta rule's decode step (mllm_kernel.ops.gdn.gdn_decode documents the
/// math): out = o, state_pool[cache_indices] updated in place, intermediate_states
/// (optional) written with the state after each token. The decay gate comes from
/// (a, A_log, dt_bias) or g, the update gate from b or beta. `scale` None means
/// head_k_dim^-0.5. `errors` (int32 [1], zeroed) counts indices >= pool_size when given.
inline void gdn_decode(TensorView out, TensorView q, TensorView k, TensorView v,
                       tvm::ffi::Optional<TensorView> a, tvm::ffi::Optional<TensorView> b,
                       tvm::ffi::Optional<TensorView> A_log, tvm::ffi::Optional<TensorView> dt_bias,
                       tvm::ffi::Optional<TensorView> g, tvm::ffi::Optional<TensorView> beta,
                       TensorView state_pool, TensorView cache_indices,
                       tvm::ffi::Optional<TensorView> intermediate_states,
                       tvm::ffi::Optional<double> scale, bool use_qk_l2norm,
                       tvm::ffi::Optional<TensorView> errors) {
  using namespace gdn_decode_impl;
  SymbolicSize batch{"batch"}, tokens{"tokens"}, heads_k{"num_k_heads"}, heads_v{"num_v_heads"},
      dim_k{"head_k_dim"}, dim_v{"head_v_dim"}, pool{"pool_size"};
  SymbolicDtype dtype, state_dtype;
  SymbolicDevice device;
  TensorMatcher().dtype<fp16_t, bf16_t>(dtype).device(kDLCUDA, device).verify(q, "q");
  ValueCheck(q.ndim() == 3 || q.ndim() == 4,
             "argument 'q': expected [batch, num_k_heads, head_k_dim] (one token) or [batch, "
             "tokens, num_k_heads, head_k_dim] but got shape ",
             dims_str(q.shape()));
  const bool with_tokens = q.ndim() == 4;
  if (!with_tokens) tokens.bind(1, "q");
  // The shape [batch, (tokens,) head, dim] of q, k, v, out; [batch, (tokens,) head] of a gate.
  auto per_token = [&](SymbolicSize& head, SymbolicSize& dim) {
    return with_tokens ? TensorMatcher({batch, tokens, head, dim})
                       : TensorMatcher({batch, head, dim});
  };
  auto per_head = [&]() {
    return with_tokens ? TensorMatcher({batch, tokens, heads_v}) : TensorMatcher({batch, heads_v});
  };
  per_token(heads_k, dim_k).last_dim_contiguous().verify(q, "q");
  per_token(heads_k, dim_k)
      .dtype(dtype)
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(k, "k");
  per_token(heads_v, dim_v)
      .dtype(dtype)
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(v, "v");
  per_token(heads_v, dim_v)
      .dtype(dtype)
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(out, "out");
  const int64_t K = dim_k.value(), V = dim_v.value(), H = heads_k.value(), HV = heads_v.value();
  ValueCheck(K == 64 || K == 128 || K == 256,
             "argument 'q': head_k_dim (the last dim) must be 64, 128 or 256, got ", K);
  ValueCheck(V == 64 || V == 128 || V == 256,
             "argument 'v': head_v_dim (the last dim) must be 64, 128 or 256, got ", V);
  ValueCheck(H >= 1, "argument 'q': expected at least one head (num_k_heads), got 0");
  ValueCheck(HV % H == 0, "argument 'v': num_v_heads (", HV,
             ") must be a multiple of q's num_k_heads (", H, ")");

  gdn_decode_impl::check_gate_form(
      g, "g",
      {{a.has_value(), "a"}, {A_log.has_value(), "A_log"}, {dt_bias.has_value(), "dt_bias"}},
      "(a, A_log, dt_bias)");
  gdn_decode_impl::check_gate_form(beta, "beta", {{b.has_value(), "b"}}, "b");
  const TensorView& decay = g.has_value() ? *g : *a;
  const TensorView& update = beta.has_value() ? *beta : *b;
  const char* decay_name = g.has_value() ? "g" : "a";
  const char* update_name = beta.has_value() ? "beta" : "b";
  per_head().dtype<fp32_t, fp16_t, bf16_t>().device(kDLCUDA, device).verify(decay, decay_name);
  per_head().dtype<fp32_t, fp16_t, bf16_t>().device(kDLCUDA, device).verify(update, update_name);
  if (!g.has_value()) {
    TensorMatcher({heads_v})
        .dtype<fp32_t, fp16_t, bf16_t>()
        .device(kDLCUDA, device)
        .verify(*A_log, "A_log");
    TensorMatcher({heads_v})
        .dtype<fp32_t, fp16_t, bf16_t>()
        .device(kDLCUDA, device)
        .verify(*dt_bias, "dt_bias");
  }

  TensorMatcher({pool, heads_v, dim_v, dim_k})
      .dtype<fp32_t, bf16_t>(state_dtype)
      .device(kDLCUDA, device)
      .strides({kAnySize, kAnySize, dim_k, 1})
      .verify(state_pool, "state_pool");
  ValueCheck(aligned_rows(state_pool, 16), "argument 'state_pool': each state must start at a ",
             "16-byte aligned address (data pointer and strides of the first two dims), got "
             "strides ",
             dims_str(state_pool.strides()));
  TensorMatcher({batch})
      .dtype<int32_t, int64_t>()
      .device(kDLCUDA, device)
      .verify(cache_indices, "cache_indices");
  if (intermediate_states.has_value()) {
    TensorMatcher({batch, tokens, heads_v, dim_v, dim_k})
        .dtype(state_dtype)
        .device(kDLCUDA, device)
        .strides({kAnySize, kAnySize, kAnySize, dim_k, 1})
        .verify(*intermediate_states, "intermediate_states");
    ValueCheck(aligned_rows(*intermediate_states, 16),
               "argument 'intermediate_states': each state must start at a 16-byte aligned "
               "address (data pointer and strides of the first three dims), got strides ",
               dims_str((*intermediate_states).strides()));
  }
  if (scale.has_value()) {
    ValueCheck(std::isfinite(*scale), "argument 'scale': expected a finite number, got ", *scale);
  }

  // Outputs overlap no input (the pool is read and written at the same rows: its own
  // in-place case).
  const tvm::ffi::Optional<TensorView> inputs[] = {q,     k,       v, a,    b,
                                                   A_log, dt_bias, g, beta, cache_indices};
  const char* input_names[] = {"q",     "k",       "v", "a",    "b",
                               "A_log", "dt_bias", "g", "beta", "cache_indices"};
  for (int i = 0; i < 10; ++i) {
    if (!inputs[i].has_value()) continue;
    verify_output(out, "out", {{*inputs[i], input_names[i]}});
    verify_output(state_pool, "state_pool", {{*inputs[i], input_names[i]}});
    if (intermediate_states.has_value()) {
      verify_output(*intermediate_states, "intermediate_states", {{*inputs[i], input_names[i]}});
    }
  }
  verify_output(out, "out", {{state_pool, "state_pool"}});
  if (intermediate_states.has_value()) {
    verify_output(*intermediate_states, "intermediate_states",
                  {{state_pool, "state_pool"}, {out, "out"}});
  }

  Params p;
  p.q = heads(q, with_tokens);
  p.k = heads(k, with_tokens);
  p.v = heads(v, with_tokens);
  p.out = heads(out, with_tokens);
  if (intermediate_states.has_value()) {
    const TensorView& s = *intermediate_states;
    p.intermediate = Heads{data_ptr<char>(s), s.stride(0), s.stride(1), s.stride(2)};
  }
  p.gates.decay = gate(decay, with_tokens);
  p.gates.update = gate(update, with_tokens);
  p.gates.raw_decay = !g.has_value();
  p.gates.raw_update = !beta.has_value();
  if (p.gates.raw_decay) {
    p.gates.A_log = head_parameter(*A_log);
    p.gates.dt_bias = head_parameter(*dt_bias);
  }
  p.state = data_ptr<char>(state_pool);
  p.state_stride_slot = state_pool.stride(0);
  p.state_stride_head = state_pool.stride(1);
  p.pool_size = pool.value();
  p.indices = data_ptr<char>(cache_indices);
  p.indices_stride = cache_indices.stride(0);
  p.indices_int64 = is_dtype<int64_t>(cache_indices.dtype());
  if (errors.has_value()) {
    TensorMatcher({1}).dtype<int32_t>().device(kDLCUDA, device).verify(*errors, "errors");
    p.errors = data_ptr<int32_t>(*errors);
  }
  p.tokens = static_cast<int>(tokens.value());
  p.num_v_heads = static_cast<int>(HV);
  p.head_ratio = static_cast<int>(HV / H);
  p.scale = static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(double(K)));
  p.l2norm = use_qk_l2norm;

  const int64_t elem = dtype.value().bits / 8;
  const int64_t state_vec = 16 / (state_dtype.value().bits / 8);
  p.vector_qk = aligned_rows(q, state_vec * elem) && aligned_rows(k, state_vec * elem);
  RuntimeCheck(tokens.value() < (int64_t{1} << 31), "gdn_decode: at most 2^31 - 1 tokens per ",
               "sequence, got ", tokens.value());
  RuntimeCheck(HV < (int64_t{1} << 31), "gdn_decode: at most 2^31 - 1 heads, got ", HV);
  dispatch_dtype<fp16_t, bf16_t>(dtype.value(), "q", [&](auto input_tag) {
    using T = typename decltype(input_tag)::type;
    dispatch_dtype<fp32_t, bf16_t>(state_dtype.value(), "state_pool", [&](auto state_tag) {
      using S = typename decltype(state_tag)::type;
      switch (K) {
        case 64: launch<T, S, 64>(p, batch.value(), V, device.value()); break;
        case 128: launch<T, S, 128>(p, batch.value(), V, device.value()); break;
        default: launch<T, S, 256>(p, batch.value(), V, device.value()); break;
      }
    });
  });
}

}  // namespace mllm_kernel::cuda
