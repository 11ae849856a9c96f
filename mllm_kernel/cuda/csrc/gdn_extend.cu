// gdn_extend: the gated delta net (Qwen3-Next / Qwen3.5 linear attention) over packed
// variable-length sequences (prefill / extend), chunk by chunk; the math is in
// gdn_chunk.cuh, the gates and the state pool's rules in gdn.cuh.
//
// Design. One CTA of 4 warps per (sequence, value head, 32 state rows) walks its
// sequence's chunks of 64 tokens in order, its 32 x K slice of the state in registers
// (fp32, as mma accumulators: warp w holds columns [w K / 4, (w + 1) K / 4) of all 32
// rows). Per chunk, between barriers:
//
//   1. stage: the chunk's k rows to shared memory (raw, with 1 / |k|), its gates (the
//      cumulated log decay, beta), the state entering it as bf16 hi / lo (S0);
//   2. project: each warp, for its 16 tokens: k S0^T and q S0^T on tensor cores (q's
//      fragments straight from global memory, |q| from them: q is only ever the A
//      operand of its own warp's rows); the right-hand sides
//      R = beta (v - e^G rk k S0^T) to shared memory, the output's state part in
//      registers;
//   3. scores: each warp, its 16 rows of K K^T (the strictly lower A of the solve, fp32)
//      and of Q K^T (the causal scores P, as hi / lo): only the tiles at or below the
//      diagonal;
//   4. solve: (I + A) d = R in fp32, by 16-row blocks (the diagonal blocks inverted at
//      once, a warp each), and d and d' = e^{G_last - G} rk d stored as hi / lo;
//   5. finish: each warp adds P d to its 16 output rows and stores them; then the state
//      decays by e^{G_last} and takes d'^T K, on tensor cores.
//
// Every global load of a step goes out as one batch before any is used (the step waits
// for memory once, not once per k step): q's fragments for all of K, v's pairs with
// them, the chunk's k rows; a token past the chunk reads the chunk's last and is zeroed.
//
// The state is read from the pool once and written once per call; nothing is atomic on
// it, and the result does not depend on the schedule. Shared memory: 64 KiB for bf16
// inputs and K = 128 (three CTAs an SM), regions reused between the steps.
//
// This is the fused path. For a few long sequences its walk (~16 us a chunk: five steps
// between barriers, each waiting on the last) is the whole time; gdn_extend_split.cu's
// split path moves everything but the products with the state out of the walk, and
// reuses this file's checks (check_call) and steps 1-4 (stage, scores, solve).
#include <tvm/ffi/optional.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "mllm_kernel/cuda/gdn.cuh"
#include "mllm_kernel/cuda/gdn_chunk.cuh"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace gdn_extend_impl {

using gdn::kChunk;
inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * kWarpSize;
/// State rows (value indices) per CTA: every head_v_dim is a multiple.
inline constexpr int kBlockV = 32;
static_assert(kChunk == 16 * kWarps, "a warp owns 16 tokens of a chunk");

/// A [tokens, heads, dim] tensor with a contiguous last dim (strides in elements).
struct Rows {
  void* data = nullptr;
  int64_t stride_t = 0, stride_h = 0;

  template <typename T>
  __device__ __forceinline__ T* at(int64_t t, int64_t h) const {
    return static_cast<T*>(data) + t * stride_t + h * stride_h;
  }
};

struct Params {
  Rows q, k, v, out;
  gdn::Gates gates;  // per token: stride_n steps tokens
  void* state = nullptr;
  int64_t state_stride_slot = 0, state_stride_head = 0, pool_size = 0;
  const void* indices = nullptr;
  int64_t indices_stride = 0;
  bool indices_int64 = false;
  const void* cu_seqlens = nullptr;
  int64_t cu_seqlens_stride = 0;
  bool cu_seqlens_int64 = false;
  int64_t total_tokens = 0;
  int32_t* errors = nullptr;  // [2]: indices past the pool, sequences outside the tokens
  int num_v_heads = 0, heads_per_key = 1, slices = 1;
  float scale = 1.0f;
  bool l2norm = true;
  bool vector_k = true;  // k's rows allow 16-byte loads
  bool vector_q = true;  // q's and v's rows: the same, for the split path's copies
  bool vector_v = true;
  bool pairs_q = true;  // q's, v's, out's rows allow 4-byte loads and stores of pairs
  bool pairs_v = true;
  bool pairs_out = true;
};

/// Shared memory of a CTA for inputs T and head_k_dim K: three regions, each reused by
/// the steps that follow the one that filled it (design note), plus the scalars.
template <typename T, int K>
struct Layout {
  static constexpr bool kSplitInputs = std::is_same_v<T, fp16_t>;  // fp16: hi + lo
  using KeyTile = gdn::Tile<kChunk, K>;
  using StateTile = gdn::Tile<kBlockV, K>;
  using ScoreTile = gdn::Tile<kChunk, kChunk>;
  using DeltaTile = gdn::Tile<kChunk, kBlockV>;
  // fp32 rows: a stride of 8 mod 32 words spreads a fragment's float2 stores over the banks.
  static constexpr int kGramStride = kChunk + 8;
  static constexpr int kResidualStride = kBlockV + 8;

  static constexpr int kKeyBytes = (kSplitInputs ? 2 : 1) * KeyTile::kBytes;
  // S0 (steps 1-2), then A (3-4), then d (4-5).
  static constexpr int kStateRegionBytes =
      std::max({2 * StateTile::kBytes, kChunk * kGramStride * 4, 2 * DeltaTile::kBytes});
  static constexpr int kScoreBytes = 2 * ScoreTile::kBytes;
  // R (steps 2-4), then d' (4-5).
  static constexpr int kResidualBytes =
      std::max(kChunk * kResidualStride * 4, 2 * DeltaTile::kBytes);

