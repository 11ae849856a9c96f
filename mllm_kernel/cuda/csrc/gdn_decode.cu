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
//   belongs to a group of G lanes of one warp, each holding K / G of its elements, and
//   the dot products end in a butterfly over those lanes: no shared memory, no barrier.
// * A lane's 16-byte vectors are interleaved: vector i of lane j starts at column
//   (i * G + j) * (16 / sizeof(state)), so the G lanes of a row read whole contiguous
//   lines with each load instruction. q and k are read at the same columns, once for
//   all the lane's rows.
// * With the L2 norms folded in, every sum a token needs is over the raw vectors: S.k
//   and S.q per row, |k|^2, |q|^2 and q.k (token_scales()).
// * Latency first: the sequence's index is the one load the state's address waits for,
//   so it goes first, then token 0's q, k, v and gates are issued unconverted, then the
//   state's loads (predicated, not branched on the slot); converting inputs and the
//   gates' exp / log1p run while the state is in flight. The grid's (sequence, head,
//   slice) comes from blockIdx by multiply-and-shift (FastDiv), not 32-bit division.
// * Two kernels over one row layout, chosen per call (choose_config) from the state's
//   rows, B * HV * V, against the SM count the caller passes:
//   - decode_in_registers: a warp-sized CTA holds 8 rows, 8 16-byte vectors a lane,
//     in registers, for any T (the state is read and written once per call however
//     many tokens: speculative verify costs one pass); 16 or 8 elements of a row a
//     lane (layouts 0 and 1; 16 and 20 CTAs an SM). Warp-sized CTAs: a finished warp
//     frees its slot at once (4-warp CTAs of the same warps were 6% slower at 512
//     sequences on an H200). Taken for T > 1, while one wave of them holds every row,
//     and past one wave of the streamed kernel for fp32 states.
//   - decode_streamed (T = 1): the state goes global -> shared by cp.async, all of a
//     thread's rows issued at once, then finished two rows at a time as they land. No
//     registers are held while the copies fly, so an SM keeps 192 KB of state in flight
//     instead of 64 KB; a thread reads back only its own copies, so its waits suffice.
//     Taken while one wave of it holds every row (8 sequences: 11.27 against 11.65 us
//     for the register kernel), and for bf16 states (1.14x the register kernel's speed).
// * The state is stored evict-first, and loaded so where it goes through registers
//   (read once, written once: 5-8% faster than plain loads and stores at 32-128
//   sequences on an H100); cp.async copies bypass L1 (.cg) with L2's default policy.
#include <tvm/ffi/optional.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "mllm_kernel/cuda/cp_async.cuh"
#include "mllm_kernel/cuda/gdn.cuh"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace gdn_decode_impl {

/// x / d for x < 2^31, d >= 1 fixed at launch: one 32 x 32 -> 64-bit multiply and a
/// shift, where a 32-bit division is a call of some twenty dependent instructions.
/// With 2^(l-1) < d <= 2^l, m = ceil(2^(31+l) / d) < 2^32 and x m / 2^(31+l) is x / d
/// plus less than 1 / d, so the floor is exact.
struct FastDiv {
  uint32_t multiplier = 1u << 31;
  uint32_t shift = 31;

  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) {
    uint32_t log = 0;
    while ((uint64_t{1} << log) < divisor) ++log;
    shift = 31 + log;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << shift) + divisor - 1) / divisor);
  }

  __device__ __forceinline__ uint32_t operator()(uint32_t x) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(x) * multiplier) >> shift);
  }
};

/// A launch configuration, for a state of any dtype and head_k_dim (Plan fits it to
/// them): `elems` of a row per lane, `vecs` 16-byte state vectors per lane in flight,
/// `warps` per CTA, the registers per thread it is built for with an fp32 and a bf16
/// state (they set the CTAs per SM); `streamed`: the state goes through shared memory
/// (cp.async) instead of registers.
struct Layout {
  int elems, vecs, warps, registers_fp32, registers_bf16;
  bool streamed;
};

inline constexpr Layout kLayouts[] = {
    {16, 8, 1, 128, 168, false},  // 0: registers, 16 elements a lane
    {8, 8, 1, 96, 168, false},    // 1: registers, 8 elements a lane
    {16, 16, 4, 80, 96, true},    // 2: streamed
};
inline constexpr int kConfigs = sizeof(kLayouts) / sizeof(kLayouts[0]);

