// gdn_extend's split path, for long sequences: what a chunk needs that does not depend on
// the state is computed for every chunk at once (kernel A), so that the walk along a
// sequence (kernel B) is a few products with the state per chunk. Included after
// gdn_extend.cu (the module's sources, in order): it takes that file's checks, gates and
// chunk steps. The algebra is gdn_chunk.cuh's; with T' = (I + A)^-1 diag(beta) and P the
// causal decayed scores (tests/gdn_reference.py: split_chunk),
//
//   d = T' (v - e^G rk (k S0^T)),   o = e^G rq (q S0^T) + P d,
//   S = e^{G_last} S0 + (e^{G_last - G} rk d)^T k.
//
// Kernel A, a CTA of 4 warps per (chunk, value head), writes to a workspace (one block per
// chunk and value head, one per chunk and key head; the layout is Workspace's):
// T' and P as bf16 hi / lo (their 16 x 16 blocks on and below the diagonal only, packed:
// LowerTile), the chunk's per-token scales, v's rows, and q's and k's rows as bf16 (hi /
// lo for fp16 inputs), zero past the chunk's tokens. Its steps are the fused kernel's
// with the state left out (stage, scores) and the solve run on the identity's columns
// (T = (I + A)^-1, 64 x 64 in fp32).
//
// Kernel B, a CTA of 4 warps per (sequence, value head, 32 state rows), walks the
// sequence's chunks in order. A pair of warps holds 16 state rows of the slice, each warp
// one half of K, in registers as mma accumulators; everything is computed transposed
// (state rows as the M dim), so that every product's A operand is the state or an
// accumulator of the step before, split into hi / lo in registers. Per chunk, per warp
// (its half h of K; R and O summed over both halves through shared memory):
//
//   R^T = v^T - (S0 k^T) diag(e^G rk)      O^T = (S0 q^T) diag(e^G rq)     (k loop: half h)
//   d^T = R^T T'^T                                       (both warps of the pair, the same)
//   O^T += d^T P^T                                       (half the token blocks each)
//   S   = e^{G_last} S + (d^T diag(e^{G_last - G} rk)) k                   (columns: half h)
//
// Four warps, one per SM sub-partition, each with half the products (282 mma.sync a chunk
// for bf16 and K = 128, against 504 for a warp holding all of K), and its state in half
// the registers. The pair exchanges its partial sums once a chunk (a named barrier of 64
// threads); the CTA's barriers are only those of the staging.
//
// The next chunk's workspace blocks arrive by cp.async while a chunk computes (two stages
// where they fit in shared memory, else one, refilled as soon as its chunk is done).
// The state is read once and written once; nothing is atomic; deterministic.
//
// The workspace block of chunk c of sequence n is number n + floor(cu_seqlens[n] / 64)
// + c: distinct for sequences in order (each ends before the next begins), and below
// num_sequences + ceil(total_tokens / 64).
//
// The segmented walk. A walk has one CTA per 32 state rows of a head, 4 warps: with few
// sequences and heads (a TP slice of 8 value heads is 32 CTAs) most SMs idle while it
// walks thousands of chunks one after another. The recurrence is affine in the state, so
// a sequence cut into segments of segment_chunks chunks is walked at once, in three
// launches after kernel A:
//
//   end walks   for every segment but the last, at once: its end state from zeros (H_i:
//               kernel B with S0 = 0, no outputs) and its transition M_i (kernel B on
//               the K x K identity's rows with v = 0: a row x becomes x M_i over the
//               segment, as each of the state's rows does without v);
//   combine     per sequence and head, segment by segment: Z_0 = the pool's state,
//               Z_i = Z_{i-1} M_{i-1} + H_{i-1} (fp32 on CUDA cores);
//   output walks every segment at once from its start Z_i, as an unsegmented walk.
//
// The end walks double the walk's products (the transition has K rows) and skip the
// output's (a third of them); the fp32 of every product is kept, so the results are an
// unsegmented walk's to fp32 rounding. The segment blocks hold H_i and M_i, then Z_i in
// H_i's place (Workspace::segment_state); segment i of sequence n is block n +
// floor(cu_seqlens[n] / (64 segment_chunks)) + i, distinct as the chunks' are. The
// grids give every sequence the call's most segments (the CTAs past a sequence's own
// exit at once): the Python rule (segment_chunks) cuts walks only where they are few,
// into as many segments as fill the GPU about once.

#include "mllm_kernel/cuda/cp_async.cuh"

namespace mllm_kernel::cuda {
namespace gdn_split_impl {

using gdn::kChunk;
using gdn_extend_impl::kBlockV;
using gdn_extend_impl::Params;
using gdn_extend_impl::Rows;
using gdn_extend_impl::Work;

/// A 64 x 64 matrix of 16-bit values that is lower triangular by 16 x 16 blocks (T', P),
/// packed: block (rb, cb), cb <= rb, is number rb (rb + 1) / 2 + cb, and each 8 x 8
/// quarter of a block is 128 contiguous bytes, so that the 8 rows ldmatrix reads at once
/// fall in distinct banks without padding. The same layout in the workspace and in
/// shared memory: a stage copies it as it is.
struct LowerTile {
  static constexpr int kBlocks = kChunk / 16 * (kChunk / 16 + 1) / 2;
  static constexpr int kBytes = kBlocks * 16 * 16 * 2;

  uint16_t* data;

  /// Where (row, col) is, in elements; col / 16 <= row / 16. Columns col .. col + 7 of
  /// a row are contiguous where col is a multiple of 8.
  __device__ __forceinline__ static int offset(int row, int col) {
    const int rb = row / 16, cb = col / 16, quarter = 2 * (row % 16 / 8) + col % 16 / 8;
    return (rb * (rb + 1) / 2 + cb) * 256 + quarter * 64 + row % 8 * 8 + col % 8;
  }
  __device__ __forceinline__ uint32_t address(int row, int col) const {
    return static_cast<uint32_t>(__cvta_generic_to_shared(data + offset(row, col)));
  }
  /// Stores a packed pair at (row, col), (row, col + 1); col even. In global memory too
  /// (kernel A writes P into the workspace so): the 32 lanes of an mma C fragment's
  /// pairs fill one 128-byte quarter.
  __device__ __forceinline__ void store_pair(int row, int col, uint32_t pair) const {
    *reinterpret_cast<uint32_t*>(data + offset(row, col)) = pair;
  }
};

/// The workspace: one block per (chunk, value head), then one per (chunk, key head).
/// Offsets are in bytes, each a multiple of 16.
struct Workspace {
  // a value head's block: T' and P as hi / lo LowerTiles, the scales, v [64][V]
  static constexpr int64_t kTHi = 0, kTLo = LowerTile::kBytes, kPHi = 2 * LowerTile::kBytes,
                           kPLo = 3 * LowerTile::kBytes;
  static constexpr int64_t kScales = 4 * LowerTile::kBytes;  // fp32 [4][64]: the Scale rows
  static constexpr int64_t kValues = kScales + 4 * kChunk * 4;
  enum Scale { kKeyCoef = 0, kQueryCoef = 1, kUpdateCoef = 2, kLast = 3 };

  char* data = nullptr;
  int64_t head_bytes = 0, key_bytes = 0, keys = 0;  // keys: where the key blocks start
  int num_v_heads = 0, num_k_heads = 0;
  // Segments (segment_chunks > 0): a sequence's walk cut into runs of segment_chunks
  // chunks (the last shorter), walked at once (design note of the segmented walk). One
  // block per (segment, value head) from `segment_offset` on: a state [V][K] and a transition
  // [K][K], fp32; segment s of sequence n is block n + floor(bos / (64 segment_chunks)) + s.
  // max_segments: the most a sequence of the call can have, ceil(ceil(tokens / 64) /
  // segment_chunks), at least 1 (the grids' count).
  int64_t segment_chunks = 0, max_segments = 1, segment_offset = 0, segment_bytes = 0,
          transition_offset = 0;