  static constexpr int kStateRegion = kKeyBytes;
  static constexpr int kScores = kStateRegion + kStateRegionBytes;
  static constexpr int kResidual = kScores + kScoreBytes;
  static constexpr int kScalars = kResidual + kResidualBytes;
  static constexpr int kBytes = kScalars + 4 * kChunk * 4;
};

/// The views of a CTA's shared memory (Layout's regions).
template <typename T, int K>
struct Shared {
  using L = Layout<T, K>;
  typename L::KeyTile key_hi, key_lo;          // the chunk's k rows (key_lo: fp16 inputs)
  typename L::StateTile state_hi, state_lo;    // S0
  float* gram;                                 // A, fp32 [kChunk][kGramStride]
  typename L::DeltaTile delta_hi, delta_lo;    // d [token][row]
  typename L::ScoreTile score_hi, score_lo;    // P
  float* residual;                             // R, fp32 [kChunk][kResidualStride]
  typename L::DeltaTile update_hi, update_lo;  // d' [token][row]
  gdn::ChunkScalars scalars;

  __device__ explicit Shared(char* base) {
    auto u16 = [&](int offset) { return reinterpret_cast<uint16_t*>(base + offset); };
    key_hi.data = u16(0);
    key_lo.data = u16(L::KeyTile::kBytes);  // used only when the inputs split
    state_hi.data = u16(L::kStateRegion);
    state_lo.data = u16(L::kStateRegion + L::StateTile::kBytes);
    gram = reinterpret_cast<float*>(base + L::kStateRegion);
    delta_hi.data = u16(L::kStateRegion);
    delta_lo.data = u16(L::kStateRegion + L::DeltaTile::kBytes);
    score_hi.data = u16(L::kScores);
    score_lo.data = u16(L::kScores + L::ScoreTile::kBytes);
    residual = reinterpret_cast<float*>(base + L::kResidual);
    update_hi.data = u16(L::kResidual);
    update_lo.data = u16(L::kResidual + L::DeltaTile::kBytes);
    float* scalars_base = reinterpret_cast<float*>(base + L::kScalars);
    scalars = {scalars_base, scalars_base + kChunk, scalars_base + 2 * kChunk,
               scalars_base + 3 * kChunk};
  }
};

/// A CTA's work: sequence n, value head hv (key head hk), its first state row v0.
struct Work {
  int64_t n;
  int hv, hk, v0;
  bool counts;  // the sequence's first CTA: the one that counts its errors
};

__device__ __forceinline__ Work work_of(const Params& p) {
  // 1-D grid (no 65535 limit on sequences): a head's slices, then heads, then sequences,
  // so that the CTAs reading the same k and q rows run together.
  const int64_t cta = blockIdx.x;
  const int slice = static_cast<int>(cta % p.slices);
  const int64_t seq_head = cta / p.slices;
  Work w;
  w.n = seq_head / p.num_v_heads;
  w.hv = static_cast<int>(seq_head - w.n * p.num_v_heads);
  w.hk = w.hv / p.heads_per_key;
  w.v0 = slice * kBlockV;
  w.counts = slice == 0 && w.hv == 0 && threadIdx.x == 0;
  return w;
}

/// A warp's fragments of the CTA's 32 x K state slice: [row tile][column tile][4] in
/// mma's C layout (rows 16 mt + g (+ 8), columns col0 + 8 nt + 2 t (+ 1)).
template <int K>
using StateFragments = float[2][K / 32][4];

/// Where the lane's elements of the state slice lie: (row, column) of entry [mt][nt][2 h].
struct FragmentPlace {
  int row0, col0;  // row 16 mt + 8 h + row0, column 8 nt + col0
};

template <int K>
__device__ __forceinline__ FragmentPlace state_place() {
  const int lane = gdn::lane_id(), warp = static_cast<int>(threadIdx.x) / kWarpSize;
  return {lane / 4, warp * (K / 4) + 2 * (lane % 4)};
}

/// The state slice from `rows` (the pool's state of the sequence and head at row v0), or
/// every element `fill` when not `held`.
template <typename S, int K>
__device__ __forceinline__ void load_state(const S* rows, bool held, float fill,
                                           StateFragments<K>& s) {
  const FragmentPlace at = state_place<K>();
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < K / 32; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const S* pair = rows + (16 * mt + 8 * h + at.row0) * K + 8 * nt + at.col0;
        float x0 = fill, x1 = fill;
        if (held) {
          if constexpr (std::is_same_v<S, fp32_t>) {
            const float2 v = *reinterpret_cast<const float2*>(pair);
            x0 = v.x;
            x1 = v.y;
          } else {
            const uint32_t bits = *reinterpret_cast<const uint32_t*>(pair);
            x0 = __uint_as_float(bits << 16);
            x1 = __uint_as_float(bits & 0xffff0000u);
          }
        }
        s[mt][nt][2 * h] = x0;
        s[mt][nt][2 * h + 1] = x1;
      }
    }
  }
}

template <typename S, int K>
__device__ __forceinline__ void store_state(S* rows, const StateFragments<K>& s) {
  const FragmentPlace at = state_place<K>();
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < K / 32; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        S* pair = rows + (16 * mt + 8 * h + at.row0) * K + 8 * nt + at.col0;
        if constexpr (std::is_same_v<S, fp32_t>) {
          *reinterpret_cast<float2*>(pair) = make_float2(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]);
        } else {
          const __nv_bfloat162 v = __floats2bfloat162_rn(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]);
          *reinterpret_cast<__nv_bfloat162*>(pair) = v;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// 1. stage
// ---------------------------------------------------------------------------