/// Layout `C` fitted to a state of S elements and head_k_dim K. A row (one value
/// index, K elements) belongs to a group of kGroup lanes of one warp, each holding
/// kElems of its elements (kVecs 16-byte vectors): its dot products end in a butterfly
/// over the group. A thread holds kRows rows at the same columns, so its q and k serve
/// all of them. A CTA covers kRowsPerCta rows (at most 64, the smallest head_v_dim) of
/// one (sequence, value head).
template <typename S, int K, int C>
struct Plan {
  static constexpr Layout kLayout = kLayouts[C];
  static constexpr bool kStreamed = kLayout.streamed;
  static constexpr int kVec = gdn::kStateVec<S>;  // elements per 16-byte vector
  static constexpr int kElems = std::max({kLayout.elems, kVec, K / kWarpSize});
  static constexpr int kVecs = kElems / kVec;
  static constexpr int kGroup = K / kElems;
  static constexpr int kGroupsPerWarp = kWarpSize / kGroup;
  static constexpr int kWantRows = std::max(1, kLayout.vecs / kVecs);
  static constexpr int kWarps =
      std::max(1, std::min(kLayout.warps, 64 / (kGroupsPerWarp * kWantRows)));
  static constexpr int kRows = std::min(kWantRows, 64 / (kGroupsPerWarp * kWarps));
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kParallelRows = kGroupsPerWarp * kWarps;  // rows a CTA works at once
  static constexpr int kRowsPerCta = kParallelRows * kRows;
  // A thread's rows: consecutive in registers (its v values in one run); kParallelRows
  // apart when streamed (a CTA's copies of one row index cover consecutive rows).
  static constexpr int kRowStride = kStreamed ? kParallelRows : 1;
  static constexpr int kSharedBytes = kStreamed ? kRows * kVecs * kThreads * 16 : 0;
  static constexpr int kRegisters =
      sizeof(S) == 4 ? kLayout.registers_fp32 : kLayout.registers_bf16;
  // Each of an SM's 4 schedulers holds its warps' registers (16384): whole warps of
  // kRegisters each, so the CTAs per SM come in steps of 4 warps.
  static constexpr int kWarpsPerSm = 4 * (16384 / (kWarpSize * kRegisters));
  static constexpr int kMinCtas = std::max(
      1, std::min({32, kWarpsPerSm / kWarps, kStreamed ? 227 * 1024 / (kSharedBytes + 1024) : 32}));
  static_assert(K % kElems == 0 && kElems % kVec == 0 && kGroup <= kWarpSize);
  static_assert(64 % kRowsPerCta == 0, "a CTA's rows must divide every head_v_dim");
  static_assert(kSharedBytes <= 48 * 1024, "static shared memory");
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
  int tokens = 0, num_v_heads = 0;
  FastDiv per_sequence;  // by num_v_heads: (sequence, value head) -> sequence
  FastDiv per_key_head;  // by num_v_heads / num_k_heads: value head -> key head
  int slice_shift = 0;   // log2 of the CTAs per (sequence, value head)
  float scale = 1.0f;
  bool l2norm = true;
  bool vector_qk = true;  // q and k rows allow vector loads at every lane's columns
};

/// Where a thread works: sequence n, value head hv (key head h), its lane in its row's
/// group, its first row, and whether its CTA is its head's first.
struct Place {
  int64_t n;
  int hv, h, lane, row;
  bool first_cta;
};

template <typename Pl>
__device__ __forceinline__ Place place(const Params& p) {
  // The 1-D grid (no 65535 limit on sequences) walks a head's CTAs, then heads, then
  // sequences, so consecutive CTAs stream consecutive memory.
  const uint32_t cta = blockIdx.x;
  const uint32_t seq_head = cta >> p.slice_shift;
  const uint32_t slice = cta & ((1u << p.slice_shift) - 1);
  const uint32_t n = p.per_sequence(seq_head);
  const int group = static_cast<int>(threadIdx.x) / Pl::kGroup;
  Place at;
  at.n = n;
  at.hv = static_cast<int>(seq_head - n * static_cast<uint32_t>(p.num_v_heads));
  at.h = static_cast<int>(p.per_key_head(static_cast<uint32_t>(at.hv)));
  at.lane = static_cast<int>(threadIdx.x) % Pl::kGroup;
  at.row = static_cast<int>(slice) * Pl::kRowsPerCta + (Pl::kStreamed ? group : group * Pl::kRows);
  at.first_cta = slice == 0;
  return at;
}