  /// The bytes of a call's workspace, and its blocks' sizes.
  static Workspace sized(int64_t sequences, int64_t tokens, int64_t num_k_heads,
                         int64_t num_v_heads, int64_t head_k_dim, int64_t head_v_dim,
                         bool split_inputs, int64_t segment_chunks, int64_t& bytes) {
    Workspace ws;
    const int64_t chunks = (tokens + kChunk - 1) / kChunk, blocks = sequences + chunks;
    ws.head_bytes = kValues + kChunk * head_v_dim * 2;
    ws.key_bytes = (split_inputs ? 4 : 2) * kChunk * head_k_dim * 2;  // q, k (hi, lo)
    ws.keys = blocks * num_v_heads * ws.head_bytes;
    ws.num_v_heads = static_cast<int>(num_v_heads);
    ws.num_k_heads = static_cast<int>(num_k_heads);
    bytes = ws.keys + blocks * num_k_heads * ws.key_bytes;
    if (segment_chunks > 0) {
      ws.segment_chunks = segment_chunks;
      ws.segment_offset = bytes;
      ws.transition_offset = head_v_dim * head_k_dim * 4;
      ws.segment_bytes = (head_v_dim + head_k_dim) * head_k_dim * 4;
      const int64_t most = (chunks + segment_chunks - 1) / segment_chunks;
      bytes += (sequences + most) * num_v_heads * ws.segment_bytes;
      ws.max_segments = std::max<int64_t>(1, most);  // a grid's count: never 0
    }
    return ws;
  }

  __device__ __forceinline__ char* head(int64_t block, int hv) const {
    return data + (block * num_v_heads + hv) * head_bytes;
  }
  __device__ __forceinline__ char* key(int64_t block, int hk) const {
    return data + keys + (block * num_k_heads + hk) * key_bytes;
  }
  /// Segment block `block`'s state [V][K] for value head hv: after the end walks, the
  /// segment before's end state from zeros (block 0 of a sequence: nothing); after the
  /// combine, the segment's start state.
  __device__ __forceinline__ float* segment_state(int64_t block, int hv) const {
    return reinterpret_cast<float*>(data + segment_offset +
                                    (block * num_v_heads + hv) * segment_bytes);
  }
  /// Segment block `block`'s transition [K][K] for value head hv: the product of its
  /// tokens' state maps (a row vector x becomes x times it; the state's rows are such).
  __device__ __forceinline__ float* segment_transition(int64_t block, int hv) const {
    return reinterpret_cast<float*>(data + segment_offset +
                                    (block * num_v_heads + hv) * segment_bytes + transition_offset);
  }
};

/// A key block's rows: q hi, k hi, then (fp16 inputs) q lo, k lo, each [64][K] bf16.
template <int K>
__device__ __forceinline__ uint16_t* key_rows(char* block, int which) {
  return reinterpret_cast<uint16_t*>(block) + which * kChunk * K;
}

/// The sequence's bounds, whether they are within the tokens, its first block, its
/// chunks, and (segmented walks) its segments and first segment block.
struct Sequence {
  int64_t bos, eos, first_block, chunks, segments, first_segment;
  bool in_range;
};

__device__ __forceinline__ Sequence sequence_of(const Params& p, int64_t n,
                                                int64_t segment_chunks = 0) {
  Sequence s;
  s.bos = gdn::load_index(p.cu_seqlens, p.cu_seqlens_int64, p.cu_seqlens_stride, n);
  s.eos = gdn::load_index(p.cu_seqlens, p.cu_seqlens_int64, p.cu_seqlens_stride, n + 1);
  s.in_range = 0 <= s.bos && s.bos <= s.eos && s.eos <= p.total_tokens;
  s.first_block = n + (s.in_range ? s.bos / kChunk : 0);
  s.chunks = s.in_range ? (s.eos - s.bos + kChunk - 1) / kChunk : 0;
  s.segments = segment_chunks > 0 ? (s.chunks + segment_chunks - 1) / segment_chunks : 1;
  s.first_segment = segment_chunks > 0 && s.in_range ? n + s.bos / (kChunk * segment_chunks) : 0;
  return s;
}

// ---------------------------------------------------------------------------
// Kernel A: the state-free factors of every chunk
// ---------------------------------------------------------------------------

/// Kernel A's copies are a thread's 16-byte units, loaded a batch at a time, all before
/// any is stored: one load at a time, each waiting for its data, was a fifth of the
/// kernel's time.
inline constexpr int kCopyBatch = 4;

/// The chunk's `count` rows of x (head `head`) from token c0 as bf16 `hi` (and `lo`, for
/// fp16 inputs) [64][K], zero past them: 8 elements a unit.
template <typename T, int K>
__device__ __forceinline__ void copy_rows(const Rows& x, int head, bool vector, int64_t c0,
                                          int count, uint16_t* hi, uint16_t* lo) {
  constexpr int kUnits = kChunk * K / 8;
  static_assert(kUnits % (kCopyBatch * gdn_extend_impl::kThreads) == 0, "whole batches");
#pragma unroll 1
  for (int first = static_cast<int>(threadIdx.x); first < kUnits;
       first += kCopyBatch * gdn_extend_impl::kThreads) {
    Vec<T, 8> raw[kCopyBatch];
#pragma unroll
    for (int i = 0; i < kCopyBatch; ++i) {
      const int u = first + i * gdn_extend_impl::kThreads, row = u / (K / 8);
      raw[i] = gdn::load_elements<T, 8>(
          x.at<const T>(c0 + min(row, count - 1), head) + 8 * (u % (K / 8)), vector);
    }
#pragma unroll
    for (int i = 0; i < kCopyBatch; ++i) {
      const int u = first + i * gdn_extend_impl::kThreads;
      const int row = u / (K / 8), col = 8 * (u % (K / 8));
      uint32_t words[4], hi_words[4], lo_words[4];
      memcpy(words, &raw[i], sizeof(words));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x0, x1;
        gdn::input_pair<T>(row < count ? words[e] : 0u, x0, x1, hi_words[e], lo_words[e]);
      }
      *reinterpret_cast<uint4*>(hi + row * K + col) =
          make_uint4(hi_words[0], hi_words[1], hi_words[2], hi_words[3]);
      if (lo != nullptr) {
        *reinterpret_cast<uint4*>(lo + row * K + col) =
            make_uint4(lo_words[0], lo_words[1], lo_words[2], lo_words[3]);
      }
    }
  }
}

/// The chunk's `count` v rows (value head hv) as they are, [64][V], zero past them.
template <typename T>
__device__ __forceinline__ void copy_values(const Params& p, int hv, int head_v_dim, int64_t c0,
                                            int count, uint16_t* values) {
  // head_v_dim is 64, 128 or 256: 4, 8 or 16 units a thread, whole batches
  const int units = kChunk * head_v_dim / 8;
#pragma unroll 1
  for (int first = static_cast<int>(threadIdx.x); first < units;
       first += kCopyBatch * gdn_extend_impl::kThreads) {
    uint4 bits[kCopyBatch];
#pragma unroll
    for (int i = 0; i < kCopyBatch; ++i) {
      const int u = first + i * gdn_extend_impl::kThreads, row = u / (head_v_dim / 8);
      const Vec<T, 8> raw = gdn::load_elements<T, 8>(
          p.v.at<const T>(c0 + min(row, count - 1), hv) + 8 * (u % (head_v_dim / 8)), p.vector_v);
      memcpy(&bits[i], &raw, sizeof(bits[i]));
    }
#pragma unroll
    for (int i = 0; i < kCopyBatch; ++i) {
      const int u = first + i * gdn_extend_impl::kThreads;
      const int row = u / (head_v_dim / 8), col = 8 * (u % (head_v_dim / 8));
      *reinterpret_cast<uint4*>(values + row * head_v_dim + col) =
          row < count ? bits[i] : make_uint4(0, 0, 0, 0);
    }
  }
}

/// Kernel A's shared memory: the fused kernel's regions that it uses, packed: the k rows,
/// whose region the solve's right-hand sides take once the scores are written (the next
/// chunk's k rows wait for the solve's last barrier), A, and the scalars; no state, and no
/// scores (P goes straight to the workspace). 36 KiB for bf16 inputs at K = 128, where the
/// fused layout has 63.5: four CTAs an SM instead of three (its 128 registers a thread
/// allow four).
template <typename T, int K>
struct FactorLayout {
  using L = gdn_extend_impl::Layout<T, K>;
  static constexpr int kResidualBytes = kChunk * L::kResidualStride * 4;
  static constexpr int kGram = std::max(L::kKeyBytes, kResidualBytes);
  static constexpr int kScalars = kGram + kChunk * L::kGramStride * 4;
  static constexpr int kBytes = kScalars + 4 * kChunk * 4;
  /// The views kernel A's steps take, over `base`; those of regions it lacks are null.
  __device__ static gdn_extend_impl::Shared<T, K> views(char* base) {
    gdn_extend_impl::Shared<T, K> sm(base);
    sm.gram = reinterpret_cast<float*>(base + kGram);
    sm.residual = reinterpret_cast<float*>(base);
    float* scalars = reinterpret_cast<float*>(base + kScalars);
    sm.scalars = {scalars, scalars + kChunk, scalars + 2 * kChunk, scalars + 3 * kChunk};
    for (auto* tile : {&sm.state_hi, &sm.state_lo}) tile->data = nullptr;
    for (auto* tile : {&sm.delta_hi, &sm.delta_lo, &sm.update_hi, &sm.update_lo}) {
      tile->data = nullptr;
    }
    for (auto* tile : {&sm.score_hi, &sm.score_lo}) tile->data = nullptr;
    return sm;
  }
};

/// Kernel A's work on one chunk: c0, count as in the fused kernel; `block` the chunk's
/// workspace block; `keys` whether this CTA writes the key block (one value head of each
/// key head does).
template <typename T, int K>
__device__ __forceinline__ void chunk_factors(const Params& p,
                                              const gdn_extend_impl::Shared<T, K>& sm,
                                              const Workspace& ws, const Work& wk, int head_v_dim,
                                              int64_t c0, int count, int64_t block, bool keys) {
  using namespace gdn_extend_impl;
  using L = Layout<T, K>;
  const gdn::ChunkScalars& sc = sm.scalars;
  char* head = ws.head(block, wk.hv);
  float* scales = reinterpret_cast<float*>(head + Workspace::kScales);

  stage_keys<T, K>(p, sm, wk, c0, count);
  if (threadIdx.x < kWarpSize) stage_gates(p, sc, wk, c0, count);
  __syncthreads();
  float rq[2];
  write_scores<T, K, /*kScalesQueries=*/true>(
      p, sm, wk, c0, count, rq, LowerTile{reinterpret_cast<uint16_t*>(head + Workspace::kPHi)},
      LowerTile{reinterpret_cast<uint16_t*>(head + Workspace::kPLo)});
  {
    const int lane = gdn::lane_id(), warp = static_cast<int>(threadIdx.x) / kWarpSize;
    if (lane % 4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 16 * warp + 8 * h + lane / 4;
        scales[Workspace::kQueryCoef * kChunk + i] = sc.decay[i] * rq[h];
      }
    }
  }
  if (threadIdx.x < kChunk) {
    const int i = static_cast<int>(threadIdx.x);
    const float last = sc.log_decay[kChunk - 1];
    scales[Workspace::kKeyCoef * kChunk + i] = sc.decay[i] * sc.inv_norm_k[i];
    scales[Workspace::kUpdateCoef * kChunk + i] =
        i < count ? expf(last - sc.log_decay[i]) * sc.inv_norm_k[i] : 0.0f;
    scales[Workspace::kLast * kChunk + i] = sc.decay[kChunk - 1];
  }
  copy_values<T>(p, wk.hv, head_v_dim, c0, count,
                 reinterpret_cast<uint16_t*>(head + Workspace::kValues));
  if (keys) {
    char* key = ws.key(block, wk.hk);
    constexpr bool kLo = L::kSplitInputs;
    copy_rows<T, K>(p.q, wk.hk, p.vector_q, c0, count, key_rows<K>(key, 0),
                    kLo ? key_rows<K>(key, 2) : nullptr);
    copy_rows<T, K>(p.k, wk.hk, p.vector_k, c0, count, key_rows<K>(key, 1),
                    kLo ? key_rows<K>(key, 3) : nullptr);
  }
  __syncthreads();  // A written
  gdn::invert_diagonal_blocks(sm.gram, L::kGramStride);
  // T = (I + A)^-1, 32 columns of the identity at a time; T' = T diag(beta) as hi / lo
  // (its blocks on and below the diagonal: T is lower triangular, so the second half's
  // substitution starts at its block row 2)
  constexpr int kPerThread = kChunk * 32 / kThreads;
  const int row0 = static_cast<int>(threadIdx.x) / 32, col = gdn::lane_id();
  uint16_t* t_hi = reinterpret_cast<uint16_t*>(head + Workspace::kTHi);
  uint16_t* t_lo = reinterpret_cast<uint16_t*>(head + Workspace::kTLo);
  auto columns = [&](auto first) {
    constexpr int b = decltype(first)::value;
#pragma unroll
    for (int e = 0; e < kPerThread; ++e) {
      const int row = row0 + kWarps * e;
      sm.residual[row * L::kResidualStride + col] = row == b + col ? 1.0f : 0.0f;
    }
    __syncthreads();  // also: the diagonal blocks inverted
    gdn::substitute_unit_lower<b>(sm.gram, L::kGramStride, sm.residual, L::kResidualStride);
    // 8 columns of a row a thread at a time: 16-byte stores, one LowerTile offset each
    for (int u = static_cast<int>(threadIdx.x); u < kChunk * 32 / 8; u += kThreads) {
      const int row = u / 4, c = 8 * (u % 4);
      if ((b + c) / 16 > row / 16) continue;
      const float* x = sm.residual + row * L::kResidualStride + c;
      const float4 x0 = *reinterpret_cast<const float4*>(x);
      const float4 x1 = *reinterpret_cast<const float4*>(x + 4);
      const float* beta = sc.beta + b + c;
      uint4 hi, lo;
      gdn::split_pair(x0.x * beta[0], x0.y * beta[1], hi.x, lo.x);
      gdn::split_pair(x0.z * beta[2], x0.w * beta[3], hi.y, lo.y);
      gdn::split_pair(x1.x * beta[4], x1.y * beta[5], hi.z, lo.z);
      gdn::split_pair(x1.z * beta[6], x1.w * beta[7], hi.w, lo.w);
      *reinterpret_cast<uint4*>(t_hi + LowerTile::offset(row, b + c)) = hi;
      *reinterpret_cast<uint4*>(t_lo + LowerTile::offset(row, b + c)) = lo;
    }
    __syncthreads();  // the residual read before it is refilled (or the next chunk staged)
  };
  static_assert(kChunk == 64, "two passes of 32 columns");
  columns(std::integral_constant<int, 0>{});
  columns(std::integral_constant<int, 32>{});
}