/// The chunk's `count` k rows from token c0 into the key tiles (zeros past them), each
/// row by two threads of 16-byte vectors (the pair's vectors adjacent), with 1 / |k|. The
/// loads go out as one batch (a row past the chunk reads the chunk's last, zeroed).
template <typename T, int K>
__device__ __forceinline__ void stage_keys(const Params& p, const Shared<T, K>& sm, const Work& wk,
                                           int64_t c0, int count) {
  constexpr int kVectors = K / 16;  // a thread's 16-byte vectors
  const int row = static_cast<int>(threadIdx.x) / 2, part = static_cast<int>(threadIdx.x) % 2;
  const bool valid = row < count;
  const T* src = p.k.at<const T>(c0 + min(row, count - 1), wk.hk) + 8 * part;
  uint4 raw[kVectors];
  if (p.vector_k) {
#pragma unroll
    for (int i = 0; i < kVectors; ++i) raw[i] = *reinterpret_cast<const uint4*>(src + 16 * i);
  } else {
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const Vec<T, 8> x = gdn::load_elements<T, 8>(src + 16 * i, false);
      memcpy(&raw[i], &x, sizeof(x));
    }
  }
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const uint32_t words[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x0, x1;
      gdn::input_pair<T>(valid ? words[e] : 0u, x0, x1, hi[e], lo[e]);
      sq = fmaf(x0, x0, fmaf(x1, x1, sq));
    }
    const int col = 16 * i + 8 * part;
    *reinterpret_cast<uint4*>(sm.key_hi.at(row, col)) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    if constexpr (Layout<T, K>::kSplitInputs) {
      *reinterpret_cast<uint4*>(sm.key_lo.at(row, col)) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
  }
  sq += __shfl_xor_sync(0xffffffffu, sq, 1);
  if (part == 0) sm.scalars.inv_norm_k[row] = p.l2norm ? gdn::l2_inv_norm(sq) : 1.0f;
}

/// Warp 0: the chunk's gates, two tokens a lane; tokens past `count` neither decay nor
/// update (g = 0, beta = 0), so they leave the state as it is.
__device__ __forceinline__ void stage_gates(const Params& p, const gdn::ChunkScalars& sc,
                                            const Work& wk, int64_t c0, int count) {
  const int lane = gdn::lane_id();
  float log_decay[2] = {0.0f, 0.0f}, beta[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = lane + kWarpSize * h;
    if (i < count) {
      const gdn::GateValues gate =
          gdn::gate_values(p.gates, gdn::load_raw_gates(p.gates, c0 + i, 0, wk.hv));
      log_decay[h] = gate.log_decay;
      beta[h] = gate.beta;
    }
  }
  gdn::warp_prefix_sum_64(log_decay[0], log_decay[1]);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = lane + kWarpSize * h;
    sc.log_decay[i] = log_decay[h];
    sc.decay[i] = expf(log_decay[h]);
    sc.beta[i] = beta[h];
  }
}

/// The state slice entering the chunk, as S0 hi / lo.
template <typename T, int K>
__device__ __forceinline__ void stage_state(const Shared<T, K>& sm, const StateFragments<K>& s) {
  const FragmentPlace at = state_place<K>();
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < K / 32; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t hi, lo;
        gdn::split_pair(s[mt][nt][2 * h], s[mt][nt][2 * h + 1], hi, lo);
        const int row = 16 * mt + 8 * h + at.row0, col = 8 * nt + at.col0;
        sm.state_hi.store_pair(row, col, hi);
        sm.state_lo.store_pair(row, col, lo);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// 2. project
// ---------------------------------------------------------------------------

/// Loads pairs of 16-bit elements at (row[h], column col(c, h)) for c < kPairs, h < 2, as
/// packed bits, zero where row h is not `valid[h]` (its pointer must still be readable):
/// one batch of loads, all issued before any is used, on one of two branch-free paths
/// (4-byte loads when `aligned`, else two 2-byte loads a pair).
template <int kPairs, typename Col>
__device__ __forceinline__ void load_pairs(const void* const (&row)[2], const bool (&valid)[2],
                                           bool aligned, Col&& col, uint32_t (&bits)[kPairs][2]) {
  if (aligned) {
#pragma unroll
    for (int c = 0; c < kPairs; ++c) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        bits[c][h] =
            *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(row[h]) + col(c, h));
      }
    }
  } else {
#pragma unroll
    for (int c = 0; c < kPairs; ++c) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint16_t* pair = static_cast<const uint16_t*>(row[h]) + col(c, h);
        bits[c][h] = pair[0] | (static_cast<uint32_t>(pair[1]) << 16);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kPairs; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) bits[c][h] = valid[h] ? bits[c][h] : 0u;
  }
}

/// The rows of `x` ([tokens, heads, dim]) at the lane's two tokens of the warp's 16 (g and
/// g + 8), head `head`, from column col0; a token past the chunk reads the chunk's last
/// (never used: load_pairs zeroes it).
template <typename T>
__device__ __forceinline__ void lane_rows(const Rows& x, int64_t c0, int count, int head, int col0,
                                          const void* (&row)[2], bool (&valid)[2]) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, g = gdn::lane_id() / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = 16 * warp + 8 * h + g;
    valid[h] = i < count;
    row[h] = x.at<const T>(c0 + min(i, count - 1), head) + col0;
  }
}

/// The raw bits of the warp's q A fragments over all of K, [k step][register] in mma's A
/// layout (register r: row g + 8 (r % 2), columns 2 t + 8 (r / 2) of the step): one batch
/// of loads.
template <typename T, int K>
struct QueryBits {
  uint32_t bits[K / 16][4];
};