/// Counts a sequence whose index is past the pool, once (its head 0's first CTA).
__device__ __forceinline__ void count_out_of_range(const Params& p, gdn::Slot slot,
                                                   const Place& at) {
  if (slot == gdn::Slot::kOutOfRange && p.errors != nullptr && at.hv == 0 && at.first_cta &&
      threadIdx.x == 0) {
    atomicAdd(p.errors, 1);
  }
}

/// One token's inputs for a thread as loaded: its columns of q and k, v at its rows,
/// the gates. Loading is split from converting so that a kernel issues the state's
/// loads before it waits for any of these.
template <typename T, typename Pl>
struct RawToken {
  Vec<T, Pl::kVec> q[Pl::kVecs], k[Pl::kVecs];
  T v[Pl::kRows];
  gdn::RawGates gate;
};

/// The same as fp32.
template <typename Pl>
struct TokenInputs {
  float q[Pl::kElems], k[Pl::kElems];
  float v[Pl::kRows];
  gdn::GateValues gate;
};

template <typename T, typename Pl>
__device__ __forceinline__ RawToken<T, Pl> load_token(const Params& p, const Place& at, int t) {
  RawToken<T, Pl> raw;
  const T* q = p.q.at<const T>(at.n, t, at.h);
  const T* k = p.k.at<const T>(at.n, t, at.h);
#pragma unroll
  for (int i = 0; i < Pl::kVecs; ++i) {
    const int col = (i * Pl::kGroup + at.lane) * Pl::kVec;
    raw.q[i] = gdn::load_elements<T, Pl::kVec>(q + col, p.vector_qk);
    raw.k[i] = gdn::load_elements<T, Pl::kVec>(k + col, p.vector_qk);
  }
  const T* v = p.v.at<const T>(at.n, t, at.hv) + at.row;
#pragma unroll
  for (int r = 0; r < Pl::kRows; ++r) raw.v[r] = v[r * Pl::kRowStride];
  raw.gate = gdn::load_raw_gates(p.gates, at.n, t, at.hv);
  return raw;
}

template <typename T, typename Pl>
__device__ __forceinline__ TokenInputs<Pl> convert(const Params& p, const RawToken<T, Pl>& raw) {
  TokenInputs<Pl> in;
#pragma unroll
  for (int i = 0; i < Pl::kVecs; ++i) {
#pragma unroll
    for (int e = 0; e < Pl::kVec; ++e) {
      in.q[i * Pl::kVec + e] = to_float(raw.q[i][e]);
      in.k[i * Pl::kVec + e] = to_float(raw.k[i][e]);
    }
  }
#pragma unroll
  for (int r = 0; r < Pl::kRows; ++r) in.v[r] = to_float(raw.v[r]);
  in.gate = gdn::gate_values(p.gates, raw.gate);
  return in;
}

/// The state of a thread's sequence and head at its first row; `held` when the pool
/// has one (else the pool's base, never read).
template <typename S, int K>
__device__ __forceinline__ S* state_rows(const Params& p, int64_t index, bool held,
                                         const Place& at) {
  const int64_t offset =
      index * p.state_stride_slot + at.hv * p.state_stride_head + static_cast<int64_t>(at.row) * K;
  return static_cast<S*>(p.state) + (held ? offset : 0);
}

/// Per token, with the L2 norms folded in, every sum a row needs is over the raw
/// vectors: S.k and S.q, plus |k|^2, |q|^2 and q.k shared by all rows:
///   kv = e^g (S.k) / |k|,   u = beta (v - kv),   S = e^g S + (u / |k|) k,
///   o  = (e^g (S.q) + (u / |k|) (q.k)) * scale / |q|
struct TokenScales {
  float inv_k, q_scale, decay;
};

__device__ __forceinline__ TokenScales token_scales(const Params& p, const gdn::GateValues& gate,
                                                    float kk, float qq) {
  TokenScales out;
  out.inv_k = p.l2norm ? gdn::l2_inv_norm(kk) : 1.0f;
  out.q_scale = (p.l2norm ? gdn::l2_inv_norm(qq) : 1.0f) * p.scale;
  out.decay = expf(gate.log_decay);
  return out;
}

/// Stores a thread's rows of the state at `rows` (its first row's first element).
template <typename S, int K, typename Pl>
__device__ __forceinline__ void store_rows(S* rows, int lane,
                                           const float (&s)[Pl::kRows][Pl::kElems]) {
#pragma unroll
  for (int r = 0; r < Pl::kRows; ++r) {
#pragma unroll
    for (int i = 0; i < Pl::kVecs; ++i) {
      gdn::store_state(rows + r * Pl::kRowStride * K + (i * Pl::kGroup + lane) * Pl::kVec,
                       s[r] + i * Pl::kVec);
    }
  }
}