template <typename T, int K>
__global__ void __launch_bounds__(gdn_extend_impl::kThreads)
    split_factors(const Params p, const Workspace ws, int head_v_dim, int chunk_stride) {
  extern __shared__ __align__(16) char shared_bytes[];
  const gdn_extend_impl::Shared<T, K> sm = FactorLayout<T, K>::views(shared_bytes);
  // 1-D grid: (sequence, value head, first chunk); a CTA takes chunks first, first +
  // chunk_stride, ...
  const int64_t cta = blockIdx.x;
  const int first = static_cast<int>(cta % chunk_stride);
  const int64_t seq_head = cta / chunk_stride;
  Work wk;
  wk.n = seq_head / p.num_v_heads;
  wk.hv = static_cast<int>(seq_head - wk.n * p.num_v_heads);
  wk.hk = wk.hv / p.heads_per_key;
  wk.v0 = 0;
  wk.counts = false;  // kernel B counts the errors
  const Sequence seq = sequence_of(p, wk.n);
  if (!seq.in_range) return;
  const bool keys = wk.hv % p.heads_per_key == 0;
  for (int64_t c = first, c0 = seq.bos + int64_t{kChunk} * first; c0 < seq.eos;
       c += chunk_stride, c0 += int64_t{kChunk} * chunk_stride) {
    const int count = static_cast<int>(std::min<int64_t>(kChunk, seq.eos - c0));
    chunk_factors<T, K>(p, sm, ws, wk, head_v_dim, c0, count, seq.first_block + c, keys);
  }
}

// ---------------------------------------------------------------------------
// Kernel B: the walk along each sequence
// ---------------------------------------------------------------------------

inline constexpr int kWalkWarps = 2 * (kBlockV / 16);  // a pair of warps per 16 state rows
inline constexpr int kWalkThreads = kWalkWarps * kWarpSize;