template <typename T, int K>
__device__ __forceinline__ QueryBits<T, K> load_query_bits(const Params& p, const Work& wk,
                                                           int64_t c0, int count) {
  const void* row[2];
  bool valid[2];
  lane_rows<T>(p.q, c0, count, wk.hk, 0, row, valid);
  const int t = gdn::lane_id() % 4;
  uint32_t pairs[K / 8][2];  // pair c: step c / 2, columns 2 t + 8 (c % 2)
  load_pairs<K / 8>(
      row, valid, p.pairs_q, [&](int c, int) { return 16 * (c / 2) + 8 * (c % 2) + 2 * t; }, pairs);
  QueryBits<T, K> q;
#pragma unroll
  for (int c = 0; c < K / 8; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) q.bits[c / 2][h + 2 * (c % 2)] = pairs[c][h];
  }
  return q;
}

/// The A fragment of step `step` of q as bf16 hi (and lo for fp16 inputs); adds the
/// squares of the lane's elements to sq[0] (row g) and sq[1] (row g + 8).
template <typename T, int K>
__device__ __forceinline__ void query_fragment(const QueryBits<T, K>& q, int step,
                                               uint32_t (&hi)[4], uint32_t (&lo)[4],
                                               float (&sq)[2]) {
#pragma unroll
  for (int reg = 0; reg < 4; ++reg) {
    float x0, x1;
    gdn::input_pair<T>(q.bits[step][reg], x0, x1, hi[reg], lo[reg]);
    sq[reg % 2] = fmaf(x0, x0, fmaf(x1, x1, sq[reg % 2]));
  }
}

/// The scale / |q| of the lane's rows g and g + 8 (`rq`), from the sums of the squares of
/// the lane's elements of them (`sq`, query_fragment's), which it sums over the rows' 4 lanes.
__device__ __forceinline__ void query_row_scales(const Params& p, float (&sq)[2], float (&rq)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sq[h] += __shfl_xor_sync(0xffffffffu, sq[h], 1);
    sq[h] += __shfl_xor_sync(0xffffffffu, sq[h], 2);
    rq[h] = (p.l2norm ? gdn::l2_inv_norm(sq[h]) : 1.0f) * p.scale;
  }
}

/// The warp's 16 tokens against S0: R = beta (v - e^G rk k S0^T) to shared memory, and
/// the output's state part e^G rq q S0^T in `o` ([v tile][4], C layout); `rq` the rows'
/// scale / |q|.
template <typename T, int K>
__device__ __forceinline__ void project_state(const Params& p, const Shared<T, K>& sm,
                                              const Work& wk, int64_t c0, int count,
                                              float (&o)[kBlockV / 8][4], float (&rq)[2]) {
  using L = Layout<T, K>;
  constexpr int kTiles = kBlockV / 8;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = gdn::lane_id();
  const int g = lane / 4, t = lane % 4, m0 = 16 * warp;
  const QueryBits<T, K> q = load_query_bits<T, K>(p, wk, c0, count);
  // v at the lane's rows and the C fragments' columns, loaded with q, used after the mma
  const void* v_row[2];
  bool v_valid[2];
  lane_rows<T>(p.v, c0, count, wk.hv, wk.v0, v_row, v_valid);
  uint32_t v_bits[kTiles][2];
  load_pairs<kTiles>(
      v_row, v_valid, p.pairs_v, [&](int nt, int) { return 8 * nt + 2 * t; }, v_bits);
  float ks[kTiles][4] = {}, qs[kTiles][4] = {};
  float sq[2] = {0.0f, 0.0f};
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t k_hi[4], k_lo[4], q_hi[4], q_lo[4];
    gdn::load_a(k_hi, sm.key_hi, m0, k0);
    if constexpr (L::kSplitInputs) gdn::load_a(k_lo, sm.key_lo, m0, k0);
    query_fragment<T, K>(q, k0 / 16, q_hi, q_lo, sq);
#pragma unroll
    for (int n0 = 0; n0 < kBlockV; n0 += 16) {
      uint32_t s_hi[4], s_lo[4];
      gdn::load_b(s_hi, sm.state_hi, n0, k0);
      gdn::load_b(s_lo, sm.state_lo, n0, k0);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int nt = n0 / 8 + h;
        gdn::mma_split<L::kSplitInputs, true>(ks[nt], k_hi, k_lo, s_hi[2 * h], s_hi[2 * h + 1],
                                              s_lo[2 * h], s_lo[2 * h + 1]);
        gdn::mma_split<L::kSplitInputs, true>(qs[nt], q_hi, q_lo, s_hi[2 * h], s_hi[2 * h + 1],
                                              s_lo[2 * h], s_lo[2 * h + 1]);
      }
    }
  }
  const gdn::ChunkScalars& sc = sm.scalars;
  query_row_scales(p, sq, rq);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = m0 + 8 * h + g;
    const float beta = sc.beta[i], k_coef = sc.decay[i] * sc.inv_norm_k[i];
    const float q_coef = sc.decay[i] * rq[h];
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      const int col = 8 * nt + 2 * t;
      float v0, v1;
      uint32_t unused_hi, unused_lo;
      gdn::input_pair<T>(v_bits[nt][h], v0, v1, unused_hi, unused_lo);
      *reinterpret_cast<float2*>(sm.residual + i * L::kResidualStride + col) = make_float2(
          beta * (v0 - k_coef * ks[nt][2 * h]), beta * (v1 - k_coef * ks[nt][2 * h + 1]));
      o[nt][2 * h] = q_coef * qs[nt][2 * h];
      o[nt][2 * h + 1] = q_coef * qs[nt][2 * h + 1];
    }
  }
}

// ---------------------------------------------------------------------------
// 3. scores
// ---------------------------------------------------------------------------