/// The state in registers, any number of tokens: read once, carried in fp32 through
/// the tokens, written once.
template <typename T, typename S, int K, int C>
__global__ void __launch_bounds__(Plan<S, K, C>::kThreads, Plan<S, K, C>::kMinCtas)
    decode_in_registers(const Params p) {
  using Pl = Plan<S, K, C>;
  constexpr int G = Pl::kGroup, kVec = Pl::kVec, kRows = Pl::kRows, kElems = Pl::kElems;
  const Place at = place<Pl>(p);

  // The index, then token 0's inputs (not waited for), then the state: its loads issue
  // as soon as the index arrives, and the gates' math runs while they are in flight.
  const int64_t index = gdn::load_index(p.indices, p.indices_int64, p.indices_stride, at.n);
  const RawToken<T, Pl> raw = load_token<T, Pl>(p, at, 0);
  const gdn::Slot slot = gdn::classify_slot(index, p.pool_size);
  const bool held = slot == gdn::Slot::kState;
  S* state = state_rows<S, K>(p, index, held, at);
  const float fill = gdn::missing_state(slot);
  float s[kRows][kElems];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < kElems / kVec; ++i) {
      gdn::load_state_or(state + r * K + (i * G + at.lane) * kVec, held, fill, s[r] + i * kVec);
    }
  }
  count_out_of_range(p, slot, at);

  TokenInputs<Pl> in = convert<T, Pl>(p, raw);
  for (int t = 0; t < p.tokens; ++t) {
    // sums: S.k and S.q per row, then |k|^2, |q|^2, q.k: one butterfly for all.
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

    const TokenScales sc = token_scales(p, in.gate, sums[kKK], sums[kQQ]);
    T* o = p.out.at<T>(at.n, t, at.hv) + at.row;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float u = in.gate.beta * (in.v[r] - sc.decay * sums[2 * r] * sc.inv_k);
      const float u_k = u * sc.inv_k;
      if (at.lane == r % G) {
        o[r] = from_float<T>((sc.decay * sums[2 * r + 1] + u_k * sums[kQK]) * sc.q_scale);
      }
      gdn::update_row(s[r], in.k, sc.decay, u_k);
    }
    if (p.intermediate.data != nullptr) {
      store_rows<S, K, Pl>(p.intermediate.at<S>(at.n, t, at.hv) + at.row * K, at.lane, s);
    }
    if (t + 1 < p.tokens) in = convert<T, Pl>(p, load_token<T, Pl>(p, at, t + 1));
  }
  if (held) store_rows<S, K, Pl>(state, at.lane, s);
}

/// Calls f(std::integral_constant<int, i>) for i = 0 .. N - 1, in order.
template <typename F, int... I>
__device__ __forceinline__ void unrolled(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}