/// One stage of kernel B's shared memory: a chunk's workspace blocks (the slice's 32
/// columns of v), q's and k's rows in padded tiles for ldmatrix (q's only for a walk with
/// outputs). The factors and the scales are one contiguous run, as in the workspace.
template <typename T, int K, bool kOutputs>
struct Stage {
  static constexpr bool kSplitInputs = std::is_same_v<T, fp16_t>;
  using RowTile = gdn::Tile<kChunk, K>;
  using ValueTile = gdn::Tile<kChunk, kBlockV>;
  static constexpr int kRowTiles = kSplitInputs ? 4 : 2;  // q hi, k hi (, q lo, k lo)
  /// Whether key row tile i (key_rows' order) is staged.
  static constexpr bool staged(int i) { return i < kRowTiles && (kOutputs || i % 2 == 1); }
  static constexpr int kStagedRowTiles = kOutputs ? kRowTiles : kRowTiles / 2;
  static constexpr int kFactorBytes = static_cast<int>(Workspace::kValues);  // T', P, scales
  static constexpr int kBytes =
      kStagedRowTiles * RowTile::kBytes + kFactorBytes + ValueTile::kBytes;

  RowTile rows[4];       // key_rows' order (null where not staged)
  LowerTile squares[4];  // T' hi, T' lo, P hi, P lo
  float* scales;         // Workspace::Scale rows
  ValueTile values;      // v [token][row of the slice]

  __device__ explicit Stage(char* base) {
    char* at = base;
    for (int i = 0; i < 4; ++i) {
      rows[i].data = staged(i) ? reinterpret_cast<uint16_t*>(at) : nullptr;
      if (staged(i)) at += RowTile::kBytes;
    }
    for (int i = 0; i < 4; ++i) {
      squares[i].data = reinterpret_cast<uint16_t*>(at + i * LowerTile::kBytes);
    }
    scales = reinterpret_cast<float*>(at + Workspace::kScales);
    values.data = reinterpret_cast<uint16_t*>(at + kFactorBytes);
  }
};

/// What a pair of warps exchanges once a chunk: each warp's part of R^T (8 C fragments of
/// its 16 rows by the chunk's tokens) and its part of O^T at the two token blocks whose
/// output the other warp finishes (4 fragments), as float4 slots [12][32 lanes].
/// (An end walk exchanges only R^T: 8 slots.)
template <bool kOutputs>
inline constexpr int kExchangeSlots = kOutputs ? kChunk / 8 + kChunk / 16 : kChunk / 8;
template <bool kOutputs>
inline constexpr int kExchangeBytes = kWalkWarps * kExchangeSlots<kOutputs> * kWarpSize * 16;

/// Kernel B's shared memory with `depth` stages: two where the GPU has room for them (the
/// next chunk's copies overlap a chunk's products), else one.
template <typename T, int K, bool kOutputs = true>
inline constexpr int walk_bytes(int depth) {
  return depth * Stage<T, K, kOutputs>::kBytes + kExchangeBytes<kOutputs>;
}
/// The most shared memory a block may have on any GPU (Hopper's 227 KiB): no two-stage
/// kernel is built where it would need more.
inline constexpr int kMostSharedBytes = 227 * 1024;

/// Issues the cp.async copies of kRows rows of kCols 16-bit values, `src_stride` apart,
/// into `tile`. The sizes are compile-time and each thread's share is unrolled, so that a
/// copy's addresses are the thread's first ones plus immediate offsets (with the sizes at
/// run time, the divisions and products of each copy's address were a quarter of the
/// walk's instructions).
template <int kRows, int kCols, class Tl>
__device__ __forceinline__ void copy_tile_async(const Tl& tile, const uint16_t* src,
                                                int64_t src_stride) {
  constexpr int kRowUnits = kCols / 8, kUnits = kRows * kRowUnits;
  static_assert(kUnits % kWalkThreads == 0 && kWalkThreads % kRowUnits == 0,
                "every thread copies the same columns of evenly many rows");
  const int row0 = static_cast<int>(threadIdx.x) / kRowUnits;
  const int col = 8 * (static_cast<int>(threadIdx.x) % kRowUnits);
  const uint16_t* from = src + row0 * src_stride + col;
  uint16_t* to = tile.at(row0, col);
#pragma unroll
  for (int i = 0; i < kUnits / kWalkThreads; ++i) {
    constexpr int kRowStep = kWalkThreads / kRowUnits;
    cp_async_16_or_zero(to + i * kRowStep * Tl::kStride, from + i * kRowStep * src_stride, true);
  }
}

/// Issues the copies of block `block`'s data for value head hv, state rows v0.. (v's
/// rows only with `values`) into `st`, and commits them as one group.
template <typename T, int K, bool kOutputs>
__device__ __forceinline__ void issue_stage(const Workspace& ws, const Stage<T, K, kOutputs>& st,
                                            int64_t block, const Work& wk, int head_v_dim,
                                            bool values) {
  using St = Stage<T, K, kOutputs>;
  char* key = ws.key(block, wk.hk);
#pragma unroll
  for (int i = 0; i < St::kRowTiles; ++i) {
    if (St::staged(i)) copy_tile_async<kChunk, K>(st.rows[i], key_rows<K>(key, i), K);
  }
  const char* head = ws.head(block, wk.hv);
  char* factors = reinterpret_cast<char*>(st.squares[0].data);
  constexpr int kFactorUnits = St::kFactorBytes / 16;
#pragma unroll
  for (int i = 0; i < (kFactorUnits + kWalkThreads - 1) / kWalkThreads; ++i) {
    const int u = static_cast<int>(threadIdx.x) + i * kWalkThreads;
    if (kFactorUnits % kWalkThreads == 0 || u < kFactorUnits) {
      cp_async_16_or_zero(factors + 16 * u, head + 16 * u, true);
    }
  }
  if (values) {
    copy_tile_async<kChunk, kBlockV>(
        st.values, reinterpret_cast<const uint16_t*>(head + Workspace::kValues) + wk.v0,
        head_v_dim);
  }
  cp_async_commit();
}

/// A warp's 16 state rows over half of K, as m16n8 C fragments: [column tile][4].
template <int K>
using HalfRowFragments = float[K / 16][4];
/// A warp's 16 rows by the chunk's 64 tokens, as C fragments.
using TokenFragments = float[kChunk / 8][4];

/// The warp's state rows over its half of K (`rows`: the pool's state at the warp's first
/// row and column; rows K apart), or `fill`.
template <typename S, int K>
__device__ __forceinline__ void load_rows(const S* rows, bool held, float fill,
                                          HalfRowFragments<K>& s) {
  const int g = gdn::lane_id() / 4, t = gdn::lane_id() % 4;
#pragma unroll
  for (int nt = 0; nt < K / 16; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const S* pair = rows + (g + 8 * h) * K + 8 * nt + 2 * t;
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
      s[nt][2 * h] = x0;
      s[nt][2 * h + 1] = x1;
    }
  }
}

/// The identity's rows row0.. over columns col0.. (an end walk's transition starts so).
template <int K>
__device__ __forceinline__ void identity_rows(int row0, int col0, HalfRowFragments<K>& s) {
  const int g = gdn::lane_id() / 4, t = gdn::lane_id() % 4;
#pragma unroll
  for (int nt = 0; nt < K / 16; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = row0 + g + 8 * (e / 2) == col0 + 8 * nt + 2 * t + e % 2 ? 1.0f : 0.0f;
    }
  }
}

template <typename S, int K>
__device__ __forceinline__ void store_rows(S* rows, const HalfRowFragments<K>& s) {
  const int g = gdn::lane_id() / 4, t = gdn::lane_id() % 4;
#pragma unroll
  for (int nt = 0; nt < K / 16; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      S* pair = rows + (g + 8 * h) * K + 8 * nt + 2 * t;
      if constexpr (std::is_same_v<S, fp32_t>) {
        *reinterpret_cast<float2*>(pair) = make_float2(s[nt][2 * h], s[nt][2 * h + 1]);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(pair) =
            __floats2bfloat162_rn(s[nt][2 * h], s[nt][2 * h + 1]);
      }
    }
  }
}