/// acc = (the warp's 16 rows of X) K^T over the key tiles, for the column tiles at or
/// below the diagonal (8-column tile nt for nt < 2 (warp + 1)); `load_rows(k0, hi, lo)`
/// gives X's A fragment at columns k0.., `kRowsLo` whether it has a lo part.
template <typename T, int K, bool kRowsLo, typename LoadRows>
__device__ __forceinline__ void rows_times_keys(const Shared<T, K>& sm, LoadRows&& load_rows,
                                                float (&acc)[kChunk / 8][4]) {
  constexpr bool kKeyLo = Layout<T, K>::kSplitInputs;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
#pragma unroll
  for (int nt = 0; nt < kChunk / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  }
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t x_hi[4], x_lo[4];
    load_rows(k0, x_hi, x_lo);
#pragma unroll
    for (int j = 0; j < kWarps; ++j) {
      if (j > warp) continue;  // above the diagonal
      uint32_t k_hi[4], k_lo[4];
      gdn::load_b(k_hi, sm.key_hi, 16 * j, k0);
      if constexpr (kKeyLo) gdn::load_b(k_lo, sm.key_lo, 16 * j, k0);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        gdn::mma_split<kRowsLo, kKeyLo>(acc[2 * j + h], x_hi, x_lo, k_hi[2 * h], k_hi[2 * h + 1],
                                        k_lo[2 * h], k_lo[2 * h + 1]);
      }
    }
  }
}

/// The warp's 16 rows of A (fp32: beta_i e^{G_i - G_j} rk_i rk_j k_i.k_j below the
/// diagonal, 0 on it and above) and of P (hi / lo: rq_i rk_j e^{G_i - G_j} q_i.k_j on and
/// below the diagonal, 0 above), each up to the diagonal's 16-column tile: P into `p_hi`,
/// `p_lo` (tiles with store_pair: sm.score_hi / lo, or kernel A's workspace). `rq`: the
/// rows' scale / |q|, as project_state gives it, or (kScalesQueries) computed here from
/// the q rows this loads (for a kernel with no other use of them).
template <typename T, int K, bool kScalesQueries = false, class ScoreTiles>
__device__ __forceinline__ void write_scores(const Params& p, const Shared<T, K>& sm,
                                             const Work& wk, int64_t c0, int count, float (&rq)[2],
                                             const ScoreTiles& p_hi, const ScoreTiles& p_lo) {
  using L = Layout<T, K>;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = gdn::lane_id();
  const int g = lane / 4, t = lane % 4, m0 = 16 * warp;
  const gdn::ChunkScalars& sc = sm.scalars;
  float acc[kChunk / 8][4];

  rows_times_keys<T, K, L::kSplitInputs>(
      sm,
      [&](int k0, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
        gdn::load_a(hi, sm.key_hi, m0, k0);
        if constexpr (L::kSplitInputs) gdn::load_a(lo, sm.key_lo, m0, k0);
      },
      acc);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = m0 + 8 * h + g;
    const float coef = sc.beta[i] * sc.inv_norm_k[i], G = sc.log_decay[i];
#pragma unroll
    for (int nt = 0; nt < kChunk / 8; ++nt) {
      if (nt >= 2 * (warp + 1)) continue;
      float value[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = 8 * nt + 2 * t + e;
        value[e] =
            i > j ? coef * sc.inv_norm_k[j] * expf(G - sc.log_decay[j]) * acc[nt][2 * h + e] : 0.0f;
      }
      *reinterpret_cast<float2*>(sm.gram + i * L::kGramStride + 8 * nt + 2 * t) =
          make_float2(value[0], value[1]);
    }
  }

  const QueryBits<T, K> q = load_query_bits<T, K>(p, wk, c0, count);
  float sq[2] = {0.0f, 0.0f};
  rows_times_keys<T, K, L::kSplitInputs>(
      sm,
      [&](int k0, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
        query_fragment<T, K>(q, k0 / 16, hi, lo, sq);
      },
      acc);
  if constexpr (kScalesQueries) query_row_scales(p, sq, rq);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = m0 + 8 * h + g;
    const float G = sc.log_decay[i];
#pragma unroll
    for (int nt = 0; nt < kChunk / 8; ++nt) {
      if (nt >= 2 * (warp + 1)) continue;
      float value[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = 8 * nt + 2 * t + e;
        value[e] = i >= j
                       ? rq[h] * sc.inv_norm_k[j] * expf(G - sc.log_decay[j]) * acc[nt][2 * h + e]
                       : 0.0f;
      }
      uint32_t hi, lo;
      gdn::split_pair(value[0], value[1], hi, lo);
      p_hi.store_pair(i, 8 * nt + 2 * t, hi);
      p_lo.store_pair(i, 8 * nt + 2 * t, lo);
    }
  }
}

// ---------------------------------------------------------------------------
// 4. solve
// ---------------------------------------------------------------------------

/// d = (I + A)^-1 R in fp32 (over R), then d and d' = e^{G_last - G_j} rk_j d_j as hi / lo
/// over A and R: each thread reads its 16 elements of d, and writes after every read.
template <typename T, int K>
__device__ __forceinline__ void solve_chunk(const Shared<T, K>& sm) {
  using L = Layout<T, K>;
  constexpr int kPerThread = kChunk * kBlockV / kThreads;
  const gdn::ChunkScalars& sc = sm.scalars;
  gdn::solve_unit_lower(sm.gram, L::kGramStride, sm.residual, L::kResidualStride);
  // element e of a thread: row threadIdx.x / 32 + 4 e, column lane (a warp's row whole)
  const int row0 = static_cast<int>(threadIdx.x) / kBlockV, v = gdn::lane_id();
  float d[kPerThread];
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {
    d[e] = sm.residual[(row0 + kWarps * e) * L::kResidualStride + v];
  }
  __syncthreads();
  const float last = sc.log_decay[kChunk - 1];
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {
    const int j = row0 + kWarps * e;
    bf16_t hi, lo;
    gdn::split_one(d[e], hi, lo);
    *sm.delta_hi.at(j, v) = __bfloat16_as_ushort(hi);
    *sm.delta_lo.at(j, v) = __bfloat16_as_ushort(lo);
    gdn::split_one(expf(last - sc.log_decay[j]) * sc.inv_norm_k[j] * d[e], hi, lo);
    *sm.update_hi.at(j, v) = __bfloat16_as_ushort(hi);
    *sm.update_lo.at(j, v) = __bfloat16_as_ushort(lo);
  }
}