/// One token, the state streamed through shared memory: a thread issues the copies of
/// all its rows at once (cp.async: no registers held while they fly, so a CTA keeps
/// kSharedBytes in flight), then finishes rows two at a time as their copies land.
/// A thread reads back only what it copied: its own waits suffice, no barrier.
template <typename T, typename S, int K, int C>
__global__ void __launch_bounds__(Plan<S, K, C>::kThreads, Plan<S, K, C>::kMinCtas)
    decode_streamed(const Params p) {
  using Pl = Plan<S, K, C>;
  constexpr int G = Pl::kGroup, kVec = Pl::kVec, kElems = Pl::kElems, kVecs = Pl::kVecs;
  constexpr int kStep = Pl::kRows < 2 ? Pl::kRows : 2;  // rows finished together
  constexpr int kSteps = Pl::kRows / kStep;
  __shared__ uint4 staged[Pl::kRows][kVecs][Pl::kThreads];
  const Place at = place<Pl>(p);

  const int64_t index = gdn::load_index(p.indices, p.indices_int64, p.indices_stride, at.n);
  const RawToken<T, Pl> raw = load_token<T, Pl>(p, at, 0);
  const gdn::Slot slot = gdn::classify_slot(index, p.pool_size);
  const bool held = slot == gdn::Slot::kState;
  S* state = state_rows<S, K>(p, index, held, at);
  auto element = [&](int r, int i) {
    return state + r * Pl::kRowStride * K + (i * G + at.lane) * kVec;
  };
#pragma unroll
  for (int r = 0; r < Pl::kRows; ++r) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) cp_async_16(&staged[r][i][threadIdx.x], element(r, i), held);
    if ((r + 1) % kStep == 0) cp_async_commit();
  }
  count_out_of_range(p, slot, at);

  const TokenInputs<Pl> in = convert<T, Pl>(p, raw);
  float norms[3] = {gdn::dot(in.k, in.k), gdn::dot(in.q, in.q), gdn::dot(in.q, in.k)};
  gdn::group_reduce_sum<G>(norms);
  const TokenScales sc = token_scales(p, in.gate, norms[0], norms[1]);
  const float fill = gdn::missing_state(slot);
  T* o = p.out.at<T>(at.n, 0, at.hv) + at.row;

  unrolled(
      [&](auto step) {
        constexpr int kFirst = decltype(step)::value * kStep;
        cp_async_wait<kSteps - 1 - decltype(step)::value>();
        float s[kStep][kElems];
        float sums[2 * kStep];
#pragma unroll
        for (int j = 0; j < kStep; ++j) {
#pragma unroll
          for (int i = 0; i < kVecs; ++i) {
            gdn::state_to_float<S>(staged[kFirst + j][i][threadIdx.x], s[j] + i * kVec);
          }
#pragma unroll
          for (int e = 0; e < kElems; ++e) s[j][e] = held ? s[j][e] : fill;
          sums[2 * j] = gdn::dot(s[j], in.k);
          sums[2 * j + 1] = gdn::dot(s[j], in.q);
        }
        gdn::group_reduce_sum<G>(sums);
#pragma unroll
        for (int j = 0; j < kStep; ++j) {
          const int r = kFirst + j;
          const float u = in.gate.beta * (in.v[r] - sc.decay * sums[2 * j] * sc.inv_k);
          const float u_k = u * sc.inv_k;
          if (at.lane == 0) {
            o[r * Pl::kRowStride] =
                from_float<T>((sc.decay * sums[2 * j + 1] + u_k * norms[2]) * sc.q_scale);
          }
          gdn::update_row(s[j], in.k, sc.decay, u_k);
          if (held) {
#pragma unroll
            for (int i = 0; i < kVecs; ++i) gdn::store_state(element(r, i), s[j] + i * kVec);
          }
        }
      },
      std::make_integer_sequence<int, kSteps>{});
}

template <typename T, typename S, int K, int C>
void launch(Params p, int64_t batch, int64_t value_dim, DLDevice device) {
  using Pl = Plan<S, K, C>;
  const int64_t slices = value_dim / Pl::kRowsPerCta;  // a power of two
  while ((int64_t{1} << p.slice_shift) < slices) ++p.slice_shift;
  const int64_t ctas = batch * p.num_v_heads * slices;
  RuntimeCheck(ctas < (int64_t{1} << 31), "gdn_decode: at most 2^31 - 1 CTAs (batch x ",
               "num_v_heads x ", slices, " per head), got ", ctas, "; split the batch");
  if (ctas == 0 || p.tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(ctas)), block(Pl::kThreads);
  if constexpr (Pl::kStreamed) {
    KernelLauncher(grid, block, device)(decode_streamed<T, S, K, C>, p);
  } else {
    KernelLauncher(grid, block, device)(decode_in_registers<T, S, K, C>, p);
  }
}

template <typename T, typename S, int K, int... C>
void launch_config(int config, Params p, int64_t batch, int64_t value_dim, DLDevice device,
                   std::integer_sequence<int, C...>) {
  ((config == C ? launch<T, S, K, C>(p, batch, value_dim, device) : void()), ...);
}

/// The configuration for a call of `rows` state rows (batch x num_v_heads x head_v_dim)
/// and `tokens` tokens on a GPU of `sm_count` SMs (design note): the register kernel
/// (layout 0, 16 an SM) while one wave of its 8-row warps holds every row, and for
/// several tokens; else the streamed kernel while one wave of it (64-row CTAs, 6 an SM)
/// does, and for a bf16 state; past that, fp32 states go back to warp-sized register
/// CTAs of 8 rows with 8 elements a lane (layout 1, 20 an SM: 531.6 against 537.0 us
/// streamed and 547.3 us for layout 0 at 512 sequences on an H200).
inline int choose_config(int64_t rows, int64_t tokens, int64_t sm_count, bool fp32_state) {
  if (tokens > 1 || rows <= 128 * sm_count) return 0;
  return !fp32_state || rows <= 384 * sm_count ? 2 : 1;
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

}  // namespace gdn_decode_impl