/// Multiplies each element of C fragments over the chunk's tokens by the scale of its
/// token (column): `scales` [64] in shared memory.
__device__ __forceinline__ void scale_tokens(TokenFragments& x, const float* scales) {
  const int t = gdn::lane_id() % 4;
#pragma unroll
  for (int nt = 0; nt < kChunk / 8; ++nt) {
    const float2 scale = *reinterpret_cast<const float2*>(scales + 8 * nt + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) x[nt][e] *= e % 2 == 0 ? scale.x : scale.y;
  }
}

/// The chunk's blocks of 16 tokens whose output a warp finishes, bit nb for block nb:
/// {0, 3} for the first half of K, {1, 2} for the second (5 of P's 10 blocks each).
__device__ __forceinline__ unsigned finished_blocks(int half) {
  static_assert(kChunk / 16 == 4, "finished_blocks and exchange's slots are for 4 token blocks");
  return half == 0 ? 0b1001u : 0b0110u;
}

/// acc += x y^T over the chunk's tokens, y lower triangular (LowerTiles `y_hi`, `y_lo`),
/// x the warp's C fragments: the blocks of 16 tokens at or below the diagonal, for the
/// result's token blocks nb where bit nb of `blocks` is set.
__device__ __forceinline__ void times_lower_transposed(const TokenFragments& x,
                                                       const LowerTile& y_hi, const LowerTile& y_lo,
                                                       unsigned blocks, TokenFragments& acc) {
#pragma unroll
  for (int kb = 0; kb < kChunk / 16; ++kb) {
    uint32_t a_hi[4], a_lo[4];
    gdn::accumulators_as_a(x[2 * kb], x[2 * kb + 1], a_hi, a_lo);
#pragma unroll
    for (int nb = kb; nb < kChunk / 16; ++nb) {
      if ((blocks >> nb & 1u) == 0) continue;
      uint32_t b_hi[4], b_lo[4];
      gdn::load_b(b_hi, y_hi, 16 * nb, 16 * kb);
      gdn::load_b(b_lo, y_lo, 16 * nb, 16 * kb);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        gdn::mma_split<true, true>(acc[2 * nb + h], a_hi, a_lo, b_hi[2 * h], b_hi[2 * h + 1],
                                   b_lo[2 * h], b_lo[2 * h + 1]);
      }
    }
  }
}

/// The 2-element pair (x0 in the low half) of T.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float x0, float x1) {
  Vec<T, 2> v;
  v[0] = from_float<T>(x0);
  v[1] = from_float<T>(x1);
  uint32_t bits;
  memcpy(&bits, &v, sizeof(bits));
  return bits;
}

/// Stores O^T (the warp's 16 rows by the chunk's tokens) to out at the chunk's `count`
/// tokens of the token blocks `finished` (finished_blocks): each 8 x 8 block transposed in
/// registers (movmatrix), so that a lane stores a pair of adjacent rows of one token.
template <typename T>
__device__ __forceinline__ void store_output(const Params& p, const Work& wk, int row0,
                                             unsigned finished, int64_t c0, int count,
                                             const TokenFragments& o) {
  const int g = gdn::lane_id() / 4, t = gdn::lane_id() % 4;
#pragma unroll
  for (int nt = 0; nt < kChunk / 8; ++nt) {
    if ((finished >> nt / 2 & 1u) == 0) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t pair = movmatrix_trans(pack_pair<T>(o[nt][2 * h], o[nt][2 * h + 1]));
      const int i = 8 * nt + g;
      if (i >= count) continue;
      T* dst = p.out.at<T>(c0 + i, wk.hv) + row0 + 8 * h + 2 * t;
      if (p.pairs_out) {
        *reinterpret_cast<uint32_t*>(dst) = pair;
      } else {
        const uint16_t halves[2] = {static_cast<uint16_t>(pair & 0xffffu),
                                    static_cast<uint16_t>(pair >> 16)};
        memcpy(dst, &halves[0], 2);
        memcpy(dst + 1, &halves[1], 2);
      }
    }
  }
}

/// Waits for the other warp of the pair (named barrier `id`, 64 threads); shared memory
/// written by either before it is visible to both after it.
__device__ __forceinline__ void pair_barrier(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(2 * kWarpSize) : "memory");
}

/// Where a warp of kernel B works: its 16 state rows (row0 within the value head, local
/// within the slice), its half of K, the token blocks whose output it finishes
/// (finished_blocks), and the pair's exchange slots (float4 [12][32]).
struct Walker {
  int row0, local, half, barrier;
  unsigned finished;
  float4 *mine, *other;
};

/// The pair's parts of R^T and O^T (sums over K; O^T only with kOutputs): this warp's r
/// and the other's token blocks of o out, the other's in and added (a + b in one warp,
/// b + a in the other: the same bits).
template <bool kOutputs>
__device__ __forceinline__ void exchange(const Walker& w, TokenFragments& r, TokenFragments& o) {
  const int lane = gdn::lane_id();
  auto slot = [&](float4* base, int i) -> float4& { return base[i * kWarpSize + lane]; };
  // o's slot: kChunk / 8 + token block / 2 * 2 + h (distinct within each warp's two blocks)
#pragma unroll
  for (int nt = 0; nt < kChunk / 8; ++nt) {
    slot(w.mine, nt) = make_float4(r[nt][0], r[nt][1], r[nt][2], r[nt][3]);
    if (kOutputs && (w.finished >> nt / 2 & 1u) == 0) {
      slot(w.mine, kChunk / 8 + nt / 4 * 2 + nt % 2) =
          make_float4(o[nt][0], o[nt][1], o[nt][2], o[nt][3]);
    }
  }
  pair_barrier(w.barrier);
#pragma unroll
  for (int nt = 0; nt < kChunk / 8; ++nt) {
    const float4 x = slot(w.other, nt);
    r[nt][0] += x.x;
    r[nt][1] += x.y;
    r[nt][2] += x.z;
    r[nt][3] += x.w;
    if (kOutputs && (w.finished >> nt / 2 & 1u) != 0) {
      const float4 y = slot(w.other, kChunk / 8 + nt / 4 * 2 + nt % 2);
      o[nt][0] += y.x;
      o[nt][1] += y.y;
      o[nt][2] += y.z;
      o[nt][3] += y.w;
    }
  }
}