// ---------------------------------------------------------------------------
// 5. finish
// ---------------------------------------------------------------------------

/// o += P d for the warp's 16 tokens, then stores those within the chunk.
template <typename T, int K>
__device__ __forceinline__ void finish_output(const Params& p, const Shared<T, K>& sm,
                                              const Work& wk, int64_t c0, int count,
                                              float (&o)[kBlockV / 8][4]) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = gdn::lane_id();
  const int g = lane / 4, t = lane % 4, m0 = 16 * warp;
#pragma unroll
  for (int j = 0; j < kWarps; ++j) {
    if (j > warp) continue;  // P is causal
    uint32_t p_hi[4], p_lo[4];
    gdn::load_a(p_hi, sm.score_hi, m0, 16 * j);
    gdn::load_a(p_lo, sm.score_lo, m0, 16 * j);
#pragma unroll
    for (int n0 = 0; n0 < kBlockV; n0 += 16) {
      uint32_t d_hi[4], d_lo[4];
      gdn::load_b_trans(d_hi, sm.delta_hi, 16 * j, n0);
      gdn::load_b_trans(d_lo, sm.delta_lo, 16 * j, n0);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        gdn::mma_split<true, true>(o[n0 / 8 + h], p_hi, p_lo, d_hi[2 * h], d_hi[2 * h + 1],
                                   d_lo[2 * h], d_lo[2 * h + 1]);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = m0 + 8 * h + g;
    if (i >= count) continue;
    T* row = p.out.at<T>(c0 + i, wk.hv) + wk.v0;
#pragma unroll
    for (int nt = 0; nt < kBlockV / 8; ++nt) {
      T* pair = row + 8 * nt + 2 * t;
      const T x0 = from_float<T>(o[nt][2 * h]), x1 = from_float<T>(o[nt][2 * h + 1]);
      if (p.pairs_out) {
        Vec<T, 2> v;
        v[0] = x0;
        v[1] = x1;
        v.store(pair);
      } else {
        pair[0] = x0;
        pair[1] = x1;
      }
    }
  }
}

/// S = e^{G_last} S + d'^T K over the chunk's 16-token blocks that hold tokens.
template <typename T, int K>
__device__ __forceinline__ void update_state(const Shared<T, K>& sm, int count,
                                             StateFragments<K>& s) {
  constexpr bool kKeyLo = Layout<T, K>::kSplitInputs;
  const int col0 = static_cast<int>(threadIdx.x) / kWarpSize * (K / 4);
  const float decay = sm.scalars.decay[kChunk - 1];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < K / 32; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] *= decay;
    }
  }