/// The gated delta rule's decode step (mllm_kernel.ops.gdn.gdn_decode documents the
/// math): out = o, state_pool[cache_indices] updated in place, intermediate_states
/// (optional) written with the state after each token. The decay gate comes from
/// (a, A_log, dt_bias) or g, the update gate from b or beta. `scale` None means
/// head_k_dim^-0.5. `errors` (int32 [1], zeroed) counts indices >= pool_size when given.
/// `sm_count`: the GPU's SMs, for choose_config; `config` -1 takes its choice, else
/// forces entry `config` of kLayouts (the tests' and the benchmark's way to each).
inline void gdn_decode(TensorView out, TensorView q, TensorView k, TensorView v,
                       tvm::ffi::Optional<TensorView> a, tvm::ffi::Optional<TensorView> b,
                       tvm::ffi::Optional<TensorView> A_log, tvm::ffi::Optional<TensorView> dt_bias,
                       tvm::ffi::Optional<TensorView> g, tvm::ffi::Optional<TensorView> beta,
                       TensorView state_pool, TensorView cache_indices,
                       tvm::ffi::Optional<TensorView> intermediate_states,
                       tvm::ffi::Optional<double> scale, bool use_qk_l2norm,
                       tvm::ffi::Optional<TensorView> errors, int64_t sm_count, int64_t config) {
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
  gdn::check_head_dims(K, V, H, HV);
  const auto [decay, update, decay_name, update_name] =
      gdn::check_gate_forms(g, beta, a, b, A_log, dt_bias);
  per_head().dtype<fp32_t, fp16_t, bf16_t>().device(kDLCUDA, device).verify(decay, decay_name);
  per_head().dtype<fp32_t, fp16_t, bf16_t>().device(kDLCUDA, device).verify(update, update_name);
  if (!g.has_value()) gdn::check_head_parameters(*A_log, *dt_bias, heads_v, device);
  gdn::check_state_pool(state_pool, pool, heads_v, dim_v, dim_k, state_dtype, device);
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
    ValueCheck(gdn::aligned_rows(*intermediate_states, 16),
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
  p.per_sequence = FastDiv(static_cast<uint32_t>(HV));
  p.per_key_head = FastDiv(static_cast<uint32_t>(HV / H));
  p.scale = static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(double(K)));
  p.l2norm = use_qk_l2norm;

  const int64_t elem = dtype.value().bits / 8;
  const int64_t state_vec = 16 / (state_dtype.value().bits / 8);
  p.vector_qk = gdn::aligned_rows(q, state_vec * elem) && gdn::aligned_rows(k, state_vec * elem);
  RuntimeCheck(tokens.value() < (int64_t{1} << 31), "gdn_decode: at most 2^31 - 1 tokens per ",
               "sequence, got ", tokens.value());
  RuntimeCheck(HV < (int64_t{1} << 31), "gdn_decode: at most 2^31 - 1 heads, got ", HV);
  ValueCheck(config >= -1 && config < kConfigs, "argument 'config': expected -1 (chosen per ",
             "call) or a configuration 0 to ", kConfigs - 1, ", got ", config);
  ValueCheck(config < 0 || !kLayouts[config].streamed || tokens.value() <= 1,
             "argument 'config': configuration ", config, " streams one token per sequence, got ",
             tokens.value());
  const int chosen = config >= 0 ? static_cast<int>(config)
                                 : choose_config(batch.value() * HV * V, tokens.value(), sm_count,
                                                 is_dtype<fp32_t>(state_dtype.value()));
  dispatch_dtype<fp16_t, bf16_t>(dtype.value(), "q", [&](auto input_tag) {
    using T = typename decltype(input_tag)::type;
    dispatch_dtype<fp32_t, bf16_t>(state_dtype.value(), "state_pool", [&](auto state_tag) {
      using S = typename decltype(state_tag)::type;
      const auto configs = std::make_integer_sequence<int, kConfigs>{};
      switch (K) {
        case 64:
          launch_config<T, S, 64>(chosen, p, batch.value(), V, device.value(), configs);
          break;
        case 128:
          launch_config<T, S, 128>(chosen, p, batch.value(), V, device.value(), configs);
          break;
        default:
          launch_config<T, S, 256>(chosen, p, batch.value(), V, device.value(), configs);
          break;
      }
    });
  });
}

}  // namespace mllm_kernel::cuda