/// One chunk of the walk for the warp's state rows and half of K (`s`): the output's rows
/// at the chunk's tokens of the warp's token blocks (kOutputs), and the state after the
/// chunk; v taken as zero without `values` (a transition's walk).
template <typename T, int K, bool kOutputs>
__device__ __forceinline__ void walk_chunk(const Params& p, const Stage<T, K, kOutputs>& st,
                                           const Work& wk, const Walker& w, int64_t c0, int count,
                                           bool values, HalfRowFragments<K>& s) {
  constexpr bool kLo = Stage<T, K, kOutputs>::kSplitInputs;
  constexpr int kHalf = K / 2;
  const auto &q_hi = st.rows[0], &k_hi = st.rows[1], &q_lo = st.rows[2], &k_lo = st.rows[3];
  const int g = gdn::lane_id() / 4, t = gdn::lane_id() % 4, k0 = w.half * kHalf;
  TokenFragments r = {}, o = {};
  // S0 k^T and S0 q^T over the warp's half of K, one k loop: S0's A fragments split once
  // for both
#pragma unroll
  for (int ks = 0; ks < kHalf / 16; ++ks) {
    uint32_t a_hi[4], a_lo[4];
    gdn::accumulators_as_a(s[2 * ks], s[2 * ks + 1], a_hi, a_lo);
#pragma unroll
    for (int nb = 0; nb < kChunk / 16; ++nb) {
      uint32_t kb_hi[4], kb_lo[4], qb_hi[4], qb_lo[4];
      gdn::load_b(kb_hi, k_hi, 16 * nb, k0 + 16 * ks);
      if constexpr (kOutputs) gdn::load_b(qb_hi, q_hi, 16 * nb, k0 + 16 * ks);
      if constexpr (kLo) {
        gdn::load_b(kb_lo, k_lo, 16 * nb, k0 + 16 * ks);
        if constexpr (kOutputs) gdn::load_b(qb_lo, q_lo, 16 * nb, k0 + 16 * ks);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        gdn::mma_split<true, kLo>(r[2 * nb + h], a_hi, a_lo, kb_hi[2 * h], kb_hi[2 * h + 1],
                                  kb_lo[2 * h], kb_lo[2 * h + 1]);
        if constexpr (kOutputs) {
          gdn::mma_split<true, kLo>(o[2 * nb + h], a_hi, a_lo, qb_hi[2 * h], qb_hi[2 * h + 1],
                                    qb_lo[2 * h], qb_lo[2 * h + 1]);
        }
      }
    }
  }
  // R^T = v^T - (S0 k^T) diag(e^G rk) and O^T = (S0 q^T) diag(e^G rq), each warp its
  // half of K's part (v^T in the first half's) before the exchange, so that the shared
  // loads of v and the scales overlap the products instead of following the barrier
  // v^T's 16 x 16 blocks as A fragments, whose registers are the C fragments' pairs
  // (ldmatrix of the [token][row] tile, transposed)
  uint32_t v_bits[kChunk / 16][4] = {};
  if (w.half == 0 && values) {
#pragma unroll
    for (int kb = 0; kb < kChunk / 16; ++kb)
      gdn::load_a_trans(v_bits[kb], st.values, w.local, 16 * kb);
  }
  const float* key_coef = st.scales + Workspace::kKeyCoef * kChunk;
#pragma unroll
  for (int nt = 0; nt < kChunk / 8; ++nt) {
    const float2 coef = *reinterpret_cast<const float2*>(key_coef + 8 * nt + 2 * t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v0, v1;
      uint32_t unused_hi, unused_lo;
      gdn::input_pair<T>(v_bits[nt / 2][h + 2 * (nt % 2)], v0, v1, unused_hi, unused_lo);
      r[nt][2 * h] = v0 - coef.x * r[nt][2 * h];
      r[nt][2 * h + 1] = v1 - coef.y * r[nt][2 * h + 1];
    }
  }
  if constexpr (kOutputs) scale_tokens(o, st.scales + Workspace::kQueryCoef * kChunk);
  exchange<kOutputs>(w, r, o);
  // d^T = R^T T'^T, all of it in both warps of the pair (both update the state with it)
  TokenFragments d = {};
  times_lower_transposed(r, st.squares[0], st.squares[1], (1u << kChunk / 16) - 1, d);
  if constexpr (kOutputs) {
    // O^T += d^T P^T at the warp's token blocks
    times_lower_transposed(d, st.squares[2], st.squares[3], w.finished, o);
    store_output<T>(p, wk, w.row0, w.finished, c0, count, o);
  }
  // S = e^{G_last} S + (d^T diag(e^{G_last - G} rk)) k over the warp's half of K
  scale_tokens(d, st.scales + Workspace::kUpdateCoef * kChunk);
  const float last = st.scales[Workspace::kLast * kChunk];
#pragma unroll
  for (int nt = 0; nt < kHalf / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] *= last;
  }
#pragma unroll
  for (int kb = 0; kb < kChunk / 16; ++kb) {
    if (16 * kb >= count) break;  // d is 0 past the tokens
    uint32_t a_hi[4], a_lo[4];
    gdn::accumulators_as_a(d[2 * kb], d[2 * kb + 1], a_hi, a_lo);
#pragma unroll
    for (int n0 = 0; n0 < kHalf; n0 += 16) {
      uint32_t b_hi[4], b_lo[4];
      gdn::load_b_trans(b_hi, k_hi, 16 * kb, k0 + n0);
      if constexpr (kLo) gdn::load_b_trans(b_lo, k_lo, 16 * kb, k0 + n0);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        gdn::mma_split<true, kLo>(s[n0 / 8 + h], a_hi, a_lo, b_hi[2 * h], b_hi[2 * h + 1],
                                  b_lo[2 * h], b_lo[2 * h + 1]);
      }
    }
  }
}

/// What a CTA of kernel B walks: its sequence, value head and state rows (wk), the
/// segment (0 unless segmented), and whether its rows are a transition's (an end walk's
/// identity rows, v taken as zero) rather than the state's.
struct WalkTask {
  Work wk;
  int64_t segment = 0;
  bool transition = false;
};

/// The task of CTA blockIdx.x. 1-D grids, a head's slices innermost, then heads, then
/// segments, then sequences, so that the CTAs reading the same chunks run together. An
/// output walk has p.slices slices of the state's rows, and ws.max_segments segments a
/// sequence where segmented; an end walk (one per segment but the last) p.slices of the
/// state's rows from zeros, then K / kBlockV of the transition's rows.
template <int K, bool kOutputs>
__device__ __forceinline__ WalkTask walk_task(const Params& p, const Workspace& ws) {
  WalkTask task;
  if (kOutputs && ws.segment_chunks == 0) {
    task.wk = gdn_extend_impl::work_of(p);
    return task;
  }
  const int slices = kOutputs ? p.slices : p.slices + K / kBlockV;
  const int64_t segments = kOutputs ? ws.max_segments : ws.max_segments - 1;
  const int64_t cta = blockIdx.x;
  const int slice = static_cast<int>(cta % slices);
  const int64_t rest = cta / slices;
  task.wk.hv = static_cast<int>(rest % p.num_v_heads);
  task.segment = rest / p.num_v_heads % segments;
  task.wk.n = rest / p.num_v_heads / segments;
  task.wk.hk = task.wk.hv / p.heads_per_key;
  task.transition = slice >= p.slices;
  task.wk.v0 = (task.transition ? slice - p.slices : slice) * kBlockV;
  task.wk.counts =
      kOutputs && task.segment == 0 && slice == 0 && task.wk.hv == 0 && threadIdx.x == 0;
  return task;
}

/// Kernel B. An output walk (kOutputs) walks its chunks from its start state, writing
/// the output, and writes the pool at the sequence's end. An end walk (segmented calls,
/// every segment but a sequence's last) walks its segment from zeros or, for the
/// transition's rows, from the identity with v taken as zero, and writes the rows it ends
/// with to the segment blocks: the combine's inputs.
// End walks at three CTAs an SM (at most 168 registers a thread; 186 unbounded), so that
// more segments fit one wave.
template <typename T, typename S, int K, int kDepth, bool kOutputs>
__global__ void __launch_bounds__(kWalkThreads, kOutputs ? 1 : 3)
    split_walk(const Params p, const Workspace ws, int head_v_dim) {
  using St = Stage<T, K, kOutputs>;
  extern __shared__ __align__(16) char shared_bytes[];
  const WalkTask task = walk_task<K, kOutputs>(p, ws);
  const Work& wk = task.wk;
  const Sequence seq = sequence_of(p, wk.n, ws.segment_chunks);
  const int64_t index = gdn::load_index(p.indices, p.indices_int64, p.indices_stride, wk.n);
  const gdn::Slot slot = gdn::classify_slot(index, p.pool_size);
  if (wk.counts && p.errors != nullptr) {
    if (slot == gdn::Slot::kOutOfRange) atomicAdd(p.errors, 1);
    if (!seq.in_range) atomicAdd(p.errors + 1, 1);
  }
  if (!seq.in_range || seq.bos == seq.eos) return;  // the whole CTA: no barrier is left waiting
  // a CTA of a segment past the sequence's (of the grid's most)
  if (task.segment + (kOutputs ? 0 : 1) >= seq.segments) return;

  // warps 2 i and 2 i + 1: state rows 16 i .. 16 i + 15 of the slice, K halves 0 and 1
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  float4* exchange_slots = reinterpret_cast<float4*>(shared_bytes + kDepth * St::kBytes);
  Walker w;
  w.local = 16 * (warp / 2);
  w.row0 = wk.v0 + w.local;
  w.half = warp % 2;
  w.finished = finished_blocks(w.half);
  w.barrier = 1 + warp / 2;  // barrier 0 is __syncthreads'
  w.mine = exchange_slots + warp * kExchangeSlots<kOutputs> * kWarpSize;
  w.other = exchange_slots + (warp ^ 1) * kExchangeSlots<kOutputs> * kWarpSize;

  // the warp's rows in [rows][K] arrays (the pool's head, a segment block's state or
  // transition) start row0 rows and its half of K in
  const int64_t at = static_cast<int64_t>(w.row0) * K + w.half * (K / 2);
  const bool segmented = ws.segment_chunks > 0;
  const int64_t block = seq.first_segment + task.segment;
  const bool held = slot == gdn::Slot::kState;
  S* pool_rows = static_cast<S*>(p.state) +
                 (held ? index * p.state_stride_slot + wk.hv * p.state_stride_head + at : 0);
  HalfRowFragments<K> s;
  if (!kOutputs && task.transition) {
    identity_rows<K>(w.row0, w.half * (K / 2), s);
  } else if (!kOutputs) {
    load_rows<fp32_t, K>(nullptr, false, 0.0f, s);
  } else if (segmented) {
    load_rows<fp32_t, K>(ws.segment_state(block, wk.hv) + at, true, 0.0f, s);
  } else {
    load_rows<S, K>(pool_rows, held, gdn::missing_state(slot), s);
  }

  // stage i at shared_bytes + i * Stage::kBytes (a pointer, not an array of views, which
  // a runtime index would put in local memory)
  auto stage = [&](int64_t c) {
    return St(shared_bytes + static_cast<int>(c % kDepth) * St::kBytes);
  };
  const int64_t first = segmented ? task.segment * ws.segment_chunks : 0;
  const int64_t end = segmented ? std::min(first + ws.segment_chunks, seq.chunks) : seq.chunks;
  const bool values = !task.transition;
  issue_stage<T, K, kOutputs>(ws, stage(first), seq.first_block + first, wk, head_v_dim, values);
  for (int64_t c = first; c < end; ++c) {
    const St st = stage(c);
    cp_async_wait<0>();
    // every thread's copies landed, and every thread done with the chunk before (its
    // stage, refilled next with two stages, and the exchange slots)
    __syncthreads();
    if constexpr (kDepth == 2) {
      if (c + 1 < end) {
        issue_stage<T, K, kOutputs>(ws, stage(c + 1), seq.first_block + c + 1, wk, head_v_dim,
                                    values);
      }
    }
    const int64_t c0 = seq.bos + kChunk * c;
    const int count = static_cast<int>(std::min<int64_t>(kChunk, seq.eos - c0));
    walk_chunk<T, K, kOutputs>(p, st, wk, w, c0, count, values, s);
    if constexpr (kDepth == 1) {
      __syncthreads();  // the stage read before it is refilled
      if (c + 1 < end) {
        issue_stage<T, K, kOutputs>(ws, st, seq.first_block + c + 1, wk, head_v_dim, values);
      }
    }
  }
  if constexpr (kOutputs) {
    if (held && task.segment + 1 == seq.segments) store_rows<S, K>(pool_rows, s);
  } else {
    // the transition of this segment, or the next segment's state from this one's zeros
    float* rows =
        task.transition ? ws.segment_transition(block, wk.hv) : ws.segment_state(block + 1, wk.hv);
    store_rows<fp32_t, K>(rows + at, s);
  }
}