#pragma unroll
  for (int k0 = 0; k0 < kChunk; k0 += 16) {
    if (k0 >= count) break;  // d' is 0 past the tokens
    uint32_t u_hi[2][4], u_lo[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      gdn::load_a_trans(u_hi[mt], sm.update_hi, 16 * mt, k0);
      gdn::load_a_trans(u_lo[mt], sm.update_lo, 16 * mt, k0);
    }
#pragma unroll
    for (int n0 = 0; n0 < K / 4; n0 += 16) {
      uint32_t k_hi[4], k_lo[4];
      gdn::load_b_trans(k_hi, sm.key_hi, k0, col0 + n0);
      if constexpr (kKeyLo) gdn::load_b_trans(k_lo, sm.key_lo, k0, col0 + n0);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          gdn::mma_split<true, kKeyLo>(s[mt][n0 / 8 + h], u_hi[mt], u_lo[mt], k_hi[2 * h],
                                       k_hi[2 * h + 1], k_lo[2 * h], k_lo[2 * h + 1]);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------

template <typename T, typename S, int K>
__global__ void __launch_bounds__(kThreads, K <= 128 ? 3 : 2) extend_chunks(const Params p) {
  extern __shared__ __align__(16) char shared_bytes[];
  const Shared<T, K> sm(shared_bytes);
  const Work wk = work_of(p);

  const int64_t bos = gdn::load_index(p.cu_seqlens, p.cu_seqlens_int64, p.cu_seqlens_stride, wk.n);
  const int64_t eos =
      gdn::load_index(p.cu_seqlens, p.cu_seqlens_int64, p.cu_seqlens_stride, wk.n + 1);
  const bool in_range = 0 <= bos && bos <= eos && eos <= p.total_tokens;
  const int64_t index = gdn::load_index(p.indices, p.indices_int64, p.indices_stride, wk.n);
  const gdn::Slot slot = gdn::classify_slot(index, p.pool_size);
  if (wk.counts && p.errors != nullptr) {
    if (slot == gdn::Slot::kOutOfRange) atomicAdd(p.errors, 1);
    if (!in_range) atomicAdd(p.errors + 1, 1);
  }
  if (!in_range || bos == eos) return;  // the whole CTA: no barrier is left waiting

  const bool held = slot == gdn::Slot::kState;
  S* rows =
      static_cast<S*>(p.state) + (held ? index * p.state_stride_slot + wk.hv * p.state_stride_head +
                                             static_cast<int64_t>(wk.v0) * K
                                       : 0);
  StateFragments<K> s;
  load_state<S, K>(rows, held, gdn::missing_state(slot), s);

  for (int64_t c0 = bos; c0 < eos; c0 += kChunk) {
    const int count = static_cast<int>(std::min<int64_t>(kChunk, eos - c0));
    stage_keys<T, K>(p, sm, wk, c0, count);
    if (threadIdx.x < kWarpSize) stage_gates(p, sm.scalars, wk, c0, count);
    stage_state<T, K>(sm, s);
    __syncthreads();
    float o[kBlockV / 8][4], rq[2];
    project_state<T, K>(p, sm, wk, c0, count, o, rq);
    __syncthreads();  // S0 read: its region takes A
    write_scores<T, K>(p, sm, wk, c0, count, rq, sm.score_hi, sm.score_lo);
    __syncthreads();
    solve_chunk<T, K>(sm);
    __syncthreads();
    finish_output<T, K>(p, sm, wk, c0, count, o);
    update_state<T, K>(sm, count, s);
    __syncthreads();  // the next chunk's stage overwrites what these read
  }
  if (held) store_state<S, K>(rows, s);
}

template <typename T, typename S, int K>
void launch(const Params& p, int64_t sequences, DLDevice device) {
  constexpr int kShared = Layout<T, K>::kBytes;
  const std::size_t allowed = max_shared_memory_per_block(device);
  RuntimeCheck(static_cast<std::size_t>(kShared) <= allowed, "gdn_extend: head_k_dim ", K, " with ",
               std::is_same_v<T, fp16_t> ? "float16" : "bfloat16", " inputs needs ", kShared,
               " bytes of shared memory per block; this GPU allows ", allowed,
               (std::is_same_v<T, fp16_t> ? " (bfloat16 inputs need less)" : ""));
  const int64_t ctas = sequences * p.num_v_heads * p.slices;
  RuntimeCheck(ctas < (int64_t{1} << 31), "gdn_extend: at most 2^31 - 1 CTAs (sequences x ",
               "num_v_heads x head_v_dim / ", kBlockV, "), got ", ctas, "; split the batch");
  if (ctas == 0) return;
  KernelLauncher(dim3(static_cast<unsigned>(ctas)), dim3(kThreads), device, kShared)(
      extend_chunks<T, S, K>, p);
}

inline Rows rows_of(const TensorView& x) {
  return Rows{data_ptr<char>(x), x.stride(0), x.stride(1)};
}

/// A gate tensor [total_tokens, HV] (stride_n steps tokens) or a per-head parameter
/// [HV] (`per_token` false), as the kernel reads it.
inline gdn::FloatTensor float_tensor(const TensorView& x, bool per_token) {
  gdn::FloatTensor out;
  out.data = data_ptr<char>(x);
  out.type = gdn::float_type(x.dtype());
  out.stride_n = per_token ? x.stride(0) : 0;
  out.stride_h = x.stride(per_token ? 1 : 0);
  return out;
}

/// A call's arguments checked (every rule gdn_extend documents) and turned into the
/// kernels' parameters, for either path.
struct Call {
  Params p;
  int64_t sequences = 0, num_k_heads = 0, head_k_dim = 0, head_v_dim = 0;
  DLDataType dtype, state_dtype;
  DLDevice device;
};

inline Call check_call(TensorView out, TensorView q, TensorView k, TensorView v,
                       tvm::ffi::Optional<TensorView> a, tvm::ffi::Optional<TensorView> b,
                       tvm::ffi::Optional<TensorView> A_log, tvm::ffi::Optional<TensorView> dt_bias,
                       tvm::ffi::Optional<TensorView> g, tvm::ffi::Optional<TensorView> beta,
                       TensorView state_pool, TensorView cache_indices, TensorView cu_seqlens,
                       tvm::ffi::Optional<double> scale, bool use_qk_l2norm,
                       tvm::ffi::Optional<TensorView> errors) {
  SymbolicSize tokens{"total_tokens"}, heads_k{"num_k_heads"}, heads_v{"num_v_heads"},
      dim_k{"head_k_dim"}, dim_v{"head_v_dim"}, pool{"pool_size"}, sequences{"num_sequences"};
  SymbolicDtype dtype, state_dtype;
  SymbolicDevice device;
  TensorMatcher({tokens, heads_k, dim_k})
      .dtype<fp16_t, bf16_t>(dtype)
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(q, "q");
  TensorMatcher({tokens, heads_k, dim_k})
      .dtype(dtype)
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(k, "k");
  TensorMatcher({tokens, heads_v, dim_v})
      .dtype(dtype)
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(v, "v");
  TensorMatcher({tokens, heads_v, dim_v})
      .dtype(dtype)
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(out, "out");
  const int64_t K = dim_k.value(), V = dim_v.value(), H = heads_k.value(), HV = heads_v.value();
  gdn::check_head_dims(K, V, H, HV);
  const auto [decay, update, decay_name, update_name] =
      gdn::check_gate_forms(g, beta, a, b, A_log, dt_bias);
  TensorMatcher({tokens, heads_v})
      .dtype<fp32_t, fp16_t, bf16_t>()
      .device(kDLCUDA, device)
      .verify(decay, decay_name);
  TensorMatcher({tokens, heads_v})
      .dtype<fp32_t, fp16_t, bf16_t>()
      .device(kDLCUDA, device)
      .verify(update, update_name);
  if (!g.has_value()) gdn::check_head_parameters(*A_log, *dt_bias, heads_v, device);
  gdn::check_state_pool(state_pool, pool, heads_v, dim_v, dim_k, state_dtype, device);
  TensorMatcher({sequences})
      .dtype<int32_t, int64_t>()
      .device(kDLCUDA, device)
      .verify(cache_indices, "cache_indices");
  TensorMatcher({kAnySize})
      .dtype<int32_t, int64_t>()
      .device(kDLCUDA, device)
      .verify(cu_seqlens, "cu_seqlens");
  ValueCheck(cu_seqlens.size(0) == sequences.value() + 1,
             "argument 'cu_seqlens': expected num_sequences + 1 = ", sequences.value() + 1,
             " offsets (one more than cache_indices has entries), got ", cu_seqlens.size(0));
  if (scale.has_value()) {
    ValueCheck(std::isfinite(*scale), "argument 'scale': expected a finite number, got ", *scale);
  }

  // Outputs overlap no input (the pool is read and written at the same rows: its own
  // in-place case).
  const tvm::ffi::Optional<TensorView> inputs[] = {
      q, k, v, a, b, A_log, dt_bias, g, beta, cache_indices, cu_seqlens};
  const char* input_names[] = {
      "q", "k", "v", "a", "b", "A_log", "dt_bias", "g", "beta", "cache_indices", "cu_seqlens"};
  for (int i = 0; i < 11; ++i) {
    if (!inputs[i].has_value()) continue;
    verify_output(out, "out", {{*inputs[i], input_names[i]}});
    verify_output(state_pool, "state_pool", {{*inputs[i], input_names[i]}});
  }
  verify_output(out, "out", {{state_pool, "state_pool"}});

  Params p;
  p.q = rows_of(q);
  p.k = rows_of(k);
  p.v = rows_of(v);
  p.out = rows_of(out);
  p.gates.decay = float_tensor(decay, true);
  p.gates.update = float_tensor(update, true);
  p.gates.raw_decay = !g.has_value();
  p.gates.raw_update = !beta.has_value();
  if (p.gates.raw_decay) {
    p.gates.A_log = float_tensor(*A_log, false);
    p.gates.dt_bias = float_tensor(*dt_bias, false);
  }
  p.state = data_ptr<char>(state_pool);
  p.state_stride_slot = state_pool.stride(0);
  p.state_stride_head = state_pool.stride(1);
  p.pool_size = pool.value();
  p.indices = data_ptr<char>(cache_indices);
  p.indices_stride = cache_indices.stride(0);
  p.indices_int64 = is_dtype<int64_t>(cache_indices.dtype());
  p.cu_seqlens = data_ptr<char>(cu_seqlens);
  p.cu_seqlens_stride = cu_seqlens.stride(0);
  p.cu_seqlens_int64 = is_dtype<int64_t>(cu_seqlens.dtype());
  p.total_tokens = tokens.value();
  if (errors.has_value()) {
    TensorMatcher({2})
        .dtype<int32_t>()
        .device(kDLCUDA, device)
        .contiguous()
        .verify(*errors, "errors");
    p.errors = data_ptr<int32_t>(*errors);
  }
  RuntimeCheck(HV < (int64_t{1} << 31), "gdn_extend: at most 2^31 - 1 heads, got ", HV);
  p.num_v_heads = static_cast<int>(HV);
  p.heads_per_key = static_cast<int>(HV / H);
  p.slices = static_cast<int>(V / kBlockV);
  p.scale = static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(double(K)));
  p.l2norm = use_qk_l2norm;
  p.vector_k = gdn::aligned_rows(k, 16);
  p.pairs_q = gdn::aligned_rows(q, 4);
  p.pairs_v = gdn::aligned_rows(v, 4);
  p.pairs_out = gdn::aligned_rows(out, 4);
  p.vector_q = gdn::aligned_rows(q, 16);
  p.vector_v = gdn::aligned_rows(v, 16);
  return Call{p, sequences.value(), H, K, V, dtype.value(), state_dtype.value(), device.value()};
}

}  // namespace gdn_extend_impl