/// The combine of a segmented walk's end walks, a CTA per (sequence, value head,
/// kCombineRows state rows), a column of K a thread: the pool's state (or the missing
/// state's fill) is segment 0's start; segment i's start is segment i - 1's times its
/// transition plus its end from zeros (which the end walk left in segment i's state
/// block, where the start replaces it). In order of the segments, in fp32 on CUDA cores:
/// a few products of kCombineRows x K by K x K a sequence.
inline constexpr int kCombineRows = 16, kCombineBatch = 32;

template <typename S, int K>
__global__ void __launch_bounds__(K)
    split_combine(const Params p, const Workspace ws, int head_v_dim) {
  __shared__ __align__(16) float start[kCombineRows][K];
  const int row_blocks = head_v_dim / kCombineRows;
  const int64_t cta = blockIdx.x;
  const int row0 = static_cast<int>(cta % row_blocks) * kCombineRows;
  const int64_t seq_head = cta / row_blocks;
  const int64_t n = seq_head / p.num_v_heads;
  const int hv = static_cast<int>(seq_head - n * p.num_v_heads);
  const Sequence seq = sequence_of(p, n, ws.segment_chunks);
  if (!seq.in_range || seq.bos == seq.eos) return;
  const int64_t index = gdn::load_index(p.indices, p.indices_int64, p.indices_stride, n);
  const gdn::Slot slot = gdn::classify_slot(index, p.pool_size);
  const int col = static_cast<int>(threadIdx.x);

  float* first = ws.segment_state(seq.first_segment, hv) + row0 * K + col;
  const bool held = slot == gdn::Slot::kState;
  const S* pool =
      static_cast<const S*>(p.state) +
      (held ? index * p.state_stride_slot + hv * p.state_stride_head + row0 * K + col : 0);
#pragma unroll
  for (int r = 0; r < kCombineRows; ++r) {
    const float x = held ? to_float(pool[r * K]) : gdn::missing_state(slot);
    start[r][col] = x;
    first[r * K] = x;
  }
  for (int64_t i = 1; i < seq.segments; ++i) {
    __syncthreads();  // the start before written
    const float* transition = ws.segment_transition(seq.first_segment + i - 1, hv) + col;
    float* state = ws.segment_state(seq.first_segment + i, hv) + row0 * K + col;
    float acc[kCombineRows];
#pragma unroll
    for (int r = 0; r < kCombineRows; ++r) acc[r] = state[r * K];
    // the thread's column of the transition kCombineBatch rows at a time, all loads
    // issued before the products (a few loads at a time, each waited for, was 10 us a
    // segment at K = 128)
#pragma unroll 1
    for (int j0 = 0; j0 < K; j0 += kCombineBatch) {
      float column[kCombineBatch];
#pragma unroll
      for (int e = 0; e < kCombineBatch; ++e) column[e] = transition[(j0 + e) * K];
#pragma unroll
      for (int j = 0; j < kCombineBatch; j += 4) {
#pragma unroll
        for (int r = 0; r < kCombineRows; ++r) {
          const float4 x = *reinterpret_cast<const float4*>(&start[r][j0 + j]);
          acc[r] = fmaf(x.x, column[j], acc[r]);
          acc[r] = fmaf(x.y, column[j + 1], acc[r]);
          acc[r] = fmaf(x.z, column[j + 2], acc[r]);
          acc[r] = fmaf(x.w, column[j + 3], acc[r]);
        }
      }
    }
    __syncthreads();  // the start before read by every thread
#pragma unroll
    for (int r = 0; r < kCombineRows; ++r) {
      start[r][col] = acc[r];
      state[r * K] = acc[r];
    }
  }
}

/// Launches kernel B with two stages where they fit in `allowed` bytes, else one; for a
/// segmented call's walks, with one where that takes fewer waves of CTAs (more CTAs an SM
/// fit; the segments are as many as fill the GPU about once at two an SM, and a walk is
/// latency-bound, so a second CTA an SM costs it little where a second wave doubles it).
template <typename T, typename S, int K, bool kOutputs>
void launch_walk(const Params& p, const Workspace& ws, int64_t ctas, int head_v_dim,
                 DLDevice device, std::size_t allowed) {
  constexpr int kOneStage = walk_bytes<T, K, kOutputs>(1);
  constexpr int kTwoStages = walk_bytes<T, K, kOutputs>(2);
  const auto one_stage = split_walk<T, S, K, 1, kOutputs>;
  if constexpr (kTwoStages <= kMostSharedBytes) {
    const auto two_stages = split_walk<T, S, K, 2, kOutputs>;
    bool deep = static_cast<std::size_t>(kTwoStages) <= allowed;
    if (deep && ws.segment_chunks > 0) {
      // CTAs an SM of each build, asked once per device (0: not yet)
      static int per_sm[64][2] = {};
      int* known = per_sm[device.device_id % 64];
      if (known[0] == 0 || known[1] == 0) {
        known[0] =
            std::max(1, max_active_blocks_per_sm(one_stage, kWalkThreads, kOneStage, device));
        known[1] =
            std::max(1, max_active_blocks_per_sm(two_stages, kWalkThreads, kTwoStages, device));
      }
      const int64_t sms = num_sms(device);
      auto waves = [&](int64_t at_once) { return (ctas + at_once * sms - 1) / (at_once * sms); };
      deep = waves(known[1]) <= waves(known[0]);
    }
    if (deep) {
      KernelLauncher(dim3(static_cast<unsigned>(ctas)), dim3(kWalkThreads), device, kTwoStages)(
          two_stages, p, ws, head_v_dim);
      return;
    }
  }
  KernelLauncher(dim3(static_cast<unsigned>(ctas)), dim3(kWalkThreads), device, kOneStage)(
      one_stage, p, ws, head_v_dim);
}

template <typename T, typename S, int K>
void launch_split(const Params& p, const Workspace& ws, int64_t sequences, int head_v_dim,
                  DLDevice device) {
  const std::size_t allowed = max_shared_memory_per_block(device);
  constexpr int kFactorBytes = FactorLayout<T, K>::kBytes;
  constexpr int kOneStage = walk_bytes<T, K>(1);
  RuntimeCheck(static_cast<std::size_t>(kOneStage) <= allowed,
               "gdn_extend (split path): ", "head_k_dim ", K, " with ",
               std::is_same_v<T, fp16_t> ? "float16" : "bfloat16", " inputs needs ", kOneStage,
               " bytes of shared memory per block; this GPU allows ", allowed,
               (std::is_same_v<T, fp16_t> ? " (bfloat16 inputs need less)" : ""));
  const int64_t heads = sequences * p.num_v_heads;
  const int64_t segments = ws.max_segments;
  const int64_t walks = heads * segments * p.slices;
  const int64_t end_walks = heads * (segments - 1) * (p.slices + K / kBlockV);
  RuntimeCheck(std::max(walks, end_walks) < (int64_t{1} << 31),
               "gdn_extend: at most 2^31 - 1 CTAs (sequences x num_v_heads x head_v_dim / ",
               kBlockV, ", by segments where the walk is cut in them), got ",
               std::max(walks, end_walks), "; split the batch");
  if (walks == 0) return;
  // Kernel A: about 30 CTAs an SM in all (whole waves where 3, 5 or 6 run at once, as
  // its shared memory allows for the inputs and K), each taking every chunk_stride-th
  // chunk of its sequence (a sequence has at most ceil(total_tokens / 64) chunks; a CTA
  // per chunk of the longest possible sequence would be mostly empty CTAs for many short
  // ones).
  const int64_t most_chunks = std::max<int64_t>(1, (p.total_tokens + kChunk - 1) / kChunk);
  const int64_t wanted = (30 * static_cast<int64_t>(num_sms(device)) + heads - 1) / heads;
  const int64_t chunk_stride = std::min(most_chunks, std::max<int64_t>(1, wanted));
  RuntimeCheck(heads * chunk_stride < (int64_t{1} << 31),
               "gdn_extend: at most 2^31 - 1 CTAs (sequences x num_v_heads), got ", heads);
  KernelLauncher(dim3(static_cast<unsigned>(heads * chunk_stride)), dim3(gdn_extend_impl::kThreads),
                 device, kFactorBytes)(split_factors<T, K>, p, ws, head_v_dim,
                                       static_cast<int>(chunk_stride));
  if (ws.segment_chunks > 0) {
    if (end_walks > 0)
      launch_walk<T, fp32_t, K, false>(p, ws, end_walks, head_v_dim, device, allowed);
    KernelLauncher(dim3(static_cast<unsigned>(heads * (head_v_dim / kCombineRows))), dim3(K),
                   device)(split_combine<S, K>, p, ws, head_v_dim);
  }
  launch_walk<T, S, K, true>(p, ws, walks, head_v_dim, device, allowed);
}

}  // namespace gdn_split_impl

/// The workspace the split path needs for a call of these sizes, in bytes (a uint8 tensor
/// of at least this many, on the call's device): one block per chunk and head.
inline int64_t gdn_extend_workspace_bytes(int64_t total_tokens, int64_t num_sequences,
                                          int64_t num_k_heads, int64_t num_v_heads,
                                          int64_t head_k_dim, int64_t head_v_dim,
                                          bool float16_inputs, int64_t segment_chunks) {
  ValueCheck(segment_chunks >= 0, "argument 'segment_chunks': expected >= 0, got ", segment_chunks);
  int64_t bytes = 0;
  gdn_split_impl::Workspace::sized(num_sequences, total_tokens, num_k_heads, num_v_heads,
                                   head_k_dim, head_v_dim, float16_inputs, segment_chunks, bytes);
  return bytes;
}

/// Whether the split path's walk fits the shared memory a block may have on CUDA device
/// `device_index`, with one stage: float16 inputs at head_k_dim 128 need more than the
/// 99 KiB of sm_86 / sm_89 GPUs. Where it does not, gdn_extend takes the fused kernel.
inline bool gdn_extend_split_fits(int64_t device_index, int64_t head_k_dim, bool float16_inputs) {
  using gdn_split_impl::walk_bytes;
  const int bytes = float16_inputs ? (head_k_dim == 64    ? walk_bytes<fp16_t, 64>(1)
                                      : head_k_dim == 128 ? walk_bytes<fp16_t, 128>(1)
                                                          : walk_bytes<fp16_t, 256>(1))
                                   : (head_k_dim == 64    ? walk_bytes<bf16_t, 64>(1)
                                      : head_k_dim == 128 ? walk_bytes<bf16_t, 128>(1)
                                                          : walk_bytes<bf16_t, 256>(1));
  const DLDevice device{kDLCUDA, static_cast<int32_t>(device_index)};
  return static_cast<std::size_t>(bytes) <= max_shared_memory_per_block(device);
}

/// gdn_extend on the split path (long sequences): the same arguments and results, plus
/// `workspace`, uint8 of at least gdn_extend_workspace_bytes (of the same
/// segment_chunks) on the call's device (scratch: its contents before and after mean
/// nothing), and `segment_chunks`: 0 walks each sequence in one run; n > 0 cuts each into
/// segments of n chunks, walked at once (the segmented walk of the design note).
inline void gdn_extend_split(TensorView out, TensorView q, TensorView k, TensorView v,
                             tvm::ffi::Optional<TensorView> a, tvm::ffi::Optional<TensorView> b,
                             tvm::ffi::Optional<TensorView> A_log,
                             tvm::ffi::Optional<TensorView> dt_bias,
                             tvm::ffi::Optional<TensorView> g, tvm::ffi::Optional<TensorView> beta,
                             TensorView state_pool, TensorView cache_indices, TensorView cu_seqlens,
                             tvm::ffi::Optional<double> scale, bool use_qk_l2norm,
                             tvm::ffi::Optional<TensorView> errors, TensorView workspace,
                             int64_t segment_chunks) {
  using namespace gdn_split_impl;
  const gdn_extend_impl::Call call =
      gdn_extend_impl::check_call(out, q, k, v, a, b, A_log, dt_bias, g, beta, state_pool,
                                  cache_indices, cu_seqlens, scale, use_qk_l2norm, errors);
  const bool fp16 = is_dtype<fp16_t>(call.dtype);
  ValueCheck(segment_chunks >= 0, "argument 'segment_chunks': expected >= 0, got ", segment_chunks);
  int64_t bytes = 0;
  Workspace ws =
      Workspace::sized(call.sequences, call.p.total_tokens, call.num_k_heads, call.p.num_v_heads,
                       call.head_k_dim, call.head_v_dim, fp16, segment_chunks, bytes);
  SymbolicDevice device;
  device.bind(call.device, "q");
  TensorMatcher({kAnySize})
      .dtype<uint8_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(workspace, "workspace");
  ValueCheck(workspace.size(0) >= bytes, "argument 'workspace': expected at least ", bytes,
             " bytes (gdn_extend_workspace_bytes), got ", workspace.size(0));
  ws.data = data_ptr<char>(workspace);
  ValueCheck(reinterpret_cast<uintptr_t>(ws.data) % 16 == 0,
             "argument 'workspace': expected a 16-byte aligned start");
  dispatch_dtype<fp16_t, bf16_t>(call.dtype, "q", [&](auto input_tag) {
    using T = typename decltype(input_tag)::type;
    dispatch_dtype<fp32_t, bf16_t>(call.state_dtype, "state_pool", [&](auto state_tag) {
      using S = typename decltype(state_tag)::type;
      const int V = static_cast<int>(call.head_v_dim);
      switch (call.head_k_dim) {
        case 64: launch_split<T, S, 64>(call.p, ws, call.sequences, V, call.device); break;
        case 128: launch_split<T, S, 128>(call.p, ws, call.sequences, V, call.device); break;
        default: launch_split<T, S, 256>(call.p, ws, call.sequences, V, call.device); break;
      }
    });
  });
}

}  // namespace mllm_kernel::cuda