/// The gated delta rule over packed variable-length sequences, chunk by chunk
/// (mllm_kernel.ops.gdn.gdn_extend documents the math and the arguments): out = o,
/// state_pool[cache_indices] updated in place with each sequence's final state. The
/// decay gate comes from (a, A_log, dt_bias) or g, the update gate from b or beta.
/// `scale` None means head_k_dim^-0.5. `errors` (int32 [2], zeroed) counts, when given,
/// indices >= pool_size and sequences whose cu_seqlens range is not within the tokens.
/// The fused path: one kernel walks each sequence's chunks (the design note above).
inline void gdn_extend(TensorView out, TensorView q, TensorView k, TensorView v,
                       tvm::ffi::Optional<TensorView> a, tvm::ffi::Optional<TensorView> b,
                       tvm::ffi::Optional<TensorView> A_log, tvm::ffi::Optional<TensorView> dt_bias,
                       tvm::ffi::Optional<TensorView> g, tvm::ffi::Optional<TensorView> beta,
                       TensorView state_pool, TensorView cache_indices, TensorView cu_seqlens,
                       tvm::ffi::Optional<double> scale, bool use_qk_l2norm,
                       tvm::ffi::Optional<TensorView> errors) {
  using namespace gdn_extend_impl;
  const Call call = check_call(out, q, k, v, a, b, A_log, dt_bias, g, beta, state_pool,
                               cache_indices, cu_seqlens, scale, use_qk_l2norm, errors);
  dispatch_dtype<fp16_t, bf16_t>(call.dtype, "q", [&](auto input_tag) {
    using T = typename decltype(input_tag)::type;
    dispatch_dtype<fp32_t, bf16_t>(call.state_dtype, "state_pool", [&](auto state_tag) {
      using S = typename decltype(state_tag)::type;
      switch (call.head_k_dim) {
        case 64: launch<T, S, 64>(call.p, call.sequences, call.device); break;
        case 128: launch<T, S, 128>(call.p, call.sequences, call.device); break;
        default: launch<T, S, 256>(call.p, call.sequences, call.device); break;
      }
    });
  });
}

}  // namespace mllm_kernel::cuda
